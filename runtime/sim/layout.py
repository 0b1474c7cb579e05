"""What the simulator asks a policy for, and what it shows the policy.

A policy sees a `Snapshot` (every node and instance, the trainer's phase, the batch's
progress) and answers a `Layout`: how many instances of each role the rollout should
run, and how many of them may sit on lent training GPUs. The simulator reaches that
layout with the fewest changes (keep roles up to their targets, switch the surplus into
deficits, start the rest, stop what is left), pricing each change with the transition
model. Planner policies enter through runtime/sim/planner_adapter.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

Mode = Literal["colocated", "disaggregated"]
Event = Literal["start", "availability", "batch", "train_begin", "train_end"]


@dataclass(frozen=True)
class Layout:
    mode: Mode
    colocated: int = 0
    prefill: int = 0
    decode: int = 0
    borrow: int = 0  # how many of the instances above may run on lent training GPUs

    def count(self, role: str) -> int:
        return int(getattr(self, role))


@dataclass(frozen=True)
class NodeView:
    nid: int
    pool: str  # training | rollout | elastic
    gpu: str
    gpus: int
    available: bool
    lendable: bool  # training node whose GPUs the trainer does not need now


@dataclass(frozen=True)
class InstanceView:
    iid: int
    nid: int
    gpus: int
    role: str
    state: str  # starting | ready | switching
    pool: str
    borrowed: bool
    slots: tuple[int, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    now: float
    event: Event
    nodes: tuple[NodeView, ...]
    instances: tuple[InstanceView, ...]
    trainer_phase: str  # idle | returning | training | syncing
    version: int
    batch_size: int
    batch_unfinished: int  # R of the batch the trainer waits for
    training_step_s: float  # predicted time of the next training step
    next_training_in_s: float | None = None  # predicted wait until the trainer needs its GPUs (None: unknown)
    extra: dict = field(default_factory=dict)

    def gpus(self, pool: str, available_only: bool = True) -> int:
        return sum(n.gpus for n in self.nodes if n.pool == pool and (n.available or not available_only))


class SimPolicy(Protocol):
    name: str

    def decide(self, snap: Snapshot) -> "PolicyStep": ...


@dataclass
class FixedLayout:
    """A layout that never changes (fidelity replays, tests): not a planner policy."""

    layout: Layout
    tp: dict
    name: str = "fixed"

    def decide(self, snap: Snapshot) -> "PolicyStep":
        return PolicyStep(reconcile(snap, self.layout, self.tp), self.layout.mode)


@dataclass(frozen=True)
class Change:
    """One instance-level change the simulator applies with its modelled delay."""

    kind: Literal["start", "switch", "stop"]
    role: str | None = None
    iid: int | None = None  # switch / stop: which instance
    nid: int | None = None  # start: on which node
    gpu_slots: tuple[int, ...] = ()  # start: which GPUs of the node (empty: any free)


@dataclass(frozen=True)
class PolicyStep:
    changes: tuple[Change, ...]
    mode: str
    info: dict = field(default_factory=dict)


def reconcile(snap: Snapshot, layout: Layout, tp: dict[str, int]) -> tuple[Change, ...]:
    """Fewest changes from the snapshot's instances to the layout's role counts.

    Keep each role up to its target (ready before starting, dedicated before lent), switch
    the surplus into deficits, start what is still missing on free GPUs (dedicated pools
    first, then lendable training GPUs up to layout.borrow), stop the rest.
    """
    roles = ("colocated", "prefill", "decode")
    order = {"ready": 0, "starting": 1, "switching": 2}
    live = sorted(snap.instances, key=lambda i: (i.borrowed, order.get(i.state, 3), i.iid))
    kept: dict[str, int] = {r: 0 for r in roles}
    surplus = []
    borrowed_kept = 0
    for inst in live:
        if inst.borrowed and borrowed_kept >= layout.borrow:
            surplus.append(inst)
            continue
        if kept[inst.role] < layout.count(inst.role):
            kept[inst.role] += 1
            borrowed_kept += inst.borrowed
        else:
            surplus.append(inst)
    changes: list[Change] = []
    deficit = {r: layout.count(r) - kept[r] for r in roles}
    for inst in list(surplus):
        if inst.borrowed and borrowed_kept >= layout.borrow:
            continue
        for r in roles:
            if deficit[r] > 0 and tp[r] == inst.gpus:
                changes.append(Change("switch", r, iid=inst.iid))
                deficit[r] -= 1
                borrowed_kept += inst.borrowed
                surplus.remove(inst)
                break
    changes += [Change("stop", iid=i.iid) for i in surplus]
    used: dict[int, int] = {}
    for inst in snap.instances:
        used[inst.nid] = used.get(inst.nid, 0) + inst.gpus
    free_nodes = sorted(
        (n for n in snap.nodes if n.available and (n.pool != "training" or n.lendable)),
        key=lambda n: ({"rollout": 0, "elastic": 1, "training": 2}[n.pool], n.nid),
    )
    for r in roles:
        for node in free_nodes:
            while deficit[r] > 0 and node.gpus - used.get(node.nid, 0) >= tp[r]:
                if node.pool == "training":
                    if borrowed_kept >= layout.borrow:
                        break
                    borrowed_kept += 1
                changes.append(Change("start", r, nid=node.nid))
                used[node.nid] = used.get(node.nid, 0) + tp[r]
                deficit[r] -= 1
    return tuple(changes)
