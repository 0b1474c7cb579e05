"""One planning step: state -> program -> solution -> Decision (with proof and diagnosis)."""

from __future__ import annotations

from dataclasses import replace

from planner.backends import solve
from planner.decision import Decision, GroupTarget, SolverProof
from planner.inputs import PlanningInputs
from planner.milp import Options, PlanningProblem, Solution, batch_completion_ms, batch_paths_ms, build_problem, completion_ms, diagnose, group_transition_ms, split_to_nodes
from planner.state import ClusterState


def decision_from(problem: PlanningProblem, x: tuple[tuple[int, int, int], ...], proof: SolverProof, objective_ms: int | None = None) -> Decision:
    """A Decision for assignment `x` of `problem` (targets, prediction, cost recomputed).

    The prediction is a fresh batch's completion; the objective prices only the work left
    (milp.py, Objective), so objective - transition cost = the priced completion."""
    tot = tuple(sum(v[r] for v in x) for r in range(3))
    t = completion_ms(problem, tot)  # type: ignore[arg-type]
    t_batch = batch_completion_ms(problem, tot)  # type: ignore[arg-type]
    t_paths = batch_paths_ms(problem, tot)  # type: ignore[arg-type]
    trans = sum(group_transition_ms(problem, g, v) for g, v in zip(problem.groups, x)) + problem.constant_ms
    targets = tuple(GroupTarget(node, g.pool, g.gpu_type, *v) for g, gx in zip(problem.groups, x) for node, v in split_to_nodes(problem, g, gx) if any(v))
    lent = sum(problem.tp[r] * v[r] for g, v in zip(problem.groups, x) for r in range(3) if g.pool == "training")
    mode = "colocated" if tot[0] > 0 else "disaggregated"
    obj = (t or 0) + trans if objective_ms is None else objective_ms
    return Decision(mode, tot[0], tot[1], tot[2], targets, (t_batch or 0) / 1000.0, trans / 1000.0, int(obj), proof, lent,  # type: ignore[arg-type]
                    earliest_completion_s=(t_paths or 0) / 1000.0)


def proof_of(sol: Solution) -> SolverProof:
    return SolverProof(sol.status, float(sol.objective_ms), float(sol.best_bound_ms), sol.gap, sol.solve_ms, sol.backend)  # type: ignore[arg-type]


def solve_step(state: ClusterState, inputs: PlanningInputs, now_s: float, options: Options = Options(), backend: str | None = None) -> tuple[PlanningProblem, Solution, Decision | None]:
    """Solve the program; on infeasibility say which constraint family causes it."""
    settings = inputs.solver
    be = backend or settings.backend
    problem = build_problem(state, inputs, now_s, options)

    def run(p: PlanningProblem) -> Solution:
        return solve(p, be, settings.time_limit_s, settings.workers, settings.seed)

    sol = run(problem)
    if sol.status in ("optimal", "feasible"):
        return problem, sol, decision_from(problem, sol.x, proof_of(sol), sol.objective_ms)
    if sol.status == "infeasible":
        fam = diagnose(problem, lambda relax: build_problem(state, inputs, now_s, replace(options, relax=relax)), run)
        sol = replace(sol, infeasible_family=fam)
    return problem, sol, None
