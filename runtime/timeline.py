"""The trainer's timeline as both runtimes estimate it: when it next needs its GPUs, and how
long its step takes.

While the trainer waits for a batch, it needs its GPUs once that batch is done: expected
batch time minus the time the batch has already run. The expected time is the plan's
prediction for the layout it chose (the layout may have just changed, so the last batches
measured another one); the mean of the last few measured batches stands in when there is
no prediction. A wrong prediction therefore shows up as a late return, measured.

Within one batch the expected need time only moves earlier: the shortest prediction made
since the batch began holds. Returning lent GPUs makes the next prediction (a fresh batch on
fewer GPUs) longer, and without this the window that forced the return would reopen and
lend the same GPUs again just before the batch ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from models.config import ExperimentSpec
from models.training import training_step_s
from planner.milp import borrow_window_closes_at

RECENT_BATCHES = 4
DUE_EPS_S = 1e-3  # the borrow window is open up to and including its closing instant


@dataclass
class TrainerTimeline:
    batch_s: list[float] = field(default_factory=list)  # measured rollout batch durations, oldest first
    batch_best_s: float = math.inf  # the shortest prediction made during the batch in rollout

    def batch_done(self, seconds: float) -> None:
        self.batch_s.append(float(seconds))
        self.batch_best_s = math.inf

    def expected_batch_s(self, predicted_s: float) -> float:
        """The plan's prediction for the layout it chose; the recent measured mean without one."""
        if math.isfinite(predicted_s):
            return predicted_s
        if self.batch_s:
            recent = self.batch_s[-RECENT_BATCHES:]
            return sum(recent) / len(recent)
        return 0.0

    def needs_gpus_at(self, now: float, waiting: bool, elapsed_s: float, predicted_s: float) -> float:
        """Absolute time the trainer wants its GPUs (now unless it is waiting for a batch)."""
        if not waiting:
            return now
        if math.isfinite(predicted_s):
            self.batch_best_s = predicted_s = min(self.batch_best_s, predicted_s)
        return now + max(self.expected_batch_s(predicted_s) - max(elapsed_s, 0.0), 0.0)


def return_due_at(trainer: Any, inputs: Any, now: float, loans_out: bool) -> float | None:
    """When to decide again so that lent GPUs start back in time: just after the borrow window
    closes (`trainer`: planner TrainerPhase). None while nothing is lent, the trainer is not
    waiting, or the window has already closed (the decision just made saw it closed)."""
    if not loans_out or trainer.phase != "waiting":
        return None
    at = borrow_window_closes_at(trainer, inputs) + DUE_EPS_S
    return at if at > now else None


def prior_batch_s(inputs: Any, rollout_gpus: int) -> float:
    """Predicted batch time on the reserved rollout GPUs, colocated (`inputs`: planner
    PlanningInputs): the timeline's estimate before any decision has predicted one."""
    k = min(rollout_gpus // inputs.tp("colocated"), inputs.colocated.max_instances)
    return float(inputs.colocated.seconds[k]) if k >= 1 else math.nan


def train_step_s(spec: ExperimentSpec, tokens: float) -> float:
    """Predicted training step on the spec's training pool (1 s when it has no training GPUs)."""
    groups = [g for g in spec.cluster.nodes if g.pool == "training"]
    if not groups:
        return 1.0
    n = spec.cluster.gpus_in_pool("training")
    return float(training_step_s(spec.model, spec.gpu(groups[0].gpu), n, tokens, spec.training.mfu, spec.training.optimizer_overhead_s))


def expected_batch_tokens(spec: ExperimentSpec) -> float:
    """Tokens the trainer gets from one batch: its trajectories cut at the token budget, as rolled out."""
    from models.predictor import batch_shape

    return batch_shape(spec.workload).trajectory_tokens()
