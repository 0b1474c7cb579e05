"""Solver backends for the planning program (see planner/milp.py for the model).

`linear_model` writes the program once as plain data (variables, rows, objective); CP-SAT,
MathOpt/HiGHS, HiGHS's own API (`highspy`) and pywraplp CBC/SCIP translate that data. PuLP is modelled independently in
planner/pulp_model.py, so a slip in this builder shows up as a disagreement in the tests.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from planner.milp import PlanningProblem, Solution, completion_ms, evaluate, policy_contradiction

if TYPE_CHECKING:
    from ortools.sat.python.cp_model_helper import CpModelProto

BACKENDS = ("cpsat", "highs", "highspy", "cbc", "scip", "pulp")


@dataclass
class LinearModel:
    """min c.x + const  s.t.  lo <= A x <= hi,  integer x in [lb, ub]."""

    lb: list[int] = field(default_factory=list)
    ub: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    rows: list[tuple[list[tuple[int, int]], float, float]] = field(default_factory=list)
    obj: dict[int, int] = field(default_factory=dict)
    const: int = 0
    x: list[list[int | None]] = field(default_factory=list)  # per group, per role: var index or None
    T: int = -1
    queue: list[tuple[int, int]] = field(default_factory=list)  # (y var, q_ms): completion = T + sum q y

    def var(self, name: str, lb: int, ub: int) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.names.append(name)
        return len(self.lb) - 1

    def row(self, terms: list[tuple[int, int]], lo: float, hi: float) -> None:
        self.rows.append((terms, lo, hi))

    def cost(self, v: int, c: int) -> None:
        if c:
            self.obj[v] = self.obj.get(v, 0) + c

    def policy_rows(self, prefill: list[tuple[int, int]], decode: list[tuple[int, int]], gpus: list[tuple[int, int]],
                    fixed_pd: tuple[int, int] | None, max_gpus: int | None) -> None:
        """A fixed P:D (exact instance counts) and a cap on the GPUs all instances occupy."""
        if fixed_pd is not None:
            self.row(prefill, fixed_pd[0], fixed_pd[0])
            self.row(decode, fixed_pd[1], fixed_pd[1])
        if max_gpus is not None:
            self.row(gpus, -INF, max_gpus)

    def flow(self, name: str, x: int, ub: int, cur: int, start_ms: int, stop_ms: int) -> tuple[int, int]:
        """Starts d and stops s of instances x from `cur` current ones (d - s = x - cur), priced."""
        d = self.var(f"d[{name}]", 0, ub)
        s = self.var(f"s[{name}]", 0, cur)
        self.row([(d, 1), (s, -1), (x, -1)], -cur, -cur)
        self.cost(d, start_ms)
        self.cost(s, stop_ms)
        return d, s


INF = math.inf


def linear_model(p: PlanningProblem) -> LinearModel:
    """The program as data. Contradictory options have no valid mode bounds: the solve_*
    functions answer those with `Solution.contradictory` before building anything."""
    why = policy_contradiction(p)
    if why is not None:
        raise ValueError(f"contradictory options: {why}")
    lm = LinearModel(const=p.constant_ms)
    tp = p.tp
    role_vars: list[list[tuple[int, int]]] = [[], [], []]  # (var, coef) for N_r
    gpu_terms: list[tuple[int, int]] = []
    classes = p.tp_classes()
    for gi, g in enumerate(p.groups):
        xs: list[int | None] = [None, None, None]
        cap_terms = []
        ds: list[int | None] = [None, None, None]
        ss: list[int | None] = [None, None, None]
        for r in range(3):
            ub = g.ub(r, tp[r])
            if ub == 0 and g.cur[r] == 0:
                continue
            v = lm.var(f"x[{gi},{r}]", 0, ub)
            xs[r] = v
            role_vars[r].append((v, 1))
            gpu_terms.append((v, tp[r]))
            cap_terms.append((v, tp[r]))
            if g.cur[r] == 0 and not any(g.cur):
                lm.cost(v, g.start_ms[r])
                continue
            ds[r], ss[r] = lm.flow(f"{gi},{r}", v, ub, g.total_cur(r), g.start_ms[r], g.stop_ms[r])
        if cap_terms:
            lm.row(cap_terms, -INF, g.total_cap)
        for roles in classes:
            save = p.switch_saving(g, roles)
            if save <= 0 or not any(g.cur[r] for r in roles):
                continue
            dd = [(ds[r], 1) for r in roles if ds[r] is not None]
            sv = [(ss[r], 1) for r in roles if ss[r] is not None]
            if not dd or not sv:
                continue
            u = lm.var(f"u[{gi}]", 0, sum(g.total_cur(r) for r in roles))
            lm.row([(u, 1)] + [(v, -c) for v, c in dd], -INF, 0)
            lm.row([(u, 1)] + [(v, -c) for v, c in sv], -INF, 0)
            lm.cost(u, -save)
        lm.x.append(xs)
    # mode and one-hot selection over pruned tables
    lo_m = 0 if "colocated" in p.modes and p.fixed_pd is None else 1
    hi_m = 1 if "disaggregated" in p.modes else 0
    m = lm.var("m", lo_m, hi_m)
    t_max = max([t for e in p.entries for _, t, _ in e] + [0])
    T = lm.var("T", 0, t_max)
    lm.T = T
    lm.cost(T, 1)
    for r in range(3):
        n_max = sum(lm.ub[v] for v, _ in role_vars[r])
        k_max = p.max_instances(r)
        ys = []
        for k, t, q in p.entries[r]:
            if k > k_max:
                continue
            y = lm.var(f"y[{r},{k}]", 0, 1)
            ys.append((y, k, t))
            if q:  # the entry's queueing comes on top of the slower path: a linear cost
                lm.cost(y, q)
                lm.queue.append((y, q))
        lm.row([(y, 1) for y, _, _ in ys], 1, 1)
        y0 = ys[0][0]
        # role unused <=> entry 0: colocated when m = 1, prefill/decode when m = 0
        if r == 0:
            lm.row([(y0, 1), (m, -1)], 0, 0)
            if role_vars[r]:
                lm.row(role_vars[r] + [(m, max(n_max, 1))], -INF, max(n_max, 1))  # N_C <= M (1 - m)
        else:
            lm.row([(y0, 1), (m, 1)], 1, 1)
            if role_vars[r]:
                lm.row(role_vars[r] + [(m, -max(n_max, 1))], -INF, 0)  # N_r <= M m
        # N_r >= sum k y_k ; T >= sum t_k y_k
        lm.row(role_vars[r] + [(y, -k) for y, k, _ in ys if k], 0, INF)
        lm.row([(T, 1)] + [(y, -t) for y, _, t in ys if t], 0, INF)
    lm.policy_rows(role_vars[1], role_vars[2], gpu_terms, p.fixed_pd, p.max_gpus)
    return lm


@dataclass(frozen=True)
class Raw:
    """What a solver returned for a LinearModel, before it is read back as a Solution."""

    values: list[float] | None
    status: str
    objective: float
    bound: float
    ms: float
    backend: str


def read_back(lm: LinearModel, raw: Raw, n_groups: int, width: int = 3) -> Solution:
    """A Solution from solver values: per group the `lm.x` variables (None: 0), completion = T + queue."""
    if raw.values is None:
        return Solution(raw.status, tuple((0,) * width for _ in range(n_groups)), 0, 0, raw.bound, raw.ms, raw.backend)  # type: ignore[arg-type]
    values = raw.values
    x = tuple(tuple(int(round(values[v])) if v is not None else 0 for v in xs) for xs in lm.x)
    completion = int(round(values[lm.T])) + sum(q * int(round(values[y])) for y, q in lm.queue)
    return Solution(raw.status, x, completion, int(round(raw.objective)), raw.bound, raw.ms, raw.backend)  # type: ignore[arg-type]


def _solution(p: PlanningProblem, lm: LinearModel, raw: Raw) -> Solution:
    """The layout the solver found, priced from its definition where that is lower: T, Q and the
    entry selection are auxiliary, and a solve stopped within a gap (or its time limit) may
    leave them above their minimum."""
    sol = read_back(lm, raw, len(p.groups))
    if raw.values is None:
        return sol
    obj = evaluate(p, sol.x)
    if obj is None or obj >= sol.objective_ms:
        return sol
    return replace(sol, objective_ms=obj, completion_ms=completion_ms(p, sol.totals()) or 0)


# ------------------------------------------------------------------------------------- CP-SAT
def solve_cpsat(p: PlanningProblem, time_limit_s: float, workers: int = 8, seed: int = 0, deterministic_limit_s: float | None = None, gap: float = 0.0) -> Solution:
    """CP-SAT stops at the wall-clock limit or at the same amount of deterministic time
    (reproducible on an idle machine), whichever comes first."""
    if (bad := Solution.contradictory(p, "cpsat")) is not None:
        return bad
    t0 = time.perf_counter()
    lm = linear_model(p)
    return _solution(p, lm, cpsat_model(lm, time_limit_s, workers, seed, deterministic_limit_s, t0, gap))


def cpsat_model(lm: LinearModel, time_limit_s: float, workers: int = 8, seed: int = 0, deterministic_limit_s: float | None = None, t0: float | None = None,
                gap: float = 0.0, small: bool = False) -> Raw:
    """small: a program of tens of variables (the mixed search's corner programs), solved with a
    light presolve: no probing, no symmetry detection, one presolve pass. A one-variable program
    then takes 0.18 ms instead of 1.2; 84 recorded mixed searches (2026-12-05) took 14-21% less
    time at 256 GPUs and found the same layouts."""
    from ortools.sat.python import cp_model_helper

    t0 = time.perf_counter() if t0 is None else t0
    params = cp_model_helper.SatParameters()
    params.log_search_progress = False  # never on stdout: `--json` output shares it
    params.num_workers = workers
    params.random_seed = seed
    params.max_time_in_seconds = time_limit_s
    params.max_deterministic_time = deterministic_limit_s if deterministic_limit_s is not None else time_limit_s
    params.relative_gap_limit = gap
    if small:
        params.cp_model_probing_level = 0
        params.symmetry_level = 0
        params.max_presolve_iterations = 1
    solver = cp_model_helper.SolveWrapper()
    solver.set_parameters(params)
    response = solver.solve(cpsat_proto(lm))
    ms = (time.perf_counter() - t0) * 1000
    st = response.status
    if st in (cp_model_helper.CpSolverStatus.OPTIMAL, cp_model_helper.CpSolverStatus.FEASIBLE):
        vals = list(response.solution)
        status = "optimal" if st == cp_model_helper.CpSolverStatus.OPTIMAL else "feasible"
        return Raw(vals, status, response.objective_value, response.best_objective_bound, ms, "cpsat")
    status = "infeasible" if st == cp_model_helper.CpSolverStatus.INFEASIBLE else "no_solution"
    return Raw(None, status, math.inf, -math.inf, ms, "cpsat")


def cpsat_proto(lm: LinearModel) -> CpModelProto:
    """`lm` as a CP-SAT model proto, written field by field.

    Why not `cp_model.CpModel`: with its Python expressions and wrappers a small program (the
    mixed search's corner programs, ~60 variables) cost ~0.9 ms more to build and solve (an empty
    CpModel alone ~0.3 ms), about a third of the time those programs took. The proto is the one `CpModel` writes for the same rows, so CP-SAT solves
    the same model (tests/test_planner_milp.py compares the two field by field): terms merged
    and sorted, a two-sided row as two constraints, an equality as one. A row with no terms is a
    linear constraint on 0 here (CpModel writes a constant bool_or); both hold or fail alike."""
    from ortools.sat.python import cp_model, cp_model_helper

    proto = cp_model_helper.CpModelProto()
    for lb, ub in zip(lm.lb, lm.ub):
        proto.variables.add().domain.extend((int(lb), int(ub)))
    for terms, lo, hi in lm.rows:
        merged: dict[int, int] = {}
        for v, c in terms:
            merged[v] = merged.get(v, 0) + int(c)
        vs = sorted(v for v, c in merged.items() if c)
        cs = [merged[v] for v in vs]
        bounds = [(int(lo), int(lo))] if lo == hi else [
            *([(int(math.ceil(lo)), cp_model.INT_MAX)] if lo != -INF else []),
            *([(cp_model.INT_MIN, int(math.floor(hi)))] if hi != INF else [])]
        for a, b in bounds:
            linear = proto.constraints.add().linear
            linear.vars.extend(vs)
            linear.coeffs.extend(cs)
            linear.domain.extend((a, b))
    objective = proto.objective
    obj = sorted(v for v, c in lm.obj.items() if c)
    objective.vars.extend(obj)
    objective.coeffs.extend(int(lm.obj[v]) for v in obj)
    objective.offset = float(lm.const)
    objective.scaling_factor = 1.0
    return proto


# ------------------------------------------------------------------------------------- MathOpt / HiGHS
def solve_highs(p: PlanningProblem, time_limit_s: float, workers: int = 1, seed: int = 0, gap: float = 0.0) -> Solution:
    if (bad := Solution.contradictory(p, "highs")) is not None:
        return bad
    t0 = time.perf_counter()
    return _solution(p, lm := linear_model(p), highs_model(lm, time_limit_s, seed, t0, gap))


def highs_model(lm: LinearModel, time_limit_s: float, seed: int = 0, t0: float | None = None, gap: float = 0.0) -> Raw:
    import datetime

    from ortools.math_opt.python import mathopt

    t0 = time.perf_counter() if t0 is None else t0
    model = mathopt.Model(name="pearl")
    xs = [model.add_integer_variable(lb=lb, ub=ub) for lb, ub in zip(lm.lb, lm.ub)]
    for terms, lo, hi in lm.rows:
        model.add_linear_constraint(lb=lo, ub=hi, expr=mathopt.LinearSum(c * xs[v] for v, c in terms))
    model.minimize(mathopt.LinearSum(c * xs[v] for v, c in lm.obj.items()) + lm.const)
    # presolve costs more than it saves on these small aggregated models (measured: ~7 -> ~4 ms)
    params = mathopt.SolveParameters(
        time_limit=datetime.timedelta(seconds=time_limit_s), random_seed=seed, relative_gap_tolerance=gap, absolute_gap_tolerance=0.5,
        presolve=mathopt.Emphasis.OFF, enable_output=False,
    )
    res = mathopt.solve(model, mathopt.SolverType.HIGHS, params=params)
    ms = (time.perf_counter() - t0) * 1000
    reason = res.termination.reason
    TR = mathopt.TerminationReason
    if res.has_primal_feasible_solution():
        vals = [res.variable_values(v) for v in xs]
        opt = reason == TR.OPTIMAL
        bound = res.termination.objective_bounds.dual_bound
        return Raw(vals, "optimal" if opt else "feasible", round(res.objective_value()), bound, ms, "highs")
    status = "infeasible" if reason in (TR.INFEASIBLE, TR.INFEASIBLE_OR_UNBOUNDED) else "no_solution"
    return Raw(None, status, math.inf, -math.inf, ms, "highs")


# ------------------------------------------------------------------------------------- HiGHS direct
def solve_highspy(p: PlanningProblem, time_limit_s: float, seed: int = 0, gap: float = 0.0) -> Solution:
    """HiGHS through its own Python API: the model goes in as arrays (no per-term objects)."""
    if (bad := Solution.contradictory(p, "highspy")) is not None:
        return bad
    t0 = time.perf_counter()
    return _solution(p, lm := linear_model(p), highspy_model(lm, time_limit_s, seed, t0, gap))


def highspy_model(lm: LinearModel, time_limit_s: float, seed: int = 0, t0: float | None = None, gap: float = 0.0) -> Raw:
    import highspy
    import numpy as np

    t0 = time.perf_counter() if t0 is None else t0
    h = _quiet_highs()
    h.setOptionValue("presolve", "off")  # costs more than it saves on these small models
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("random_seed", int(seed))
    h.setOptionValue("mip_rel_gap", float(gap))
    h.setOptionValue("mip_abs_gap", 0.5)
    inf = highspy.kHighsInf
    n = len(lm.lb)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, len(lm.rows)
    lp.col_cost_ = np.array([lm.obj.get(i, 0) for i in range(n)], dtype=float)
    lp.col_lower_ = np.array(lm.lb, dtype=float)
    lp.col_upper_ = np.array(lm.ub, dtype=float)
    lp.row_lower_ = np.array([-inf if lo == -INF else lo for _, lo, _ in lm.rows], dtype=float)
    lp.row_upper_ = np.array([inf if hi == INF else hi for _, _, hi in lm.rows], dtype=float)
    starts, idx, val = [0], [], []
    for terms, _, _ in lm.rows:
        merged: dict[int, int] = {}
        for v, c in terms:
            merged[v] = merged.get(v, 0) + c
        idx.extend(merged)
        val.extend(merged.values())
        starts.append(len(idx))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(idx, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(val, dtype=float)
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n
    lp.offset_ = float(lm.const)
    h.passModel(lp)
    h.run()
    ms = (time.perf_counter() - t0) * 1000
    status = h.getModelStatus()
    info = h.getInfo()
    MS = highspy.HighsModelStatus
    if info.primal_solution_status == 2:  # feasible point available
        vals = list(h.getSolution().col_value)
        opt = status == MS.kOptimal
        return Raw(vals, "optimal" if opt else "feasible", round(info.objective_function_value), info.mip_dual_bound, ms, "highspy")
    st = "infeasible" if status in (MS.kInfeasible, MS.kUnboundedOrInfeasible) else "no_solution"
    return Raw(None, st, math.inf, -math.inf, ms, "highspy")


def _quiet_highs():
    """A HiGHS instance that never writes to stdout.

    `highspy.Highs()` prints the "Running HiGHS ..." banner to fd 1 from its constructor
    (its `enableCallbacks` call), before any option can be set (ERGO-Code/HiGHS#1702,
    #2749), which broke `--json` output. The bare binding it wraps has every method used
    here and logs nothing until a solver call, so output_flag is off before the first one.
    """
    import highspy

    h = getattr(highspy, "_Highs", highspy.Highs)()
    h.setOptionValue("output_flag", False)
    return h


# ------------------------------------------------------------------------------------- pywraplp CBC / SCIP
def solve_pywraplp(p: PlanningProblem, time_limit_s: float, engine: str, gap: float = 0.0) -> Solution:
    if (bad := Solution.contradictory(p, engine)) is not None:
        return bad
    t0 = time.perf_counter()
    return _solution(p, lm := linear_model(p), pywraplp_model(lm, time_limit_s, engine, t0, gap))


def pywraplp_model(lm: LinearModel, time_limit_s: float, engine: str, t0: float | None = None, gap: float = 0.0) -> Raw:
    from ortools.linear_solver import pywraplp

    t0 = time.perf_counter() if t0 is None else t0
    solver = pywraplp.Solver.CreateSolver(engine.upper())
    if solver is None:
        raise RuntimeError(f"OR-Tools was built without {engine}")
    solver.SuppressOutput()
    xs = [solver.IntVar(lb, ub, f"v{i}") for i, (lb, ub) in enumerate(zip(lm.lb, lm.ub))]
    inf = solver.infinity()
    for terms, lo, hi in lm.rows:
        ct = solver.Constraint(-inf if lo == -INF else lo, inf if hi == INF else hi)
        for v, c in terms:
            ct.SetCoefficient(xs[v], ct.GetCoefficient(xs[v]) + c)
    obj = solver.Objective()
    for v, c in lm.obj.items():
        obj.SetCoefficient(xs[v], c)
    obj.SetOffset(lm.const)
    obj.SetMinimization()
    solver.SetTimeLimit(int(time_limit_s * 1000))
    params = pywraplp.MPSolverParameters()
    params.SetDoubleParam(pywraplp.MPSolverParameters.RELATIVE_MIP_GAP, gap)
    st = solver.Solve(params)
    ms = (time.perf_counter() - t0) * 1000
    if st in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        vals = [v.solution_value() for v in xs]
        return Raw(vals, "optimal" if st == pywraplp.Solver.OPTIMAL else "feasible", round(obj.Value()), obj.BestBound(), ms, engine)
    status = "infeasible" if st == pywraplp.Solver.INFEASIBLE else "no_solution"
    return Raw(None, status, math.inf, -math.inf, ms, engine)


def solve_model(lm: LinearModel, backend: str, time_limit_s: float = 1.0, workers: int = 8, seed: int = 0, gap: float = 0.0, small: bool = False) -> Raw:
    """Solve a program given as data (the mixed-layout program of planner/mixed.py uses this;
    PuLP here translates the same data, so it is not an independent formulation there).
    small: see `cpsat_model` (the other backends ignore it)."""
    t0 = time.perf_counter()
    if backend == "cpsat":
        return cpsat_model(lm, time_limit_s, workers, seed, t0=t0, gap=gap, small=small)
    if backend == "highs":
        return highs_model(lm, time_limit_s, seed, t0, gap)
    if backend == "highspy":
        return highspy_model(lm, time_limit_s, seed, t0, gap)
    if backend in ("cbc", "scip"):
        return pywraplp_model(lm, time_limit_s, backend, t0, gap)
    if backend == "pulp":
        from planner.pulp_model import pulp_model

        return pulp_model(lm, time_limit_s, t0, gap)
    raise ValueError(f"unknown backend {backend!r}; one of {BACKENDS}")


def solve(p: PlanningProblem, backend: str, time_limit_s: float = 1.0, workers: int = 8, seed: int = 0, gap: float = 0.0) -> Solution:
    """The program on `backend`; "optimal" is proven within the relative `gap` (0: exact; the
    objective is whole ms, so every backend also stops within 0.5 ms absolute)."""
    if backend == "cpsat":
        return solve_cpsat(p, time_limit_s, workers, seed, gap=gap)
    if backend == "highs":
        return solve_highs(p, time_limit_s, seed=seed, gap=gap)
    if backend == "highspy":
        return solve_highspy(p, time_limit_s, seed, gap)
    if backend in ("cbc", "scip"):
        return solve_pywraplp(p, time_limit_s, backend, gap)
    if backend == "pulp":
        from planner.pulp_model import solve_pulp

        return solve_pulp(p, time_limit_s, gap)
    raise ValueError(f"unknown backend {backend!r}; one of {BACKENDS}")
