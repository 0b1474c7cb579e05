"""Small shared runtime parts: the loan ledger, the routing rule, the trainer timeline, GC deferral."""

from __future__ import annotations

import gc
import math

import pytest

from runtime import router
from runtime.gc_pause import gc_deferred
from runtime.loans import LoanLedger
from runtime.timeline import RECENT_BATCHES, TrainerTimeline


# ----------------------------------------------------------------------------- LoanLedger
def test_on_time_returns_are_not_late_and_cost_no_delay() -> None:
    led = LoanLedger()
    led.lend(("t/0", "t/1"), 0.0)
    assert led.lent == ("t/0", "t/1")
    assert led.returned(("t/1", "t/0"), 5.0) is False  # nobody waits yet
    assert led.trainer_needs(10.0) is True
    assert (led.late_returns, led.train_delay_s, led.delays, led.needed_at) == (0, 0.0, [], None)
    assert (led.lends, led.returns) == (2, 2)


def test_trainer_with_nothing_lent_starts_at_once() -> None:
    led = LoanLedger()
    assert led.trainer_needs(3.0) is True
    assert led.returned((), 4.0) is False
    assert (led.late_returns, led.train_delay_s, led.delays) == (0, 0.0, [])


def test_late_returns_count_gpus_out_and_delay_runs_to_the_last_return() -> None:
    led = LoanLedger()
    led.lend(("t/0", "t/1", "t/2"), 0.0)
    assert led.returned(("t/0",), 5.0) is False
    assert led.trainer_needs(10.0) is False
    assert led.late_returns == 2 and led.needed_at == 10.0
    assert led.returned(("t/1",), 12.0) is False  # t/2 still out
    assert led.train_delay_s == 0.0
    assert led.returned(("t/2",), 15.5) is True
    assert led.train_delay_s == pytest.approx(5.5) and led.delays == [5.5]
    assert led.needed_at is None and led.lent == ()
    # the next step: on time, no new delay; the totals keep the earlier step
    led.lend(("t/0",), 20.0)
    led.returned(("t/0",), 25.0)
    assert led.trainer_needs(30.0) is True
    assert (led.late_returns, led.delays) == (2, [5.5])
    # and a second late step adds up
    led.lend(("t/0",), 40.0)
    assert led.trainer_needs(41.0) is False
    assert led.returned(("t/0",), 42.0) is True
    assert led.late_returns == 3 and led.delays == [5.5, 1.0] and led.train_delay_s == pytest.approx(6.5)


def test_lending_a_gpu_twice_and_returning_an_unknown_one_count_once() -> None:
    led = LoanLedger()
    led.lend(("t/0",), 1.0)
    led.lend(("t/0", "t/1"), 2.0)
    assert led.lends == 2 and led.out == {"t/0": 1.0, "t/1": 2.0}  # the loan began at the first lend
    led.returned(("t/9", "t/0"), 3.0)
    assert led.returns == 1 and led.lent == ("t/1",)


# ----------------------------------------------------------------------------- router.pick
def draws(*values: int):
    seq = list(values)
    calls: list[int] = []

    def draw(n: int) -> int:
        calls.append(n)
        return seq.pop(0)

    draw.calls = calls  # type: ignore[attr-defined]
    return draw


def test_pick_empty_is_none_and_single_is_that_one() -> None:
    assert router.pick([], lambda k: 0.0, None, draws()) is None
    assert router.pick(["a"], lambda k: 100.0, None, draws()) == "a"


def test_pick_best_of_two_distinct_draws() -> None:
    load = {"a": 5.0, "b": 1.0, "c": 3.0}.__getitem__
    d = draws(0, 1)  # a, then the second of the others (b, c): c
    assert router.pick(["a", "b", "c"], load, None, d) == "c"  # the best of the two drawn, not the global best
    assert d.calls == [3, 2]
    assert router.pick(["a", "b", "c"], load, None, draws(2, 0)) == "c"  # c, then a
    assert router.pick(["a", "b", "c"], {"a": 2.0, "b": 2.0, "c": 2.0}.__getitem__, None, draws(1, 0)) == "b"  # tie: first draw


@pytest.mark.parametrize("first", [0, 1])
def test_pick_of_two_engines_is_always_the_less_loaded(first: int) -> None:
    """Two distinct candidates: with two engines every draw compares both (a batch splits evenly)."""
    loads = {"a": 1.0, "b": 0.0}
    assert router.pick(["a", "b"], loads.__getitem__, None, draws(first, 0)) == "b"


@pytest.mark.parametrize(("home_load", "kept"), [(10.0, True), (10.0001, False), (0.0, True), (4.0, True)])
def test_pick_home_kept_while_within_twice_best_plus_four(home_load: float, kept: bool) -> None:
    loads = {"home": home_load, "b": 3.0, "c": 7.0}
    got = router.pick(["home", "b", "c"], loads.__getitem__, "home", draws(1, 0))
    assert got == ("home" if kept else "b")  # threshold 2 * 3 + 4 = 10


def test_pick_home_against_an_idle_alternative() -> None:
    loads = {"home": 4.0, "b": 0.0}
    assert router.pick(["home", "b"], loads.__getitem__, "home", draws(1, 0)) == "home"
    loads["home"] = 5.0
    assert router.pick(["home", "b"], loads.__getitem__, "home", draws(1, 0)) == "b"
    assert router.pick(["home"], {"home": 50.0}.__getitem__, "home", draws()) == "home"  # nothing else to go to


def test_pick_weighs_loads_by_the_decisions_shares() -> None:
    """Mixed layouts: an engine is compared by load / its kind's share (relative to the largest);
    a kind the prediction idles (share 0) gets nothing while another serves, even as home;
    equal shares route as no shares."""
    loads = {"fast": 3.0, "slow": 1.0}
    share = {"fast": 0.5, "slow": 0.125}.__getitem__  # slow carries a quarter of fast's share
    assert router.pick(["fast", "slow"], loads.__getitem__, None, draws(0, 0)) == "slow"  # unweighted: fewer requests
    assert router.pick(["fast", "slow"], loads.__getitem__, None, draws(0, 0), share) == "fast"  # 3 / 1 < 1 / 0.25
    idle = {"fast": 0.5, "idle": 0.0}.__getitem__
    assert router.pick(["fast", "idle"], {"fast": 50.0, "idle": 0.0}.__getitem__, "idle", draws(0, 0), idle) == "fast"
    assert router.pick(["idle"], {"idle": 9.0}.__getitem__, None, draws(), idle) == "idle"  # nothing else can serve
    equal = {"home": 0.25, "b": 0.25, "c": 0.25}.__getitem__
    for home_load in (10.0, 10.0001):
        loads = {"home": home_load, "b": 3.0, "c": 7.0}
        assert router.pick(["home", "b", "c"], loads.__getitem__, "home", draws(1, 0), equal) == router.pick(["home", "b", "c"], loads.__getitem__, "home", draws(1, 0))


# ----------------------------------------------------------------------------- router.path
@pytest.mark.parametrize(("co", "pd", "mode", "home", "want"), [
    (True, True, "disaggregated", "colocated", "colocated"),  # stays where its prefix is
    (True, True, "colocated", "prefill", "pd"),
    (True, True, "disaggregated", None, "pd"),  # new trajectory follows the mode
    (True, True, "colocated", None, "colocated"),
    (True, True, "colocated", "decode", "colocated"),  # only colocated/prefill count as a home
    (True, False, "disaggregated", "prefill", "colocated"),  # only one kind serves: that one
    (False, True, "colocated", "colocated", "pd"),
    (False, False, "colocated", "colocated", None),
])
def test_path_rules(co: bool, pd: bool, mode: str, home: str | None, want: str | None) -> None:
    assert router.path(co, pd, mode, home) == want


# ----------------------------------------------------------------------------- TrainerTimeline
def test_not_waiting_needs_gpus_now() -> None:
    tl = TrainerTimeline([50.0])
    assert tl.needs_gpus_at(100.0, False, 3.0, 40.0) == 100.0


def test_finite_prediction_wins_over_history() -> None:
    tl = TrainerTimeline([500.0, 600.0])
    assert tl.needs_gpus_at(1000.0, True, 30.0, 100.0) == pytest.approx(1070.0)


@pytest.mark.parametrize("no_prediction", [math.inf, -math.inf, math.nan])
def test_without_prediction_mean_of_last_four_batches(no_prediction: float) -> None:
    assert RECENT_BATCHES == 4
    tl = TrainerTimeline()
    for s in (1000.0, 1000.0, 10.0, 20.0, 30.0, 40.0):
        tl.batch_done(s)
    assert tl.needs_gpus_at(100.0, True, 5.0, no_prediction) == pytest.approx(120.0)  # mean 25 - 5 elapsed
    assert TrainerTimeline([8.0]).needs_gpus_at(100.0, True, 2.0, no_prediction) == pytest.approx(106.0)


def test_never_before_now() -> None:
    assert TrainerTimeline().needs_gpus_at(7.0, True, 0.0, math.inf) == 7.0  # no prediction, no history
    assert TrainerTimeline().needs_gpus_at(7.0, True, 90.0, 60.0) == 7.0  # batch ran past its prediction
    assert TrainerTimeline([10.0]).needs_gpus_at(7.0, True, 15.0, math.inf) == 7.0
    assert TrainerTimeline().needs_gpus_at(7.0, True, -5.0, 60.0) == pytest.approx(67.0)  # negative elapsed counts as 0


# ----------------------------------------------------------------------------- gc_deferred
@pytest.fixture
def gc_state():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_gc_disabled_inside_and_restored_after(gc_state: None) -> None:
    gc.enable()
    with gc_deferred():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_gc_deferral_nests(gc_state: None) -> None:
    gc.enable()
    with gc_deferred():
        with gc_deferred():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block leaves the outer one's choice
    assert gc.isenabled()


def test_gc_restored_on_exception(gc_state: None) -> None:
    gc.enable()
    with pytest.raises(KeyError):
        with gc_deferred():
            raise KeyError("x")
    assert gc.isenabled()


def test_gc_left_off_when_it_was_off(gc_state: None) -> None:
    gc.disable()
    with gc_deferred():
        assert not gc.isenabled()
    assert not gc.isenabled()
