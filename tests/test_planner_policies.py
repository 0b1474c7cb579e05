"""Policies: the switch gate and its hysteresis, forced switches, the Eq. 7 borrow gate, baselines."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from models.config import CostWeights
from planner.inputs import ActionCosts, MemoryModel, PlanningInputs, RoleTable, SolverSettings
from planner.policies import POLICIES, get_policy
from planner.state import GPU, ClusterState, TrainerPhase, Worker

INF = 1e5


def table(role: str, values: dict[int, float], n: int = 16) -> RoleTable:
    s = np.full(n + 1, INF)
    s[0] = np.inf
    for k, v in values.items():
        s[k] = v
    return RoleTable(role, 2, s)


def inputs(col: dict[int, float], pre: dict[int, float], dec: dict[int, float], weight: float = 0.0) -> PlanningInputs:
    costs = ActionCosts({"rollout": 15.0, "elastic": 16.7, "training": 9.44}, 2.0, 30.0, 6.26, 3.18, 15.0, 8.0)
    memory = MemoryModel(16e9, 147456.0, {"H800": 80.0}, 0.0)
    w = CostWeights(transition_weight=weight, ratio_change_margin=0.03, mode_switch_margin=0.08)
    return PlanningInputs(table("colocated", col), table("prefill", pre), table("decode", dec), costs, memory, w, SolverSettings("cbc", 5.0), 64)


def node(name: str, pool: str, n: int, **kw) -> list[GPU]:
    return [GPU(f"{name}/{i}", name, "H800", pool, **kw) for i in range(n)]


def workers(roles: list[str], gpus: list[GPU]) -> tuple[Worker, ...]:
    return tuple(Worker(f"w{i}", r, (gpus[2 * i].id, gpus[2 * i + 1].id), 2) for i, r in enumerate(roles))


def test_gate_suppresses_a_tiny_ratio_gain_and_no_gate_takes_it() -> None:
    g = node("r", "rollout", 8)
    state = ClusterState(tuple(g), workers(["prefill", "decode", "decode", "decode"], g))
    inp = inputs({4: 500.0}, {1: 101.0, 2: 100.0}, {2: 100.5, 3: 100.0})  # 1P3D 101 s, 2P2D 100.5 s (0.5%)
    kept = get_policy("pearl").decide(state, inp, 0.0).decision
    assert not kept.applied and kept.ratio == "1P3D" and "gated ratio change" in kept.reason
    assert kept.proof.status == "optimal" and kept.proof.solve_ms > 0  # the rejected optimum's proof
    taken = get_policy("pearl-no-gate").decide(state, inp, 0.0).decision
    assert taken.applied and taken.ratio == "2P2D"
    # a larger gain (5%) passes the 3% ratio margin
    big = inputs({4: 500.0}, {1: 105.0, 2: 100.0}, {2: 100.0, 3: 100.0})
    assert get_policy("pearl").decide(state, big, 0.0).decision.ratio == "2P2D"


def test_mode_switch_needs_the_larger_margin() -> None:
    g = node("r", "rollout", 8)
    state = ClusterState(tuple(g), workers(["colocated"] * 4, g))
    inp = inputs({4: 105.0}, {2: 100.0}, {2: 100.0})  # disaggregation 4.8% better: > ratio margin, < mode margin
    d = get_policy("pearl").decide(state, inp, 0.0).decision
    assert not d.applied and d.mode == "colocated" and "mode switch" in d.reason
    inp2 = inputs({4: 110.0}, {2: 100.0}, {2: 100.0})  # 9.1% better: passes
    assert get_policy("pearl").decide(state, inp2, 0.0).decision.mode == "disaggregated"


def test_forced_switch_bypasses_the_gate() -> None:
    g = node("r", "rollout", 8)
    g = [replace(x, preempt_notice=x.id in ("r/0", "r/1")) for x in g]  # the only prefill worker is going away
    state = ClusterState(tuple(g), workers(["prefill", "decode", "decode", "decode"], g))
    inp = inputs({3: 500.0}, {1: 101.0}, {2: 100.5, 3: 100.0})
    d = get_policy("pearl").decide(state, inp, 0.0).decision
    assert d.applied and d.forced and d.ratio == "1P2D"
    assert all(t.count("prefill") + t.count("decode") <= 3 for t in d.targets)


def _borrow_case(unfinished: float):
    r = node("r", "rollout", 4)
    t = node("t", "training", 8)
    state = ClusterState(tuple(r + t), workers(["colocated"] * 2, r), TrainerPhase("waiting", 1e6), unfinished_fraction=unfinished)
    inp = inputs({2: 200.0, 6: 150.0}, {}, {})  # T_ded = 200 s, with all training GPUs 150 s
    return state, inp


def test_borrow_gate_follows_eq7() -> None:
    # toggle = lend 6.26 + return 3.18 = 9.44 s; (R/B) * 50 > 9.44  <=>  R/B > 0.1888
    for frac, expect in ((0.15, False), (0.25, True), (1.0, True)):
        state, inp = _borrow_case(frac)
        step = get_policy("pearl").decide(state, inp, 0.0, "training_end")
        d = step.decision
        assert d.extras["borrow"] is expect, frac
        assert abs(d.extras["borrow_benefit_s"] - frac * 50.0) < 1e-6
        assert (d.lent_gpus == 8) is expect and (step.plan.lent == 8) is expect
    state, inp = _borrow_case(1.0)
    assert get_policy("pearl-no-borrow").decide(state, inp, 0.0).decision.lent_gpus == 0
    # the trainer is training: nothing may be lent, whatever the gain
    busy = replace(state, trainer=TrainerPhase("training", 1e6))
    assert get_policy("pearl-no-gate").decide(busy, inp, 0.0).decision.lent_gpus == 0
    # the return would not finish before the trainer needs the GPUs
    soon = replace(state, trainer=TrainerPhase("waiting", 5.0))
    assert get_policy("pearl").decide(soon, inp, 0.0).decision.lent_gpus == 0


def test_baselines() -> None:
    r = node("r", "rollout", 4)
    e = node("e", "elastic", 8)
    t = node("t", "training", 8)
    state = ClusterState(tuple(r + e + t), (), TrainerPhase("waiting", 1e6))
    col = {k: 400.0 / k for k in range(1, 11)}
    pre = {k: 300.0 / k for k in range(1, 11)}
    dec = {k: 350.0 / k for k in range(1, 11)}
    inp = inputs(col, pre, dec)
    roll = get_policy("roll").decide(state, inp, 0.0).decision
    assert roll.mode == "colocated" and roll.colocated == 2 and roll.lent_gpus == 0  # the 4 reserved GPUs only
    rlb = get_policy("rlboost+").decide(state, inp, 0.0).decision
    assert rlb.mode == "colocated" and rlb.colocated == 6 and rlb.lent_gpus == 0  # DP over reserved + elastic, no borrowing
    rpd = get_policy("rlboost+pd").decide(state, inp, 0.0).decision
    assert rpd.mode == "disaggregated" and rpd.instances == 6 and rpd.lent_gpus == 0  # the same GPUs, static P:D
    pearl = get_policy("pearl").decide(state, inp, 0.0).decision
    assert pearl.lent_gpus == 8 and pearl.predicted_completion_s < rlb.predicted_completion_s
    assert set(POLICIES) == {"pearl", "pearl-no-borrow", "pearl-fixed-pd", "pearl-no-gate", "roll", "rlboost+", "rlboost+pd"}


def test_time_limit_without_a_solution_keeps_the_current_configuration() -> None:
    g = node("r", "rollout", 8)
    state = ClusterState(tuple(g), workers(["prefill", "decode", "decode", "decode"], g))
    inp = replace(inputs({4: 500.0}, {1: 101.0, 2: 100.0}, {2: 100.5, 3: 100.0}), solver=SolverSettings("cpsat", 1e-6))
    step = get_policy("pearl-no-gate").decide(state, inp, 0.0)
    d = step.decision
    assert d.proof.status == "no_solution" and not d.applied and d.ratio == "1P3D" and step.plan.empty
    assert d.proof.gap == float("inf")
