"""The Ray runtime's GPU slots as data: which worker each slot leads, in which role and status,
and the planner's `ClusterState` built from them. Pure (no Ray, no clock): testable alone.

Every GPU is a stable slot; a worker is named by the slot that leads its TP group
(`runtime/naming.py`), so a worker restarted on the same GPUs keeps its name. A lent
training GPU is recorded in the loan ledger (`runtime/loans.py`), not here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from planner.state import ClusterState, TrainerPhase, Worker
from planner.transition import Action
from runtime.naming import lead_gpu, worker_id
from runtime.ray_runtime.resources import Slot

SERVING_STATES = ("starting", "active", "draining", "switching")


@dataclass
class SlotRuntime:
    """Mutable runtime record of one stable GPU slot."""

    slot: Slot
    actor: Any = None
    slot_no: int = 0
    role: str | None = None
    status: str = "down"  # down | starting | active | draining | switching | parked
    load: int = 0
    version: int = 0
    served: int = 0
    gpus: tuple[str, ...] = ()  # the worker's TP group when this slot leads one
    parked: bool = False  # a returned training slot: process and engine alive, serving nothing
    failures: int = 0  # unplanned deaths of this slot's worker (bounded: runtime.max_restarts_per_slot)
    last_error: str = ""
    load_area: float = 0.0  # requests in flight integrated over the caller's clock (`add_load`)
    busy_s: float = 0.0  # time with a request in flight, on the same clock
    load_at: float = 0.0

    def add_load(self, delta: int, now: float) -> float:
        """Change the requests in flight at time `now`; returns the area so far (requests x
        seconds): the difference of two readings over their interval is the mean concurrency a
        request met there, which its engine's step times depend on."""
        dt = max(now - self.load_at, 0.0)
        self.load_area += self.load * dt
        self.busy_s += dt if self.load > 0 else 0.0
        self.load_at = now
        self.load += delta
        return self.load_area

    @property
    def worker_id(self) -> str:
        return worker_id(self.slot.gpu)


class SlotTable:
    """Every slot's record, elastic availability, and dead slots; planner state in and out."""

    def __init__(self, base: ClusterState, slots: tuple[Slot, ...]) -> None:
        self.base = base
        self.slots = slots
        self.rec: dict[str, SlotRuntime] = {s.gpu: SlotRuntime(s, slot_no=s.index) for s in slots}
        self.elastic_total = sum(1 for s in slots if s.pool == "elastic")
        self.elastic_available = self.elastic_total
        self.dead: set[str] = set()
        self.lost: set[str] = set()  # GPUs whose Ray node is gone (node_watch): unavailable until it joins again
        self.node_of: dict[str, str] = {g.id: g.node for g in base.gpus}  # GPU -> planner node
        self.type_of: dict[str, str] = {g.id: g.type for g in base.gpus}  # GPU -> its type
        self.elastic_by_type: dict[str, int] = {}  # with elastic_traces: each type's elastic GPUs that exist now

    def gone_elastic(self) -> set[str]:
        """Elastic GPUs that do not exist now: past the pool's count, or past their own type's
        where `elastic_traces` drives each type (`set_elastic`)."""
        elastic = [s.gpu for s in self.slots if s.pool == "elastic"]
        if not self.elastic_by_type:
            return set(elastic[self.elastic_available :])
        out: set[str] = set()
        for typ, n in self.elastic_by_type.items():
            out |= set([g for g in elastic if self.type_of[g] == typ][n:])
        return out

    def set_elastic(self, available: int, gpu_type: str | None = None) -> bool:
        """The elastic pool (or, with a type, that type's elastic GPUs) now has `available` GPUs; False if nothing changed."""
        if gpu_type is None:
            changed = available != self.elastic_available or bool(self.elastic_by_type)
            self.elastic_available, self.elastic_by_type = available, {}
            return changed
        if self.elastic_by_type.get(gpu_type, sum(1 for g in self.base.gpus if g.pool == "elastic" and g.type == gpu_type)) == available:
            return False
        self.elastic_by_type[gpu_type] = available
        return True

    def elastic_now(self) -> int | dict[str, int]:
        """What exists of the elastic pool, as `set_elastic` last set it (a count, or one per type)."""
        return dict(self.elastic_by_type) or self.elastic_available

    def group_slots(self, r: SlotRuntime) -> tuple[Slot, ...]:
        """The slots of the TP group `r` leads (its own first)."""
        return (r.slot, *(self.rec[g].slot for g in r.gpus if g != r.slot.gpu))

    def kind_of(self, r: SlotRuntime) -> tuple[str, int]:
        """(GPU type, TP degree) of the engine `r` leads: what its step model and vLLM's TP follow."""
        return self.type_of[r.slot.gpu], max(len(r.gpus), 1)

    def of(self, a: Action) -> SlotRuntime:
        """The slot an action acts on: its worker's lead GPU, else its first GPU."""
        if a.worker is not None and a.worker.startswith("w:"):
            return self.rec[lead_gpu(a.worker)]
        if a.gpus:
            return self.rec[a.gpus[0]]
        raise KeyError(f"plan action {a} names no slot")

    def serving(self, role: str) -> list[SlotRuntime]:
        return [r for r in self.rec.values() if r.status == "active" and r.role == role and r.slot.gpu not in self.dead]

    def state(self, trainer: TrainerPhase, version: int, unfinished: float, lent: set[str]) -> ClusterState:
        """The cluster as the planner sees it (before the executor adds what running plans will do)."""
        gone = self.gone_elastic() | self.lost
        gpus, workers = [], []
        for g in self.base.gpus:
            r = self.rec[g.id]
            gpus.append(replace(g, available=g.id not in gone, borrowed=g.id in lent and g.pool == "training"))
            # a dead slot being restarted is the worker it is becoming (else the next decision starts it again)
            if r.status in SERVING_STATES and r.role is not None and r.gpus and not set(r.gpus) & gone and (g.id not in self.dead or r.status == "starting"):
                if g.pool == "training" and g.id not in lent:
                    continue
                workers.append(Worker(r.worker_id, r.role, r.gpus, len(r.gpus), r.version, r.status == "draining"))  # type: ignore[arg-type]
        return ClusterState(tuple(gpus), tuple(workers), trainer, version, min(max(unfinished, 0.0), 1.0))

    def mode(self, wanted: str) -> str:
        roles = Counter(r.role for r in self.rec.values() if r.status == "active")
        if roles["prefill"] and roles["decode"] and (wanted == "disaggregated" or not roles["colocated"]):
            return "disaggregated"
        return "colocated"

    def layout_by_type(self) -> dict[str, dict[str, dict[int, int]]]:
        """Serving workers per GPU type, role and TP degree (as `Decision.layout_by_type`)."""
        out: dict[str, dict[str, dict[int, int]]] = {}
        for r in self.rec.values():
            if r.status == "active" and r.role is not None:
                typ, tp = self.kind_of(r)
                by_tp = out.setdefault(typ, {}).setdefault(r.role, {})
                by_tp[tp] = by_tp.get(tp, 0) + 1
        return out

    def ratio(self, mode: str) -> str:
        roles = Counter(r.role for r in self.rec.values() if r.status == "active")
        return f"{roles['prefill']}P{roles['decode']}D" if mode == "disaggregated" else f"{roles['colocated']}C"
