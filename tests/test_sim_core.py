"""Simulator invariants: conservation, preemption storms, borrowing, predictor agreement, determinism."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from models.builder import build_models
from models.config import load_experiment
from runtime.sim.layout import FixedLayout, Layout
from runtime.sim.run import TraceFlags, make_policy, simulate
from runtime.sim.simulator import Simulator

ROOT = Path(__file__).resolve().parent.parent
PAPER = ROOT / "configs/experiments/default.yaml"


@dataclass(frozen=True)
class Avail:
    times_s: tuple
    gpus: tuple


def _models(path=PAPER, **training):
    spec = load_experiment(path)
    spec = spec.model_copy(update={"trace": None, "training": spec.training.model_copy(update=training)})
    return build_models(spec)


def _tp(m):
    return {"colocated": m.tp_colocated, "prefill": m.tp_prefill, "decode": m.tp_decode}


def _assert_conserved(r):
    assert r.launched > 0 and r.finished > 0
    assert r.lost_trajectories == 0
    assert r.launched == r.finished + r.in_flight


def test_conservation_under_a_real_trace_with_pearl():
    spec = load_experiment(PAPER)
    r = simulate(spec, "pearl", TraceFlags(), hours=0.75)
    _assert_conserved(r)
    assert r.steps > 0 and r.late_returns == 0
    assert r.elastic_series, "the Bamboo trace drove the elastic pool"


@pytest.mark.parametrize("policy", ["fixed:disaggregated:0:3:5", "pearl"])
def test_preemption_storm_loses_nothing(policy):
    m = _models()
    # all 12 elastic GPUs vanish at once, several times, and come back in between
    times = tuple(float(t) for t in range(0, 2400, 150))
    gpus = tuple(12 if i % 2 == 0 else 0 for i in range(len(times)))
    r = Simulator(m, make_policy(policy, m), Avail(times, gpus), hours=0.67).run()
    _assert_conserved(r)
    assert r.preempted_instances >= 6
    assert r.resumed > 0, "preempted requests resumed elsewhere"


def _borrowing_run(predicted_s: float, hours: float = 1.0):
    """16 colocated instances, 8 of them on lent training GPUs, with the trainer timeline
    starting from `predicted_s` as the plan's batch time."""
    m = _models()
    lay = Layout("colocated", colocated=16, borrow=8)
    sim = Simulator(m, FixedLayout(lay, _tp(m), predicted_s=predicted_s), None, hours=hours)
    seen = []
    start = sim._start_training

    def checked_start():
        seen.append((sum(1 for i in sim.instances.values() if i.pool == "training"), len(sim.ledger.out)))
        start()

    sim._start_training = checked_start
    return m, sim, sim.run(), seen


def test_borrowed_gpus_are_back_before_every_training_step():
    m = _models()
    pred = m.predictor.colocated(16).completion_s
    _, sim, r, seen = _borrowing_run(0.7 * pred)  # the plan expects the trainer a bit early: returns start in time
    _assert_conserved(r)
    assert r.lends > 0 and r.returns > 0
    assert seen and all(n == (0, 0) for n in seen), seen
    assert r.late_returns == 0 and r.train_delay_s == 0.0 and r.forced_returns == 0


def test_training_earlier_than_the_plan_assumed_is_a_measured_late_return():
    """The plan believes the batch takes 3x what it does: the recall comes too late, the
    training step waits for its GPUs, and the run says so (counted and timed)."""
    m = _models()
    pred = m.predictor.colocated(16).completion_s
    _, sim, r, seen = _borrowing_run(3.0 * pred, hours=1.5 * pred / 3600.0)  # past the first batch
    _assert_conserved(r)
    assert r.steps >= 1 and r.late_returns >= 2, r.summary()
    assert r.train_delay_s > 0 and all(d > 0 for d in sim.ledger.delays)
    assert all(n == (0, 0) for n in seen), "training still starts only once every GPU is home"


@pytest.mark.parametrize("mode,n", [("colocated", 8), ("disaggregated", 8)])
def test_simulator_agrees_with_predictor_on_steady_state_batches(mode, n):
    m = _models(staleness=0)
    if mode == "colocated":
        lay, pred = Layout("colocated", colocated=n), m.predictor.colocated(n).completion_s
    else:
        lay, pred = Layout("disaggregated", prefill=2, decode=n - 2), m.predictor.disaggregated(2, n - 2).completion_s
    r = Simulator(m, FixedLayout(lay, _tp(m)), None, hours=7.0 * pred / 3600.0, rollout_only=True).run()
    batches = np.array(r.batch_times_s[1:])
    assert len(batches) >= 5
    # The predictor takes disaggregated completion as max(prefill path, decode path) + the
    # prefill queue (trajectories that reach a busy prefill engine wait): here within ~1% of the
    # simulator, -5% without the queue term (measured with the queue's introduction).
    # Colocated runs sit a few % above the predictor at the calibrated batch of 1,024 (README:
    # predictor vs simulator); which of the two seeds' router draws the
    # test sees moves it by ~1.5% (measured, 2026-11-30), hence 0.12 (issue 12/13 own the gap).
    bound = 0.12 if mode == "colocated" else 0.15
    assert abs(batches.mean() - pred) / pred <= bound, (batches.mean(), pred)


def test_same_seed_same_result_other_seed_differs():
    m = _models()
    pol = lambda: FixedLayout(Layout("disaggregated", prefill=2, decode=6), _tp(m))  # noqa: E731
    avail = Avail((0.0, 600.0, 1200.0), (12, 4, 10))
    def run(seed):
        out = Simulator(m, pol(), avail, hours=0.5, seed=seed).run().summary()
        out.pop("policy_wall_s")  # wall-clock time, not a simulated quantity
        return out

    a, b, c = run(3), run(3), run(4)
    assert a == b
    assert a["generated_tokens"] != c["generated_tokens"]


def test_pearl_runs_are_deterministic_under_a_real_trace():
    spec = load_experiment(PAPER)

    def run():
        out = simulate(spec, "pearl", TraceFlags(offset_hours=2.0), hours=0.4).summary()
        out.pop("policy_wall_s")
        return out

    assert run() == run()


def test_simulator_applies_the_workloads_prefix_cache_hit():
    """Of the earlier context a home engine holds, only `prefix_cache_hit` hits; the predictor
    assumes the same, so both re-prefill the rest (before this, the simulator cached it all)."""

    def batch_s(hit: float) -> float:
        spec = load_experiment(PAPER)
        w = spec.workload.model_copy(update={"prefix_cache_hit": hit})
        spec = spec.model_copy(update={"workload": w, "trace": None, "training": spec.training.model_copy(update={"staleness": 0})})
        m = build_models(spec)
        r = Simulator(m, FixedLayout(Layout("colocated", colocated=8), _tp(m)), None, hours=0.5, rollout_only=True).run()
        return float(np.mean(r.batch_times_s)), m.predictor.colocated(8).completion_s

    full, full_pred = batch_s(1.0)
    low, low_pred = batch_s(0.1)
    assert low > full * 1.05 and low_pred > full_pred * 1.05  # both pay for the re-prefill
    assert abs(low - low_pred) / low_pred <= 0.10
