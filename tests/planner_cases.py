"""Seeded random small planning instances and a brute-force oracle that knows nothing of the MILP."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import numpy as np

from models.config import CostWeights
from planner.inputs import KV_UNIT_TOKENS, ActionCosts, MemoryModel, PlanningInputs, RoleTable, SolverSettings
from planner.milp import borrow_window_open
from planner.state import GPU, ROLES, ClusterState, TrainerPhase, Worker

GIB = 2**30


def random_table(rng: random.Random, k_max: int, tp: int) -> np.ndarray:
    base = rng.uniform(50, 400)
    t = [math.inf] + [base / (k ** rng.uniform(0.2, 1.0)) + rng.uniform(5, 60) for k in range(1, k_max + 1)]
    for k in range(2, k_max + 1):  # occasional non-monotone entries (dominated, must be pruned)
        if rng.random() < 0.25:
            t[k] = t[k - 1] + rng.uniform(0.0, 20.0)
    return np.asarray(t)


def random_inputs(rng: random.Random, tps: tuple[int, int, int], max_gpus: int = 16, mem_gib: float = 80.0) -> PlanningInputs:
    tabs = [RoleTable(r, tp, random_table(rng, max_gpus // tp, tp)) for r, tp in zip(ROLES, tps)]
    start = {"rollout": rng.uniform(5, 30), "elastic": rng.uniform(5, 60), "training": rng.uniform(5, 20)}
    costs = ActionCosts(start, rng.uniform(1, 10), rng.uniform(3, 40), rng.uniform(2, 8), rng.uniform(1, 5), start["rollout"], 4.0)
    weights_gb = rng.choice([16.0, 16.0, 60.0, 120.0])
    demand = rng.choice([0.0, 1e5, 3e5])
    memory = MemoryModel(weights_gb * 1e9, 147456.0, {"H800": mem_gib, "A100": 40.0}, demand)
    w = CostWeights(transition_weight=rng.choice([0.0, 1.0, 5.0]), horizon_batches=rng.choice([1.0, 2.0]))
    return PlanningInputs(tabs[0], tabs[1], tabs[2], costs, memory, w, SolverSettings("cpsat", 10.0, 8, 0), 64)


def random_state(rng: random.Random, tps: tuple[int, int, int]) -> ClusterState:
    gpus: list[GPU] = []
    n_nodes = rng.choice([1, 2, 2, 3])
    for n in range(n_nodes):
        pool = rng.choice(["rollout", "rollout", "elastic", "elastic", "training"])
        typ = rng.choice(["H800", "H800", "A100"])
        for i in range(rng.choice([1, 2, 4, 4])):
            gpus.append(GPU(f"n{n}/{i}", f"n{n}", typ, pool, available=rng.random() > 0.1, preempt_notice=rng.random() < 0.1))
    # workers on free available GPUs; training ones must be borrowed
    workers: list[Worker] = []
    by_node: dict[str, list[GPU]] = {}
    for g in gpus:
        by_node.setdefault(g.node, []).append(g)
    borrowed: set[str] = set()
    for node, gs in by_node.items():
        free = [g for g in gs if g.available]
        while free and rng.random() < 0.7:
            role = rng.choice(ROLES)
            tp = tps[ROLES.index(role)] if rng.random() < 0.9 else rng.choice([1, 2])
            if len(free) < tp:
                break
            take, free = free[:tp], free[tp:]
            if take[0].pool == "training":
                borrowed.update(g.id for g in take)
            workers.append(Worker(f"w{len(workers)}", role, tuple(g.id for g in take), tp, draining=rng.random() < 0.05))
    gpus = [replace(g, borrowed=g.id in borrowed) for g in gpus]
    trainer = TrainerPhase(rng.choice(["training", "waiting"]), rng.choice([0.0, 5.0, 1000.0]))
    return ClusterState(tuple(gpus), tuple(workers), trainer)


def _ms(x: float) -> int:
    return int(round(x * 1000.0))


def oracle(state: ClusterState, inputs: PlanningInputs, now_s: float = 0.0, modes=("colocated", "disaggregated")) -> int | None:
    """Best objective (ms) by enumerating every per-node role assignment; None if none is feasible.

    Written from the semantics, not from the program: completion = running-min table
    (extra instances idle), disaggregated = max(prefill, decode); each node's current
    instances are kept, switched (same TP), or stopped, and missing ones started, at the
    cheapest mix found by enumerating keeps and switches.
    """
    tp = [inputs.tp(r) for r in ROLES]
    lendable = borrow_window_open(state, inputs, now_s)
    groups = state.groups()
    draining = {x for wk in state.workers if wk.draining for x in wk.gpus}
    caps = {g.key: (g.usable - sum(1 for x in g.gpu_ids if x in draining and state.gpu(x).usable) if (g.pool != "training" or lendable) else 0) for g in groups}
    denom = max(sum(v for k, v in caps.items() if k[1] != "training"), 1)  # prices spread over dedicated GPUs
    w = inputs.weights.transition_weight / inputs.weights.horizon_batches
    c = inputs.costs
    cur = {g.key: [0, 0, 0] for g in groups}
    constant = 0
    for wk in state.workers:
        if wk.draining:
            continue
        key = state.group_key_of(wk)
        r = ROLES.index(wk.role)
        if wk.tp == tp[r] and all(state.gpu(x).usable for x in wk.gpus) and caps[key] >= wk.tp:
            cur[key][r] += 1
        else:
            constant += _ms(w * c.stop_s * wk.tp / denom)

    def node_cost(g, x) -> int:
        cu = cur[g.key]
        start = [_ms(w * c.start_s[g.pool] * t / denom) for t in tp]
        stop = [_ms(w * c.stop_s * t / denom) for t in tp]
        switch = [_ms(w * c.switch_s * t / denom) for t in tp]
        best = None
        for keep in itertools.product(*[range(min(cu[r], x[r]) + 1) for r in range(3)]):
            left_cur = [cu[r] - keep[r] for r in range(3)]
            left_tgt = [x[r] - keep[r] for r in range(3)]
            # switches: enumerate a matrix of moves a -> b (same TP), tiny counts
            moves = [(a, b) for a in range(3) for b in range(3) if a != b and tp[a] == tp[b]]
            for counts in itertools.product(*[range(min(left_cur[a], left_tgt[b]) + 1) for a, b in moves]):
                out = [0, 0, 0]
                inn = [0, 0, 0]
                for (a, b), k in zip(moves, counts):
                    out[a] += k
                    inn[b] += k
                if any(out[r] > left_cur[r] or inn[r] > left_tgt[r] for r in range(3)):
                    continue
                cost = sum(start[r] * (left_tgt[r] - inn[r]) + stop[r] * (left_cur[r] - out[r]) + switch[r] * inn[r] for r in range(3))
                best = cost if best is None else min(best, cost)
        return best  # type: ignore[return-value]

    def envelope(r: int, n: int) -> int | None:
        if n < 1:
            return None
        s = inputs.table(ROLES[r]).seconds
        vals = [_ms(float(s[k])) for k in range(1, min(n, len(s) - 1) + 1) if math.isfinite(s[k])]
        return min(vals) if vals else None

    kv = [[int(inputs.memory.kv_capacity_tokens(g.type, t) // KV_UNIT_TOKENS) for t in tp] for g in groups]
    fits = [[inputs.memory.fits_weights(g.type, t) for t in tp] for g in groups]
    demand = int(math.ceil(inputs.memory.kv_demand_tokens / KV_UNIT_TOKENS))
    options = []
    for gi, g in enumerate(groups):
        opts = []
        cap = caps[g.key]
        for x in itertools.product(*[range((cap // tp[r] if fits[gi][r] else 0) + 1) for r in range(3)]):
            if sum(tp[r] * x[r] for r in range(3)) <= cap:
                opts.append((x, node_cost(g, x)))
        options.append(opts)
    best = None
    for combo in itertools.product(*options):
        tot = [sum(x[r] for x, _ in combo) for r in range(3)]
        if tot[0] > 0 and tot[1] == 0 and tot[2] == 0 and "colocated" in modes:
            t = envelope(0, tot[0])
            serving = 0
        elif tot[0] == 0 and tot[1] > 0 and tot[2] > 0 and "disaggregated" in modes:
            a, b = envelope(1, tot[1]), envelope(2, tot[2])
            t = None if a is None or b is None else max(a, b)
            serving = 2
        else:
            continue
        if t is None:
            continue
        if sum(kv[gi][serving] * x[serving] for gi, (x, _) in enumerate(combo)) < demand:
            continue
        obj = t + sum(cost for _, cost in combo) + constant
        best = obj if best is None else min(best, obj)
    return best
