"""One planning step: state -> program -> solution -> Decision (with proof and diagnosis)."""

from __future__ import annotations

from dataclasses import replace

from planner.backends import solve
from planner.decision import Decision, GroupTarget, SolverProof
from planner.inputs import PlanningInputs
from planner import mixed
from planner.milp import Options, PlanningProblem, Solution, batch_completion_ms, batch_paths_ms, build_problem, completion_ms, diagnose, evaluate, group_transition_ms, split_to_nodes
from planner.mixed import MixedProblem
from planner.state import ROLES, ClusterState
from planner.uniform import solve_slots


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


def mixed_decision_from(problem: MixedProblem, x: tuple[tuple[int, ...], ...], proof: SolverProof, objective_ms: int | None = None) -> Decision:
    """`decision_from` for a mixed layout: targets carry (role, TP, instances) per node."""
    t = mixed.completion_ms(problem, x)
    t_batch, t_paths = mixed.batch_completion_ms(problem, x), mixed.batch_paths_ms(problem, x)
    trans = sum(mixed.group_transition_ms(g, v) for g, v in zip(problem.groups, x)) + problem.constant_ms
    targets, lent, tot = [], 0, [0, 0, 0]
    per_node: dict = {}  # (slots, a node's counts) -> its role totals, layout and GPUs: folded nodes repeat them
    for g, gx in zip(problem.groups, x):
        for node, v in mixed.split_mixed(g, gx):
            if not any(v):
                continue
            if (got := per_node.get((g.slots, v))) is None:
                got = per_node[(g.slots, v)] = ([sum(n for (r, _), n in zip(g.slots, v) if r == role) for role in range(3)],
                                                tuple((ROLES[r], tp, n) for (r, tp), n in zip(g.slots, v) if n),
                                                sum(tp * n for (_, tp), n in zip(g.slots, v)))
            counts, layout, gpus = got
            targets.append(GroupTarget(node, g.pool, g.gpu_type, *counts, layout=layout))
            lent += gpus if g.pool == "training" else 0
            tot = [a + b for a, b in zip(tot, counts)]
    mode = "colocated" if tot[0] > 0 else "disaggregated"
    obj = (t or 0) + trans if objective_ms is None else objective_ms
    return Decision(mode, tot[0], tot[1], tot[2], tuple(targets), (t_batch or 0) / 1000.0, trans / 1000.0, int(obj), proof, lent,  # type: ignore[arg-type]
                    earliest_completion_s=(t_paths or 0) / 1000.0, shares=mixed.routing_shares(problem, x))


def build_any(state: ClusterState, inputs: PlanningInputs, now_s: float, options: Options = Options()) -> PlanningProblem | MixedProblem:
    """The program of this step: the mixed one when the inputs carry per-(role, type, TP) tables."""
    return mixed.build_mixed_problem(state, inputs, now_s, options) if inputs.mixed else build_problem(state, inputs, now_s, options)


def current_x(problem: PlanningProblem | MixedProblem) -> tuple[tuple[int, ...], ...]:
    """The current instances as an assignment of `problem`."""
    if isinstance(problem, MixedProblem):
        return tuple(tuple(g.total_cur(i) for i in range(len(g.slots))) for g in problem.groups)
    return tuple((g.total_cur(0), g.total_cur(1), g.total_cur(2)) for g in problem.groups)


def evaluate_any(problem: PlanningProblem | MixedProblem, x: tuple[tuple[int, ...], ...]) -> int | None:
    """Layout x's objective, whatever the entry pruning of a mixed problem kept (`mixed.exact_for`)."""
    return mixed.evaluate_mixed(mixed.exact_for(problem, x), x) if isinstance(problem, MixedProblem) else evaluate(problem, x)  # type: ignore[arg-type]


def decision_for(problem: PlanningProblem | MixedProblem, x: tuple[tuple[int, ...], ...], proof: SolverProof, objective_ms: int | None = None) -> Decision:
    if isinstance(problem, MixedProblem):
        return mixed_decision_from(mixed.exact_for(problem, x), x, proof, objective_ms)
    return decision_from(problem, x, proof, objective_ms)  # type: ignore[arg-type]


def proof_of(sol: Solution) -> SolverProof:
    return SolverProof(sol.status, float(sol.objective_ms), float(sol.best_bound_ms), sol.gap, sol.solve_ms, sol.backend)  # type: ignore[arg-type]


def solve_step(state: ClusterState, inputs: PlanningInputs, now_s: float, options: Options = Options(), backend: str | None = None,
               built: MixedProblem | None = None) -> tuple[PlanningProblem, Solution, Decision | None]:
    """Solve the program; on infeasibility say which constraint family causes it. `built`: the
    mixed program of these arguments already built (`first_mixed_problem`), to solve as is."""
    settings = inputs.solver
    be = backend or settings.backend
    if inputs.mixed:
        return _solve_mixed_step(state, inputs, now_s, options, be, built)
    problem = build_problem(state, inputs, now_s, options)

    def run(p: PlanningProblem) -> Solution:
        return solve(p, be, settings.time_limit_s, settings.workers, settings.seed, settings.relative_gap)

    sol = (solve_slots(problem) if settings.slot_pricing else None) or run(problem)
    if sol.status in ("optimal", "feasible"):
        return problem, sol, decision_from(problem, sol.x, proof_of(sol), sol.objective_ms)
    if sol.status == "infeasible":
        fam = diagnose(problem, lambda relax: build_problem(state, inputs, now_s, replace(options, relax=relax)), run)
        sol = replace(sol, infeasible_family=fam)
    return problem, sol, None


def first_mixed_problem(state: ClusterState, inputs: PlanningInputs, now_s: float, options: Options) -> MixedProblem:
    """The mixed program a step solves first: nodes that run the same instances folded (below)."""
    return mixed.build_mixed_problem(state, inputs, now_s, replace(options, fold_running=options.aggregate))


def _solve_mixed_step(state: ClusterState, inputs: PlanningInputs, now_s: float, options: Options, backend: str, built: MixedProblem | None = None):
    """solve_step for mixed layouts; infeasibility is diagnosed by relaxing one family at a time."""
    settings = inputs.solver

    def run(p: MixedProblem) -> Solution:
        return mixed.solve_mixed(p, backend, settings.time_limit_s, settings.workers, settings.seed, gap=settings.relative_gap,
                                 exact_backend=settings.exact_backend)

    # nodes that run the same instances folded first (a relaxation: fewer groups, no symmetric
    # layouts to enumerate); its layout stands when it splits back onto the nodes at the price
    # it was charged, else the nodes are solved apart (exact either way: mixed.splits_at_price)
    problem = built if built is not None else first_mixed_problem(state, inputs, now_s, options)
    sol = run(problem)
    if sol.status in ("optimal", "feasible") and not mixed.splits_at_price(problem, sol.x):
        problem = mixed.build_mixed_problem(state, inputs, now_s, replace(options, fold_running=False))
        sol = run(problem)
    if sol.status in ("optimal", "feasible"):
        return problem, sol, mixed_decision_from(problem, sol.x, proof_of(sol), sol.objective_ms)
    if sol.status == "infeasible" and sol.infeasible_family is None:
        fam = next((f for f in ("policy", "borrow_window", "memory")
                    if run(mixed.build_mixed_problem(state, inputs, now_s, replace(options, relax=(f,)))).status in ("optimal", "feasible")), "availability")
        sol = replace(sol, infeasible_family=fam)
    return problem, sol, None
