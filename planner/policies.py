"""Policies: one interface for PEARL, its ablations and the baselines.

INTERFACE (stable; the simulator and the Ray runtime build on it)
    policy = get_policy(name)                     # "pearl", "pearl-no-borrow", "pearl-fixed-pd",
                                                  # "pearl-no-gate", "roll", "rlboost+"
    inputs = planning_inputs(models, max_gpus)    # planner.inputs: tables + costs, once per refit
    step   = policy.decide(state, inputs, now_s, event="availability")
    step.decision : planner.decision.Decision     # mode, ratio, per-node targets, proof, applied?
    step.plan     : planner.transition.TransitionPlan   # ordered actions with dependencies
  `state` is a planner.state.ClusterState (GPUs, workers, trainer phase, R/B). `event` is one of
  EVENTS (informational; the policy reacts to the state itself). Policies are frozen values
  without memory: hysteresis comes from comparing against the configuration in the state.
  Applying `step.plan` and reporting back a new ClusterState is the runtime's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from planner.decision import Decision
from planner.inputs import PlanningInputs
from planner.state import ClusterState
from planner.transition import TransitionPlan

Event = Literal["initial", "training_begin", "training_end", "availability", "preempt_notice", "rollout_step"]
EVENTS: tuple[str, ...] = ("initial", "training_begin", "training_end", "availability", "preempt_notice", "rollout_step")


@dataclass(frozen=True)
class Step:
    decision: Decision
    plan: TransitionPlan


class Policy(Protocol):
    name: str

    def decide(self, state: ClusterState, inputs: PlanningInputs, now_s: float, event: str = "availability") -> Step: ...
