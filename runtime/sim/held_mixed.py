"""A mixed layout held throughout: instances per (GPU type, role, TP degree), named on the CLI.

Why: on a mixed cluster `fixed:<mode>:<c>:<p>:<d>` cannot say which type runs which role at
which degree, and it routes trajectories evenly over instances of different speeds (the slow
kind then holds the batch back). `fixed:H800=8P@TP1,H20=3D@TP4` names the layout the way
`pearl compare` reports one (`layout_by_type`); the policy prices it with the mixed program's
own definition (`planner.mixed`), so the simulated batch time can be set against the same
prediction the planner would have made, and the router splits the load by the decision's
shares as it does for PEARL's layouts. Never on lent training GPUs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from models.config import ClusterSpec
from planner import mixed
from planner.decision import SolverProof
from planner.inputs import PlanningInputs
from planner.milp import Options
from planner.solve import mixed_decision_from
from planner.state import ROLES, ClusterState
from planner.transition import build_plan
from runtime.sim.layout import PolicyStep

TYPED_FORM = "fixed:<type>=<n><C|P|D>@TP<d>[+...][,<type>=...] (e.g. fixed:H800=8P@TP1,H20=3D@TP4)"
_TERM = re.compile(r"^(\d+)([CPD])@TP(\d+)$")
_ROLE = {"C": "colocated", "P": "prefill", "D": "decode"}

Kind = tuple[str, str, int]  # (GPU type, role, TP degree)


@dataclass(frozen=True)
class TypedLayout:
    """Instances per (GPU type, role, TP degree), sorted; every count positive."""

    counts: tuple[tuple[Kind, int], ...]

    def want(self) -> dict[Kind, int]:
        return dict(self.counts)

    def label(self) -> dict[str, str]:
        """Per GPU type, as `layout_by_type` labels it ('3D@TP4 8P@TP1')."""
        out: dict[str, list[str]] = {}
        for (typ, role, tp), n in self.counts:
            out.setdefault(typ, []).append(f"{n}{role[0].upper()}@TP{tp}")
        return {typ: " ".join(terms) for typ, terms in out.items()}


def parse_typed(name: str) -> TypedLayout | None:
    """The layout a `fixed:<type>=<terms>,...` policy names (terms joined by '+' or spaces, a
    kind named once); None for any other form."""
    if not name.startswith("fixed:") or "=" not in name:
        return None
    counts: dict[Kind, int] = {}
    for part in name.removeprefix("fixed:").split(","):
        typ, sep, terms = part.partition("=")
        typ = typ.strip()
        if not sep or not typ or not terms.strip():
            return None
        for term in terms.replace("+", " ").split():
            m = _TERM.match(term)
            if m is None or int(m[1]) < 1:
                return None
            kind = (typ, _ROLE[m[2]], int(m[3]))
            if kind in counts:
                return None
            counts[kind] = int(m[1])
    return TypedLayout(tuple(sorted(counts.items()))) if counts else None


def typed_layout_problem(layout: TypedLayout, cluster: ClusterSpec, fits_memory: Callable[[str, int], bool] | None = None) -> str | None:
    """What the cluster cannot run of `layout` (None: it can): its types on rollout or elastic
    nodes, degrees the config allows for the role, one mode, and instances that pack into
    whole nodes of their type (an instance never spans nodes). `fits_memory(type, tp)`:
    weights and one sequence fit the TP group (skipped when None)."""
    roles = {role for (_, role, _), _ in layout.counts}
    if "colocated" in roles and roles != {"colocated"}:
        return "one mode: colocated (C) instances alone, or prefill (P) and decode (D) instances together"
    if roles != {"colocated"} and roles != {"prefill", "decode"}:
        return "a disaggregated layout with at least one prefill (P) and one decode (D) instance"
    serving = [g for g in cluster.nodes if g.pool != "training"]
    types = sorted({g.gpu for g in serving})
    for (typ, role, tp), _ in layout.counts:
        if typ not in types:
            return f"GPU types of the cluster's rollout and elastic nodes: {types}; got {typ}"
        allowed = getattr(cluster.tp, role)
        if tp not in allowed:
            return f"TP degrees the config allows for {role} (cluster.tp.{role}): {allowed}; got TP{tp} on {typ}"
        if fits_memory is not None and not fits_memory(typ, tp):
            return f"{typ} {role} at TP{tp}: the weights and one sequence do not fit {tp} {typ} GPU(s); pick a larger degree"
    for typ in types:
        rooms = sorted((g.gpus_per_node for g in serving if g.gpu == typ for _ in range(g.count)), reverse=True)
        need = sorted((tp for (ty, _, tp), n in layout.counts if ty == typ for _ in range(n)), reverse=True)
        for tp in need:  # largest first into the fullest-room node that takes it (exact for powers of two)
            i = max((j for j, room in enumerate(rooms) if room >= tp), key=lambda j: rooms[j], default=None)
            if i is None:
                free = sum(g.count * g.gpus_per_node for g in serving if g.gpu == typ)
                return (f"instances that fit the {free} {typ} GPU(s) of the rollout and elastic nodes, in whole "
                        f"nodes: {layout.label()[typ]} needs {sum(need)}")
            rooms[i] -= tp
    return None


@dataclass
class HeldTypedLayout:
    """Holds a `TypedLayout` (`pearl simulate --policy fixed:H800=8P@TP1,H20=3D@TP4`): at every
    decision it keeps the instances that still run and starts the rest where GPUs are free
    (reserved rollout nodes first); while GPUs are missing it holds what fits."""

    layout: TypedLayout
    name: str = "fixed"
    predicted_s: float = math.nan  # before its first decision: none (SimPolicy)
    batch_s: float = math.nan  # a fresh batch's predicted completion with what runs (`Decision.predicted_completion_s`)
    shares: tuple[tuple[str, str, int, float], ...] = ()  # the last decision's (`Decision.shares`): how the router splits the load

    def decide(self, state: ClusterState, inputs: PlanningInputs, now: float, event: str) -> PolicyStep:
        """Priced on the simulator's tables (`inputs`, as `FixedLayout` plans): the same models a planner policy tabulates."""
        problem = mixed.build_mixed_problem(state, inputs, now, Options(allow_borrow=False), prune=False)
        x = place_typed(problem, self.layout.want())
        d = mixed_decision_from(problem, x, SolverProof("evaluated", 0.0, 0.0, 0.0, 0.0, "none"))
        priced = mixed.batch_completion_ms(problem, x) is not None  # a layout missing a role (GPUs gone) has no prediction
        self.batch_s, self.shares = (d.predicted_completion_s if priced else math.nan), d.shares
        info = {"ratio": d.ratio, "applied": True, "predicted_s": round(self.batch_s, 2), "layout_by_type": d.layout_by_type()}
        return PolicyStep(build_plan(state, d, inputs, now), d.mode, d.timeline_s if priced else math.nan, info, d.shares)


def place_typed(problem: mixed.MixedProblem, want: dict[Kind, int]) -> tuple[tuple[int, ...], ...]:
    """Instances per group and slot: the running ones first (as many as `want` asks), then the
    rest on free GPUs, reserved rollout groups before elastic ones, never training GPUs."""
    groups = problem.groups
    left = dict(want)
    x = [[0] * len(g.slots) for g in groups]
    room = [g.total_cap if g.pool != "training" else 0 for g in groups]
    for gi, g in enumerate(groups):
        for i, (r, tp) in enumerate(g.slots):
            kind = (g.gpu_type, ROLES[r], tp)
            n = min(g.total_cur(i), left.get(kind, 0), room[gi] // tp)
            x[gi][i], room[gi], left[kind] = n, room[gi] - n * tp, left.get(kind, 0) - n
    order = sorted(range(len(groups)), key=lambda gi: (groups[gi].pool != "rollout", gi))
    for gi in order:
        g = groups[gi]
        for i, (r, tp) in sorted(enumerate(g.slots), key=lambda s: -s[1][1]):  # larger degrees first: they pack whole nodes
            kind = (g.gpu_type, ROLES[r], tp)
            n = min(left.get(kind, 0), room[gi] // tp, g.ub(i) - x[gi][i])
            if n > 0:
                x[gi][i] += n
                room[gi] -= n * tp
                left[kind] -= n
    return tuple(tuple(v) for v in x)
