"""What one simulation reports: counters, time series, and the paper's throughput."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SimResult:
    policy: str
    hours: float
    seed: int
    sim_s: float = 0.0
    events: int = 0
    launched: int = 0
    finished: int = 0
    in_flight: int = 0
    lost_trajectories: int = 0
    resumed: int = 0
    preempted_instances: int = 0
    generated_tokens: float = 0.0
    trained_tokens: float = 0.0
    steps: int = 0
    train_busy_s: float = 0.0
    decisions: int = 0
    policy_failures: int = 0  # the policy could not decide (infeasible, solver limit): the layout was kept
    failure: str | None = None  # the first such decision's reason, so a 0 tokens/s run says why
    mode_switches: int = 0
    role_switches: int = 0
    starts: int = 0
    stops: int = 0
    lends: int = 0
    returns: int = 0
    late_returns: int = 0  # lent GPUs still out when the trainer needed them (runtime/loans.py)
    train_delay_s: float = 0.0  # training steps waited for late GPUs, in total
    forced_returns: int = 0  # GPUs taken back with no planned return (a policy that never recalled)
    admission_pause_s: float = 0.0
    wall_s: float = 0.0
    policy_wall_s: float = 0.0  # wall time spent inside the policy (solver), part of wall_s
    batch_times_s: list = field(default_factory=list)
    train_times_s: list = field(default_factory=list)
    train_wait_s: list = field(default_factory=list)
    step_end_times_s: list = field(default_factory=list)
    series: list = field(default_factory=list)
    elastic_series: list = field(default_factory=list)
    decision_log: list = field(default_factory=list)

    # ------------------------------------------------------------- derived
    @property
    def switches(self) -> int:
        """Role changes of running instances plus mode changes (colocated <-> disaggregated)."""
        return self.role_switches + self.mode_switches

    @property
    def failed_all(self) -> bool:
        """The policy never produced a working layout: every decision failed, or failures left it no engine."""
        return failed_every_decision(self.policy_failures, self.decisions, self.starts)

    @property
    def steps_per_h(self) -> float:
        return self.steps / (self.sim_s / 3600.0) if self.sim_s else 0.0

    @property
    def trajectories_per_h(self) -> float:
        return self.finished / (self.sim_s / 3600.0) if self.sim_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        """The paper's throughput: (rollout-generated tokens + trained tokens) per second."""
        return (self.generated_tokens + self.trained_tokens) / self.sim_s if self.sim_s else 0.0

    @property
    def rollout_share(self) -> float:
        """Share of end-to-end time in which the trainer is not training (it waits on rollout)."""
        return 1.0 - min(self.train_busy_s / self.sim_s, 1.0) if self.sim_s else 0.0

    @property
    def mean_batch_s(self) -> float:
        return sum(self.batch_times_s) / len(self.batch_times_s) if self.batch_times_s else float("nan")

    @property
    def mean_step_interval_s(self) -> float:
        t = self.step_end_times_s
        return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else float("nan")

    def summary(self) -> dict:
        """The `pearl compare --json` contract, plus a few extras."""
        return {
            "steps_per_h": round(self.steps_per_h, 3),
            "trajectories_per_h": round(self.trajectories_per_h, 2),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "rollout_share": round(self.rollout_share, 4),
            "switches": self.switches,
            "lost_trajectories": self.lost_trajectories,
            "late_returns": self.late_returns,
            "train_delay_s": round(self.train_delay_s, 3),
            "steps": self.steps,
            "trajectories": self.finished,
            "in_flight": self.in_flight,
            "generated_tokens": int(self.generated_tokens),
            "trained_tokens": int(self.trained_tokens),
            "mean_batch_s": round(self.mean_batch_s, 2) if self.batch_times_s else None,
            "mean_step_interval_s": round(self.mean_step_interval_s, 2) if len(self.step_end_times_s) > 1 else None,
            "role_switches": self.role_switches,
            "mode_switches": self.mode_switches,
            "starts": self.starts,
            "stops": self.stops,
            "lends": self.lends,
            "returns": self.returns,
            "forced_returns": self.forced_returns,
            "preempted_instances": self.preempted_instances,
            "resumed_requests": self.resumed,
            "admission_pause_s": round(self.admission_pause_s, 1),
            "decisions": self.decisions,
            "policy_failures": self.policy_failures,
            "failure": self.failure,
            "policy_wall_s": round(self.policy_wall_s, 2),
            "events": self.events,
            "hours": self.hours,
            "seed": self.seed,
        }

    def utilization(self) -> dict:
        """Mean GPUs per pool:role and mean busy fraction per role over the run."""
        if not self.series:
            return {}
        keys = sorted({k for s in self.series for k in s["gpus"]})
        gpus = {k: round(sum(s["gpus"].get(k, 0) for s in self.series) / len(self.series), 2) for k in keys}
        roles = sorted({r for s in self.series for r in s["util"]})
        util = {}
        for r in roles:
            vals = [s["util"][r] for s in self.series if any(k.endswith(":" + r) for k in s["gpus"])]
            util[r] = round(sum(vals) / len(vals), 4) if vals else 0.0
        return {"mean_gpus": gpus, "busy_fraction": util}

    def solver(self) -> dict:
        """The planner's decisions: how many were proven optimal and the solver's wall time per
        decision (wall-clock, so apart from `summary`, whose simulated quantities repeat per seed);
        empty for a policy that does not solve (a fixed layout)."""
        proofs = [info for _, _, _, info in self.decision_log if "solve_ms" in info]
        if not proofs:
            return {}
        ms = np.array([float(info["solve_ms"]) for info in proofs])
        return {"decisions": len(proofs), "proven_optimal": sum(info["status"] == "optimal" for info in proofs),
                "solve_ms_p50": round(float(np.percentile(ms, 50)), 1), "solve_ms_p95": round(float(np.percentile(ms, 95)), 1),
                "solve_ms_max": round(float(ms.max()), 1)}

    def to_json(self, series: bool = False) -> dict:
        out = {"policy": self.policy, **self.summary(), "utilization": self.utilization(), "wall_s": round(self.wall_s, 3)}
        if solver := self.solver():
            out["solver"] = solver
        if series:
            out["series"] = self.series
            out["elastic_series"] = self.elastic_series
        return out


def failed_every_decision(failures: int, decisions: int, starts: int) -> bool:
    """True when a run's throughput is meaningless because its policy never got a layout running."""
    return failures > 0 and (failures >= decisions or starts == 0)


def failure_warning(who: str, failures: int, decisions: int, starts: int, reason: str | None) -> str:
    """The one stderr line for a policy that failed decisions (the tables would only show 0 tokens/s)."""
    none_ran = ", no engine ever ran" if starts == 0 else ""
    return f"pearl: warning: {who} failed {failures} of {decisions} decisions{none_ran}; first failure: {reason or 'no reason given'}"


def layout_label(by_type: dict[str, dict[str, dict[int, int]]]) -> dict[str, str]:
    """Per GPU type: its instances as `<n><role initial>@TP<d>` terms, e.g. {'H20': '3D@TP4'}."""
    return {ty: " ".join(f"{n}{r[0].upper()}@TP{tp}" for r, by_tp in sorted(roles.items()) for tp, n in sorted(by_tp.items()))
            for ty, roles in sorted(by_type.items())}


def longest_held_layout(decision_log: list, horizon_s: float) -> dict[str, str]:
    """Per GPU type, the layout (`layout_label`) the applied decisions held longest over the run.

    A decision's layout holds from its time until the next applied decision; mixed layouts only
    (decisions without `layout_by_type` in their info are not counted)."""
    applied = [(t, info["layout_by_type"]) for t, _, _, info in decision_log if info.get("applied") and "layout_by_type" in info]
    held: dict[str, dict[str, float]] = {}
    for i, (t, by_type) in enumerate(applied):
        end = applied[i + 1][0] if i + 1 < len(applied) else horizon_s
        for ty, label in layout_label(by_type).items():
            held.setdefault(ty, {})
            held[ty][label] = held[ty].get(label, 0.0) + max(end - t, 0.0)
    return {ty: max(d.items(), key=lambda kv: kv[1])[0] for ty, d in sorted(held.items())}
