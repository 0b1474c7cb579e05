"""The prefill queue Q(N_P) in the integer program: a linear cost on the prefill role's one-hot.

Disaggregated completion is max(T_P(n_p), T_D(n_d)) + Q(n_p) (models/predictor.py). Every
backend's optimum equals brute-force enumeration of that over all splits: on the real
predictor's tables (where the queue moves the best split), on a hand case where an entry
that improves only the queue must survive pruning, and on seeded random instances against
the oracle of tests/planner_cases.py.
"""

from __future__ import annotations

import random
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from models.builder import build_models
from models.config import CostWeights, load_experiment
from planner.backends import BACKENDS, solve
from planner.inputs import ActionCosts, MemoryModel, PlanningInputs, RoleTable, SolverSettings, improving_entries, planning_inputs
from planner.milp import Options, build_problem, evaluate
from planner.policies import best_static_split
from planner.solve import solve_step
from planner.state import GPU, ClusterState, TrainerPhase, initial_state
from planner_cases import oracle, random_inputs, random_state

ROOT = Path(__file__).resolve().parents[1]
N_RANDOM = 100


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000.0))


def test_entries_keep_what_improves_path_or_queue() -> None:
    """An entry is dominated only by one with fewer instances that is no worse in both."""
    seconds = np.array([np.inf, 10.0, 8.0, 8.0, 7.0, 9.0, 9.0, 7.0])
    queue = np.array([0.0, 5.0, 5.0, 3.0, 4.0, 1.0, 3.0, 4.0])
    got = [k for k, _, _ in improving_entries(seconds, queue)]
    assert got == [0, 1, 2, 3, 4, 5]  # 6 (9, 3) loses to 3 (8, 3); 7 (7, 4) to 4 (7, 4)
    assert [k for k, _, _ in improving_entries(seconds)] == [0, 1, 2, 4]  # no queue: the running minimum


# ------------------------------------------------------------------------------------ predictor tables
@cache
def _crossover_inputs() -> tuple[PlanningInputs, object]:
    """pd-crossover at batch 256: 16 H800 as 8 TP2 workers, where one prefill instance saturates."""
    spec = load_experiment(ROOT / "configs/experiments/pd-crossover.yaml")
    spec = spec.model_copy(update={"workload": spec.workload.model_copy(update={"trajectories_per_batch": 256})})
    models = build_models(spec)
    return planning_inputs(models, 16, weights=CostWeights(transition_weight=0.0)), models.predictor


def _brute_force(predictor, instances: int, queue: bool = True) -> dict[tuple[int, int], int]:
    """max(T_P, T_D) + Q in ms for every split of at most `instances` instances, from the predictor itself."""
    n = np.arange(1, instances)
    t_p, (t_d, _) = predictor.prefill_path_many(n), predictor.decode_path_many(n)
    q = predictor.prefill_queue_many(n) if queue else np.zeros(n.shape[0])
    return {(a, b): max(_ms(t_p[a - 1]), _ms(t_d[b - 1])) + _ms(q[a - 1]) for a in n for b in n if a + b <= instances}


@pytest.mark.parametrize("backend", [*BACKENDS, "slots"])
def test_split_and_objective_equal_brute_force_on_predictor_tables(backend: str) -> None:
    inputs, predictor = _crossover_inputs()
    # each backend's MILP, and the slot pricing (planner/uniform.py) that the default settings try first
    inputs = replace(inputs, solver=replace(inputs.solver, slot_pricing=backend == "slots"))
    state = initial_state([(2, 8, "H800", "rollout")])
    values = _brute_force(predictor, 8)
    best = min(values.values())
    argmin = [s for s, v in values.items() if v == best]
    assert argmin == [(2, 6)], argmin  # unique; without the queue it would be 1P7D (below)
    problem, sol, decision = solve_step(state, inputs, 0.0, Options(modes=("disaggregated",)), "cbc" if backend == "slots" else backend)
    assert sol.status == "optimal" and decision is not None and decision.proof.backend == backend
    assert sol.objective_ms == best == sol.completion_ms  # transition weight 0: the objective is the completion
    assert (decision.prefill, decision.decode) == (2, 6)
    assert round(decision.predicted_completion_s * 1000) == best
    assert evaluate(problem, sol.x) == best
    # the trainer's timeline plans on the paths alone: a queue that does not materialise cannot
    # make a lent GPU late (measured: 16 late returns in 5 of 54 paper runs before this)
    t_p, t_d = predictor.prefill_path_many(np.array([2]))[0], predictor.decode_path_many(np.array([6]))[0][0]
    assert round(decision.earliest_completion_s * 1000) == max(_ms(t_p), _ms(t_d)) < best
    assert decision.timeline_s == decision.earliest_completion_s


def test_queue_moves_the_split_consistently_in_predictor_and_planner() -> None:
    """At batch 256 one prefill instance is nearly saturated: its queue makes 2P6D the best
    split (the simulator's best, results/predictor_vs_sim.json), where max(T_P, T_D) alone
    picks 1P7D. The predictor, the static split and the program agree."""
    inputs, predictor = _crossover_inputs()
    blind = _brute_force(predictor, 8, queue=False)
    assert min(blind, key=blind.get) == (1, 7)
    pred = predictor.best_disaggregated(8)
    assert (pred.prefill, pred.decode) == (2, 6)
    assert pred.completion_s == pytest.approx(max(pred.prefill_path_s, pred.decode_path_s) + pred.prefill_queue_s)
    assert best_static_split(inputs, 8) == (2, 6)
    one = predictor.disaggregated(1, 7)
    assert one.prefill_queue_s > 10.0 and one.completion_s > pred.completion_s


# ------------------------------------------------------------------------------------ by hand
def _hand(queue: np.ndarray | None) -> PlanningInputs:
    """TP1; prefill path 100 s whatever its count, queue 30 / 10 / 0 s; decode 90/k s; colocated slow."""
    k = np.arange(1, 5, dtype=float)
    col = RoleTable("colocated", 1, np.concatenate([[np.inf], 1000.0 / k]))
    pre = RoleTable("prefill", 1, np.array([np.inf, 100.0, 100.0, 100.0, 100.0]), queue)
    dec = RoleTable("decode", 1, np.concatenate([[np.inf], 90.0 / k]))
    costs = ActionCosts({"rollout": 10.0, "elastic": 10.0, "training": 5.0}, 1.0, 1.0, 2.0, 3.0, 10.0, 4.0)
    return PlanningInputs(col, pre, dec, costs, MemoryModel(16e9, 147456.0, {"H800": 80.0}, 0.0), CostWeights(transition_weight=0.0), SolverSettings(), 64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_entry_that_only_shortens_the_queue_is_kept(backend: str) -> None:
    """Splits of 4: 1P3D max(100, 30) + 30, 2P2D 100 + 10, 3P1D max(100, 90) + 0 = 100 s. The
    prefill path never improves past one instance, so pruning by path alone would keep only
    1P and miss the optimum."""
    state = ClusterState(tuple(GPU(f"n/{i}", "n", "H800", "rollout") for i in range(4)))
    problem = build_problem(state, _hand(np.array([0.0, 30.0, 10.0, 0.0, 0.0])), 0.0)
    assert [k for k, _, _ in problem.entries[1]] == [0, 1, 2, 3]
    sol = solve(problem, backend, time_limit_s=10.0)
    assert sol.status == "optimal" and sol.objective_ms == 100_000 == sol.completion_ms
    assert sol.totals() == (0, 3, 1)
    blind = solve(build_problem(state, _hand(None), 0.0), backend, time_limit_s=10.0)
    assert blind.objective_ms == 100_000 and blind.totals()[0] == 0  # max(100, 90/k): no queue, any split with k_d >= 1


# ------------------------------------------------------------------------------------ random instances
def _with_queue(rng: random.Random, inputs: PlanningInputs) -> PlanningInputs:
    """The prefill table gains a queue: non-increasing in k (the predictor's), or arbitrary."""
    n = inputs.prefill.seconds.shape[0]
    q = np.sort([rng.uniform(0.0, 80.0) for _ in range(n)])[::-1] if rng.random() < 0.7 else np.array([rng.uniform(0.0, 80.0) for _ in range(n)])
    q[0] = 0.0
    return replace(inputs, prefill=RoleTable("prefill", inputs.prefill.tp, inputs.prefill.seconds, q))


def _cases() -> list[tuple[ClusterState, PlanningInputs, Options]]:
    rng = random.Random(20261212)
    out = []
    while len(out) < N_RANDOM:
        tps = rng.choice([(1, 1, 1), (2, 2, 2), (1, 1, 2), (2, 1, 2)])
        inputs = _with_queue(rng, random_inputs(rng, tps))
        state = random_state(rng, tps)
        opts = Options(modes=("disaggregated",)) if rng.random() < 0.7 else Options()
        out.append((state, inputs, opts))
    return out


CASES = _cases()


@cache
def _want(i: int) -> int | None:
    state, inputs, opts = CASES[i]
    return oracle(state, inputs, 0.0, opts)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_matches_brute_force_with_a_prefill_queue(backend: str) -> None:
    feasible = 0
    for i, (state, inputs, opts) in enumerate(CASES):
        want = _want(i)
        problem = build_problem(state, inputs, 0.0, opts)
        sol = solve(problem, backend, time_limit_s=10.0)
        if want is None:
            assert sol.status == "infeasible", (i, sol)
            continue
        feasible += 1
        assert sol.status == "optimal", (i, sol.status)
        assert sol.objective_ms == want, (i, backend, sol.objective_ms, want)
        assert evaluate(problem, sol.x) == want, i
    assert feasible >= 50, feasible


def test_the_queue_changes_the_optimum_in_many_random_cases() -> None:
    """Without this, a backend that ignored the queue could still pass the test above."""
    changed = 0
    for i, (state, inputs, opts) in enumerate(CASES):
        blind = replace(inputs, prefill=RoleTable("prefill", inputs.prefill.tp, inputs.prefill.seconds))
        want = _want(i)
        changed += want is not None and want != oracle(state, blind, 0.0, opts)
    assert changed >= 25, changed


def test_oracle_and_program_agree_mid_batch() -> None:
    """Priced for the work left (f < 1), queue and path are rounded each on its own, as the oracle does."""
    checked = 0
    for i, (state, inputs, opts) in enumerate(CASES[:30]):
        mid = replace(state, unfinished_fraction=0.37)
        want = oracle(mid, inputs, 0.0, opts)
        sol = solve(build_problem(mid, inputs, 0.0, opts), "cbc", time_limit_s=10.0)
        if want is None:
            continue
        assert sol.objective_ms == want, (i, sol.objective_ms, want)
        checked += 1
    assert checked >= 10
