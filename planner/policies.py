"""Policies: one interface for PEARL, its ablations and the baselines.

INTERFACE (stable; the simulator and the Ray runtime build on it)
    policy = get_policy(name)                     # "pearl", "pearl-no-borrow", "pearl-fixed-pd",
                                                  # "pearl-no-gate", "roll", "rlboost+", "rlboost+pd"
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

from dataclasses import dataclass, replace
from typing import Literal, Protocol

import numpy as np

from models.predictor import best_split
from planner.decision import Decision, SolverProof
from planner.inputs import PlanningInputs
from planner.milp import Options, borrow_window_open, remaining_fraction
from planner.mixed import MixedProblem, batch_completion_floor_ms
from planner.solve import build_any, current_x, decision_for, evaluate_any, first_mixed_problem, solve_step
from planner.state import ClusterState
from planner.transition import TransitionPlan, build_plan

Event = Literal["initial", "training_begin", "training_end", "availability", "preempt_notice", "rollout_step", "return_due"]
# return_due: the borrow window is about to close (lent GPUs must start back to be in time)
EVENTS: tuple[str, ...] = ("initial", "training_begin", "training_end", "availability", "preempt_notice", "rollout_step", "return_due")


@dataclass(frozen=True)
class Step:
    decision: Decision
    plan: TransitionPlan


class Policy(Protocol):
    name: str

    def decide(self, state: ClusterState, inputs: PlanningInputs, now_s: float, event: str = "availability") -> Step: ...


# ----------------------------------------------------------------------------- implementations
class PlanningError(RuntimeError):
    """No configuration found; the message names the constraint family (or the time limit)."""

    def __init__(self, message: str, status: str = "infeasible") -> None:
        super().__init__(message)
        self.status = status


def _solve_or_raise(state: ClusterState, inputs: PlanningInputs, now_s: float, options: Options, backend: str | None, built: MixedProblem | None = None):
    problem, sol, decision = solve_step(state, inputs, now_s, options, backend, built)
    if decision is None:
        fam = sol.infeasible_family or sol.status
        raise PlanningError(f"no feasible rollout configuration ({sol.status}; constraint family: {fam})", sol.status)
    return problem, sol, decision


def best_static_split(inputs: PlanningInputs, instances: int) -> tuple[int, int]:
    """The best P:D split of `instances` by the prediction tables (the 'fixed PD' choice).

    The split is the predictor's `best_split` (max(prefill, decode) + prefill queue) over the
    tables the planner solves with, the decode path its table's envelope (the best with up to
    k instances). The prefill side is taken as tabulated, path and queue together: serving
    with fewer prefill instances than a split holds is the split with more decode ones, which
    the scan also covers, so this is the program's optimum over splits of `instances`."""
    n = max(instances, 2)
    n_p = np.arange(1, n)
    at = np.minimum(n_p, inputs.prefill.max_instances)
    p, q = inputs.prefill.seconds[at], inputs.prefill.queue[at]  # type: ignore[index]
    d = np.minimum.accumulate(inputs.decode.seconds[1:])[np.minimum(n - n_p, inputs.decode.max_instances) - 1]
    k = best_split(p, d, q)
    return k, n - k


@dataclass(frozen=True)
class PearlPolicy:
    """Solve the program; borrow by Eq. 7; switch only past a hysteresis margin.

    borrow: training GPUs may serve rollout between updates, if (R/B)(T_ded - T_borrow)
      exceeds lend + return cost x transition_weight (+ borrow_threshold_s); T_borrow is the optimum with
      borrowing allowed (what would run), T_ded the optimum on dedicated GPUs only, both
      fresh-batch predictions. The toggle (lend + return) is charged once: gated policies
      solve with training-GPU starts priced without it and let Eq. 7 charge it in full;
      without the gate the objective prices it and the lower objective wins. R/B = 0 (the
      batch is complete) counts as 1: the loan would serve the next, fresh batch. On a mixed
      cluster a floor on T_ded that alone makes the loan pay settles it without the dedicated
      search (`_dedicated_floor_s`).
    gate: a new configuration replaces the current one only if its objective (the work left,
      priced as in planner/milp.py, + transition cost per horizon batch) beats the current
      one's by margin x the current one's priced completion (a relative gain of the work left);
      margin = mode_switch_margin for colocated <-> disaggregated, ratio_change_margin when
      surviving workers change role or stop, 0 for pure growth / forced shrink. A current
      configuration that became infeasible (preemption, recall) is a forced switch: no gate.
    fixed_pd: keep disaggregation at the best static P:D proportion (ablation / RLBoost+).
    """

    name: str = "pearl"
    borrow: bool = True
    gate: bool = True
    fixed_pd: bool = False
    elastic: bool = True
    pools: tuple[str, ...] = ("rollout", "elastic", "training")
    modes: tuple[str, ...] = ("colocated", "disaggregated")
    backend: str | None = None

    def options(self, state: ClusterState, inputs: PlanningInputs, borrow: bool) -> Options:
        """The program's options for one solve, with or without borrowing training GPUs."""
        opts = Options(allow_borrow=borrow, allow_elastic=self.elastic, pools=self.pools, modes=self.modes, toggle_in_objective=not self.gate)
        if self.fixed_pd:
            tp = inputs.tp("decode")
            nominal = sum(1 for g in state.gpus if g.pool in ("rollout", "elastic")) // tp
            p, d = best_static_split(inputs, nominal)
            usable = sum(g.usable for g in state.gpus if g.pool in ("rollout", "elastic")) + (
                state.usable_count("training") if borrow else 0
            )
            total = max(usable // tp, 2)
            n_p = min(max(1, round(total * p / (p + d))), total - 1)
            opts = replace(opts, modes=("disaggregated",), fixed_pd=(n_p, total - n_p))
        return opts

    def _solve(self, state: ClusterState, inputs: PlanningInputs, now_s: float, borrow: bool):
        opts = self.options(state, inputs, borrow)
        try:
            return _solve_or_raise(state, inputs, now_s, opts, self.backend)
        except PlanningError:
            if not self.fixed_pd:
                raise
        # the exact static split does not fit this availability: keep the mode, free the counts
        return _solve_or_raise(state, inputs, now_s, replace(opts, fixed_pd=None), self.backend)

    def _keep_on_timeout(self, state: ClusterState, inputs: PlanningInputs, now_s: float, exc: PlanningError) -> Step:
        """The time limit passed with no solution at all: keep the current configuration if it is feasible."""
        problem = build_any(state, inputs, now_s, self.options(state, inputs, borrow=False))
        x_cur = current_x(problem)
        obj = evaluate_any(problem, x_cur)
        if obj is None:
            raise exc
        proof = SolverProof("no_solution", float(obj), float("-inf"), float("inf"), 0.0, self.backend or inputs.solver.backend)
        keep = replace(decision_for(problem, x_cur, proof), applied=False, reason="solver time limit without a solution: kept the current configuration")
        return Step(keep, build_plan(state, keep, inputs, now_s))

    def _dedicated_floor_s(self, state: ClusterState, inputs: PlanningInputs, now_s: float, options: Options, t_full_s: float, toggle_s: float) -> tuple[float | None, MixedProblem]:
        """On a mixed cluster: a floor on T_ded (`mixed.batch_completion_floor_ms` of the program
        without borrowing) where it alone makes Eq. 7 lend, else None; and that program, built
        once for the solve that then needs it.

        Why: the loan's benefit only grows with T_ded, so a floor past the toggle settles the
        gate, and the dedicated optimum (the slower search: fewer GPUs, tighter layouts; ~1 s of
        the 256-GPU bench walk's slowest decision) is never used. The decision is the one the
        solved T_ded gives; its extras report the floor, `t_dedicated_bound: true`."""
        dedicated = first_mixed_problem(state, inputs, now_s, options)
        floor_ms = batch_completion_floor_ms(dedicated)
        if floor_ms is None:  # nothing covers without the loan: the solve says why, as before
            return None, dedicated
        floor_s = floor_ms / 1000.0
        if remaining_fraction(state.unfinished_fraction) * (floor_s - t_full_s) > toggle_s + inputs.weights.borrow_threshold_s:
            return floor_s, dedicated
        return None, dedicated

    def decide(self, state: ClusterState, inputs: PlanningInputs, now_s: float, event: str = "availability") -> Step:
        can_borrow = self.borrow and borrow_window_open(state, inputs, now_s) and state.usable_count("training") > 0
        extras: dict = {"event": event}
        # the transition weight scales every transition price, the Eq. 7 toggle included: else a
        # heavy weight would make loans (free in the gated objective) cheaper than elastic starts
        toggle = (inputs.costs.lend_s + inputs.costs.return_s) * inputs.weights.transition_weight
        floor_s = None  # a floor on T_ded that alone makes the loan pay (then T_ded is not solved for)
        try:
            borrowed = self._solve(state, inputs, now_s, borrow=True) if can_borrow else None
            if borrowed is not None and borrowed[2].lent_gpus == 0 and not self.fixed_pd:
                # the optimum with borrowing lends nothing, so it is also the optimum without
                # (same prices on the common assignments): one solve instead of two
                problem, sol, cand = borrowed
                t = cand.predicted_completion_s
                extras.update(t_dedicated_s=t, t_dedicated_bound=False, t_borrow_s=t, borrow_benefit_s=0.0, toggle_s=toggle, borrow=False)
                borrowed = None
            elif borrowed is not None and self.gate and not self.fixed_pd and inputs.mixed:
                opts = self.options(state, inputs, borrow=False)
                floor_s, dedicated = self._dedicated_floor_s(state, inputs, now_s, opts, borrowed[2].predicted_completion_s, toggle)
                if floor_s is None:
                    problem, sol, cand = _solve_or_raise(state, inputs, now_s, opts, self.backend, dedicated)
            else:
                problem, sol, cand = self._solve(state, inputs, now_s, borrow=False)
        except PlanningError as exc:
            if exc.status != "no_solution":
                raise
            return self._keep_on_timeout(state, inputs, now_s, exc)
        if borrowed is not None:
            p_b, s_b, cand_b = borrowed
            t_ded, t_full = floor_s if floor_s is not None else cand.predicted_completion_s, cand_b.predicted_completion_s
            benefit = remaining_fraction(state.unfinished_fraction) * (t_ded - t_full)
            ok = benefit > toggle + inputs.weights.borrow_threshold_s if self.gate else cand_b.objective_ms < cand.objective_ms
            extras.update(t_dedicated_s=t_ded, t_dedicated_bound=floor_s is not None, t_borrow_s=t_full, borrow_benefit_s=benefit, toggle_s=toggle, borrow=bool(ok))
            if ok:
                problem, sol, cand = p_b, s_b, cand_b
        cand = replace(cand, extras=extras)
        plan = build_plan(state, cand, inputs, now_s)
        if not self.gate:
            return Step(replace(cand, reason="ungated"), plan)
        x_cur = current_x(problem)
        if not any(any(v) for v in x_cur):
            return Step(replace(cand, forced=True, reason="no serving workers: start the optimum"), plan)
        obj_cur = evaluate_any(problem, x_cur)
        if obj_cur is None:
            return Step(replace(cand, forced=True, reason="current configuration infeasible: forced switch"), plan)
        keep = decision_for(problem, x_cur, SolverProof("evaluated", float(obj_cur), float(obj_cur), 0.0, 0.0, "none"))
        if keep.targets == cand.targets:
            return Step(replace(cand, reason="already optimal"), plan)
        if keep.mode != cand.mode:
            margin, kind = inputs.weights.mode_switch_margin, "mode switch"
        elif plan.role_changes or _voluntary_leaves(state, plan, cand):
            margin, kind = inputs.weights.ratio_change_margin, "ratio change"
        else:
            margin, kind = 0.0, "scale change"
        gain_ms = obj_cur - cand.objective_ms
        need_ms = margin * problem.work * keep.predicted_completion_s * 1000.0
        if gain_ms > need_ms:
            return Step(replace(cand, reason=f"{kind}: gain {gain_ms / 1000:.2f} s > margin {need_ms / 1000:.2f} s"), plan)
        # the proof stays the solver's (of the optimum the gate rejected): its status and time are real
        kept = replace(keep, proof=cand.proof, applied=False, extras=extras, reason=f"gated {kind}: gain {gain_ms / 1000:.2f} s <= margin {need_ms / 1000:.2f} s")
        return Step(kept, build_plan(state, kept, inputs, now_s))


def _voluntary_leaves(state: ClusterState, plan: TransitionPlan, decision: Decision) -> bool:
    """Does the plan stop a worker whose GPUs stay usable and in a group the decision keeps using?"""
    used = {t.node for t in decision.targets}
    for a in plan.actions:
        if a.kind == "stop" and all(state.gpu(g).usable for g in a.gpus) and state.gpu(a.gpus[0]).node in used:
            return True
    return False


POLICIES: dict[str, PearlPolicy] = {
    "pearl": PearlPolicy("pearl"),
    "pearl-no-borrow": PearlPolicy("pearl-no-borrow", borrow=False),
    "pearl-fixed-pd": PearlPolicy("pearl-fixed-pd", fixed_pd=True),
    "pearl-no-gate": PearlPolicy("pearl-no-gate", gate=False),
    # ROLL: the reserved rollout GPUs only, colocated, nothing elastic, no borrowing
    "roll": PearlPolicy("roll", borrow=False, gate=False, elastic=False, pools=("rollout",), modes=("colocated",)),
    # RLBoost+ as the paper defines it: PD-colocated engines scaled by data parallelism over the
    # reserved and preemptible GPUs (it harvests elastic GPUs at once), no borrowing
    "rlboost+": PearlPolicy("rlboost+", borrow=False, gate=False, modes=("colocated",)),
    # our stronger variant: the same GPUs, disaggregated at the best static P:D split
    "rlboost+pd": PearlPolicy("rlboost+pd", borrow=False, gate=False, fixed_pd=True),
}


def get_policy(name: str, backend: str | None = None) -> PearlPolicy:
    """A policy by name (models.config.PolicySpec.name); unknown names raise KeyError listing the known ones."""
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; one of {sorted(POLICIES)}")
    pol = POLICIES[name]
    return replace(pol, backend=backend) if backend else pol
