"""Planner policies inside the simulator: the planner decides from the simulator's cluster state.

The simulator names GPUs, nodes and workers as the planner and the Ray runtime do
(`runtime/naming.py`) and the plan runs through the shared executor, so this adapter only
calls the policy and keeps going when it cannot decide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from models.builder import ExperimentModels
from planner.inputs import PlanningInputs, planning_inputs
from planner.policies import PlanningError, get_policy
from planner.state import ClusterState
from planner.transition import TransitionPlan
from runtime.gc_pause import gc_deferred
from runtime.sim.layout import PolicyStep
from runtime.timeline import prior_batch_s

NO_PLAN = TransitionPlan((), 0, 0, 0, 0, 0)


@dataclass
class PlannerPolicy:
    """Wraps `planner.policies.get_policy(name)`; plans with `models` (its view of the system)."""

    name: str
    models: ExperimentModels
    failures: int = 0  # decisions the planner could not make (kept the current layout)
    record: list | None = None  # a list: each decision's (now, event, state, inputs, planner Step) is appended (experiments/mixed_why.py)
    predicted_s: float = field(init=False, default=math.nan)  # its batch time before its first decision
    _inputs: PlanningInputs = field(init=False, repr=False)

    def __post_init__(self) -> None:
        spec = self.models.spec
        self._policy = get_policy(self.name)
        self._inputs = planning_inputs(self.models, sum(g.count * g.gpus_per_node for g in spec.cluster.nodes))
        self.predicted_s = prior_batch_s(self._inputs, spec.cluster.gpus_in_pool("rollout"))

    def decide(self, state: ClusterState, inputs: PlanningInputs, now: float, event: str) -> PolicyStep:
        try:
            with gc_deferred():
                step = self._policy.decide(state, self._inputs, now, event)
        except PlanningError as exc:
            # no decision this time (e.g. the solver's time limit ran out): keep the current layout
            self.failures += 1
            mode = "disaggregated" if any(w.role != "colocated" for w in state.workers) else "colocated"
            return PolicyStep(NO_PLAN, mode, math.nan, {"error": str(exc)})
        if self.record is not None:
            self.record.append((now, event, state, self._inputs, step))
        d = step.decision
        info = {
            "ratio": d.ratio, "applied": d.applied, "lent_gpus": d.lent_gpus, "predicted_s": round(d.predicted_completion_s, 2),
            "status": d.proof.status, "gap": d.proof.gap, "solve_ms": round(d.proof.solve_ms, 2), "reason": d.reason,
            "actions": len(step.plan.actions),
        }
        if by_type := d.layout_by_type():  # mixed layouts: instances per GPU type, role and TP degree
            info["layout_by_type"] = by_type
        return PolicyStep(step.plan, d.mode, d.timeline_s, info, d.shares)
