"""What a Ray run reports, and the ways it can stop: values and exceptions, no behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class RuntimeStartError(RuntimeError):
    """Something the run needs could not start (an engine, the model, Ray): one clear line."""


class RunFailed(RuntimeError):
    """The run stopped early for a stated cause (a slot past its restart bound): one clear line."""


class TrajectoryFailed(RuntimeError):
    """A trajectory given up with a recorded reason (its request killed engines repeatedly)."""


@dataclass(frozen=True)
class EngineDied:
    """A request's engine died under it (not stopped by us): the error it died with."""

    worker: str
    error: str


@dataclass(frozen=True)
class RunSummary:
    steps: int
    weight_version: int
    mean_reward: float
    transitions_applied: int
    modes_used: list[str]
    lost_trajectories: int
    late_returns: int
    decisions: int
    solve_ms_p95: float
    resumed_turns: int
    worker_versions: dict[str, int]
    kv_handoffs: int
    rewards: list[float]
    failed_trajectories: list[dict[str, str]] = field(default_factory=list)
    worker_failures: dict[str, int] = field(default_factory=dict)
    weights_verified: int = 0  # (push, engine) pairs whose probe log-probs matched the trainer's
    weights_mismatched: int = 0
    train_delay_s: float = 0.0  # training steps waited for late GPUs (virtual seconds), in total
    forced_returns: int = 0  # lent GPUs taken back with no planned return
    predictions: list[dict[str, Any]] = field(default_factory=list)  # per step: StepTelemetry.prediction()
    profile: str = ""  # the engine profile the predictor started from
    steps_detail: list[dict[str, Any]] = field(default_factory=list)  # per training step (trainer_loop.step_detail)
    control: str = "none"  # a learning test's negative control, if one ran (runtime.control)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # per planner node: Ray node, slots, workers placed (node_watch)
    node_events: list[dict[str, Any]] = field(default_factory=list)  # Ray nodes lost and joined during the run
    placement_mismatches: int = 0  # workers that ran on another Ray node than their slot's
    services: dict[str, str] = field(default_factory=dict)  # driver, trainer, env -> Ray node (on a cluster: all the head)
    pd_profile: str | None = None  # the P/D instances' own profile, where the deployment names one (`profile_by_engines`)
    speed: float = 1.0  # the tracker's engine speed at the end (x the profiles' step times)
    type_speeds: dict[str, float] = field(default_factory=dict)  # and per GPU type on a mixed cluster, relative (RuntimeTracker.refit_type_speeds)

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps, "weight_version": self.weight_version, "mean_reward": round(self.mean_reward, 6),
            "transitions_applied": self.transitions_applied, "modes_used": self.modes_used,
            "lost_trajectories": self.lost_trajectories, "failed_trajectories": self.failed_trajectories,
            "worker_failures": self.worker_failures, "late_returns": self.late_returns,
            "train_delay_s": round(self.train_delay_s, 3), "forced_returns": self.forced_returns,
            "decisions": self.decisions, "solve_ms_p95": round(self.solve_ms_p95, 3), "kv_handoffs": self.kv_handoffs,
            "weights_verified": self.weights_verified, "weights_mismatched": self.weights_mismatched,
            "profile": self.profile, "pd_profile": self.pd_profile, "prediction_error_pct": [p["error_pct"] for p in self.predictions], "predictions": self.predictions,
            "control": self.control, "steps_detail": self.steps_detail,
            "nodes": self.nodes, "node_events": self.node_events, "placement_mismatches": self.placement_mismatches,
            "services": self.services, "speed": round(self.speed, 4), "type_speeds": {k: round(v, 4) for k, v in self.type_speeds.items()},
        }


def error_text(exc: BaseException) -> str:
    """One line for an engine's error: the exception raised inside the actor, not Ray's wrapper."""
    cause = getattr(exc, "cause", None) or exc
    return f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"[:400]


def actor_errors() -> tuple[type[BaseException], ...]:
    import ray.exceptions as rex

    return (rex.RayActorError, rex.ActorUnavailableError)
