"""The prefill queue Q(N_P) of disaggregated prediction (models/predictor.py, module docstring).

Q is what trajectories wait at busy prefill instances beyond max(T_P, T_D): positive,
falling as prefill instances are added, near zero when they are lightly loaded, never more
than the open-loop M/D/1 wait, and at saturation held at its rho = 1 value (the prefill path
holds the rest). The disaggregated completion is max(T_P, T_D) + Q everywhere it is reported.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from models.builder import build_models
from models.config import WorkloadSpec, load_experiment
from models.predictor import RolloutPredictor, best_split
from test_predictor_properties import RTOL, SETTINGS, models_, non_increasing, predictor, tps, workloads

ROOT = Path(__file__).resolve().parents[1]
N = np.arange(1, 65)


@cache
def crossover(batch: int) -> RolloutPredictor:
    """Qwen3-30B-A3B on TP2 H800 instances, the calibrated SWE-like workload (pd-crossover)."""
    spec = load_experiment(ROOT / "configs/experiments/pd-crossover.yaml")
    return build_models(spec.model_copy(update={"workload": spec.workload.model_copy(update={"trajectories_per_batch": batch})})).predictor


def _loads(p: RolloutPredictor, n_p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, S, b) per turn as the docstring defines them: an instance's prefill work, one request's
    prefill, the turn without queueing (tool wait + own prefill + KV send + decode at concurrency 1)."""
    s = p.shape
    eng = p.prefill_engine
    m = s.active / n_p
    fresh, cached = s.prefill_engine_tokens()
    new, prefix = p._pressured(eng, np.maximum(m, 1.0), fresh, cached, fresh + cached)
    a = eng.prefill_work(m * new, np.maximum(m, 1.0), m * prefix)
    own = eng.prefill_work(fresh, 1.0, cached)
    b = s.env_s + own + p._kv_send_s(fresh, eng) + s.response_tokens * p._tau(p.decode_engine, np.ones(1))
    return np.asarray(a), np.asarray(own), np.asarray(b)


def _first_turn_wait(p: RolloutPredictor, n_p: int) -> float:
    """Turn 0 (everyone starts at once): a request leaves with the step holding its last token,
    so over the batch's `steps` steps of s_1 seconds each it waits s_1 (steps + 1) / 2 - S on average."""
    a, own, _ = _loads(p, n_p)
    fresh, cached = p.shape.prefill_engine_tokens()
    m = p.shape.active[0] / n_p
    new, _ = p._pressured(p.prefill_engine, np.maximum(m, 1.0), fresh, cached, fresh + cached)
    steps = max(m * new[0] / p.prefill_engine.step_token_budget(), 1.0)
    step = float(a[0]) / steps
    return max(step * (steps + 1.0) / 2.0 - own[0], 0.0)


def test_queue_is_positive_falls_with_prefill_instances_and_vanishes_when_lightly_loaded() -> None:
    p = crossover(256)
    q = p.prefill_queue_many(N)
    assert np.all(q > 0.0) and np.all(np.diff(q) < 0.0), q
    assert q[0] > 30.0  # one instance for 256 trajectories is near saturation (utilisation ~1 per turn)
    t_d, _ = p.decode_path_many(N)
    assert q[-1] < 1e-3 * t_d.min()  # 64 instances for 256 trajectories: nearly nothing to wait for


def test_queue_never_exceeds_the_open_loop_md1_wait() -> None:
    """Arrivals from a closed loop slow down as they queue, so the wait is at most the M/D/1 wait
    at the unqueued arrival rate, rho = a / b, wherever every turn has rho < 1."""
    p = crossover(256)
    checked = 0
    for n_p in range(1, 17):
        a, own, b = _loads(p, n_p)
        rho = a[1:] / b[1:]
        if rho.max() >= 1.0:
            continue
        bound = _first_turn_wait(p, n_p) + float(np.sum(rho * own[1:] / (2.0 * (1.0 - rho))))
        assert p.prefill_queue_many(np.array([n_p]))[0] <= bound * (1 + RTOL), n_p
        checked += 1
    assert checked >= 10


def test_saturated_instances_hold_the_queue_at_its_knee() -> None:
    """Past saturation the instance's extra cycle is the prefill path's: T_P grows with the load,
    the queue does not grow past the rho = 1 wait sqrt(b S / 2) per turn (+ the first turn's)."""
    p = crossover(4096)
    a, own, b = _loads(p, 1)
    assert np.sum(a[1:] > b[1:]) > 20  # most turns are saturated
    knee = _first_turn_wait(p, 1) + float(np.sum(np.sqrt(np.minimum(a[1:], b[1:]) * own[1:] / 2.0)))
    q = float(p.prefill_queue_many(np.array([1]))[0])
    assert q <= knee * (1 + RTOL)
    assert q < 0.05 * float(p.prefill_path_many(np.array([1]))[0])


def test_one_turn_batches_wait_for_their_place_in_the_chunked_line() -> None:
    """Turn 0 starts in lockstep: a batch chunked into many steps leaves step by step (the
    critical trajectory waits about half the line); one that fits a step leaves with it."""
    spec = load_experiment(ROOT / "configs/experiments/pd-crossover.yaml")
    w: WorkloadSpec = spec.workload.model_copy(update={"trajectories_per_batch": 512, "turns": spec.workload.turns.model_copy(update={"kind": "constant", "mean": 1.0, "cv": 0.0, "min": 1.0})})
    p = build_models(spec.model_copy(update={"workload": w})).predictor
    assert p.shape.turns == 1
    for n_p in (1, 2, 8, 512):
        a, own, _ = _loads(p, n_p)
        q = p.prefill_queue_many(np.array([n_p]))[0]
        assert q == pytest.approx(_first_turn_wait(p, n_p))
        assert max(a[0] / 2.0 - own[0], 0.0) <= q
    a, own, _ = _loads(p, 1)  # 512 prompts on one instance: a line of many steps, each a little dearer than its share of one
    assert (a[0] - own[0]) / 2.0 < p.prefill_queue_many(np.array([1]))[0] < 0.7 * (a[0] - own[0])


def test_a_constant_workload_stays_in_lockstep_at_every_turn() -> None:
    """With no spread in tool time or tokens the trajectories return together: every turn's
    batch that fits one step is prefilled at once, so each waits the whole batch beyond its own
    (the open-loop M/D/1 wait would be far smaller); a spread in tool time releases it."""
    spec = load_experiment(ROOT / "configs/experiments/cpu-tiny.yaml")
    w: WorkloadSpec = spec.workload.model_copy(update={"trajectories_per_batch": 16})
    p = build_models(spec.model_copy(update={"workload": w})).predictor
    assert p.shape.turns == 3 and p.shape.env_var_s2 < 1e-20
    a, own, _ = _loads(p, 1)
    assert p.prefill_queue_many(np.array([1]))[0] == pytest.approx(float(np.sum(a - own)))
    spread = w.model_copy(update={"env_latency_s": w.env_latency_s.model_copy(update={"kind": "lognormal", "cv": 1.0})})
    q = build_models(spec.model_copy(update={"workload": spread})).predictor.prefill_queue_many(np.array([1]))[0]
    assert q < 0.5 * float(np.sum(a - own))


def test_disaggregated_completion_adds_the_queue_to_the_slower_path() -> None:
    p = crossover(256)
    for n_p in range(1, 8):
        d = p.disaggregated(n_p, 8 - n_p)
        assert d.prefill_queue_s == pytest.approx(float(p.prefill_queue_many(np.array([n_p]))[0]))
        assert d.completion_s == pytest.approx(max(d.prefill_path_s, d.decode_path_s) + d.prefill_queue_s)
    best = p.best_disaggregated(8)
    assert best.completion_s == pytest.approx(min(p.disaggregated(k, 8 - k).completion_s for k in range(1, 8)), rel=RTOL)
    n_p = np.arange(1, 8)
    assert best.prefill == best_split(p.prefill_path_many(n_p), p.decode_path_many(8 - n_p)[0], p.prefill_queue_many(n_p))


@SETTINGS
@given(models_, tps, workloads())
def test_more_prefill_instances_never_lengthen_the_queue(model: str, tp: int, w: WorkloadSpec) -> None:
    q = predictor(model, tp, w).prefill_queue_many(N)
    assert np.all(q >= 0.0) and non_increasing(q), q


@SETTINGS
@given(models_, tps, workloads(), st.integers(1, 32))
def test_more_prefill_instances_never_slow_the_disaggregated_batch(model: str, tp: int, w: WorkloadSpec, n_d: int) -> None:
    p = predictor(model, tp, w)
    t = np.array([p.disaggregated(int(k), n_d).completion_s for k in (1, 2, 3, 5, 8, 13)])
    assert non_increasing(t), t
