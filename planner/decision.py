"""What one planning step decides, and the solver's proof that it is the best under the model."""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["colocated", "disaggregated"]
ProofStatus = Literal["optimal", "feasible", "infeasible", "no_solution", "evaluated"]


@dataclass(frozen=True)
class SolverProof:
    """How sure we are. Objective and bound are in the model's integer unit (milliseconds).

    status: optimal (proven), feasible (time limit hit; `gap` says how far from proven),
    infeasible (`infeasible_family` names the constraint family responsible),
    no_solution (time limit with nothing found), evaluated (no solve: a fixed configuration
    priced by the same objective, e.g. 'keep the current one').
    """

    status: ProofStatus
    objective: float
    best_bound: float
    gap: float
    solve_ms: float
    backend: str
    infeasible_family: str | None = None

    @property
    def proven_optimal(self) -> bool:
        return self.status == "optimal"


@dataclass(frozen=True)
class GroupTarget:
    """Target engine instances on one interchangeable GPU group (node, pool, type)."""

    node: str
    pool: str
    gpu_type: str
    colocated: int = 0
    prefill: int = 0
    decode: int = 0
    # mixed layouts: (role, TP degree, instances) per slot; empty when every role has one degree
    layout: tuple[tuple[str, int, int], ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.node, self.pool, self.gpu_type)

    def count(self, role: str) -> int:
        return int(getattr(self, role))

    def slots(self, tp: dict[str, int]) -> dict[tuple[str, int], int]:
        """Instances per (role, TP degree); `tp` gives each role's degree when there is no layout."""
        if self.layout:
            return {(r, t): n for r, t, n in self.layout if n}
        return {(r, tp[r]): self.count(r) for r in ("colocated", "prefill", "decode") if self.count(r)}


@dataclass(frozen=True)
class Decision:
    """Mode, ratio and placement of rollout instances, with predicted completion and cost.

    `predicted_completion_s` is a fresh batch's completion with these counts; `objective_ms`
    prices only the work left (R of B trajectories, planner/milp.py) plus the transition.
    `applied` is False when a policy's gate kept the current configuration; then the
    targets, prediction and objective are the current ones, `proof` is the solver's proof of
    the optimum the gate rejected, and `reason` says why.
    """

    mode: Mode
    colocated: int
    prefill: int
    decode: int
    targets: tuple[GroupTarget, ...]
    predicted_completion_s: float
    transition_cost_s: float
    objective_ms: int
    proof: SolverProof
    lent_gpus: int = 0  # training GPUs serving rollout in the target
    applied: bool = True
    forced: bool = False  # the current configuration was infeasible: the gate was bypassed
    reason: str = ""
    extras: dict = field(default_factory=dict, compare=False, hash=False)
    # the paths alone, without the prefill queue: the earliest the model lets the batch end.
    # The trainer's timeline plans returns of lent GPUs on it, so a queue that does not
    # materialise cannot make a return late (nan: same as predicted_completion_s)
    earliest_completion_s: float = math.nan
    # mixed layouts: the share of a batch one instance of each (role, GPU type, TP) kind carries
    # at the predicted operating point (1/k; 0: the prediction idles the kind). The router splits
    # the load by these (runtime/router.py), as the prediction assumes; empty: equal instances
    shares: tuple[tuple[str, str, int, float], ...] = ()

    @property
    def timeline_s(self) -> float:
        """The batch time the trainer's timeline assumes for this decision."""
        return self.earliest_completion_s if math.isfinite(self.earliest_completion_s) else self.predicted_completion_s

    @property
    def ratio(self) -> str:
        return f"{self.prefill}P{self.decode}D" if self.mode == "disaggregated" else f"{self.colocated}C"

    @property
    def instances(self) -> int:
        return self.colocated + self.prefill + self.decode

    def per_node(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for t in self.targets:
            d = out.setdefault(t.node, {"colocated": 0, "prefill": 0, "decode": 0})
            for r in ("colocated", "prefill", "decode"):
                d[r] += t.count(r)
        return {n: d for n, d in out.items() if any(d.values())}

    def layout_by_type(self) -> dict[str, dict[str, dict[int, int]]]:
        """Mixed layouts: instances per GPU type, role and TP degree (empty for a single degree per role)."""
        out: dict[str, dict[str, dict[int, int]]] = {}
        for t in self.targets:
            for r, tp, n in t.layout:
                if n:
                    by_tp = out.setdefault(t.gpu_type, {}).setdefault(r, {})
                    by_tp[tp] = by_tp.get(tp, 0) + n
        return out

    def to_json(self) -> dict:
        out = {
            "mode": self.mode, "ratio": self.ratio, "colocated": self.colocated, "prefill": self.prefill, "decode": self.decode,
            "per_node": self.per_node(), "lent_gpus": self.lent_gpus,
            "predicted_completion_s": round(self.predicted_completion_s, 4), "transition_cost_s": round(self.transition_cost_s, 4),
            "objective_ms": self.objective_ms, "applied": self.applied, "forced": self.forced, "reason": self.reason,
            "extras": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.extras.items()},
            "proof": {
                "status": self.proof.status, "objective": self.proof.objective, "best_bound": self.proof.best_bound,
                "gap": self.proof.gap, "solve_ms": round(self.proof.solve_ms, 3), "backend": self.proof.backend,
                "infeasible_family": self.proof.infeasible_family,
            },
        }
        if by_type := self.layout_by_type():
            out["layout_by_type"] = {ty: {r: {str(t): n for t, n in d.items()} for r, d in roles.items()} for ty, roles in by_type.items()}
        if self.shares:
            out["shares"] = [{"role": r, "gpu_type": ty, "tp": t, "share": round(w, 6)} for r, ty, t, w in self.shares]
        return out
