"""Everything a planning step needs besides the state: prediction tables, costs, solver settings.

Built once per predictor (i.e. once per refit), not per decision: tabulating 2048 instance
counts costs ~80 ms, solving must cost less. Pure: `planning_inputs` only calls the
predictor's vectorised numpy functions.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from models import architecture as arch
from models.builder import ExperimentModels
from models.config import CostWeights, ExperimentSpec, SolverSpec

MEMORY_UTILIZATION = 0.9


Entry = tuple[int, int, int]  # (k instances, t_ms path time, q_ms queueing added on top), milliseconds


@dataclass(frozen=True)
class RoleTable:
    """Predicted seconds with k instances of one role, k = 0..max (index 0 unused: inf).

    `queue` is what the role adds to the completion on top of the slower path (the prefill
    role's queueing, models/predictor.py: completion = max(T_P, T_D) + Q(N_P)); zeros if None.
    """

    role: str
    tp: int
    seconds: np.ndarray = field(compare=False)
    queue: np.ndarray | None = field(default=None, compare=False)
    gpu_type: str = ""  # the GPU type the table was built for ("": the experiment's one rollout type)
    improving: tuple[Entry, ...] = field(init=False, compare=False, repr=False)
    improving_rows: np.ndarray = field(init=False, compare=False, repr=False)  # the same entries with k > 0, as (n, 3) integers

    def __post_init__(self) -> None:
        if self.queue is None:
            object.__setattr__(self, "queue", np.zeros(self.seconds.shape[0]))
        object.__setattr__(self, "improving", improving_entries(self.seconds, self.queue))
        object.__setattr__(self, "improving_rows", np.array([e for e in self.improving if e[0] > 0], dtype=np.int64).reshape(-1, 3))

    @property
    def max_instances(self) -> int:
        return int(self.seconds.shape[0]) - 1

    def envelope(self, k: int) -> float:
        """Path time with k instances when extra ones may idle: min over 1..k (inf at 0); queue not included."""
        if k < 1:
            return float("inf")
        k = min(k, self.max_instances)
        return float(np.min(self.seconds[1 : k + 1]))


def pareto_entries(rows: Iterable[Entry]) -> tuple[Entry, ...]:
    """The rows (in order of k, (0, ...) first and always kept) that no earlier kept row dominates.

    A row is dominated by one with fewer instances that is no slower (t) and queues no longer
    (q): the solver may always idle the extra instances, so it never needs to select it. With
    q = 0 throughout this keeps exactly the strictly improving running minimum of t. The kept
    rows' (t, q) staircase (t ascending, q descending) answers each test by bisection.
    """
    out: list[Entry] = []
    front_t: list[int] = []
    front_q: list[int] = []
    for k, t, q in rows:
        if k == 0:
            out.append((k, t, q))
            continue
        i = bisect_right(front_t, t)  # front[:i]: kept rows no slower; the last queues least of them
        if i and front_q[i - 1] <= q:
            continue
        out.append((k, t, q))
        j = i
        while j < len(front_t) and front_q[j] >= q:  # slower rows that queue no less: dominated from now on
            j += 1
        front_t[i:j], front_q[i:j] = [t], [q]
    return tuple(out)


def improving_entries(seconds: np.ndarray, queue: np.ndarray | None = None) -> tuple[Entry, ...]:
    """(k, t_ms, q_ms) entries of the table that no entry with fewer instances dominates, plus (0, 0, 0).

    Computed once per table (a value of the table, not a cache), milliseconds as the integer
    program counts them. Without a queue these are the strictly improving running minima.
    """
    q = np.zeros(seconds.shape[0]) if queue is None else queue
    rows: list[Entry] = [(0, 0, 0)]
    for k in range(1, seconds.shape[0]):
        t, w = float(seconds[k]), float(q[k])
        if math.isfinite(t) and math.isfinite(w):
            rows.append((k, int(round(t * 1000.0)), int(round(w * 1000.0))))
    return pareto_entries(rows)


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
    relative_gap: float = 0.0  # "optimal" is proven within this share of the objective (0: exact)
    exact_backend: str | None = "cpsat"  # the mixed search's exact-units programs (None: `backend`)
    slot_pricing: bool = True  # plain-slot single-type programs priced directly (planner/uniform.py), not on `backend`


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
    # mixed layouts: one table per (role, GPU type, TP degree) the cluster allows; empty for a
    # single type and one TP degree per role (then the three tables above are the program's)
    variants: tuple[RoleTable, ...] = ()

    @property
    def mixed(self) -> bool:
        return bool(self.variants)

    def table(self, role: str) -> RoleTable:
        return {"colocated": self.colocated, "prefill": self.prefill, "decode": self.decode}[role]

    def tp(self, role: str) -> int:
        return self.table(role).tp


def memory_model(spec: ExperimentSpec) -> MemoryModel:
    """The config's weights, KV per token and GPU memory: where an instance of a degree fits."""
    return MemoryModel(
        weight_bytes=arch.weight_bytes(spec.model),
        kv_bytes_per_token=float(arch.kv_bytes_per_token(spec.model)),
        gpu_memory_gib={name: g.memory_gib for name, g in spec.hardware.gpus.items()},
        max_seq_tokens=float(spec.workload.max_trajectory_tokens),
    )


def planning_inputs(models: ExperimentModels, max_gpus: int, weights: CostWeights | None = None, solver: SolverSpec | None = None) -> PlanningInputs:
    """Tabulate the predictor for up to `max_gpus` GPUs per role and collect costs."""
    spec = models.spec
    p = models.predictor

    def tab(role: str, tp: int, p=p, gpu_type: str = "") -> RoleTable:
        n = np.arange(1, max(max_gpus // tp, 1) + 1)
        queue = None
        if role == "colocated":
            t = p.colocated_many(n)[0]
        elif role == "prefill":
            t = p.prefill_path_many(n)
            queue = np.concatenate([[0.0], p.prefill_queue_many(n)])  # priced on the prefill role: separable
        else:
            t = p.decode_path_many(n)[0]
        return RoleTable(role, tp, np.concatenate([[np.inf], np.asarray(t, dtype=float)]), queue, gpu_type)

    c = models.costs
    w = weights or spec.costs
    start = {
        "rollout": c.engine_start_s,
        "elastic": c.expand_finalize_s + w.background_weight * c.expand_prepare_s,
        "training": c.borrow_s + c.return_s,
    }
    costs = ActionCosts(start, c.drain_s, c.role_switch_s, c.borrow_s, c.return_s, c.engine_start_s, c.weight_load_storage_s)
    memory = memory_model(spec)
    sv = solver or spec.solver
    settings = SolverSettings(sv.backend, sv.time_limit_s, sv.workers, spec.seed, sv.relative_gap, sv.exact_backend, sv.slot_pricing)
    degrees = spec.cluster.tp
    variants = tuple(tab(role, t, pred, typ) for typ, t, pred in models.variants for role in ("colocated", "prefill", "decode")
                     if t in getattr(degrees, role))
    return PlanningInputs(tab("colocated", models.tp_colocated), tab("prefill", models.tp_prefill), tab("decode", models.tp_decode), costs, memory, w, settings,
                          p.shape.batch, variants)
