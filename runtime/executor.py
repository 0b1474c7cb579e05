"""One plan executor for the simulator and the Ray runtime: which action may begin, and what
its completion means. It never reads a clock and never touches an engine.

The planner's `TransitionPlan` is a DAG of actions. Both runtimes hand each plan to an
`Executor` and then only (1) begin the actions it releases and (2) report each one's end;
the simulator does both on its virtual clock (an action lasts its modelled `duration_s`),
the Ray runtime on the wall clock (an action lasts as long as the actors take). One
implementation, so one set of semantics:

- an action begins once every action it depends on (`after`) succeeded, and once every
  action of an earlier, unfinished plan on one of its GPUs has ended (plans overlap, but one
  GPU's actions run in the order the plans were made);
- the planner orders starts before drains where capacity allows; the executor keeps that
  order, it never reorders;
- new engines that need no freed GPU form the plan's expansion: they join together when
  the last of them has loaded weights, or not at all if one fails (the runtime stops the
  others); a start that reuses a stopped worker's GPUs joins on its own;
- an existing worker serves again after its role switch (and the weight load that follows it);
- a failed action fails everything that depends on it.

`committed(state)` is the cluster as the next decision must see it: the actions not yet
begun applied to the runtime's own state, so a decision made while a plan runs plans from
where that plan is going, not from where it started. Worker ids are canonical
(`worker_id(lead GPU)`) in every plan the executor accepts, so both runtimes and the
planner name a worker the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from planner.state import ClusterState
from planner.transition import Action, TransitionPlan, apply_plan
from runtime.naming import worker_id

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"


@dataclass(frozen=True)
class Progress:
    """What the runtime does next after a submit or a completion."""

    begin: tuple[tuple[int, Action], ...] = ()  # (plan id, action) that may start now
    serving: tuple[Action, ...] = ()  # an existing worker serves again (its switch and weights are done)
    admitted: tuple[Action, ...] = ()  # start actions whose engines join now
    cancelled: tuple[Action, ...] = ()  # start actions whose engines must stop: their expansion failed
    failed: tuple[Action, ...] = ()  # actions given up because something they depend on failed

    def __add__(self, other: "Progress") -> "Progress":
        return Progress(self.begin + other.begin, self.serving + other.serving, self.admitted + other.admitted,
                        self.cancelled + other.cancelled, self.failed + other.failed)


@dataclass
class _Run:
    """Mutable book of one plan in flight (private to the executor)."""

    rid: int
    actions: dict[int, Action]
    status: dict[int, str]
    expansion: frozenset[int]  # start ids admitted together
    load_of: dict[int, int]  # start or switch id -> the load_weights that completes it
    expansion_failed: bool = False
    admitted: bool = False
    dependents: dict[int, list[int]] = field(default_factory=dict)

    def unfinished(self) -> list[Action]:
        return [a for i, a in self.actions.items() if self.status[i] in (PENDING, RUNNING)]

    @property
    def settled(self) -> bool:
        return all(s in (DONE, FAILED) for s in self.status.values())


def canonical(plan: TransitionPlan) -> TransitionPlan:
    """The plan with every worker named by its lead GPU (the planner names new workers freely)."""
    return replace(plan, actions=tuple(replace(a, worker=worker_id(a.gpus[0])) if a.worker is not None and a.gpus else a for a in plan.actions))


class Executor:
    """Plans in flight, in the order they were made. Not thread-safe: one event loop owns it."""

    def __init__(self) -> None:
        self._runs: dict[int, _Run] = {}
        self._next = 0

    # ------------------------------------------------------------------ queries
    @property
    def busy(self) -> bool:
        return bool(self._runs)

    def pending_kinds(self, kind: str) -> list[Action]:
        """Unfinished actions of one kind across every plan (e.g. returns still to come)."""
        return [a for run in self._runs.values() for a in run.unfinished() if a.kind == kind]

    def running(self, rid: int) -> bool:
        """Is plan `rid` still in flight (some action not yet ended)?"""
        return rid in self._runs

    def committed(self, state: ClusterState) -> ClusterState:
        """`state` with every action not yet begun applied (what the running plans will do);
        a lend or return under way counts as done (its GPUs are already promised)."""
        todo = tuple(a for run in self._runs.values() for i, a in run.actions.items()
                     if (run.status[i] == PENDING or (run.status[i] == RUNNING and a.kind in ("lend", "return")))
                     and (a.kind not in ("start", "lend") or all(state.gpu(g).available for g in a.gpus)))
        # (a start or lend on a GPU that has gone since will fail when it begins: it is not promised)
        if not todo:
            return state
        return apply_plan(state, TransitionPlan(todo, 0, 0, 0, 0, 0))

    # ------------------------------------------------------------------ driving
    def submit(self, plan: TransitionPlan) -> tuple[int, Progress]:
        """Accept a plan; return its id and the actions that may begin now."""
        plan = canonical(plan)
        actions = {a.id: a for a in plan.actions}
        stops = {i for i, a in actions.items() if a.kind == "stop"}
        load_of: dict[int, int] = {}
        dependents: dict[int, list[int]] = {}
        for a in plan.actions:
            for d in a.after:
                dependents.setdefault(d, []).append(a.id)
            if a.kind == "load_weights":
                for d in a.after:
                    if actions[d].kind in ("start", "switch_role") and actions[d].worker == a.worker:
                        load_of[d] = a.id
        expansion = frozenset(i for i, a in actions.items() if a.kind == "start" and not (set(_ancestors(actions, i)) & stops))
        rid = self._next
        self._next += 1
        if not actions:
            return rid, Progress()  # nothing to run: settled at once
        self._runs[rid] = _Run(rid, actions, {i: PENDING for i in actions}, expansion, load_of, dependents=dependents)
        return rid, self._release()

    def complete(self, rid: int, aid: int, ok: bool) -> Progress:
        """Action `aid` of plan `rid` ended (succeeded if `ok`); what follows from it."""
        run = self._runs.get(rid)
        if run is None or run.status.get(aid) != RUNNING:
            return Progress()
        run.status[aid] = DONE if ok else FAILED
        a = run.actions[aid]
        out = Progress()
        if not ok:
            out += self._fail(run, aid)
        else:
            out += self._completed(run, a)
        out += self._release()
        if run.settled:
            del self._runs[rid]
        return out

    # ------------------------------------------------------------------ internals
    def _completed(self, run: _Run, a: Action) -> Progress:
        owner = next((s for s, ld in run.load_of.items() if ld == a.id), a.id)  # the start/switch this load completes
        first = run.actions[owner]
        if first.kind == "start":
            if owner in run.expansion and run.expansion_failed:
                return Progress(cancelled=(first,))  # started after its group failed: stop it
            if a.kind == "start" and owner in run.load_of:
                return Progress()  # joins once its weights are loaded
            if owner not in run.expansion:
                return Progress(admitted=(first,))
            if all(self._joined(run, s) for s in run.expansion):
                run.admitted = True
                return Progress(admitted=tuple(run.actions[s] for s in sorted(run.expansion)))
            return Progress()
        if first.kind == "switch_role" and (a.kind == "load_weights" or owner not in run.load_of):
            return Progress(serving=(first,))
        return Progress()

    @staticmethod
    def _joined(run: _Run, start: int) -> bool:
        ld = run.load_of.get(start)
        return run.status[start] == DONE and (ld is None or run.status[ld] == DONE)

    def _fail(self, run: _Run, aid: int) -> Progress:
        failed: list[Action] = []

        def give_up(i: int) -> None:
            stack = [i]
            while stack:
                j = stack.pop()
                for d in run.dependents.get(j, []):
                    if run.status[d] == PENDING:
                        run.status[d] = FAILED
                        failed.append(run.actions[d])
                        stack.append(d)

        give_up(aid)
        cancelled: dict[int, Action] = {}
        owner = next((s for s, ld in run.load_of.items() if ld == aid), None)
        if owner is not None and run.actions[owner].kind == "start" and run.status[owner] == DONE:
            cancelled[owner] = run.actions[owner]  # a new engine that could not load weights never serves
        members = set(run.expansion) | {run.load_of[s] for s in run.expansion if s in run.load_of}
        if (members & ({aid} | {a.id for a in failed})) and not run.expansion_failed and not run.admitted:
            run.expansion_failed = True  # all or nothing: the rest of the group is not admitted
            for s in sorted(run.expansion):
                ld = run.load_of.get(s)
                if ld is not None and run.status[ld] == PENDING:
                    run.status[ld] = FAILED
                    failed.append(run.actions[ld])
                if run.status[s] == PENDING:
                    run.status[s] = FAILED
                    failed.append(run.actions[s])
                    give_up(s)
                elif run.status[s] == DONE and not (ld is not None and run.status[ld] == RUNNING):
                    cancelled[s] = run.actions[s]
                # a start (or its weight load) still running is cancelled when it ends (see _completed)
        return Progress(cancelled=tuple(cancelled.values()), failed=tuple(failed))

    def _release(self) -> Progress:
        """Every pending action whose dependencies succeeded and whose GPUs no earlier plan still holds."""
        begin: list[Action] = []
        held: set[str] = set()
        for rid in sorted(self._runs):
            run = self._runs[rid]
            mine: set[str] = set()
            for i in sorted(run.actions):
                a = run.actions[i]
                st = run.status[i]
                if st == PENDING and all(run.status[d] == DONE for d in a.after) and not (set(a.gpus) & held):
                    run.status[i] = RUNNING
                    begin.append((rid, a))
                    st = RUNNING
                if st in (PENDING, RUNNING):
                    mine.update(a.gpus)
            held |= mine
        return Progress(begin=tuple(begin))


def _ancestors(actions: dict[int, Action], i: int) -> set[int]:
    out: set[int] = set()
    stack = list(actions[i].after)
    while stack:
        d = stack.pop()
        if d not in out:
            out.add(d)
            stack.extend(actions[d].after)
    return out
