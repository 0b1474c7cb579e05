"""The last finisher under varying tool waits (models/wait_tail.py, `predictor.wait_tail`).

The analytic latest finish is checked against drawing the waits; the predictor with the option
against the simulator, which draws every trajectory's own waits and runs the engine model step
by step (the turn-indexed prediction misses that workload by 15-18%, README)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from models.builder import build_models
from models.config import CONFIG_ROOT, load_experiment
from models.predictor import batch_shape
from models.wait_tail import active_behind, latest_finish
from runtime.sim.layout import FixedLayout, Layout
from runtime.sim.simulator import Simulator

MIXED = CONFIG_ROOT / "experiments" / "train-mixed-emulated.yaml"


def quantile_turns(batch: int, rng: np.random.Generator) -> np.ndarray:
    """A batch's turn counts and the `active` row they make (trajectories with more than k turns)."""
    n = np.sort(np.clip(np.round(rng.lognormal(np.log(10.0), 0.6, batch)), 1, 40)).astype(int)
    return n, np.array([(n > k).sum() for k in range(n.max())], dtype=float)


@pytest.mark.parametrize("batch, cv", [(64, 1.0), (512, 1.0), (256, 0.5)])
def test_latest_finish_matches_drawn_waits(batch: int, cv: float) -> None:
    rng = np.random.default_rng(batch)
    n, active = quantile_turns(batch, rng)
    mean = 6.0
    var = (cv * mean) ** 2
    turn = mean + rng.uniform(8.0, 20.0, size=(3, active.size))  # engine part per turn, three candidates
    latest, excess = latest_finish(turn, active, mean, var)
    s2 = np.log1p(cv * cv)
    draws = rng.lognormal(np.log(mean) - s2 / 2, np.sqrt(s2), size=(2000, batch, active.size))
    waits = np.where(np.arange(active.size)[None, None, :] < n[None, :, None], draws, 0.0).sum(axis=2)
    for row in range(3):
        engine = np.concatenate([[0.0], np.cumsum(turn[row] - mean)])[n]
        finish = engine[None, :] + waits
        drawn = finish.max(axis=1).mean()
        assert latest[row] == pytest.approx(drawn, rel=0.01)
        assert latest[row] > turn[row].sum() * 1.02  # the tail is not a rounding: the mean wait's path finishes sooner
        last = finish.argmax(axis=1)
        behind = ((waits[np.arange(2000), last] - n[last] * mean) / n[last]).mean()
        assert excess[row] == pytest.approx(behind, rel=0.15)


def test_constant_waits_leave_the_turn_indexed_sum() -> None:
    active = np.array([8.0, 8.0, 5.0, 1.0])
    turn = np.array([[3.0, 4.0, 5.0, 6.0], [1.0, np.inf, 1.0, 1.0]])
    for var in (0.0, 5.6e-191):  # quadrature of a constant leaves ~1e-190
        latest, excess = latest_finish(turn, active, 2.0, var)
        assert latest[0] == 18.0 and np.isinf(latest[1]) and not excess.any()
    latest, excess = latest_finish(turn, active, 2.0, 4.0)
    assert latest[0] > 18.0 and np.isinf(latest[1]) and excess[1] == 0.0


def test_the_last_finisher_meets_fewer_trajectories_the_further_behind() -> None:
    active = np.array([10.0, 10.0, 8.0, 6.0, 3.0, 1.0])
    turn = np.full((1, 6), 5.0)
    schedule = np.cumsum(turn, axis=1) - turn
    assert np.array_equal(active_behind(schedule, turn, active, np.zeros(1))[0], active)
    # a turn's excess each turn: its turn k starts at 10k s, when the batch starts turn 2k
    one = active_behind(schedule, turn, active, np.array([5.0]))[0]
    assert np.array_equal(one, active[np.minimum(2 * np.arange(6), 5)])
    two = active_behind(schedule, turn, active, np.array([10.0]))[0]
    assert np.array_equal(two, active[np.minimum(3 * np.arange(6), 5)]) and np.all(two <= one)


def test_the_predictor_option_reaches_every_kind_and_lifts_every_table() -> None:
    spec = load_experiment(MIXED)
    on = build_models(spec.model_copy(update={"predictor": spec.predictor.model_copy(update={"wait_tail": True})}))
    off = build_models(spec)
    assert on.predictor.wait_tail and all(p.wait_tail for _, _, p in on.variants)
    assert not off.predictor.wait_tail and not any(p.wait_tail for _, _, p in off.variants)
    n = np.arange(1, 9)
    for a, b in [(off.predictor, on.predictor)] + [(x[2], y[2]) for x, y in zip(off.variants, on.variants)]:
        for table in ("colocated_many", "decode_path_many"):
            plain, tail = getattr(a, table)(n)[0], getattr(b, table)(n)[0]
            assert np.all(tail >= plain) and tail[0] > plain[0] * 1.05, (table, plain, tail)
        assert np.array_equal(a.prefill_path_many(n), b.prefill_path_many(n))  # a throughput path: no one trajectory's waits


def test_the_lighter_load_of_the_last_finisher_lowers_its_latest_finish() -> None:
    """At a loaded batch the last finisher, behind the schedule, meets fewer trajectories: the
    prediction falls below the latest finish at the turn-indexed load, never below that load's sum."""
    spec = load_experiment(CONFIG_ROOT / "experiments" / "pd-crossover.yaml")
    p = replace(build_models(spec).predictor, wait_tail=True, _cache={})
    *_, t, _ = p._colocated_turns(np.array([8]))
    at_schedule, _ = latest_finish(t, p.shape.active, p.shape.env_s, p.shape.env_var_s2)
    done = p.colocated(8).completion_s
    assert t.sum() <= done < at_schedule[0] * 0.995


def test_a_constant_workload_is_predicted_as_before() -> None:
    spec = load_experiment(MIXED)
    wl = spec.workload.model_copy(update={"env_latency_s": spec.workload.env_latency_s.model_copy(update={"kind": "constant", "cv": 0.0})})
    models = build_models(spec.model_copy(update={"workload": wl}))
    assert batch_shape(wl).env_var_s2 < 1e-12
    p = models.predictor
    assert replace(p, wait_tail=True, _cache={}).colocated(2).completion_s == p.colocated(2).completion_s


def test_with_the_option_the_prediction_meets_the_simulator() -> None:
    """Two reserved H800 colocated on the mixed workload (waits lognormal, cv 1): the simulator,
    over 24 batches after a cold one, against both predictions."""
    spec = load_experiment(MIXED)
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"staleness": 0}), "trace": None, "elastic_traces": {}})
    models = build_models(spec)
    lay = Layout("colocated", colocated=2)
    plain = models.predictor.colocated(2).completion_s
    tail = replace(models.predictor, wait_tail=True, _cache={}).colocated(2).completion_s
    tp = {"colocated": models.tp_colocated, "prefill": models.tp_prefill, "decode": models.tp_decode}
    r = Simulator(models, FixedLayout(lay, tp), None, hours=plain * 40 / 3600, rollout_only=True).run()
    sim = float(np.mean(r.batch_times_s[1:25]))
    assert len(r.batch_times_s) >= 25
    assert abs(tail / sim - 1) < 0.08, (plain, tail, sim)
    assert plain / sim - 1 < -0.10  # what the option is for: the turn-indexed path misses the tail
