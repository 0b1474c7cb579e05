"""Mixed layouts (several GPU types, several TP degrees per role): every backend equals the
brute-force oracle of tests/mixed_cases.py, and a layout that needs two TP degrees at once is found."""

from __future__ import annotations

import random
from dataclasses import replace
from functools import cache

import numpy as np
import pytest

from models.config import CostWeights
from planner.backends import BACKENDS
from planner.inputs import ActionCosts, MemoryModel, PlanningInputs, RoleTable, SolverSettings
from planner.milp import Options
from planner.mixed import build_mixed_problem, evaluate_mixed, share_units, solve_mixed
from planner.state import GPU, ClusterState, TrainerPhase
from mixed_cases import mixed_oracle, random_mixed_inputs, random_mixed_state

N_CASES = 200


@cache
def cases() -> tuple:
    rng = random.Random(20261201)
    out = []
    for _ in range(N_CASES):
        inputs = random_mixed_inputs(rng)
        state = random_mixed_state(rng, inputs)
        out.append((state, inputs, mixed_oracle(state, inputs)))
    return tuple(out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_matches_brute_force_on_mixed_instances(backend: str) -> None:
    feasible = 0
    for i, (state, inputs, want) in enumerate(cases()):
        problem = build_mixed_problem(state, inputs, 0.0)
        sol = solve_mixed(problem, backend, time_limit_s=10.0)
        if want is None:
            assert sol.status == "infeasible", (i, sol.status)
            continue
        feasible += 1
        assert sol.status == "optimal", (i, sol.status)
        assert sol.objective_ms == want, (i, backend, sol.objective_ms, want)
        assert evaluate_mixed(problem, sol.x) == want, i
    assert feasible >= 100, feasible


def test_mixed_instances_exercise_types_degrees_and_changes() -> None:
    """The 200 instances are not degenerate: optima mix GPU types and TP degrees, and many
    start from running workers (switches, TP changes as stop + start)."""
    types = degrees = running = 0
    for state, inputs, want in cases():
        running += bool(state.workers)
        if want is None:
            continue
        problem = build_mixed_problem(state, inputs, 0.0)
        sol = solve_mixed(problem, "cbc", time_limit_s=10.0)
        used = {(g.gpu_type, t) for g, v in zip(problem.groups, sol.x) for (_, t), n in zip(g.slots, v) if n}
        types += len({ty for ty, _ in used}) > 1
        degrees += len({t for _, t in used}) > 1
    assert types >= 5 and degrees >= 5 and running >= 100, (types, degrees, running)


def test_folding_identical_nodes_is_exact() -> None:
    for i, (state, inputs, _) in enumerate(cases()[:60]):
        a = solve_mixed(build_mixed_problem(state, inputs, 0.0), "cbc")
        b = solve_mixed(build_mixed_problem(state, inputs, 0.0, Options(aggregate=False)), "cbc")
        assert (a.status, a.objective_ms) == (b.status, b.objective_ms), i


def test_options_bind_like_the_oracle() -> None:
    """Modes, a fixed P:D and a GPU cap restrict the mixed program exactly as the oracle reads them."""
    rng = random.Random(5)
    for i, (state, inputs, _) in enumerate(cases()[:60]):
        opts = rng.choice([Options(modes=("disaggregated",)), Options(modes=("colocated",)), Options(fixed_pd=(1, 2)), Options(max_gpus=rng.randint(1, 6))])
        want = mixed_oracle(state, inputs, 0.0, opts)
        sol = solve_mixed(build_mixed_problem(state, inputs, 0.0, opts), "cpsat", time_limit_s=10.0)
        assert (sol.objective_ms if sol.status == "optimal" else None) == want, (i, opts)


# ------------------------------------------------------------------------------------------- two TP degrees
def _linear(role: str, tp: int, per_instance_s: float, k_max: int) -> RoleTable:
    """Completion = work / k: k instances of this kind split the batch evenly."""
    return RoleTable(role, tp, np.array([np.inf] + [per_instance_s / k for k in range(1, k_max + 1)]), gpu_type="H800")


def two_degree_case() -> tuple[ClusterState, PlanningInputs]:
    """A 4-GPU node and three 1-GPU spot nodes (H800). A TP2 instance does the work of 8/3 TP1
    ones (its doubled KV room keeps more trajectories resident): 3 TP2 or 8 TP1 finish in 100 s.
    Pure TP2 uses only the big node (2 instances: 150 s); pure TP1 all 7 GPUs (114 s); 2 TP2 on
    the big node + 3 TP1 on the small ones carry 2/3 + 3/8 of the batch: 100 s."""
    tabs = (_linear("colocated", 1, 800.0, 16), _linear("colocated", 2, 300.0, 8))
    memory = MemoryModel(16e9, 147456.0, {"H800": 80.0}, 0.0)
    costs = ActionCosts({"rollout": 10.0, "elastic": 10.0, "training": 10.0}, 1.0, 5.0, 1.0, 1.0, 10.0, 1.0)
    inputs = PlanningInputs(tabs[0], tabs[0], tabs[0], costs, memory, CostWeights(transition_weight=0.0), SolverSettings("cpsat", 10.0, 8, 0), 64, tabs)
    gpus = [GPU(f"big/{i}", "big", "H800", "rollout") for i in range(4)]
    gpus += [GPU(f"spot{n}/0", f"spot{n}", "H800", "elastic") for n in range(3)]
    return ClusterState(tuple(gpus), (), TrainerPhase("training", 0.0)), inputs


def test_best_layout_uses_two_tp_degrees_at_once() -> None:
    state, inputs = two_degree_case()
    problem = build_mixed_problem(state, inputs, 0.0)
    sol = solve_mixed(problem, "cpsat", time_limit_s=10.0)
    assert sol.status == "optimal"
    layout = {(g.nodes, t): n for g, v in zip(problem.groups, sol.x) for (_, t), n in zip(g.slots, v) if n}
    assert {t for _, t in layout} == {1, 2}, layout
    assert sol.objective_ms == 100_000 == mixed_oracle(state, inputs)
    for only in (1, 2):  # either degree alone is slower, by brute force too
        single = replace(inputs, variants=tuple(v for v in inputs.variants if v.tp == only))
        assert mixed_oracle(state, single) == {1: 114_286, 2: 150_000}[only]


def test_one_kind_alone_is_exact_at_every_count() -> None:
    """S >= K^2: with one kind, meeting a level by shares is exactly N >= need (no rounding gain)."""
    for k_max in (1, 2, 7, 64, 4096):
        units = share_units(k_max)
        for need in {n for n in (1, 2, 3, k_max // 2, k_max - 1, k_max) if 1 <= n <= k_max}:
            share = -(-units // need)
            assert share * need >= units and share * (need - 1) < units, (k_max, need)
