"""Seeded small mixed-layout instances (several GPU types, several TP degrees per role) and a
brute-force oracle written from the definitions in planner/mixed.py's docstring, never from
its code: no planner function is called below the marked line."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import numpy as np

from models.config import CostWeights
from planner.inputs import MEMORY_UTILIZATION, ActionCosts, MemoryModel, PlanningInputs, RoleTable, SolverSettings
from planner.state import GPU, ROLES, ClusterState, TrainerPhase
from planner_cases import allowed_pools, borrow_window_is_open, random_workers, work_share

TYPES = {"H800": 80.0, "H20": 96.0, "A100": 40.0}
SPEED = {"H800": 1.0, "H20": 0.45, "A100": 0.6}  # invented relative speeds: only the shapes matter here


def mixed_table(rng: random.Random, role: str, typ: str, tp: int, k_max: int, queue: bool) -> RoleTable:
    base = rng.uniform(60, 300) / (SPEED[typ] * tp ** rng.uniform(0.3, 0.9))
    t = [math.inf] + [base / (k ** rng.uniform(0.3, 1.0)) + rng.uniform(5, 40) for k in range(1, k_max + 1)]
    for k in range(2, k_max + 1):
        if rng.random() < 0.2:
            t[k] = t[k - 1] + rng.uniform(0.0, 15.0)
    q = None
    if queue:
        q0 = rng.uniform(0, 40)
        q = np.array([0.0] + [q0 / k ** rng.uniform(0.5, 1.5) for k in range(1, k_max + 1)])
    return RoleTable(role, tp, np.asarray(t), q, gpu_type=typ)


def random_mixed_inputs(rng: random.Random, max_gpus: int = 8) -> PlanningInputs:
    degrees = {r: sorted(rng.sample([1, 2, 4], rng.choice([1, 2, 2, 3]))) for r in ROLES}
    types = sorted(rng.sample(sorted(TYPES), rng.choice([2, 2, 3])))
    variants = tuple(mixed_table(rng, r, typ, tp, max(max_gpus // tp, 1), r == "prefill" and rng.random() < 0.7)
                     for r in ROLES for typ in types for tp in degrees[r])
    home = {r: next(v for v in variants if v.role == r) for r in ROLES}
    start = {"rollout": rng.uniform(5, 30), "elastic": rng.uniform(5, 60), "training": rng.uniform(5, 20)}
    costs = ActionCosts(start, rng.uniform(1, 10), rng.uniform(3, 40), rng.uniform(2, 8), rng.uniform(1, 5), start["rollout"], 4.0)
    weights_gb = rng.choice([16.0, 16.0, 60.0])
    memory = MemoryModel(weights_gb * 1e9, 147456.0, dict(TYPES), rng.choice([0.0, 32768.0, 2e5]))
    w = CostWeights(transition_weight=rng.choice([0.0, 1.0, 5.0]), horizon_batches=rng.choice([1.0, 2.0, 0.5]))
    return PlanningInputs(home["colocated"], home["prefill"], home["decode"], costs, memory, w, SolverSettings("cpsat", 10.0, 8, 0), 64, variants)


def random_mixed_state(rng: random.Random, inputs: PlanningInputs) -> ClusterState:
    types = sorted({v.gpu_type for v in inputs.variants})
    gpus: list[GPU] = []
    for n in range(rng.choice([1, 2, 2, 3])):
        pool = rng.choice(["rollout", "elastic", "elastic", "training"])
        typ = rng.choice(types)
        for i in range(rng.choice([1, 2, 2, 4])):
            gpus.append(GPU(f"n{n}/{i}", f"n{n}", typ, pool, available=rng.random() > 0.1, preempt_notice=rng.random() < 0.08))
    gpus, workers = random_workers(rng, gpus, 0.6, lambda role: rng.choice([1, 2, 4]))
    trainer = TrainerPhase(rng.choice(["training", "waiting"]), rng.choice([0.0, 1000.0]))
    return ClusterState(tuple(gpus), tuple(workers), trainer, unfinished_fraction=rng.choice([1.0, 1.0, 0.5, 0.1, 0.0]))


def random_twin_state(rng: random.Random, inputs: PlanningInputs) -> ClusterState:
    """Two or three nodes of one type, pool and size that run the same instances (what
    `Options.fold_running` folds into one class), beside one node drawn as in random_mixed_state."""
    types = sorted({v.gpu_type for v in inputs.variants})
    typ, pool, size = rng.choice(types), rng.choice(["rollout", "elastic", "elastic", "training"]), rng.choice([2, 4, 4])
    first, workers = random_workers(rng, [GPU(f"t0/{i}", "t0", typ, pool) for i in range(size)], 0.8, lambda role: rng.choice([1, 2, 4]))
    gpus: list[GPU] = []
    for n in range(2 if size == 4 else rng.choice([2, 3])):  # small enough for the oracle
        gpus += [replace(g, id=f"t{n}/{i}", node=f"t{n}") for i, g in enumerate(first)]
    twins = [replace(wk, id=f"{wk.id}@{node}", gpus=tuple(gid.replace("t0/", f"{node}/") for gid in wk.gpus))
             for node in sorted({g.node for g in gpus}) for wk in workers]
    other = [GPU(f"o/{i}", "o", rng.choice(types), rng.choice(["rollout", "elastic"]), available=rng.random() > 0.1) for i in range(rng.choice([0, 2]))]
    other, more = random_workers(rng, other, 0.6, lambda role: rng.choice([1, 2, 4]))
    more = [replace(wk, id=f"{wk.id}@o") for wk in more]
    trainer = TrainerPhase("waiting", 1000.0)  # training GPUs lendable, so a training class can run
    return ClusterState(tuple(gpus + other), tuple(twins + more), trainer, unfinished_fraction=rng.choice([1.0, 0.5]))


def _ms(x: float) -> int:
    return int(round(x * 1000.0))


# ------------------------------------------------------------------------------------------- oracle
def undominated(points: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """(k, t, q) points, in order of k, that no point with fewer instances matches or beats in both t and q."""
    return [p for i, p in enumerate(points) if not any(o[1] <= p[1] and o[2] <= p[2] for o in points[:i])]


def mixed_oracle(state: ClusterState, inputs: PlanningInputs, now_s: float = 0.0, options: object | None = None) -> int | None:
    """Best objective (ms) over every per-node layout of (role, TP) instances; None if none is feasible.

    Completion of a layout, per role: every kind (GPU type, TP) runs at one row (k, t, q) of its
    table (priced for the work left, in whole ms) or idles; the router gives it at most
    floor(S N_kind / k) of a batch's S units (S = 64 x the power of two >= K, K the role's
    largest table); if the units cover S the role meets T = the largest t and Q = the largest
    q of the serving kinds. Colocated = T + Q; disaggregated = max(prefill T, decode T) + queues.
    """
    modes = tuple(getattr(options, "modes", ("colocated", "disaggregated")))
    fixed_pd = getattr(options, "fixed_pd", None)
    max_gpus = getattr(options, "max_gpus", None)
    pools = allowed_pools(options)
    if not borrow_window_is_open(state.trainer, inputs.costs, now_s):
        pools.discard("training")
    share = work_share(state, inputs)
    tables = {(t.role, t.gpu_type, t.tp): t for t in inputs.variants}
    mem = inputs.memory

    def fits(typ: str, tp: int) -> bool:
        kv = max(mem.gpu_memory_gib[typ] * 2**30 * tp * MEMORY_UTILIZATION - mem.weight_bytes, 0.0) / mem.kv_bytes_per_token
        return kv >= mem.max_seq_tokens

    by_id = {g.id: g for g in state.gpus}
    usable = {g.id: g.available and not g.preempt_notice for g in state.gpus}
    held = {gid for wk in state.workers if wk.draining for gid in wk.gpus}
    nodes = sorted({(g.node, g.pool, g.type) for g in state.gpus})
    cap = {k: (sum(1 for g in state.gpus if (g.node, g.pool, g.type) == k and usable[g.id] and g.id not in held) if k[1] in pools else 0) for k in nodes}
    slots = {k: [(r, tp) for r in range(3) for (ro, ty, tp) in sorted(tables) if ro == ROLES[r] and ty == k[2] and tp <= cap[k] and fits(ty, tp)] for k in nodes}
    denom = max(sum(v for k, v in cap.items() if k[1] != "training"), 1)
    w = inputs.weights.transition_weight / inputs.weights.horizon_batches
    c = inputs.costs
    cur = {k: {s: 0 for s in slots[k]} for k in nodes}
    constant = 0
    for wk in state.workers:
        if wk.draining:
            continue
        g = by_id[wk.gpus[0]]
        k, s = (g.node, g.pool, g.type), (ROLES.index(wk.role), wk.tp)
        if s in cur[k] and all(usable[x] for x in wk.gpus):
            cur[k][s] += 1
        else:
            constant += _ms(w * c.stop_s * wk.tp / denom)

    def node_cost(k, x: dict) -> int:
        start_s = 0.0 if k[1] == "training" and not getattr(options, "toggle_in_objective", True) else c.start_s[k[1]]
        sl = slots[k]
        moves = [(a, b) for a in sl for b in sl if a != b and a[1] == b[1]]
        best = None
        for keep in itertools.product(*[range(min(cur[k][s], x[s]) + 1) for s in sl]):
            lc = {s: cur[k][s] - kk for s, kk in zip(sl, keep)}
            lt = {s: x[s] - kk for s, kk in zip(sl, keep)}
            for counts in itertools.product(*[range(min(lc[a], lt[b]) + 1) for a, b in moves]):
                out = {s: 0 for s in sl}
                inn = {s: 0 for s in sl}
                for (a, b), n in zip(moves, counts):
                    out[a] += n
                    inn[b] += n
                if any(out[s] > lc[s] or inn[s] > lt[s] for s in sl):
                    continue
                cost = sum(_ms(w * start_s * s[1] / denom) * (lt[s] - inn[s]) + _ms(w * c.stop_s * s[1] / denom) * (lc[s] - out[s])
                           + _ms(w * c.switch_s * s[1] / denom) * inn[s] for s in sl)
                best = cost if best is None else min(best, cost)
        return best  # type: ignore[return-value]

    # every node's layouts, combined node by node: (instances per (role, type, tp), GPUs) -> cheapest cost
    combos: dict[tuple, int] = {((), 0): 0}
    for k in nodes:
        sl = slots[k]
        opts = []
        for x in itertools.product(*[range(cap[k] // s[1] + 1) for s in sl]):
            used = sum(s[1] * n for s, n in zip(sl, x))
            if used <= cap[k]:
                opts.append((dict(zip(sl, x)), used))
        nxt: dict[tuple, int] = {}
        for (tot, gp), cost in combos.items():
            for x, used in opts:
                d = dict(tot)
                for (r, tp), n in x.items():
                    if n:
                        d[(r, k[2], tp)] = d.get((r, k[2], tp), 0) + n
                key = (tuple(sorted(d.items())), gp + used)
                v = cost + node_cost(k, x)
                if key not in nxt or v < nxt[key]:
                    nxt[key] = v
        combos = nxt

    def entries(r: int, kind: tuple[str, int]) -> list[tuple[int, int, int]]:
        """(k, t, q) of every finite row of the kind's table, priced for the work left, in whole ms."""
        tab = tables[(ROLES[r], *kind)]
        qs = tab.queue if tab.queue is not None else np.zeros(tab.seconds.shape[0])
        return [(k, int(round(share * _ms(float(tab.seconds[k])))), int(round(share * _ms(float(qs[k])))))
                for k in range(1, tab.seconds.shape[0]) if math.isfinite(tab.seconds[k])]

    def role_best(r: int, counts: dict) -> list[tuple[int, int]]:
        """Every (T, Q) the layout meets: each kind runs at one entry with t <= T and q <= Q (the
        fewest instances of those: the largest share) or idles; its units floor(S N / k) cover S."""
        big = max(tables[k].seconds.shape[0] - 1 for k in tables if k[0] == ROLES[r])
        units = 64 * 2 ** max(0, math.ceil(math.log2(max(big, 1))))
        rows = {kd: entries(r, kd) for kd in counts}
        ts = sorted({t for e in rows.values() for _, t, _ in e})
        qs = sorted({q for e in rows.values() for _, _, q in e})
        met = []
        for t_max in ts:
            for q_max in qs:
                got = 0
                for kd, n in counts.items():
                    k = min((k for k, t, q in rows[kd] if t <= t_max and q <= q_max), default=0)
                    got += (units * n) // k if k else 0
                if got >= units:
                    met.append((t_max, q_max))
        return met

    best = None
    for (tot, gpus_used), cost in combos.items():
        per = [{(typ, tp): n for (r, typ, tp), n in tot if r == role} for role in range(3)]
        n = [sum(p.values()) for p in per]
        if max_gpus is not None and gpus_used > max_gpus:
            continue
        if fixed_pd is not None and (n[1], n[2]) != tuple(fixed_pd):
            continue
        if n[0] > 0 and n[1] == 0 and n[2] == 0 and "colocated" in modes:
            met = role_best(0, per[0])
            priced = min((t + q for t, q in met), default=None)
        elif n[0] == 0 and n[1] > 0 and n[2] > 0 and "disaggregated" in modes:
            a, b = role_best(1, per[1]), role_best(2, per[2])
            priced = min((max(ta, tb) + qa + qb for ta, qa in a for tb, qb in b), default=None)
        else:
            continue
        if priced is None:
            continue
        obj = priced + cost + constant
        best = obj if best is None else min(best, obj)
    return best
