"""What the simulator asks a policy for: a plan from the cluster state, as the Ray runtime asks.

A policy sees the planner's `ClusterState` (built by the simulator with the shared naming
and trainer timeline) and answers a `PolicyStep`: the `TransitionPlan` the shared executor
runs, the mode, and the predicted batch time the trainer timeline starts from. Planner
policies enter through runtime/sim/planner_adapter.py; `FixedLayout` (fidelity replays,
tests) holds fixed instance counts and reaches them with the planner's own minimal-change
plan (`planner.transition.build_plan`), so there is one matching of workers to roles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Protocol

from models.config import MAX_GPUS, ClusterSpec
from planner.decision import Decision, GroupTarget, SolverProof
from planner.inputs import PlanningInputs
from planner.milp import borrow_window_open
from planner.state import ROLES, ClusterState
from planner.transition import TransitionPlan, build_plan

Mode = Literal["colocated", "disaggregated"]


@dataclass(frozen=True)
class Layout:
    mode: Mode
    colocated: int = 0
    prefill: int = 0
    decode: int = 0
    borrow: int = 0  # how many of the instances above may run on lent training GPUs

    def count(self, role: str) -> int:
        return int(getattr(self, role))


FIXED_FORM = "fixed:<colocated|disaggregated>:<c>:<p>:<d>[:<borrow>]"


def parse_fixed(name: str) -> Layout | None:
    """The layout a `fixed:<mode>:<c>:<p>:<d>[:<borrow>]` policy names (counts 0..MAX_GPUS); None for any other form."""
    parts = name.split(":")
    if parts[0] != "fixed" or len(parts) not in (5, 6) or parts[1] not in ("colocated", "disaggregated"):
        return None
    try:
        counts = [int(p) for p in parts[2:]]
    except ValueError:
        return None
    if not all(0 <= c <= MAX_GPUS for c in counts):
        return None
    return Layout(parts[1], *counts)  # type: ignore[arg-type]


def fixed_layout_problem(layout: Layout, cluster: ClusterSpec) -> str | None:
    """What a fixed layout asks that the cluster cannot run (None: it can): an instance of every
    role its mode needs, and instances that fit the cluster's GPUs at the TP degrees it runs
    (`place` would quietly start fewer, or nothing)."""
    roles = ("colocated",) if layout.mode == "colocated" else ("prefill", "decode")
    if any(layout.count(r) < 1 for r in roles):
        return f"a {layout.mode} layout with at least one {' and one '.join(roles)} instance"
    tp = {r: getattr(cluster.tp, r)[0] for r in ROLES}
    need = sum(layout.count(r) * tp[r] for r in ROLES)
    own = sum(g.count * g.gpus_per_node for g in cluster.nodes if g.pool != "training")
    lent = min(cluster.gpus_in_pool("training"), layout.borrow * max(tp.values()))
    if need <= own + lent:
        return None
    degrees = ", ".join(f"{r} TP{tp[r]}" for r in ROLES if layout.count(r))
    return (f"instances on at most {own + lent} GPUs (the cluster's {own} rollout and elastic GPUs"
            f"{f' + {lent} lent training GPUs' if lent else ''}; {degrees}): this layout needs {need}")


@dataclass(frozen=True)
class PolicyStep:
    plan: TransitionPlan
    mode: str
    predicted_s: float = math.nan  # the batch time the trainer's timeline assumes for the decision (Decision.timeline_s; nan: none)
    info: dict = field(default_factory=dict)
    shares: tuple[tuple[str, str, int, float], ...] = ()  # Decision.shares: how the router splits a mixed layout's load


class SimPolicy(Protocol):
    name: str
    predicted_s: float  # the batch time this policy expects before its first decision (nan: none)

    def decide(self, state: ClusterState, inputs: PlanningInputs, now: float, event: str) -> PolicyStep:
        """`inputs` are the simulated system's true costs and tables; a planner policy may plan with its own."""
        ...


@dataclass
class FixedLayout:
    """A layout that never changes (fidelity replays, tests): not a planner policy."""

    layout: Layout
    tp: dict
    name: str = "fixed"
    predicted_s: float = math.nan  # the batch time the trainer timeline assumes until it has measured one

    def decide(self, state: ClusterState, inputs: PlanningInputs, now: float, event: str) -> PolicyStep:
        lendable = borrow_window_open(state, inputs, now)
        targets = place(state, self.layout, self.tp, lendable)
        lay = self.layout
        proof = SolverProof("evaluated", 0.0, 0.0, 0.0, 0.0, "none")
        d = Decision(lay.mode, lay.colocated, lay.prefill, lay.decode, targets, self.predicted_s, 0.0, 0, proof)
        return PolicyStep(build_plan(state, d, inputs, now), lay.mode, self.predicted_s, {"ratio": d.ratio, "applied": True})


def place(state: ClusterState, layout: Layout, tp: dict, lendable: bool) -> tuple[GroupTarget, ...]:
    """Per-group instance counts for a fixed layout: workers stay where they are, the rest fill
    free GPUs (reserved rollout first, then elastic, then up to `layout.borrow` lent training ones)."""
    order = {"rollout": 0, "elastic": 1, "training": 2}
    groups = sorted((g for g in state.groups() if g.pool != "training" or lendable), key=lambda g: (order[g.pool], g.key))
    draining = {gid for w in state.workers if w.draining for gid in w.gpus}
    cap = {g.key: g.usable - sum(1 for gid in g.gpu_ids if gid in draining) for g in groups}
    counts = {g.key: {r: 0 for r in ROLES} for g in groups}
    need = {r: layout.count(r) for r in ROLES}
    borrow = layout.borrow
    for w in state.workers:
        key = state.group_key_of(w)
        if w.draining or key not in cap or w.tp != tp[w.role] or need[w.role] <= 0 or not all(state.gpu(g).usable for g in w.gpus):
            continue
        if key[1] == "training":
            if borrow <= 0:
                continue
            borrow -= 1
        counts[key][w.role] += 1
        cap[key] -= w.tp
        need[w.role] -= 1
    for r in sorted(ROLES, key=lambda r: -tp[r]):
        for g in groups:
            while need[r] > 0 and cap[g.key] >= tp[r] and (g.pool != "training" or borrow > 0):
                borrow -= g.pool == "training"
                counts[g.key][r] += 1
                cap[g.key] -= tp[r]
                need[r] -= 1
    return tuple(GroupTarget(*key, **c) for key, c in counts.items() if any(c.values()))
