"""Policy options (modes, pools, fixed P:D, GPU cap, borrowing) are exact on every backend.

For seeded random small instances under random `Options`, at random decision times around
the borrow window's edge, each backend's optimum equals the brute-force oracle's
(tests/planner_cases.py, written from the definitions, calling no planner function), and
both agree on infeasibility. The solver's assignment is also checked against the options
directly. A coverage test makes sure every option actually changes the optimum in some
cases, so a backend that ignored one would fail.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from functools import cache

import numpy as np
import pytest

from models.config import CostWeights
from planner.backends import BACKENDS, solve
from planner.inputs import ActionCosts, MemoryModel, PlanningInputs, RoleTable, SolverSettings
from planner.milp import Options, build_problem, evaluate
from planner.solve import solve_step
from planner.state import GPU, ClusterState, TrainerPhase
from planner.uniform import solve_slots
from planner_cases import allowed_pools, borrow_window_is_open, oracle, random_inputs, random_now, random_option_fields, random_state

FOCUS = ("modes", "pools", "fixed_pd", "max_gpus", "borrow", "mixed")
PER_FOCUS = 30


@dataclass(frozen=True)
class Case:
    focus: str
    state: ClusterState
    inputs: PlanningInputs
    now_s: float
    options: Options
    unrestricted: int  # the oracle's optimum under Options() (every case is feasible without options)


def _cases() -> list[Case]:
    rng = random.Random(20260511)
    out = []
    while len(out) < PER_FOCUS * len(FOCUS):
        focus = FOCUS[len(out) % len(FOCUS)]
        tps = rng.choice([(1, 1, 1), (2, 2, 2), (1, 1, 2), (2, 1, 2)])
        inputs = random_inputs(rng, tps)
        state = random_state(rng, tps)
        if focus in ("borrow", "mixed"):  # training GPUs and a trainer that may lend them
            if not any(g.pool == "training" and g.usable for g in state.gpus):
                continue
            state = replace(state, trainer=TrainerPhase(rng.choice(["waiting", "waiting", "training"]), rng.choice([5.0, 20.0, 1000.0])))
        now = random_now(rng, state, inputs)
        base = oracle(state, inputs, now)
        if base is None:  # infeasible whatever the options (covered by test_planner_milp): no signal here
            continue
        if focus == "fixed_pd" and oracle(state, inputs, now, Options(modes=("disaggregated",))) is None:
            continue  # no P:D split at all would fit
        gpus = sum(g.usable for g in state.gpus)
        out.append(Case(focus, state, inputs, now, Options(**random_option_fields(rng, focus, tps, gpus)), base))
    return out


CASES = _cases()


@cache
def want(i: int) -> int | None:
    c = CASES[i]
    return oracle(c.state, c.inputs, c.now_s, c.options)


def _respects_options(case: Case, problem, x) -> None:
    """The assignment obeys the options, checked directly (not through the program)."""
    o = case.options
    tp = problem.tp
    tot = [sum(v[r] for v in x) for r in range(3)]
    colocated = tot[0] > 0 and tot[1] == tot[2] == 0
    disaggregated = tot[0] == 0 and tot[1] > 0 and tot[2] > 0
    assert colocated or disaggregated, tot
    assert ("colocated" if colocated else "disaggregated") in o.modes, (tot, o.modes)
    if o.fixed_pd is not None:
        assert (tot[1], tot[2]) == o.fixed_pd, (tot, o.fixed_pd)
    if o.max_gpus is not None:
        assert sum(tp[r] * tot[r] for r in range(3)) <= o.max_gpus, (tot, o.max_gpus)
    pools = allowed_pools(o)
    if not borrow_window_is_open(case.state.trainer, case.inputs.costs, case.now_s):
        pools.discard("training")
    for g, v in zip(problem.groups, x):
        assert not any(v) or g.pool in pools, (g.pool, v, pools)


@pytest.mark.parametrize("backend", BACKENDS)
def test_options_every_backend_matches_exhaustive_enumeration(backend: str) -> None:
    feasible = infeasible = 0
    for i, case in enumerate(CASES):
        w = want(i)
        problem = build_problem(case.state, case.inputs, case.now_s, case.options)
        sol = solve(problem, backend, time_limit_s=10.0)
        where = (i, case.focus, case.options, case.now_s, backend)
        if w is None:
            assert sol.status == "infeasible", (*where, sol.status, sol.objective_ms)
            infeasible += 1
            continue
        feasible += 1
        assert sol.status == "optimal", (*where, sol.status)
        assert sol.objective_ms == w, (*where, sol.objective_ms, w)
        _respects_options(case, problem, sol.x)
        assert evaluate(problem, sol.x) == w, where  # the solution itself, recomputed
    assert feasible >= 60 and infeasible >= 30, (feasible, infeasible)  # both kinds were exercised


def test_options_slot_pricing_matches_exhaustive_enumeration() -> None:
    """Where planner/uniform.py prices a program directly (one TP degree, roles priced alike) it
    equals brute force under every option it takes (modes, pools, borrowing at the window's
    edge) and obeys them; fixed P:D counts and GPU caps are left to the MILP."""
    answered = {f: 0 for f in FOCUS}
    for i, case in enumerate(CASES):
        problem = build_problem(case.state, case.inputs, case.now_s, case.options)
        sol = solve_slots(problem)
        if case.options.fixed_pd is not None or case.options.max_gpus is not None:
            assert sol is None, i
        if sol is None:
            continue
        assert sol.objective_ms == want(i) == evaluate(problem, sol.x), (i, case.focus, sol.objective_ms, want(i))
        _respects_options(case, problem, sol.x)
        answered[case.focus] += 1
    assert all(answered[f] >= 5 for f in ("modes", "pools", "borrow")), answered


def test_every_option_changes_the_optimum_somewhere() -> None:
    """Each option binds (the oracle's optimum with it differs from the one without) in several
    cases, and the borrow window both shuts out lending and, when open, lending pays: a backend
    ignoring any of them would disagree with the oracle above."""
    binds = {f: 0 for f in FOCUS}
    window_shut_binds = lending_binds = 0
    for i, c in enumerate(CASES):
        if want(i) != c.unrestricted:
            binds[c.focus] += 1
        if not any(g.pool == "training" and g.usable for g in c.state.gpus):
            continue
        no_borrow = replace(c.options, allow_borrow=False)
        if borrow_window_is_open(c.state.trainer, c.inputs.costs, c.now_s):
            lending_binds += want(i) != oracle(c.state, c.inputs, c.now_s, no_borrow)
        elif c.options.allow_borrow and "training" in c.options.pools:
            opened = replace(c.state, trainer=TrainerPhase("waiting", 1e9))
            window_shut_binds += want(i) != oracle(opened, c.inputs, c.now_s, c.options)
    assert all(n >= 6 for n in binds.values()), binds
    assert window_shut_binds >= 5 and lending_binds >= 5, (window_shut_binds, lending_binds)


# ------------------------------------------------------------------------------------------- by hand
def _hand_inputs(lend_s: float = 2.0, return_s: float = 3.0) -> PlanningInputs:
    """TP1 everywhere; colocated 120/k s, prefill 60/k s, decode 90/k s; no transition cost, no KV demand."""
    k = np.arange(1, 9, dtype=float)
    tab = {r: np.concatenate([[np.inf], s / k]) for r, s in (("colocated", 120.0), ("prefill", 60.0), ("decode", 90.0))}
    costs = ActionCosts({"rollout": 10.0, "elastic": 10.0, "training": 5.0}, 1.0, 1.0, lend_s, return_s, 10.0, 4.0)
    memory = MemoryModel(16e9, 147456.0, {"H800": 80.0}, 0.0)
    return PlanningInputs(
        RoleTable("colocated", 1, tab["colocated"]), RoleTable("prefill", 1, tab["prefill"]), RoleTable("decode", 1, tab["decode"]),
        costs, memory, CostWeights(transition_weight=0.0), SolverSettings(), 64,
    )


def _hand_state(trainer: TrainerPhase) -> ClusterState:
    gpus = [GPU(f"r/{i}", "r", "H800", "rollout") for i in range(2)]
    gpus += [GPU(f"e/{i}", "e", "H800", "elastic") for i in range(2)]
    gpus += [GPU(f"t/{i}", "t", "H800", "training") for i in range(4)]
    return ClusterState(tuple(gpus), (), trainer)


# (trainer, now_s, options) -> optimum in ms, worked out by hand from the tables above
HAND = [
    (TrainerPhase("training", 100.0), 0.0, Options(), 30000),  # 4 dedicated GPUs colocated: 120/4
    (TrainerPhase("waiting", 10.0), 5.0, Options(), 15000),  # 5 + 2 + 3 <= 10: lend all 8, 120/8
    (TrainerPhase("waiting", 10.0), 5.25, Options(), 30000),  # 5.25 + 5 > 10: the window is shut
    (TrainerPhase("waiting", 10.0), 0.0, Options(allow_borrow=False), 30000),
    (TrainerPhase("waiting", 10.0), 0.0, Options(pools=("rollout", "training")), 20000),  # 6 GPUs
    (TrainerPhase("waiting", 10.0), 0.0, Options(allow_elastic=False, allow_borrow=False), 60000),
    (TrainerPhase("training", 100.0), 0.0, Options(modes=("disaggregated",)), 45000),  # P2 D2: max(30, 45); P1 D3: max(60, 30)
    (TrainerPhase("training", 100.0), 0.0, Options(fixed_pd=(1, 3)), 60000),
    (TrainerPhase("training", 100.0), 0.0, Options(fixed_pd=(3, 2)), None),  # 5 instances on 4 GPUs
    (TrainerPhase("training", 100.0), 0.0, Options(max_gpus=3), 40000),  # colocated on 3 (P1 D2: 45)
    (TrainerPhase("waiting", 10.0), 0.0, Options(max_gpus=6, modes=("disaggregated",)), 30000),  # 6 of 8 GPUs: P2 D3 max(30, 30)
    (TrainerPhase("waiting", 10.0), 0.0, Options(max_gpus=0), None),
    (TrainerPhase("waiting", 10.0), 0.0, Options(pools=("elastic",), modes=("disaggregated",), fixed_pd=(1, 1)), 90000),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_options_by_hand(backend: str) -> None:
    """Small instances whose optimum is worked out by hand: the oracle and every backend agree with it."""
    inputs = _hand_inputs()
    for trainer, now, opts, expected in HAND:
        state = _hand_state(trainer)
        assert oracle(state, inputs, now, opts) == expected, (trainer, now, opts)
        sol = solve(build_problem(state, inputs, now, opts), backend, time_limit_s=10.0)
        if expected is None:
            assert sol.status == "infeasible", (trainer, now, opts, sol.status)
        else:
            assert sol.status == "optimal" and sol.objective_ms == expected, (trainer, now, opts, sol.status, sol.objective_ms)


# A fixed P:D with no disaggregated mode allowed (or no mode at all) admits no plan. The mode
# variable would need lower bound 1 > upper bound 0, which some solvers reject as an invalid
# model (CP-SAT: no_solution, MathOpt/HiGHS and PuLP: exceptions) instead of proving
# infeasibility; every backend must answer "infeasible" with the family "policy", and the
# planning step must report the same family.
CONTRADICTORY = (Options(fixed_pd=(1, 1), modes=("colocated",)), Options(modes=()), Options(fixed_pd=(2, 1), modes=()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_contradictory_options_are_infeasible(backend: str) -> None:
    inputs = _hand_inputs()
    state = _hand_state(TrainerPhase("training", 100.0))
    for opts in CONTRADICTORY:
        assert oracle(state, inputs, 0.0, opts) is None
        sol = solve(build_problem(state, inputs, 0.0, opts), backend, time_limit_s=10.0)
        assert sol.status == "infeasible" and sol.infeasible_family == "policy", (opts, sol.status, sol.infeasible_family)
        _, step_sol, decision = solve_step(state, inputs, 0.0, opts, backend)
        assert decision is None and step_sol.status == "infeasible" and step_sol.infeasible_family == "policy", (opts, step_sol)
