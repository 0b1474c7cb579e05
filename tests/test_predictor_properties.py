"""Property tests: predictions move the way physics says when one input moves.

More instances of a role never slow that role's path; longer tool latency and more
trajectories never make a batch finish sooner. Workloads, models and batch sizes are drawn
by hypothesis over the ranges agentic RL sees.
"""

from __future__ import annotations

import math

from dataclasses import replace
from functools import lru_cache

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from models.config import CONFIG_ROOT, Distribution, WorkloadSpec, load_hardware, load_llms
from models.predictor import RolloutPredictor, batch_shape
from models.step_latency import StepLatencyModel, load_profile

RTOL = 1e-6  # the per-turn fixed point is iterated, not solved in closed form
# Disaggregated batches add the prefill queue, priced from each turn's unqueued cycle so that it
# depends on N_P alone: where the decode side is saturated a longer tool wait or a longer turn
# lengthens that cycle and lowers the queue's utilisation while the path hardly moves; and in a
# constant workload (lockstep) a request whose own prefill outgrows one engine step (prefix
# reuse lost) stops queueing behind the others' while its path grows by less. Both are
# approximations of the queue, not of the paths: measured at most 0.11% of the completion in
# the generated cases (the planner's choices differ by more than that where they differ).
QUEUE_RTOL = 5e-3
N = np.arange(1, 65)


@lru_cache(maxsize=None)
def engine(model: str, tp: int) -> StepLatencyModel:
    llm = load_llms().models[model]
    return StepLatencyModel(llm, load_hardware().gpus["H800"], tp, load_profile(CONFIG_ROOT / "profiles" / f"h800-{model}.json"))


def predictor(model: str, tp: int, workload: WorkloadSpec, batch: int | None = None, env_scale: float = 1.0) -> RolloutPredictor:
    eng = engine(model, tp)
    return RolloutPredictor(batch_shape(workload, batch, env_scale), eng, eng, eng, kv_link_gb_s=100.0 * tp)


@st.composite
def workloads(draw: st.DrawFn) -> WorkloadSpec:
    def dist(lo: float, hi: float, mean_hi: float) -> Distribution:
        mean = draw(st.floats(lo, mean_hi))
        kind = draw(st.sampled_from(["constant", "lognormal"]))
        return Distribution(kind=kind, mean=mean, cv=draw(st.floats(0.0, 1.2)) if kind != "constant" else 0.0, min=lo, max=hi)

    prompt, response = dist(16, 16000, 6000), dist(1, 4096, 1500)
    return WorkloadSpec(
        trajectories_per_batch=draw(st.integers(1, 256)),
        turns=dist(1, 60, 40),
        initial_prompt_tokens=prompt,
        new_tokens_per_turn=dist(1, 8000, 3000),
        response_tokens_per_turn=response,
        env_latency_s=dist(0, 120, 20),
        # a budget below the first turn is refused (models/config.py)
        max_trajectory_tokens=max(draw(st.sampled_from([4096, 16384, 32768])), math.ceil(prompt.expected() + response.expected())),
        prefix_cache_hit=draw(st.sampled_from([0.0, 0.28, 1.0])),
    )


models_ = st.sampled_from(["qwen3-8b", "qwen3-30b-a3b"])
tps = st.sampled_from([1, 2, 4])
SETTINGS = settings(max_examples=50, deadline=None)


def non_increasing(t: np.ndarray) -> bool:
    return bool(np.all(t[1:] <= t[:-1] * (1 + RTOL)))


@SETTINGS
@given(models_, tps, workloads())
def test_more_decode_instances_never_slow_decode(model: str, tp: int, w: WorkloadSpec) -> None:
    t, _ = predictor(model, tp, w).decode_path_many(N)
    assert non_increasing(t), t


@SETTINGS
@given(models_, tps, workloads())
def test_more_prefill_instances_never_slow_prefill(model: str, tp: int, w: WorkloadSpec) -> None:
    assert non_increasing(predictor(model, tp, w).prefill_path_many(N))


@SETTINGS
@given(models_, tps, workloads())
def test_more_colocated_instances_never_slow_colocation(model: str, tp: int, w: WorkloadSpec) -> None:
    t, _ = predictor(model, tp, w).colocated_many(N)
    assert non_increasing(t), t


@SETTINGS
@given(models_, tps, workloads(), st.floats(1.0, 10.0), st.integers(1, 32), st.integers(2, 32))
def test_longer_tool_latency_never_speeds_the_batch(model: str, tp: int, w: WorkloadSpec, factor: float, n: int, total: int) -> None:
    fast, slow = predictor(model, tp, w), predictor(model, tp, w, env_scale=factor)
    assert slow.colocated(n).completion_s >= fast.colocated(n).completion_s * (1 - RTOL)
    n_p = max(1, total // 3)
    assert slow.disaggregated(n_p, total - n_p).completion_s >= fast.disaggregated(n_p, total - n_p).completion_s * (1 - QUEUE_RTOL)
    assert slow.best_disaggregated(total).completion_s >= fast.best_disaggregated(total).completion_s * (1 - QUEUE_RTOL)


@SETTINGS
@given(models_, tps, workloads(), st.integers(1, 200), st.integers(1, 64), st.integers(1, 32), st.integers(2, 32))
def test_more_trajectories_never_finish_sooner(model: str, tp: int, w: WorkloadSpec, batch: int, extra: int, n: int, total: int) -> None:
    small, big = predictor(model, tp, w, batch), predictor(model, tp, w, batch + extra)
    assert big.colocated(n).completion_s >= small.colocated(n).completion_s * (1 - RTOL)
    n_p = max(1, total // 3)
    assert big.disaggregated(n_p, total - n_p).completion_s >= small.disaggregated(n_p, total - n_p).completion_s * (1 - QUEUE_RTOL)
    assert big.best_disaggregated(total).completion_s >= small.best_disaggregated(total).completion_s * (1 - QUEUE_RTOL)


@SETTINGS
@given(models_, tps, workloads(), st.integers(1, 32), st.integers(2, 32))
def test_losing_prefix_reuse_never_speeds_the_batch(model: str, tp: int, w: WorkloadSpec, n: int, total: int) -> None:
    reuse, no_reuse = (predictor(model, tp, w.model_copy(update={"prefix_cache_hit": h})) for h in (1.0, 0.0))
    assert no_reuse.colocated(n).completion_s >= reuse.colocated(n).completion_s * (1 - RTOL)
    assert no_reuse.best_disaggregated(total).completion_s >= reuse.best_disaggregated(total).completion_s * (1 - QUEUE_RTOL)


def tailed(p: RolloutPredictor) -> RolloutPredictor:
    """The same predictor, predicting the batch's last finisher (`predictor.wait_tail`)."""
    return replace(p, wait_tail=True, _cache={})


@SETTINGS
@given(models_, tps, workloads())
def test_the_last_finisher_keeps_more_instances_never_slower_and_is_never_sooner(model: str, tp: int, w: WorkloadSpec) -> None:
    plain = predictor(model, tp, w)
    tail = tailed(plain)
    for table in ("colocated_many", "decode_path_many"):
        t = getattr(tail, table)(N)[0]
        assert non_increasing(t), (table, t)
        assert np.all(t >= getattr(plain, table)(N)[0] * (1 - RTOL)), table


def _constant(mean: float, lo: float, hi: float) -> Distribution:
    return Distribution(kind="constant", mean=mean, cv=0.0, min=lo, max=hi)


# found by this test: 4 prompts of 2,049 tokens need a second engine step where 3 fit one, and a
# whole-step count for the prefill line halved its mean wait, so the fourth trajectory made the batch sooner
LINE_SPLIT = WorkloadSpec(trajectories_per_batch=1, group_size=1, turns=_constant(2.0, 1, 60), initial_prompt_tokens=_constant(2049.0, 16, 16000),
                          new_tokens_per_turn=_constant(1.0, 1, 8000), response_tokens_per_turn=_constant(1.0, 1, 4096),
                          env_latency_s=_constant(1.0, 0, 120), max_trajectory_tokens=4096, prefix_cache_hit=0.0)


@SETTINGS
@given(models_, tps, workloads(), st.floats(1.0, 10.0), st.integers(1, 200), st.integers(1, 64), st.integers(1, 32), st.integers(2, 32))
@example("qwen3-8b", 1, LINE_SPLIT, 1.0, 3, 1, 1, 2)
def test_the_last_finisher_never_comes_sooner_with_longer_waits_or_more_trajectories(model: str, tp: int, w: WorkloadSpec, factor: float, batch: int,
                                                                                   extra: int, n: int, total: int) -> None:
    base = tailed(predictor(model, tp, w, batch))
    for more in (tailed(predictor(model, tp, w, batch, env_scale=factor)), tailed(predictor(model, tp, w, batch + extra))):
        assert more.colocated(n).completion_s >= base.colocated(n).completion_s * (1 - RTOL)
        n_p = max(1, total // 3)
        assert more.disaggregated(n_p, total - n_p).completion_s >= base.disaggregated(n_p, total - n_p).completion_s * (1 - QUEUE_RTOL)
