"""From the current state and a decision to concrete, ordered actions with the fewest role changes.

Filled in below the value types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
