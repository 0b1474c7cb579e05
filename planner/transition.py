"""From the current state and a decision to concrete, ordered actions with the fewest role changes.

Per node group, existing workers are matched to the decision's slots by a min-cost
assignment (keep free, switch role, stop; unfilled slots are starts), which reaches the
paper's closed form D_worker + D_role when a switch is cheaper than a stop plus a start.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from scipy.optimize import linear_sum_assignment

from planner.decision import Decision
from planner.inputs import PlanningInputs
from planner.milp import _ms, borrow_window_open
from planner.state import ROLES, ClusterState, Worker

ActionKind = Literal["start", "load_weights", "drain", "switch_role", "stop", "lend", "return"]


@dataclass(frozen=True)
class Action:
    """One step of a plan. `after` lists ids of actions that must finish first.

    start: a new engine (worker) on `gpus` with `role`; load_weights: sync it to the newest
    weights; drain: stop admitting and finish (or hand off) in-flight requests; switch_role:
    restart a drained engine in `role`; stop: end a drained engine; lend: take training GPUs
    from the trainer; return: give them back, no later than `deadline_s`.
    """

    id: int
    kind: ActionKind
    worker: str | None = None
    gpus: tuple[str, ...] = ()
    role: str | None = None
    from_role: str | None = None
    after: tuple[int, ...] = ()
    duration_s: float = 0.0
    deadline_s: float | None = None


@dataclass(frozen=True)
class TransitionPlan:
    actions: tuple[Action, ...]
    joins: int  # new workers (|W' \\ W|)
    leaves: int  # stopped workers (|W \\ W'|)
    role_changes: int  # survivors that switch role (D_role)
    lent: int  # training GPUs lent by this plan
    returned: int  # training GPUs returned by this plan

    @property
    def worker_changes(self) -> int:
        return self.joins + self.leaves

    @property
    def empty(self) -> bool:
        return not self.actions


# ----------------------------------------------------------------------------- planning

BIG = 1e12


@dataclass(frozen=True)
class UnitCosts:
    """Prices the worker matching minimises (any consistent unit)."""

    start: dict[str, float]  # per pool
    stop: float
    switch: float


def unit_costs(inputs: PlanningInputs) -> UnitCosts:
    c = inputs.costs
    return UnitCosts(dict(c.start_s), c.stop_s, c.switch_s)


Slot = tuple[str, int]  # (role, TP degree)


def match_workers(workers: list[Worker], target: dict[Slot, int], pool: str, costs: UnitCosts) -> tuple[dict[str, str | None], dict[Slot, int]]:
    """Min-cost assignment of a node group's workers to its target slots (role, TP degree).

    Returns worker id -> new role (None: stop) and the unfilled slots (starts). Keeping a
    worker in its role is free; switching costs `switch` (same TP only: a TP change is a stop
    and a start); stopping costs `stop`; every slot left unfilled costs a start.
    """
    order = sorted(target, key=lambda s: (ROLES.index(s[0]), s[1]))  # type: ignore[arg-type]
    slots = [s for s in order for _ in range(target[s])]
    n, m = len(workers), len(slots)
    if n == 0:
        return {}, dict(target)
    cost = np.full((n, m + n), 0.0)
    for i, w in enumerate(workers):
        for j, (r, t) in enumerate(slots):
            if w.tp != t:
                cost[i, j] = BIG
            else:
                cost[i, j] = (0.0 if w.role == r else costs.switch) - costs.start[pool]
        cost[i, m:] = costs.stop
    rows, cols = linear_sum_assignment(cost)
    out: dict[str, str | None] = {}
    filled = {s: 0 for s in target}
    for i, j in zip(rows, cols):
        if j < m and cost[i, j] < BIG / 2:
            out[workers[i].id] = slots[j][0]
            filled[slots[j]] += 1
        else:
            out[workers[i].id] = None
    return out, {s: target[s] - filled[s] for s in target}


def allowed_degrees(inputs: PlanningInputs) -> dict[str, set[int]]:
    """The TP degrees each role may run at: the one per role, or every degree of a mixed layout."""
    if inputs.mixed:
        return {r: {v.tp for v in inputs.variants if v.role == r} for r in ROLES}
    return {r: {inputs.tp(r)} for r in ROLES}


def build_plan(state: ClusterState, decision: Decision, inputs: PlanningInputs, now_s: float, costs: UnitCosts | None = None) -> TransitionPlan:
    """Ordered actions that turn `state` into `decision` with the cheapest worker changes.

    Ordering: lend before a start on a training GPU; a start that reuses GPUs of a
    stopping worker waits for that stop; other starts come first and the non-urgent
    drains wait until those new engines have loaded weights (capacity never dips);
    drain before switch_role or stop; a borrowed GPU no longer used is returned right
    after its worker stops, with the trainer's deadline attached.
    """
    costs = costs or unit_costs(inputs)
    c = inputs.costs
    tp = {r: inputs.tp(r) for r in ROLES}
    degrees = allowed_degrees(inputs)
    lendable = borrow_window_open(state, inputs, now_s)
    deadline = state.trainer.next_needs_gpus_at_s
    targets = {t.key: t.slots(tp) for t in decision.targets}
    by_group: dict[tuple[str, str, str], list[Worker]] = {}
    forced: list[Worker] = []  # must leave: lost GPU, preemption notice, wrong TP, recalled training GPU
    forced_gpus: dict[tuple[str, str, str], set[str]] = {}  # per group: the GPUs its forced workers free
    for w in state.workers:
        if w.draining:
            continue
        key = state.group_key_of(w)
        usable = all(state.gpu(g).usable for g in w.gpus)
        recalled = key[1] == "training" and not lendable and key not in targets
        if not usable or w.tp not in degrees[w.role] or recalled:
            forced.append(w)
            forced_gpus.setdefault(key, set()).update(w.gpus)
        else:
            by_group.setdefault(key, []).append(w)
    actions: list[Action] = []

    def add(kind: ActionKind, **kw: object) -> int:
        actions.append(Action(len(actions), kind, **kw))  # type: ignore[arg-type]
        return len(actions) - 1

    owner = state.owner_of()
    stop_of: dict[str, int] = {}  # worker id -> its stop action
    leaving: list[tuple[Worker, bool]] = [(w, True) for w in forced]  # (worker, urgent)
    switching: list[tuple[Worker, str]] = []
    starts: list[tuple[tuple[str, str, str], str, tuple[str, ...], tuple[str, ...]]] = []  # key, role, gpus, reused-from workers
    groups = {g.key: g for g in state.groups()}
    for key in sorted(set(by_group) | set(targets)):
        ws = sorted(by_group.get(key, []), key=lambda w: (-w.weight_version, w.id))
        assign, need = match_workers(ws, targets.get(key, {}), key[1], costs)
        for w in ws:
            new = assign[w.id]
            if new is None:
                leaving.append((w, False))
            elif new != w.role:
                switching.append((w, new))
        leaving_here = {gid for w in ws if assign[w.id] is None for gid in w.gpus} | forced_gpus.get(key, set())
        grp = groups.get(key)
        ids = grp.gpu_ids if grp else ()
        free = [g for g in ids if state.gpu(g).usable and g not in owner]
        free += [g for g in ids if g in leaving_here and state.gpu(g).usable]
        for r, t in sorted(need, key=lambda s: (-s[1], ROLES.index(s[0]))):  # type: ignore[arg-type]
            for _ in range(need[(r, t)]):
                gpus, free = tuple(free[:t]), free[t:]
                if len(gpus) < t:
                    raise ValueError(f"decision puts more {r} instances on {key[0]} than its usable GPUs hold")
                starts.append((key, r, gpus, tuple(sorted({owner[g] for g in gpus if g in owner}))))
    # stops of leaving workers (urgent ones first, no waiting)
    drain_of: dict[str, int] = {}
    for w, urgent in leaving:
        d = add("drain", worker=w.id, gpus=w.gpus, from_role=w.role, duration_s=c.stop_s)
        drain_of[w.id] = d
        stop_of[w.id] = add("stop", worker=w.id, gpus=w.gpus, from_role=w.role, after=(d,))
    returns = 0
    reused = {s for _, _, _, src in starts for s in src}  # workers whose GPUs a start takes over
    for w, _ in leaving:
        borrowed = tuple(g for g in w.gpus if state.gpu(g).borrowed)
        if borrowed and not (w.id in reused and lendable):
            add("return", gpus=borrowed, after=(stop_of[w.id],), duration_s=c.return_s, deadline_s=deadline)
            returns += len(borrowed)
    # borrowed GPUs that hold nothing and are not in the target: give back
    target_keys = set(targets)
    idle_borrowed = tuple(g.id for g in state.gpus if g.borrowed and g.id not in owner and (not lendable or (g.node, g.pool, g.type) not in target_keys))
    if idle_borrowed:
        add("return", gpus=idle_borrowed, duration_s=c.return_s, deadline_s=deadline)
        returns += len(idle_borrowed)
    # starts
    lent = 0
    ready: list[int] = []
    new_id = 0
    taken = {w.id for w in state.workers}
    for key, r, gpus, src in starts:
        deps = [stop_of[s] for s in src if s in stop_of]
        to_lend = tuple(g for g in gpus if state.gpu(g).pool == "training" and not state.gpu(g).borrowed)
        if to_lend:
            deps.append(add("lend", gpus=to_lend, duration_s=c.lend_s, deadline_s=deadline))
            lent += len(to_lend)
        while f"w{new_id}" in taken:
            new_id += 1
        wid = f"w{new_id}"
        taken.add(wid)
        dur = c.engine_start_s if key[1] != "elastic" else c.start_s["elastic"]
        s = add("start", worker=wid, gpus=gpus, role=r, after=tuple(deps), duration_s=dur)
        lw = add("load_weights", worker=wid, gpus=gpus, role=r, after=(s,), duration_s=c.weight_load_s)
        if not src:
            ready.append(lw)
    # capacity first: non-urgent drains wait for the new engines that need no freed GPUs
    urgent = {w.id for w, u in leaving if u}
    after_ready = tuple(ready)
    for i, a in enumerate(actions):
        if a.kind == "drain" and a.worker not in urgent and ready:
            actions[i] = Action(a.id, a.kind, a.worker, a.gpus, a.role, a.from_role, after_ready, a.duration_s, a.deadline_s)
    for w, r in switching:
        d = add("drain", worker=w.id, gpus=w.gpus, from_role=w.role, after=after_ready, duration_s=c.stop_s)
        sw = add("switch_role", worker=w.id, gpus=w.gpus, role=r, from_role=w.role, after=(d,), duration_s=c.switch_s)
        if w.weight_version < state.weight_version:
            add("load_weights", worker=w.id, gpus=w.gpus, role=r, after=(sw,), duration_s=c.weight_load_s)
    switched = {w.id for w, _ in switching}
    for w in state.workers:
        if w.draining or w.id in switched or w.id in stop_of:
            continue
        if w.weight_version < state.weight_version:
            add("load_weights", worker=w.id, gpus=w.gpus, role=w.role, duration_s=c.weight_load_s)
    n_starts = sum(1 for a in actions if a.kind == "start")
    return TransitionPlan(tuple(_topological(actions)), n_starts, len(leaving), len(switching), lent, returns)


def _topological(actions: list[Action]) -> list[Action]:
    """Stable topological order (ids keep their meaning; dependencies come first)."""
    done: set[int] = set()
    out: list[Action] = []
    pending = list(actions)
    while pending:
        rest = []
        for a in pending:
            if all(d in done for d in a.after):
                out.append(a)
                done.add(a.id)
            else:
                rest.append(a)
        if len(rest) == len(pending):
            raise AssertionError("cyclic plan")
        pending = rest
    return out


def plan_cost_ms(plan: TransitionPlan, state: ClusterState, inputs: PlanningInputs, cost_gpus: int) -> int:
    """The plan's transition cost priced from its actions alone (same units as the program)."""
    w = inputs.weights.transition_weight / inputs.weights.horizon_batches
    denom = max(cost_gpus, 1)
    c = inputs.costs
    total = 0
    for a in plan.actions:
        n = len(a.gpus)
        if a.kind == "start":
            pool = state.gpu(a.gpus[0]).pool
            total += _ms(w * c.start_s[pool] * n / denom)
        elif a.kind == "stop":
            total += _ms(w * c.stop_s * n / denom)
        elif a.kind == "switch_role":
            total += _ms(w * c.switch_s * n / denom)
    return total


def apply_plan(state: ClusterState, plan: TransitionPlan) -> ClusterState:
    """The state after every action of `plan` has completed (pure; for offline planning and tests)."""
    workers = {w.id: w for w in state.workers}
    borrowed = {g.id: g.borrowed for g in state.gpus}  # in action order: a GPU returned, then lent again, is lent
    for a in plan.actions:
        if a.kind == "stop" and a.worker in workers:
            del workers[a.worker]
        elif a.kind == "switch_role" and a.worker in workers:
            workers[a.worker] = replace(workers[a.worker], role=a.role)  # type: ignore[arg-type]
        elif a.kind == "start":
            workers[a.worker] = Worker(a.worker, a.role, a.gpus, len(a.gpus), state.weight_version)  # type: ignore[arg-type]
        elif a.kind == "load_weights" and a.worker in workers:
            workers[a.worker] = replace(workers[a.worker], weight_version=state.weight_version)
        elif a.kind in ("lend", "return"):
            borrowed.update({g: a.kind == "lend" for g in a.gpus})
    gpus = tuple(replace(g, borrowed=borrowed[g.id]) for g in state.gpus)
    return replace(state, gpus=gpus, workers=tuple(workers.values()))
