"""The planning program modelled a second time, independently, in PuLP (solved with CBC).

Same data as planner/backends.py but a different formulation of the transition: explicit
flows f[g, from, to] of current instances (kept: from == to; switched: same TP only),
plus stops and starts, instead of aggregated start/stop counts and a switch count. The
tests require both formulations to reach the same optimum as exhaustive enumeration.
CBC runs as a subprocess with temporary files: the one backend that touches disk.
"""

from __future__ import annotations

import math
import time
import warnings

# OR-Tools' native library before PuLP, always. Importing PuLP (3.3) loads highspy's HiGHS
# into the process's global symbol scope (RTLD_GLOBAL); OR-Tools, loaded after that, binds its
# own HiGHS calls to highspy's copy, a different HiGHS version, and the next MathOpt/HiGHS
# solve crashes the process (SIGSEGV in HighsSolver::New). Loaded first, OR-Tools keeps its own.
import ortools.linear_solver.pywraplp  # noqa: F401  (for its load order only)
import pulp

from planner.milp import PlanningProblem, Solution, completion_ms, evaluate


def solve_pulp(p: PlanningProblem, time_limit_s: float, gap: float = 0.0) -> Solution:
    if (bad := Solution.contradictory(p, "pulp")) is not None:  # the `dis` bounds below would cross
        return bad
    t0 = time.perf_counter()
    prob = pulp.LpProblem("pearl", pulp.LpMinimize)
    tp = p.tp
    R = range(3)
    X, N, G = {}, {r: [] for r in R}, []
    cost_terms = []
    for gi, g in enumerate(p.groups):
        used = []
        for r in R:
            ub = g.ub(r, tp[r])
            X[gi, r] = prob.add_variable(f"x_{gi}_{r}", 0, ub, cat="Integer")
            N[r].append(X[gi, r])
            G.append(tp[r] * X[gi, r])
            used.append(tp[r] * X[gi, r])
        prob += pulp.lpSum(used) <= g.total_cap, f"cap_{gi}"
        flows = {}
        for a in R:
            for b in R:
                if g.cur[a] and tp[a] == tp[b]:
                    flows[a, b] = prob.add_variable(f"f_{gi}_{a}_{b}", 0, g.total_cur(a), cat="Integer")
        for a in R:
            stop = prob.add_variable(f"stop_{gi}_{a}", 0, g.total_cur(a), cat="Integer")
            prob += pulp.lpSum(flows[a, b] for b in R if (a, b) in flows) + stop == g.total_cur(a), f"out_{gi}_{a}"
            cost_terms.append(g.stop_ms[a] * stop)
        for b in R:
            start = prob.add_variable(f"start_{gi}_{b}", 0, None, cat="Integer")
            prob += pulp.lpSum(flows[a, b] for a in R if (a, b) in flows) + start == X[gi, b], f"in_{gi}_{b}"
            cost_terms.append(g.start_ms[b] * start)
        for (a, b), f in flows.items():
            if a != b:
                cost_terms.append(g.switch_ms[b] * f)
    dis = prob.add_variable("dis", 0 if "colocated" in p.modes and p.fixed_pd is None else 1, 1 if "disaggregated" in p.modes else 0, cat="Integer")
    T = prob.add_variable("T", 0, None)
    queue = []  # (q_ms, selection): the prefill queue rides on the completion, T + sum q sel
    for r in R:
        cap_r = sum(g.ub(r, tp[r]) for g in p.groups)
        sel = {k: prob.add_variable(f"sel_{r}_{k}", 0, 1, cat="Binary") for k, _, _ in p.entries[r] if k <= cap_r}
        prob += pulp.lpSum(sel.values()) == 1, f"onehot_{r}"
        off = sel[0]
        prob += (off == dis) if r == 0 else (off == 1 - dis), f"off_{r}"
        big = max(cap_r, 1)
        prob += (pulp.lpSum(N[r]) <= big * (1 - dis)) if r == 0 else (pulp.lpSum(N[r]) <= big * dis), f"mode_{r}"
        prob += pulp.lpSum(N[r]) >= pulp.lpSum(k * v for k, v in sel.items()), f"count_{r}"
        t_of = {k: t for k, t, _ in p.entries[r]}
        prob += T >= pulp.lpSum(t_of[k] * v for k, v in sel.items()), f"time_{r}"
        queue += [(q, sel[k]) for k, _, q in p.entries[r] if q and k in sel]
    if p.fixed_pd is not None:
        prob += pulp.lpSum(N[1]) == p.fixed_pd[0], "fixed_p"
        prob += pulp.lpSum(N[2]) == p.fixed_pd[1], "fixed_d"
    if p.max_gpus is not None:
        prob += pulp.lpSum(G) <= p.max_gpus, "max_gpus"
    prob += T + pulp.lpSum(q * v for q, v in queue) + pulp.lpSum(cost_terms) + p.constant_ms
    with warnings.catch_warnings():  # PuLP 3.3 flags PULP_CBC_CMD for its 4.0 rename; it is the bundled CBC
        warnings.simplefilter("ignore", DeprecationWarning)
        solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, gapRel=gap, gapAbs=0.5)
        prob.solve(solver)
    ms = (time.perf_counter() - t0) * 1000
    status = pulp.LpStatus[prob.status]
    sol_status = prob.sol_status
    if status == "Optimal" and sol_status == pulp.LpSolutionOptimal:
        st = "optimal"
    elif sol_status in (pulp.LpSolutionIntegerFeasible,) or (status == "Optimal" and sol_status != pulp.LpSolutionOptimal):
        st = "feasible"
    elif status == "Infeasible":
        return Solution("infeasible", tuple((0, 0, 0) for _ in p.groups), 0, 0, -math.inf, ms, "pulp")
    else:
        return Solution("no_solution", tuple((0, 0, 0) for _ in p.groups), 0, 0, -math.inf, ms, "pulp")
    x = tuple(tuple(int(round(X[gi, r].value() or 0)) for r in R) for gi in range(len(p.groups)))
    obj = int(round(pulp.value(prob.objective)))
    # PuLP's CBC interface reports no dual bound: a proven optimum is within the gap of the objective
    bound = float(obj) * (1.0 - gap) if st == "optimal" else -math.inf
    completion = int(round(T.value())) + sum(q * int(round(v.value() or 0)) for q, v in queue)
    priced = evaluate(p, x)  # T and the selection are auxiliary: within a gap they may sit above their minimum
    if priced is not None and priced < obj:
        obj, completion = priced, completion_ms(p, tuple(sum(v[r] for v in x) for r in R)) or 0  # type: ignore[arg-type]
    return Solution(st, x, completion, obj, bound, ms, "pulp")  # type: ignore[arg-type]


def pulp_model(lm, time_limit_s: float, t0: float | None = None, gap: float = 0.0):
    """A program given as data (planner.backends.LinearModel) solved through PuLP's CBC: the
    mixed-layout program's PuLP path translates the same rows as the other backends."""
    from planner.backends import INF, Raw

    t0 = time.perf_counter() if t0 is None else t0
    prob = pulp.LpProblem("pearl_mixed", pulp.LpMinimize)
    xs = [prob.add_variable(f"v{i}", lb, ub, cat="Integer") for i, (lb, ub) in enumerate(zip(lm.lb, lm.ub))]
    for i, (terms, lo, hi) in enumerate(lm.rows):
        expr = pulp.lpSum(c * xs[v] for v, c in terms)
        if lo == hi:
            prob += expr == lo, f"r{i}"
            continue
        if lo != -INF:
            prob += expr >= lo, f"r{i}lo"
        if hi != INF:
            prob += expr <= hi, f"r{i}hi"
    prob += pulp.lpSum(c * xs[v] for v, c in lm.obj.items()) + lm.const
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        prob.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, gapRel=gap, gapAbs=0.5))
    ms = (time.perf_counter() - t0) * 1000
    status = pulp.LpStatus[prob.status]
    value = pulp.value(prob.objective)
    obj = round(value) if value is not None else lm.const  # None: an objective without variables
    if status == "Optimal" and prob.sol_status == pulp.LpSolutionOptimal:
        return Raw([v.value() or 0.0 for v in xs], "optimal", obj, float(obj) * (1.0 - gap), ms, "pulp")
    if prob.sol_status == pulp.LpSolutionIntegerFeasible:
        return Raw([v.value() or 0.0 for v in xs], "feasible", obj, -math.inf, ms, "pulp")
    return Raw(None, "infeasible" if status == "Infeasible" else "no_solution", math.inf, -math.inf, ms, "pulp")
