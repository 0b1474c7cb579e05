"""Everything a planning step needs besides the state: prediction tables, costs, solver settings.

Built once per predictor (i.e. once per refit), not per decision: tabulating 2048 instance
counts costs ~80 ms, solving must cost less. Pure: `planning_inputs` only calls the
predictor's vectorised numpy functions.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field

import numpy as np

from models import architecture as arch
from models.builder import ExperimentModels
from models.config import CostWeights, SolverSpec

MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True)
class RoleTable:
    """Predicted seconds with k instances of one role, k = 0..max (index 0 unused: inf)."""

    role: str
    tp: int
    seconds: np.ndarray = field(compare=False)
    improving: tuple[tuple[int, int], ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "improving", improving_entries(self.seconds))

    @property
    def max_instances(self) -> int:
        return int(self.seconds.shape[0]) - 1

    def envelope(self, k: int) -> float:
        """Completion with k instances when extra ones may idle: min over 1..k (inf at 0)."""
        if k < 1:
            return float("inf")
        k = min(k, self.max_instances)
        return float(np.min(self.seconds[1 : k + 1]))


def improving_entries(seconds: np.ndarray) -> tuple[tuple[int, int], ...]:
    """(k, t_ms) entries of the running-minimum table that strictly improve, plus (0, 0).

    An entry that is no faster than one with fewer instances is dominated: the solver may
    always idle the extra instances, so it never needs to select it. Computed once per table
    (a value of the table, not a cache), milliseconds as the integer program counts them.
    """
    out: list[tuple[int, int]] = [(0, 0)]
    best = math.inf
    for k in range(1, seconds.shape[0]):
        t = float(seconds[k])
        if not math.isfinite(t):
            continue
        tm = int(round(t * 1000.0))
        if tm < best:
            best = tm
            out.append((k, tm))
    return tuple(out)


@dataclass(frozen=True)
class ActionCosts:
    """Seconds one instance-level action blocks its GPUs (from models.transition + config)."""

    start_s: dict[str, float]  # per pool: rollout engine start, elastic finalize (+ weighted prepare), training lend+return
    stop_s: float
    switch_s: float
    lend_s: float
    return_s: float
    engine_start_s: float
    weight_load_s: float


@dataclass(frozen=True)
class MemoryModel:
    """Weights + KV: which groups can host a role (KV pressure itself is priced by the predictor)."""

    weight_bytes: float
    kv_bytes_per_token: float
    gpu_memory_gib: dict[str, float]
    max_seq_tokens: float  # one trajectory at the token budget: an engine must hold at least this (vLLM's start check)

    def kv_capacity_tokens(self, gpu_type: str, tp: int) -> float:
        free = self.gpu_memory_gib[gpu_type] * 2**30 * tp * MEMORY_UTILIZATION - self.weight_bytes
        return max(free, 0.0) / self.kv_bytes_per_token

    def fits(self, gpu_type: str, tp: int) -> bool:
        return self.kv_capacity_tokens(gpu_type, tp) >= self.max_seq_tokens


@dataclass(frozen=True)
class SolverSettings:
    backend: str = "cbc"
    time_limit_s: float = 1.0
    workers: int = 8
    seed: int = 0


@dataclass(frozen=True)
class PlanningInputs:
    colocated: RoleTable
    prefill: RoleTable
    decode: RoleTable
    costs: ActionCosts
    memory: MemoryModel
    weights: CostWeights
    solver: SolverSettings
    batch: int

    def table(self, role: str) -> RoleTable:
        return {"colocated": self.colocated, "prefill": self.prefill, "decode": self.decode}[role]

    def tp(self, role: str) -> int:
        return self.table(role).tp


def planning_inputs(models: ExperimentModels, max_gpus: int, weights: CostWeights | None = None, solver: SolverSpec | None = None) -> PlanningInputs:
    """Tabulate the predictor for up to `max_gpus` GPUs per role and collect costs."""
    spec = models.spec
    p = models.predictor

    def tab(role: str, tp: int) -> RoleTable:
        n = np.arange(1, max(max_gpus // tp, 1) + 1)
        if role == "colocated":
            t = p.colocated_many(n)[0]
        elif role == "prefill":
            t = p.prefill_path_many(n)
        else:
            t = p.decode_path_many(n)[0]
        return RoleTable(role, tp, np.concatenate([[np.inf], np.asarray(t, dtype=float)]))

    c = models.costs
    w = weights or spec.costs
    start = {
        "rollout": c.engine_start_s,
        "elastic": c.expand_finalize_s + w.background_weight * c.expand_prepare_s,
        "training": c.borrow_s + c.return_s,
    }
    costs = ActionCosts(start, c.drain_s, c.role_switch_s, c.borrow_s, c.return_s, c.engine_start_s, c.weight_load_storage_s)
    memory = MemoryModel(
        weight_bytes=arch.weight_bytes(spec.model),
        kv_bytes_per_token=float(arch.kv_bytes_per_token(spec.model)),
        gpu_memory_gib={name: g.memory_gib for name, g in spec.hardware.gpus.items()},
        max_seq_tokens=float(spec.workload.max_trajectory_tokens),
    )
    sv = solver or spec.solver
    settings = SolverSettings(sv.backend, sv.time_limit_s, sv.workers, spec.seed)
    return PlanningInputs(tab("colocated", models.tp_colocated), tab("prefill", models.tp_prefill), tab("decode", models.tp_decode), costs, memory, w, settings, p.shape.batch)
