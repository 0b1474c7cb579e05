"""Unit tests of the physical formulas against architecture facts (DESIGN.md reference numbers)."""

from __future__ import annotations

import numpy as np
import pytest

from models import architecture as arch
from models.config import ClusterSpec, Distribution, NodeGroup, TransitionCostsSpec, WorkloadSpec, load_hardware, load_llms
from models.predictor import batch_shape
from models.step_latency import FEATURES, StepLatencyModel, StepShape, load_profile, step_features
from models.training import training_step_s
from models.transition import transition_costs
from models.config import CONFIG_ROOT

LLMS = load_llms().models
GPUS = load_hardware().gpus
Q8, Q30 = LLMS["qwen3-8b"], LLMS["qwen3-30b-a3b"]
H800 = GPUS["H800"]


def engine(model: str = "qwen3-30b-a3b", tp: int = 2) -> StepLatencyModel:
    return StepLatencyModel(LLMS[model], H800, tp, load_profile(CONFIG_ROOT / "profiles" / f"h800-{model}.json"))


# ----------------------------------------------------------------------------- architecture
def test_kv_bytes_per_token_bf16() -> None:
    assert arch.kv_bytes_per_token(Q8) == 147_456 == 144 * 1024
    assert arch.kv_bytes_per_token(Q30) == 98_304 == 96 * 1024


def test_qwen3_8b_matmul_params_are_total_minus_embeddings() -> None:
    # Qwen3-8B has untied input embedding and LM head: 8.19 B - 2 * vocab * hidden.
    expected = Q8.params_b * 1e9 - 2 * arch.embedding_params(Q8)
    assert arch.active_params_per_token(Q8) == pytest.approx(expected, rel=0.01)


def test_qwen3_30b_a3b_active_and_total_params() -> None:
    active = arch.active_params_per_token(Q30) + 2 * arch.embedding_params(Q30)
    assert active == pytest.approx(3.35e9, rel=0.03)
    total = arch.attention_params(Q30) + Q30.moe.experts * arch.expert_params(Q30) + 2 * arch.embedding_params(Q30)
    assert total == pytest.approx(30.5e9, rel=0.02)
    # MoE decode: one token reads far fewer weights than the whole model, a full batch nearly all.
    assert arch.weight_bytes_read(Q30, 1.0) < 0.25 * arch.weight_bytes(Q30)
    assert arch.weight_bytes_read(Q30, 4096.0) == pytest.approx(arch.weight_bytes(Q30), rel=0.03)


def test_experts_touched_grows_and_saturates() -> None:
    assert float(arch.experts_touched(Q30, 1.0)) == pytest.approx(8.0)
    n = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 8192], dtype=float)
    e = arch.experts_touched(Q30, n)
    assert np.all(np.diff(e[:8]) > 0) and np.all(np.diff(e) >= 0)
    assert np.all(e <= 128.0)
    assert e[-1] == pytest.approx(128.0, abs=1e-6)
    assert 8.0 < e[1] < 16.0  # two tokens share some experts
    assert np.all(arch.experts_touched(Q8, n) == 0)  # dense model: no experts


def test_tp_allreduce_bytes() -> None:
    assert float(arch.tp_allreduce_bytes(Q8, 128.0, 1)) == 0.0
    b2, b4 = float(arch.tp_allreduce_bytes(Q8, 128.0, 2)), float(arch.tp_allreduce_bytes(Q8, 128.0, 4))
    assert b2 > 0 and b4 == pytest.approx(b2 * 1.5)  # ring: 2(tp-1)/tp
    assert float(arch.tp_allreduce_bytes(Q8, 256.0, 2)) == pytest.approx(2 * b2)
    feats = step_features(StepShape(decode_seqs=8.0, decode_context_tokens=8000.0), Q8, H800, 1)
    assert feats[FEATURES.index("comm")] == 0.0


def test_matmul_flops_are_two_per_param_per_token() -> None:
    f = float(arch.matmul_flops(Q8, 1000.0, 0.0))
    assert f == pytest.approx(2 * arch.active_params_per_token(Q8) * 1000)
    assert float(arch.matmul_flops(Q8, 1000.0, 1.0)) - f == pytest.approx(2 * Q8.hidden * Q8.vocab)


# ----------------------------------------------------------------------------- step latency
def test_decode_step_grows_with_batch_and_context() -> None:
    eng = engine()
    seqs = np.array([1, 2, 4, 8, 16, 32, 64, 128], dtype=float)
    t = eng.decode_time(seqs, 4096.0)
    assert np.all(np.diff(t) > 0)
    ctx = np.array([512, 2048, 8192, 32768], dtype=float)
    t_ctx = eng.decode_time(16.0, ctx)
    assert np.all(np.diff(t_ctx) > 0)
    # Per-token cost falls with batch (weights are read once per step).
    assert t[-1] / seqs[-1] < t[0]


def test_prefill_grows_with_tokens_and_prefix() -> None:
    eng = engine("qwen3-8b")
    t = eng.prefill_time(np.array([128, 1024, 8192], dtype=float))
    assert np.all(np.diff(t) > 0)
    t_prefix = eng.prefill_time(1024.0, 1.0, np.array([0, 8192, 32768], dtype=float))
    assert np.all(np.diff(t_prefix) > 0)


def test_kv_capacity_more_than_doubles_with_tp() -> None:
    one, two = engine(tp=1).kv_capacity_tokens(), engine(tp=2).kv_capacity_tokens()
    assert one > 0 and two > 2 * one
    expected = (2 * 80 * 2**30 * 0.9 - arch.weight_bytes(Q30)) / 98_304
    assert two == pytest.approx(expected)


# ----------------------------------------------------------------------------- workload shape
def test_distribution_quantiles_and_clipping() -> None:
    assert Distribution(kind="constant", mean=7).expected() == pytest.approx(7)
    assert Distribution(kind="uniform", min=2, max=6).expected() == pytest.approx(4, rel=1e-3)
    d = Distribution(kind="lognormal", mean=20, cv=0.5, min=3, max=50)
    qs = [d.quantile(q) for q in (0.0, 0.1, 0.5, 0.9, 1.0)]
    assert qs == sorted(qs) and qs[0] >= 3 and qs[-1] <= 50
    assert Distribution(kind="exponential", mean=4).expected() == pytest.approx(4, rel=0.1)


def test_batch_shape_tail_and_context_cap() -> None:
    from models.config import load_experiment

    spec = load_experiment(CONFIG_ROOT / "experiments" / "pd-crossover.yaml")
    s = batch_shape(spec.workload, 64)
    assert s.active[0] == 64 and s.active[-1] >= 1
    assert np.all(np.diff(s.active) <= 0)  # the long tail: trajectories finish, none join
    assert np.all(s.prefix_tokens <= spec.workload.max_trajectory_tokens)
    assert np.all(np.diff(s.prefix_tokens) >= 0)


def test_trajectories_end_at_the_token_budget() -> None:
    w = WorkloadSpec(
        trajectories_per_batch=4,
        turns=Distribution(kind="constant", mean=100),
        initial_prompt_tokens=Distribution(kind="constant", mean=1000),
        new_tokens_per_turn=Distribution(kind="constant", mean=700),
        response_tokens_per_turn=Distribution(kind="constant", mean=300),
        env_latency_s=Distribution(kind="constant", mean=1.0),
        max_trajectory_tokens=10_000,
    )
    s = batch_shape(w)
    # 1300 tokens after turn 1, then +1000 per turn: 9,300 after turn 9; turn 10 would cross
    # 10,000, so the rollout cuts the trajectory before it (the simulator's sampler, same rule)
    assert s.turns == 9
    assert s.prefix_tokens[-1] + s.new_tokens[-1] + s.response_tokens <= 10_000
    from runtime.sim.workload import TrajectorySampler

    assert {p.turns for p in TrajectorySampler(w, np.random.default_rng(0)).sample(4)} == {9}


def test_short_turns_outlast_the_mean_budget() -> None:
    """With random per-turn tokens, some trajectories fit more turns under the budget than
    the mean sizes allow: the batch's longest trajectory (its completion) grows with the spread
    and with the batch, as in the simulator's sampled batches."""
    base = dict(turns=Distribution(kind="constant", mean=60), initial_prompt_tokens=Distribution(kind="constant", mean=1000),
                response_tokens_per_turn=Distribution(kind="constant", mean=300), env_latency_s=Distribution(kind="constant", mean=1.0),
                max_trajectory_tokens=10_000)
    fixed = batch_shape(WorkloadSpec(trajectories_per_batch=64, new_tokens_per_turn=Distribution(kind="constant", mean=700), **base))
    spread = WorkloadSpec(trajectories_per_batch=64, new_tokens_per_turn=Distribution(kind="lognormal", mean=700, cv=1.0), **base)
    small, large = batch_shape(spread, 8), batch_shape(spread, 1024)
    assert fixed.turns == 9 and small.turns <= large.turns and large.turns > fixed.turns
    from runtime.sim.workload import TrajectorySampler

    drawn = max(p.turns for p in TrajectorySampler(spread, np.random.default_rng(1)).sample(1024))
    assert abs(drawn - large.turns) <= max(2, 0.15 * drawn), (drawn, large.turns)


def test_prefix_cache_hit_moves_context_into_prefill() -> None:
    from models.config import load_experiment

    w = load_experiment(CONFIG_ROOT / "experiments" / "pd-crossover.yaml").workload
    full, none = (batch_shape(w.model_copy(update={"prefix_cache_hit": h}), 64) for h in (1.0, 0.0))
    assert np.allclose(full.prefix_tokens + full.new_tokens, none.prefix_tokens + none.new_tokens)  # same context
    assert np.all(none.prefix_tokens == 0) and np.all(none.new_tokens >= full.new_tokens)


# ----------------------------------------------------------------------------- transitions
def _cluster() -> ClusterSpec:
    return ClusterSpec(nodes=[NodeGroup(count=2, gpus_per_node=8, gpu="H800", pool="rollout")], inter_node_gb_s=100, storage_gb_s=2)


def test_transition_costs_use_measured_values_when_configured() -> None:
    measured = TransitionCostsSpec(borrow_s=6.26, return_s=3.18, expand_prepare_s=56.29, expand_finalize_s=11.05, role_switch_s=30.0, engine_start_s=20.0)
    c = transition_costs(Q8, H800, _cluster(), 2, measured, training_gpus=16)
    assert (c.borrow_s, c.return_s, c.expand_prepare_s, c.expand_finalize_s, c.role_switch_s, c.engine_start_s) == (6.26, 3.18, 56.29, 11.05, 30.0, 20.0)


def test_transition_costs_from_physics_otherwise() -> None:
    c8 = transition_costs(Q8, H800, _cluster(), 2, TransitionCostsSpec(), training_gpus=16)
    c30 = transition_costs(Q30, H800, _cluster(), 2, TransitionCostsSpec(), training_gpus=16)
    # Weight load from storage: bytes / bandwidth.
    assert c8.weight_load_storage_s == pytest.approx(8.19e9 * 2 / 2e9)
    assert c30.weight_load_storage_s > c8.weight_load_storage_s
    # Lending moves more state than returning (rollout weights too); both grow with model size.
    assert 0 < c8.return_s < c8.borrow_s and c30.borrow_s > c8.borrow_s
    assert c8.role_switch_s > c8.engine_start_s  # a switch drains then restarts
    assert c8.expand_prepare_s > c8.engine_start_s
    assert c8.kv_migration_s_per_token == pytest.approx(147_456 / 100e9)
    # More training GPUs shard the trainer's state thinner: cheaper to offload.
    c8_small = transition_costs(Q8, H800, _cluster(), 2, TransitionCostsSpec(), training_gpus=4)
    assert c8_small.return_s > c8.return_s


# ----------------------------------------------------------------------------- training
def test_training_step_scales_inversely_with_gpus() -> None:
    overhead = 5.0
    t8 = training_step_s(Q8, H800, 8, 1e6, 0.35, overhead) - overhead
    t16 = training_step_s(Q8, H800, 16, 1e6, 0.35, overhead) - overhead
    assert t8 == pytest.approx(2 * t16)
    assert training_step_s(Q8, H800, 8, 2e6, 0.35, overhead) - overhead == pytest.approx(2 * t8)
    assert training_step_s(Q8, H800, 0, 1e6, 0.35, overhead) == float("inf")
    # 6 * params * tokens at the given MFU.
    flops = 6 * (arch.active_params_per_token(Q8) + Q8.hidden * Q8.vocab) * 1e6
    assert t8 == pytest.approx(flops / (8 * 989e12 * 0.35))
    # MoE trains on active parameters only: far cheaper per token than its total size suggests.
    assert training_step_s(Q30, H800, 8, 1e6, 0.35, 0.0) < 0.5 * training_step_s(Q8, H800, 8, 1e6, 0.35, 0.0)
