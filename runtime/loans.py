"""Training GPUs on loan to rollout, and whether they came back in time: measured, never assumed.

Both runtimes record here when a lend begins and when a return ends, and when the trainer
needs its GPUs (its batch is ready). A GPU still out at that moment is a late return; the
training step waits until the last one is back, and that wait is its delay. The runtime
does not force a GPU back on its own: the planner's recall (drain, stop, return) brings it
back, so a plan that misjudges the trainer's timeline shows up here as lateness.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoanLedger:
    out: dict[str, float] = field(default_factory=dict)  # GPU -> when its loan began
    late_returns: int = 0  # GPUs still out when the trainer needed them
    train_delay_s: float = 0.0  # training steps waited for late GPUs, in total
    delays: list[float] = field(default_factory=list)  # each delayed step's wait
    needed_at: float | None = None  # set while the trainer waits for GPUs to come back
    lends: int = 0
    returns: int = 0

    def lend(self, gpus: tuple[str, ...], now: float) -> None:
        for g in gpus:
            if g not in self.out:
                self.out[g] = now
                self.lends += 1

    def returned(self, gpus: tuple[str, ...], now: float) -> bool:
        """Record a return; True if this was the last GPU the waiting trainer needed."""
        for g in gpus:
            if self.out.pop(g, None) is not None:
                self.returns += 1
        if self.needed_at is not None and not self.out:
            delay = now - self.needed_at
            self.train_delay_s += delay
            self.delays.append(round(delay, 6))
            self.needed_at = None
            return True
        return False

    def trainer_needs(self, now: float) -> bool:
        """The trainer wants its GPUs now. True if all are home (training may start)."""
        if not self.out:
            return True
        self.late_returns += len(self.out)
        self.needed_at = now
        return False

    @property
    def lent(self) -> tuple[str, ...]:
        return tuple(sorted(self.out))
