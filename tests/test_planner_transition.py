"""Transition plans: fewest changes (brute force and the paper's Eqs. 5-6), valid order, reach the target."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from planner.decision import Decision, GroupTarget, SolverProof
from planner.state import GPU, ROLES, ClusterState, TrainerPhase, Worker
from planner.transition import UnitCosts, apply_plan, build_plan
from planner_cases import random_inputs

PROOF = SolverProof("evaluated", 0.0, 0.0, 0.0, 0.0, "none")
UNIT = UnitCosts({"rollout": 1.0, "elastic": 1.0, "training": 1.0}, 1.0, 1.0)  # a switch beats stop + start


def decision_for(targets: dict[str, tuple[int, int, int]], pool: str = "rollout") -> Decision:
    tg = tuple(GroupTarget(node, pool, "H800", *v) for node, v in targets.items())
    tot = [sum(v[r] for v in targets.values()) for r in range(3)]
    mode = "colocated" if tot[0] else "disaggregated"
    return Decision(mode, tot[0], tot[1], tot[2], tg, 1.0, 0.0, 0, PROOF)  # type: ignore[arg-type]


def one_node_state(rng: random.Random, n_gpus: int, nodes: int = 1) -> ClusterState:
    gpus, workers = [], []
    for n in range(nodes):
        for i in range(n_gpus):
            gpus.append(GPU(f"n{n}/{i}", f"n{n}", "H800", "rollout"))
            if rng.random() < 0.7:
                workers.append(Worker(f"w{len(workers)}", rng.choice(ROLES), (f"n{n}/{i}",), 1))
    return ClusterState(tuple(gpus), tuple(workers))


def brute_force_changes(roles: list[str], target: tuple[int, int, int]) -> int:
    """Fewest (joins + leaves + role switches) over every fate of every worker (unit costs)."""
    best = None
    for fates in itertools.product([*ROLES, None], repeat=len(roles)):
        got = Counter(f for f in fates if f is not None)
        if any(got[r] > target[i] for i, r in enumerate(ROLES)):
            continue
        switches = sum(1 for f, r in zip(fates, roles) if f is not None and f != r)
        leaves = sum(1 for f in fates if f is None)
        joins = sum(target) - sum(got.values())
        cost = switches + leaves + joins
        best = cost if best is None else min(best, cost)
    return best  # type: ignore[return-value]


def closed_form(state: ClusterState, plan, target_counts: Counter) -> int:
    """Paper Eqs. 5-6 on the plan's survivors: D_worker + sum_r n_src(r) - min(n_src(r), n_dst(r))."""
    stopped = {a.worker for a in plan.actions if a.kind == "stop"}
    survivors = [w for w in state.workers if w.id not in stopped]
    n_src = Counter(w.role for w in survivors)
    d_role = sum(n_src[r] - min(n_src[r], target_counts[r]) for r in ROLES)
    return plan.joins + plan.leaves + d_role


@pytest.mark.parametrize("seed", range(60))
def test_plan_is_minimal_vs_brute_force_and_closed_form(seed: int) -> None:
    rng = random.Random(seed)
    inputs = random_inputs(rng, (1, 1, 1))
    state = one_node_state(rng, rng.randint(1, 5))
    n = len(state.gpus)
    target = [0, 0, 0]
    for _ in range(rng.randint(0, n)):
        target[rng.randrange(3)] += 1
    plan = build_plan(state, decision_for({"n0": tuple(target)}), inputs, 0.0, costs=UNIT)  # type: ignore[arg-type]
    changes = plan.joins + plan.leaves + plan.role_changes
    assert changes == brute_force_changes([w.role for w in state.workers], tuple(target))  # type: ignore[arg-type]
    assert changes == closed_form(state, plan, Counter(dict(zip(ROLES, target))))
    by = {a.id: a for a in plan.actions}
    for a in plan.actions:
        if a.kind in ("switch_role", "stop"):  # drain first
            assert any(by[d].kind == "drain" and by[d].worker == a.worker for d in a.after)
    after = apply_plan(state, plan)
    assert Counter(w.role for w in after.workers) == Counter({r: t for r, t in zip(ROLES, target) if t})


def test_two_nodes_switch_only_within_a_node() -> None:
    rng = random.Random(3)
    inputs = random_inputs(rng, (1, 1, 1))
    gpus = tuple(GPU(f"n{n}/{i}", f"n{n}", "H800", "rollout") for n in range(2) for i in range(2))
    workers = (Worker("a", "prefill", ("n0/0",), 1), Worker("b", "prefill", ("n0/1",), 1), Worker("c", "decode", ("n1/0",), 1))
    state = ClusterState(gpus, workers)
    plan = build_plan(state, decision_for({"n0": (0, 1, 1), "n1": (0, 0, 2)}), inputs, 0.0, costs=UNIT)
    assert (plan.joins, plan.leaves, plan.role_changes) == (1, 0, 1)
    switched = [a for a in plan.actions if a.kind == "switch_role"]
    assert switched[0].worker in ("a", "b") and switched[0].role == "decode"


def test_ordering_rules() -> None:
    """Starts on free GPUs before non-urgent drains; drain before switch/stop; lend before start; returns carry the deadline."""
    rng = random.Random(5)
    inputs = random_inputs(rng, (1, 1, 1))
    gpus = [GPU(f"r/{i}", "r", "H800", "rollout") for i in range(4)]
    gpus += [GPU(f"t/{i}", "t", "H800", "training", borrowed=(i == 0)) for i in range(2)]
    workers = (
        Worker("p", "prefill", ("r/0",), 1), Worker("d", "decode", ("r/1",), 1), Worker("x", "decode", ("r/2",), 1),
        Worker("b", "decode", ("t/0",), 1),
    )
    state = ClusterState(tuple(gpus), workers, TrainerPhase("training", 50.0))  # trainer wants its GPUs: b must go
    dear_switch = UnitCosts(UNIT.start, 1.0, 5.0)  # stop + start beats a switch here
    plan = build_plan(state, decision_for({"r": (0, 2, 1)}), inputs, 0.0, costs=dear_switch)
    assert (plan.joins, plan.leaves, plan.role_changes) == (1, 2, 0)
    order = {a.id: k for k, a in enumerate(plan.actions)}
    by = {a.id: a for a in plan.actions}
    for a in plan.actions:
        for dep in a.after:
            assert order[dep] < order[a.id]  # dependencies first
        if a.kind in ("switch_role", "stop"):
            assert any(by[d].kind == "drain" and by[d].worker == a.worker for d in a.after)
    returns = [a for a in plan.actions if a.kind == "return"]
    assert returns and all(r.deadline_s == 50.0 for r in returns) and "t/0" in returns[0].gpus
    # the recalled worker's drain is urgent: it waits for no start
    drain_b = next(a for a in plan.actions if a.kind == "drain" and a.worker == "b")
    assert drain_b.after == ()
    # a non-urgent drain waits for the new engine on a free GPU
    starts = [a for a in plan.actions if a.kind == "start"]
    assert starts and starts[0].gpus == ("r/3",)
    loads = {a.id for a in plan.actions if a.kind == "load_weights" and a.worker == starts[0].worker}
    other_drains = [a for a in plan.actions if a.kind == "drain" and a.worker != "b"]
    assert other_drains and all(loads & set(a.after) for a in other_drains)
    # lending: a start on a training GPU depends on its lend
    state2 = ClusterState(tuple(gpus[:4] + [GPU("t/1", "t", "H800", "training")]), (), TrainerPhase("waiting", 1e6))
    plan2 = build_plan(state2, decision_for({"t": (1, 0, 0)}, pool="training"), inputs, 0.0, costs=UNIT)
    lend = next(a for a in plan2.actions if a.kind == "lend")
    start = next(a for a in plan2.actions if a.kind == "start")
    assert lend.id in start.after and lend.gpus == ("t/1",) and plan2.lent == 1
