"""The cluster as the planner sees it: every GPU, every rollout worker, the trainer's phase.

Values only. Invariants are checked when a `ClusterState` is built, so a plan can never be
computed from an impossible state (a GPU in two workers, a TP group across nodes, a worker
on a preempted GPU, a training GPU serving rollout without being lent).

The integer program does not look at single GPUs: GPUs on the same node, in the same pool
and of the same type are interchangeable, so `groups()` folds them into counts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Literal

PoolName = Literal["training", "rollout", "elastic"]
Role = Literal["colocated", "prefill", "decode"]
ROLES: tuple[Role, ...] = ("colocated", "prefill", "decode")
POOLS: tuple[PoolName, ...] = ("training", "rollout", "elastic")


class StateError(ValueError):
    """A ClusterState that violates an invariant (a bug in whoever built it)."""


@dataclass(frozen=True)
class GPU:
    id: str
    node: str
    type: str
    pool: PoolName
    available: bool = True  # False: preempted / absent; it can hold nothing
    preempt_notice: bool = False  # still up, but going away: plan as if gone
    borrowed: bool = False  # a training GPU currently lent to rollout

    @property
    def usable(self) -> bool:
        """Can the next plan put an engine here (training GPUs additionally need a lend)."""
        return self.available and not self.preempt_notice


@dataclass(frozen=True)
class Worker:
    """One engine instance (a TP group) bound to fixed GPUs; only its role changes."""

    id: str
    role: Role
    gpus: tuple[str, ...]
    tp: int
    weight_version: int = 0
    draining: bool = False


@dataclass(frozen=True)
class TrainerPhase:
    phase: Literal["training", "waiting"]
    next_needs_gpus_at_s: float  # absolute time (s) when the trainer wants its GPUs back


@dataclass(frozen=True)
class GPUGroup:
    """Interchangeable GPUs: one node, one pool, one type."""

    node: str
    pool: PoolName
    type: str
    gpu_ids: tuple[str, ...]  # every GPU of the group, usable or not
    usable: int  # available and without a preemption notice

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.node, self.pool, self.type)


@dataclass(frozen=True)
class ClusterState:
    gpus: tuple[GPU, ...]
    workers: tuple[Worker, ...] = ()
    trainer: TrainerPhase = TrainerPhase("training", 0.0)
    weight_version: int = 0  # the newest policy weights rollout should serve
    unfinished_fraction: float = 1.0  # R/B: share of the current batch still running (Eq. 7)
    # derived from the fields above once, at construction (values, not caches; never state)
    _gpu_index: dict[str, GPU] = field(default_factory=dict, init=False, compare=False, hash=False, repr=False)
    _owner: dict[str, str] = field(default_factory=dict, init=False, compare=False, hash=False, repr=False)
    _groups: tuple[GPUGroup, ...] = field(default=(), init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        index: dict[str, GPU] = {}
        for g in self.gpus:
            if g.id in index:
                raise StateError(f"GPU id {g.id!r} appears twice")
            if g.borrowed and g.pool != "training":
                raise StateError(f"GPU {g.id} is marked borrowed but is in pool {g.pool!r}; only training GPUs are lent")
            index[g.id] = g
        object.__setattr__(self, "_gpu_index", index)
        if not 0.0 <= self.unfinished_fraction <= 1.0:
            raise StateError(f"unfinished_fraction {self.unfinished_fraction} is outside [0, 1]")
        owner: dict[str, str] = {}
        ids: set[str] = set()
        for w in self.workers:
            if w.id in ids:
                raise StateError(f"worker id {w.id!r} appears twice")
            ids.add(w.id)
            if len(w.gpus) != w.tp or w.tp < 1:
                raise StateError(f"worker {w.id} has TP {w.tp} but {len(w.gpus)} GPUs")
            nodes = set()
            for gid in w.gpus:
                g = index.get(gid)
                if g is None:
                    raise StateError(f"worker {w.id} uses unknown GPU {gid!r}")
                if gid in owner:
                    raise StateError(f"GPU {gid} belongs to workers {owner[gid]} and {w.id}")
                if not g.available:
                    raise StateError(f"worker {w.id} holds unavailable GPU {gid}")
                if g.pool == "training" and not g.borrowed:
                    raise StateError(f"worker {w.id} runs on training GPU {gid} that is not lent")
                owner[gid] = w.id
                nodes.add(g.node)
            if len(nodes) > 1:
                raise StateError(f"worker {w.id} (TP{w.tp}) spans nodes {sorted(nodes)}; TP stays inside a node")
        object.__setattr__(self, "_owner", owner)
        members: dict[tuple[str, str, str], list[GPU]] = {}
        for g in self.gpus:
            members.setdefault((g.node, g.pool, g.type), []).append(g)
        groups = tuple(
            GPUGroup(node, pool, typ, tuple(g.id for g in gs), sum(g.usable for g in gs))  # type: ignore[arg-type]
            for (node, pool, typ), gs in sorted(members.items())
        )
        object.__setattr__(self, "_groups", groups)

    # ---------------------------------------------------------------- lookups
    def gpu(self, gpu_id: str) -> GPU:
        return self._gpu_index[gpu_id]

    def owner_of(self) -> dict[str, str]:
        return dict(self._owner)

    def group_key_of(self, worker: Worker) -> tuple[str, str, str]:
        g = self.gpu(worker.gpus[0])
        return (g.node, g.pool, g.type)

    def groups(self) -> tuple[GPUGroup, ...]:
        """GPUs folded into interchangeable groups, in a stable order (computed with the state)."""
        return self._groups

    def usable_count(self, pool: PoolName | None = None) -> int:
        return sum(g.usable for g in self.gpus if pool is None or g.pool == pool)

    def role_counts(self) -> Counter[str]:
        return Counter(w.role for w in self.workers if not w.draining)

    def borrowed_gpus(self) -> tuple[GPU, ...]:
        return tuple(g for g in self.gpus if g.borrowed)

    # ---------------------------------------------------------------- updates (new values)
    def with_availability(self, pool: PoolName, usable: int, gpu_type: str | None = None) -> "ClusterState":
        """Make exactly `usable` GPUs of `pool` (of `gpu_type` only, if given) available (others
        preempted / absent).

        Keeps GPUs that host workers when it can, so a shrink hits idle GPUs first; workers
        left on GPUs that go away are dropped (they were preempted).
        """
        owner = self.owner_of()
        mine = lambda g: g.pool == pool and (gpu_type is None or g.type == gpu_type)  # noqa: E731
        pool_gpus = [g for g in self.gpus if mine(g)]
        # prefer GPUs holding workers, then by id (whole nodes stay together in id order)
        order = sorted(pool_gpus, key=lambda g: (g.id not in owner, g.id))
        keep = {g.id for g in order[: max(0, min(usable, len(order)))]}
        gpus = tuple(replace(g, available=g.id in keep, preempt_notice=False) if mine(g) else g for g in self.gpus)
        alive = {g.id for g in gpus if g.available}
        workers = tuple(w for w in self.workers if all(gid in alive for gid in w.gpus))
        return replace(self, gpus=gpus, workers=workers)


def node_name(pool: str, group: int, index: int) -> str:
    """The node id of the `index`-th node of the cluster spec's `group`-th node group."""
    return f"{pool}{group}-{index}"


def gpu_name(node: str, slot: int) -> str:
    return f"{node}/{slot}"


def initial_state(nodes: list[tuple[int, int, str, PoolName]], trainer: TrainerPhase | None = None) -> ClusterState:
    """All GPUs of a cluster spec (count, gpus_per_node, gpu type, pool), available, no workers.

    Node ids are `<pool><group>-<n>`; GPU ids `<node>/<i>`: stable across states.
    """
    gpus: list[GPU] = []
    for gi, (count, per_node, typ, pool) in enumerate(nodes):
        for n in range(count):
            node = node_name(pool, gi, n)
            gpus.extend(GPU(gpu_name(node, i), node, typ, pool) for i in range(per_node))
    return ClusterState(tuple(gpus), (), trainer or TrainerPhase("training", 0.0))


def state_from_cluster_spec(cluster: object, trainer: TrainerPhase | None = None) -> ClusterState:
    """`initial_state` from a models.config.ClusterSpec (duck-typed: planner does not import config)."""
    nodes = [(g.count, g.gpus_per_node, g.gpu, g.pool) for g in cluster.nodes]  # type: ignore[attr-defined]
    return initial_state(nodes, trainer)
