"""The shared plan executor (runtime/executor.py): release order, expansion all-or-nothing,
serving after a role switch, failure propagation, `committed`, `canonical`. Pure, no clock."""

from __future__ import annotations

import itertools
import random

import pytest

from planner.decision import Decision, GroupTarget, SolverProof
from planner.state import GPU, ClusterState, Worker
from planner.transition import Action, TransitionPlan, UnitCosts, apply_plan, build_plan
from planner_cases import random_inputs
from runtime.executor import Executor, Progress, canonical

PROOF = SolverProof("evaluated", 0.0, 0.0, 0.0, 0.0, "none")
# a switch costs far more than stop + start: the matching stops and starts instead of switching
NO_SWITCH = UnitCosts({"rollout": 1.0, "elastic": 1.0, "training": 1.0}, 1.0, 100.0)


# ----------------------------------------------------------------------------- helpers
def act(i: int, kind: str, gpus: tuple[str, ...] = (), after: tuple[int, ...] = (), worker: str | None = "tmp", role: str | None = "decode") -> Action:
    if kind in ("lend", "return"):
        worker, role = None, None
    return Action(i, kind, worker, gpus, role, after=after)  # type: ignore[arg-type]


def plan(*actions: Action) -> TransitionPlan:
    return TransitionPlan(tuple(actions), 0, 0, 0, 0, 0)


def ids(actions: tuple[Action, ...]) -> list[int]:
    return sorted(a.id for a in actions)


def began(p: Progress, rid: int | None = None) -> list[int]:
    return sorted(a.id for r, a in p.begin if rid is None or r == rid)


def expansion_pair() -> TransitionPlan:
    """Two new engines on free GPUs, each followed by its weight load."""
    return plan(act(0, "start", ("g0",)), act(1, "load_weights", ("g0",), (0,)),
                act(2, "start", ("g1",)), act(3, "load_weights", ("g1",), (2,)))


def rollout_state(n: int, workers: tuple[Worker, ...] = (), version: int = 0) -> ClusterState:
    return ClusterState(tuple(GPU(f"n0/{i}", "n0", "H800", "rollout") for i in range(n)), workers, weight_version=version)


def decision(c: int, p: int, d: int) -> Decision:
    mode = "colocated" if c else "disaggregated"
    return Decision(mode, c, p, d, (GroupTarget("n0", "rollout", "H800", c, p, d),), 1.0, 0.0, 0, PROOF)  # type: ignore[arg-type]


def two_colocated() -> ClusterState:
    return rollout_state(4, (Worker("w:n0/0", "colocated", ("n0/0",), 1), Worker("w:n0/1", "colocated", ("n0/1",), 1)))


def roles(state: ClusterState) -> dict[str, str]:
    return {w.id: w.role for w in state.workers}


# ----------------------------------------------------------------------------- canonical
def test_canonical_names_workers_by_first_gpu_and_leaves_the_rest() -> None:
    p = TransitionPlan((Action(0, "start", "w7", ("n0/3", "n0/2"), "decode"),
                        Action(1, "lend", None, ("t0/0",)),
                        Action(2, "drain", "keep", (), None)), 1, 2, 3, 4, 5)
    c = canonical(p)
    assert [a.worker for a in c.actions] == ["w:n0/3", None, "keep"]  # first GPU, not the smallest
    assert (c.joins, c.leaves, c.role_changes, c.lent, c.returned) == (1, 2, 3, 4, 5)
    assert c.actions[0].gpus == ("n0/3", "n0/2") and c.actions[0].role == "decode"


def test_submitted_actions_carry_canonical_worker_ids() -> None:
    ex = Executor()
    _, p = ex.submit(plan(act(0, "start", ("n1/2", "n1/3"), worker="anything")))
    assert [a.worker for _, a in p.begin] == ["w:n1/2"]


# ----------------------------------------------------------------------------- release order
def test_actions_released_only_after_all_deps_succeeded() -> None:
    ex = Executor()
    rid, p = ex.submit(plan(act(0, "start", ("g0",)), act(1, "load_weights", ("g0",), (0,)),
                            act(2, "drain", ("g1",)), act(3, "stop", ("g1",), (2,)),
                            act(4, "return", ("g2",), (1, 3))))
    assert began(p) == [0, 2]
    assert ex.complete(rid, 3, True) == Progress()  # not running: ignored
    assert began(ex.complete(rid, 0, True)) == [1]
    assert began(ex.complete(rid, 2, True)) == [3]
    assert began(ex.complete(rid, 1, True)) == []  # 4 still waits for 3
    assert began(ex.complete(rid, 3, True)) == [4]
    assert ex.complete(rid, 3, True) == Progress()  # a second report of the same end is ignored
    assert ex.running(rid)
    ex.complete(rid, 4, True)
    assert not ex.running(rid) and not ex.busy


def test_failure_propagates_transitively_and_once() -> None:
    ex = Executor()
    # diamond 0 -> (1, 2) -> 3 -> 4, plus an independent action 5
    rid, p = ex.submit(plan(act(0, "drain", ("g0",)), act(1, "switch_role", ("g0",), (0,)), act(2, "stop", ("g0",), (0,)),
                            act(3, "load_weights", ("g0",), (1, 2)), act(4, "return", ("g9",), (3,)),
                            act(5, "drain", ("g1",))))
    assert began(p) == [0, 5]
    out = ex.complete(rid, 0, False)
    assert sorted(a.id for a in out.failed) == [1, 2, 3, 4]
    assert out.begin == () and out.serving == () and out.admitted == ()
    assert ex.running(rid)  # 5 still runs
    assert ex.complete(rid, 5, True) == Progress()
    assert not ex.running(rid)
    assert ex.complete(rid, 5, True) == Progress()  # a settled plan ignores late reports


def test_running_false_once_every_action_ended() -> None:
    ex = Executor()
    rid, _ = ex.submit(expansion_pair())
    for aid in (0, 2, 1):
        ex.complete(rid, aid, True)
        assert ex.running(rid)
    ex.complete(rid, 3, True)
    assert not ex.running(rid) and not ex.busy


def test_empty_plan_is_not_running() -> None:
    ex = Executor()
    rid, p = ex.submit(plan())
    assert p == Progress()
    assert not ex.running(rid) and not ex.busy


def test_second_plan_waits_for_earlier_plan_on_shared_gpu() -> None:
    ex = Executor()
    r1, p1 = ex.submit(plan(act(0, "drain", ("g0",), worker="w:g0"), act(1, "stop", ("g0",), (0,), worker="w:g0")))
    assert began(p1) == [0]
    # plan 2: a TP2 start over g1 and g0 (g0 is held by plan 1) and an independent start on g5
    r2, p2 = ex.submit(plan(act(0, "start", ("g1", "g0")), act(1, "load_weights", ("g1", "g0"), (0,)),
                            act(2, "start", ("g5",))))
    assert [(r, a.id) for r, a in p2.begin] == [(r2, 2)]
    p = ex.complete(r1, 0, True)
    assert [(r, a.id) for r, a in p.begin] == [(r1, 1)]  # plan 1's stop still holds g0
    p = ex.complete(r1, 1, True)
    assert [(r, a.id) for r, a in p.begin] == [(r2, 0)]
    assert not ex.running(r1) and ex.running(r2)
    assert ex.pending_kinds("load_weights")[0].worker == "w:g1"


def test_earlier_plans_not_yet_begun_action_also_holds_its_gpu() -> None:
    ex = Executor()
    r1, _ = ex.submit(plan(act(0, "drain", ("g1",)), act(1, "stop", ("g0",), (0,))))  # g0's stop waits for the drain
    r2, p2 = ex.submit(plan(act(0, "start", ("g0",)), act(1, "start", ("g2",))))
    assert began(p2, r2) == [1]
    assert [(r, a.id) for r, a in ex.complete(r1, 0, True).begin] == [(r1, 1)]
    assert [(r, a.id) for r, a in ex.complete(r1, 1, False).begin] == [(r2, 0)]  # a failed end releases the GPU too


def test_later_plan_does_not_hold_back_an_earlier_one() -> None:
    ex = Executor()
    r1, _ = ex.submit(plan(act(0, "drain", ("g0",)), act(1, "stop", ("g1",), (0,))))
    r2, p2 = ex.submit(plan(act(0, "drain", ("g2",))))
    assert began(p2, r2) == [0]
    assert [(r, a.id) for r, a in ex.complete(r1, 0, True).begin] == [(r1, 1)]


# ----------------------------------------------------------------------------- expansion
_ORDERS = [o for o in itertools.permutations(range(4)) if o.index(0) < o.index(1) and o.index(2) < o.index(3)]


@pytest.mark.parametrize("order", _ORDERS)
def test_expansion_admitted_together_after_every_start_and_load(order: tuple[int, ...]) -> None:
    ex = Executor()
    rid, p = ex.submit(expansion_pair())
    assert began(p) == [0, 2]
    for n, aid in enumerate(order):
        out = ex.complete(rid, aid, True)
        if n < 3:
            assert out.admitted == ()
        else:
            assert [(a.id, a.worker) for a in out.admitted] == [(0, "w:g0"), (2, "w:g1")]
        assert out.cancelled == () and out.serving == ()


def test_expansion_includes_a_start_after_a_lend() -> None:
    ex = Executor()
    rid, p = ex.submit(plan(act(0, "lend", ("t0",)), act(1, "start", ("t0",), (0,)), act(2, "load_weights", ("t0",), (1,)),
                            act(3, "start", ("g0",)), act(4, "load_weights", ("g0",), (3,))))
    assert began(p) == [0, 3]
    for aid in (3, 4, 0, 1):
        assert ex.complete(rid, aid, True).admitted == ()
    assert ids(ex.complete(rid, 2, True).admitted) == [1, 3]


def test_expansion_failure_cancels_started_and_fails_pending_members() -> None:
    ex = Executor()
    rid, _ = ex.submit(plan(act(0, "lend", ("t0",)), act(1, "start", ("t0",), (0,)), act(2, "load_weights", ("t0",), (1,)),
                            act(3, "start", ("g0",)), act(4, "load_weights", ("g0",), (3,)),
                            act(5, "start", ("g1",)), act(6, "load_weights", ("g1",), (5,))))
    ex.complete(rid, 3, True)
    ex.complete(rid, 4, True)  # member 3 has fully joined (but the group is not complete)
    out = ex.complete(rid, 5, False)
    assert ids(out.cancelled) == [3]
    assert ids(out.failed) == [1, 2, 6]  # the pending member (behind the lend) and the loads
    assert out.admitted == () and out.begin == ()
    out = ex.complete(rid, 0, True)  # the lend still ends; nothing follows it
    assert out == Progress()
    assert not ex.running(rid)


def test_expansion_member_loading_when_group_fails_is_cancelled_when_load_ends() -> None:
    ex = Executor()
    rid, _ = ex.submit(expansion_pair())
    assert began(ex.complete(rid, 0, True)) == [1]  # load 1 running
    out = ex.complete(rid, 2, False)
    assert out.cancelled == () and ids(out.failed) == [3]
    out = ex.complete(rid, 1, True)
    assert ids(out.cancelled) == [0] and out.admitted == ()
    assert not ex.running(rid)


def test_expansion_failure_by_a_weight_load_cancels_its_own_start_too() -> None:
    ex = Executor()
    rid, _ = ex.submit(expansion_pair())
    ex.complete(rid, 0, True)
    ex.complete(rid, 2, True)
    ex.complete(rid, 1, True)
    out = ex.complete(rid, 3, False)
    assert ids(out.cancelled) == [0, 2] and out.admitted == ()


def test_expansion_member_starting_when_group_fails_does_not_load_weights() -> None:
    ex = Executor()
    rid, _ = ex.submit(expansion_pair())
    first = ex.complete(rid, 2, False)  # start 0 is still running: its weight load is given up now
    assert 1 in ids(first.failed) and ids(first.cancelled) == []
    out = ex.complete(rid, 0, True)
    assert ids(out.cancelled) == [0]  # stopped once, when its start ends
    assert began(out) == []  # never a weight load on an engine the runtime is told to stop
    assert not ex.running(rid)


def test_expansion_member_whose_load_fails_after_group_failed_is_cancelled() -> None:
    ex = Executor()
    rid, _ = ex.submit(expansion_pair())
    ex.complete(rid, 0, True)  # load 1 running
    ex.complete(rid, 2, False)  # group fails; start 0 is to be cancelled when its load ends
    out = ex.complete(rid, 1, False)
    assert ids(out.cancelled) == [0]  # got: ()


def test_start_reusing_a_stopped_workers_gpus_is_admitted_on_its_own() -> None:
    ex = Executor()
    rid, p = ex.submit(plan(act(0, "drain", ("g0",), worker="w:g0"), act(1, "stop", ("g0",), (0,), worker="w:g0"),
                            act(2, "start", ("g0",), (1,)), act(3, "load_weights", ("g0",), (2,)),
                            act(4, "start", ("g1",)), act(5, "load_weights", ("g1",), (4,))))
    assert began(p) == [0, 4]
    for aid in (0, 1, 2):
        assert ex.complete(rid, aid, True).admitted == ()
    out = ex.complete(rid, 3, True)
    assert ids(out.admitted) == [2]  # while the expansion (4, 5) is still under way
    out = ex.complete(rid, 4, False)  # the expansion fails: the replacement is unaffected
    assert out.cancelled == () and ids(out.failed) == [5]
    assert not ex.running(rid)


def test_replacement_that_cannot_load_weights_is_cancelled() -> None:
    ex = Executor()
    rid, _ = ex.submit(plan(act(0, "stop", ("g0",), worker="w:g0"), act(1, "start", ("g0",), (0,)), act(2, "load_weights", ("g0",), (1,))))
    ex.complete(rid, 0, True)
    assert ex.complete(rid, 1, True).admitted == ()
    out = ex.complete(rid, 2, False)
    assert ids(out.cancelled) == [1] and out.admitted == ()


# ----------------------------------------------------------------------------- role switch
def test_switch_then_load_serves_only_after_the_load() -> None:
    ex = Executor()
    rid, p = ex.submit(plan(act(0, "drain", ("g0",), worker="w:g0"), act(1, "switch_role", ("g0",), (0,), worker="w:g0", role="prefill"),
                            act(2, "load_weights", ("g0",), (1,), worker="w:g0", role="prefill")))
    assert began(p) == [0]
    assert ex.complete(rid, 0, True).serving == ()
    out = ex.complete(rid, 1, True)
    assert out.serving == () and began(out) == [2]
    out = ex.complete(rid, 2, True)
    assert [(a.id, a.kind, a.worker) for a in out.serving] == [(1, "switch_role", "w:g0")]
    assert out.admitted == ()


def test_switch_without_load_serves_when_switched_and_failed_switch_never_serves() -> None:
    ex = Executor()
    rid, _ = ex.submit(plan(act(0, "switch_role", ("g0",), worker="w:g0"), act(1, "switch_role", ("g1",), worker="w:g1"),
                            act(2, "load_weights", ("g1",), (1,), worker="w:g1")))
    assert ids(ex.complete(rid, 0, True).serving) == [0]
    out = ex.complete(rid, 1, False)
    assert out.serving == () and ids(out.failed) == [2]


# ----------------------------------------------------------------------------- with build_plan
def test_build_plan_expansion_then_drain_then_replacement() -> None:
    """1C + 3D from 2C on 4 GPUs: two new decodes join together, then the surplus worker drains
    and stops, and a decode restarts on its GPU and joins on its own."""
    state = two_colocated()
    tp = build_plan(state, decision(1, 0, 3), random_inputs(random.Random(0), (1, 1, 1)), 0.0, costs=NO_SWITCH)
    ex = Executor()
    rid, p = ex.submit(tp)
    by = {a.id: a for a in canonical(tp).actions}
    starts = [a for _, a in p.begin]
    assert sorted((a.kind, a.worker) for a in starts) == [("start", "w:n0/2"), ("start", "w:n0/3")]
    seen_admitted: list[list[str]] = []
    ended: list[str] = []
    running = [a for _, a in p.begin]
    while running:
        a = running.pop(0)
        out = ex.complete(rid, a.id, True)
        ended.append(f"{a.kind}:{a.worker}")
        if out.admitted:
            seen_admitted.append(sorted(x.worker for x in out.admitted))
        for _, b in out.begin:
            assert all(f"{by[d].kind}:{by[d].worker}" in ended for d in b.after)
            if b.kind == "drain":  # capacity first: the new engines have joined
                assert seen_admitted and seen_admitted[0] == ["w:n0/2", "w:n0/3"]
        running.extend(b for _, b in out.begin)
    assert seen_admitted == [["w:n0/2", "w:n0/3"], ["w:n0/1"]]
    assert ended.index("stop:w:n0/1") < ended.index("start:w:n0/1")
    assert not ex.running(rid)


# ----------------------------------------------------------------------------- committed
def test_committed_is_the_state_itself_when_idle() -> None:
    ex = Executor()
    s = two_colocated()
    assert ex.committed(s) is s
    rid, _ = ex.submit(plan(act(0, "drain", ("n0/0",))))
    ex.complete(rid, 0, True)
    assert ex.committed(s) is s


def test_committed_drops_a_pending_stop() -> None:
    state = two_colocated()
    tp = build_plan(state, decision(1, 0, 2), random_inputs(random.Random(0), (1, 1, 1)), 0.0, costs=NO_SWITCH)
    assert {a.worker for a in tp.actions if a.kind == "stop"} == {"w:n0/1"}
    ex = Executor()
    ex.submit(tp)
    # the runtime's own state holds the engines whose start has begun
    now = rollout_state(4, (*state.workers, Worker("w:n0/2", "decode", ("n0/2",), 1), Worker("w:n0/3", "decode", ("n0/3",), 1)))
    got = ex.committed(now)
    assert roles(got) == {"w:n0/0": "colocated", "w:n0/2": "decode", "w:n0/3": "decode"}
    assert roles(now)["w:n0/1"] == "colocated"  # the runtime's state is not touched


def test_committed_applies_a_pending_start_under_its_canonical_id() -> None:
    state = two_colocated()
    tp = build_plan(state, decision(1, 0, 3), random_inputs(random.Random(0), (1, 1, 1)), 0.0, costs=NO_SWITCH)
    ex = Executor()
    ex.submit(tp)
    now = rollout_state(4, (*state.workers, Worker("w:n0/2", "decode", ("n0/2",), 1), Worker("w:n0/3", "decode", ("n0/3",), 1)))
    got = ex.committed(now)
    # w:n0/1 (colocated) stops and a decode restarts on its GPU: same canonical name, new role
    assert roles(got) == {"w:n0/0": "colocated", "w:n0/1": "decode", "w:n0/2": "decode", "w:n0/3": "decode"}
    assert sorted(roles(got).values()) == sorted(w.role for w in apply_plan(state, tp).workers)


def test_committed_counts_a_running_lend_and_applies_the_pending_start_after_it() -> None:
    s = ClusterState((GPU("t0/0", "t0", "H800", "training"), GPU("n0/0", "n0", "H800", "rollout")), weight_version=3)
    ex = Executor()
    rid, p = ex.submit(plan(act(0, "lend", ("t0/0",)), act(1, "start", ("t0/0",), (0,), worker="new"),
                            act(2, "load_weights", ("t0/0",), (1,), worker="new")))
    assert began(p) == [0]
    got = ex.committed(s)
    assert got.gpu("t0/0").borrowed
    assert [(w.id, w.role, w.gpus, w.weight_version) for w in got.workers] == [("w:t0/0", "decode", ("t0/0",), 3)]


def test_committed_counts_a_running_return_and_not_a_running_stop() -> None:
    s = ClusterState((GPU("t0/0", "t0", "H800", "training", borrowed=True), GPU("n0/0", "n0", "H800", "rollout")),
                     (Worker("w:n0/0", "decode", ("n0/0",), 1),))
    ex = Executor()
    ex.submit(plan(act(0, "return", ("t0/0",)), act(1, "stop", ("n0/0",), worker="w:n0/0")))
    got = ex.committed(s)
    assert not got.gpu("t0/0").borrowed
    assert roles(got) == {"w:n0/0": "decode"}  # a stop under way is the runtime's to report


def test_progress_add_concatenates_each_field() -> None:
    a, b = Action(0, "start"), Action(1, "stop")
    x = Progress(begin=((0, a),), serving=(a,), admitted=(a,), cancelled=(a,), failed=(a,))
    y = Progress(begin=((1, b),), serving=(b,), admitted=(b,), cancelled=(b,), failed=(b,))
    z = x + y
    assert z.begin == ((0, a), (1, b))
    assert z.serving == z.admitted == z.cancelled == z.failed == (a, b)
