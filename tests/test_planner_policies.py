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


def _borrow_case(unfinished: float, weight: float = 1.0):
    r = node("r", "rollout", 4)
    t = node("t", "training", 8)
    state = ClusterState(tuple(r + t), workers(["colocated"] * 2, r), TrainerPhase("waiting", 1e6), unfinished_fraction=unfinished)
    inp = inputs({2: 200.0, 6: 150.0}, {}, {}, weight)  # T_ded = 200 s, with all training GPUs 150 s
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
    # the transition weight scales the toggle like every other transition price: at 0 any gain lends
    state, inp = _borrow_case(0.15, weight=0.0)
    free = get_policy("pearl").decide(state, inp, 0.0, "training_end").decision
    assert free.extras["toggle_s"] == 0.0 and free.lent_gpus == 8
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
    inp = replace(inputs({4: 500.0}, {1: 101.0, 2: 100.0}, {2: 100.5, 3: 100.0}), solver=SolverSettings("cpsat", 1e-6, slot_pricing=False))  # the MILP path: slot pricing needs no time
    step = get_policy("pearl-no-gate").decide(state, inp, 0.0)
    d = step.decision
    assert d.proof.status == "no_solution" and not d.applied and d.ratio == "1P3D" and step.plan.empty
    assert d.proof.gap == float("inf")


# ----------------------------------------------------------------------------- with transition cost
# transition_weight 1 on 8 dedicated GPUs: one TP2 role change (stop 2 s + start 15 s; a 30 s
# switch is dearer) is priced (2 + 15) * 2 / 8 = 4.25 s; the ratio margin is 3% of the current
# completion (200 s): 6 s for a fresh batch.
RATIO_STATE_ROLES = ["prefill", "decode", "decode", "decode"]


def _ratio_case(gain_s: float, unfinished: float = 1.0):
    g = node("r", "rollout", 8)
    state = ClusterState(tuple(g), workers(RATIO_STATE_ROLES, g), unfinished_fraction=unfinished)
    # 1P3D: max(200, 150) = 200 s; 2P2D: max(150, 200 - gain) = 200 - gain
    inp = inputs({4: 500.0}, {1: 200.0, 2: 150.0}, {2: 200.0 - gain_s, 3: 150.0}, weight=1.0)
    return state, inp


def test_gate_weighs_the_gain_net_of_the_transition_cost() -> None:
    # 9 s faster is above the 6 s margin, but net of the 4.25 s role change only 4.75 s: held
    state, inp = _ratio_case(9.0)
    step = get_policy("pearl").decide(state, inp, 0.0)
    d = step.decision
    assert not d.applied and d.ratio == "1P3D" and d.reason == "gated ratio change: gain 4.75 s <= margin 6.00 s", d.reason
    assert abs(d.predicted_completion_s - 200.0) < 1e-9 and step.plan.empty
    taken = get_policy("pearl-no-gate").decide(state, inp, 0.0).decision  # the objective alone takes it
    assert taken.applied and taken.ratio == "2P2D" and abs(taken.transition_cost_s - 4.25) < 1e-9
    # 20 s faster: 15.75 s net passes the margin
    state, inp = _ratio_case(20.0)
    step = get_policy("pearl").decide(state, inp, 0.0)
    d = step.decision
    assert d.applied and d.ratio == "2P2D" and d.reason == "ratio change: gain 15.75 s > margin 6.00 s", d.reason
    assert step.plan.joins == 1 and step.plan.leaves == 1  # a decode worker restarts as prefill


def test_mid_batch_prices_only_the_work_left() -> None:
    # a fresh batch switches for 20 s (net 15.75 s); with a fifth of the batch left the gain is
    # 4 s < 4.25 s of transition: the optimum itself keeps the configuration, gate or no gate
    for frac, ratio in ((1.0, "2P2D"), (0.5, "2P2D"), (0.2, "1P3D"), (0.0, "2P2D")):  # 0: complete, the next batch is fresh
        state, inp = _ratio_case(20.0, unfinished=frac)
        for name in ("pearl", "pearl-no-gate"):
            step = get_policy(name).decide(state, inp, 0.0)
            d = step.decision
            assert d.ratio == ratio and d.applied, (frac, name, d.ratio, d.reason)
            assert abs(d.predicted_completion_s - (200.0 if ratio == "1P3D" else 180.0)) < 1e-9  # a fresh batch's time
            assert step.plan.empty is (ratio == "1P3D"), (frac, name)
    # half the batch left: 10 s - 4.25 s = 5.75 s net, against half the margin (3 s)
    state, inp = _ratio_case(20.0, unfinished=0.5)
    d = get_policy("pearl").decide(state, inp, 0.0).decision
    assert d.reason == "ratio change: gain 5.75 s > margin 3.00 s", d.reason
    assert d.objective_ms == 90000 + 4250  # half of 180 s, plus the role change


def test_lend_and_return_are_charged_once() -> None:
    """T_ded 200 s, with all 8 training GPUs 185 s: Eq. 7 lends (15 s > 9.44 s). Pricing the
    toggle in the objective as well (4 starts x 9.44 s x 2 GPUs / 4 dedicated GPUs = 18.88 s)
    would make the borrowing optimum lend nothing; the ungated policy does price it there."""
    r = node("r", "rollout", 4)
    t = node("t", "training", 8)
    state = ClusterState(tuple(r + t), workers(["colocated"] * 2, r), TrainerPhase("waiting", 1e6))
    inp = inputs({2: 200.0, 6: 185.0}, {}, {}, weight=1.0)
    d = get_policy("pearl").decide(state, inp, 0.0, "training_end").decision
    assert d.extras["borrow"] is True and d.lent_gpus == 8 and d.applied, d.extras
    assert abs(d.extras["borrow_benefit_s"] - 15.0) < 1e-6 and abs(d.extras["toggle_s"] - 9.44) < 1e-9
    assert d.transition_cost_s == 0.0  # the toggle is not in the objective as well
    ungated = get_policy("pearl-no-gate").decide(state, inp, 0.0, "training_end").decision
    assert ungated.lent_gpus == 0 and ungated.colocated == 2  # 185 + 18.88 > 200
    # a fifth of the batch left: (R/B) 15 s = 3 s < 9.44 s, no loan
    d = get_policy("pearl").decide(replace(state, unfinished_fraction=0.2), inp, 0.0, "training_end").decision
    assert d.extras["borrow"] is False and d.lent_gpus == 0
