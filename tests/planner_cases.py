"""Seeded random small planning instances and a brute-force oracle that knows nothing of the MILP."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from models.config import CostWeights
from planner.inputs import MEMORY_UTILIZATION, ActionCosts, MemoryModel, PlanningInputs, RoleTable, SolverSettings
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
    max_seq = rng.choice([0.0, 32768.0, 3e5])  # 3e5 tokens (44 GB of KV) fit on 80 GB only beside small weights
    memory = MemoryModel(weights_gb * 1e9, 147456.0, {"H800": mem_gib, "A100": 40.0}, max_seq)
    w = CostWeights(transition_weight=rng.choice([0.0, 1.0, 5.0]), horizon_batches=rng.choice([1.0, 2.0, 0.5]))
    return PlanningInputs(tabs[0], tabs[1], tabs[2], costs, memory, w, SolverSettings("cpsat", 10.0, 8, 0), 64)


def random_workers(rng: random.Random, gpus: list[GPU], p_more: float, pick_tp: Callable[[str], int]) -> tuple[list[GPU], list[Worker]]:
    """Workers on free available GPUs, node by node (another with probability `p_more`, its TP
    from `pick_tp(role)`); training GPUs that host one are marked borrowed."""
    workers: list[Worker] = []
    by_node: dict[str, list[GPU]] = {}
    for g in gpus:
        by_node.setdefault(g.node, []).append(g)
    borrowed: set[str] = set()
    for gs in by_node.values():
        free = [g for g in gs if g.available]
        while free and rng.random() < p_more:
            role = rng.choice(ROLES)
            tp = pick_tp(role)
            if len(free) < tp:
                break
            take, free = free[:tp], free[tp:]
            if take[0].pool == "training":
                borrowed.update(g.id for g in take)
            workers.append(Worker(f"w{len(workers)}", role, tuple(g.id for g in take), tp, draining=rng.random() < 0.05))
    return [replace(g, borrowed=g.id in borrowed) for g in gpus], workers


def assert_matches_oracle(i: int, backend: str, sol, want: int | None, recomputed: int | None) -> bool:
    """One case of "every backend equals the oracle": both infeasible, or proven optimal at the
    oracle's objective, recomputed from the assignment too. True when the case is feasible."""
    if want is None:
        assert sol.status == "infeasible", (i, sol)
        return False
    assert sol.status == "optimal", (i, sol.status)
    assert sol.objective_ms == want, (i, backend, sol.objective_ms, want)
    assert recomputed == want, i
    return True


def random_state(rng: random.Random, tps: tuple[int, int, int]) -> ClusterState:
    gpus: list[GPU] = []
    n_nodes = rng.choice([1, 2, 2, 3])
    for n in range(n_nodes):
        pool = rng.choice(["rollout", "rollout", "elastic", "elastic", "training"])
        typ = rng.choice(["H800", "H800", "A100"])
        for i in range(rng.choice([1, 2, 4, 4])):
            gpus.append(GPU(f"n{n}/{i}", f"n{n}", typ, pool, available=rng.random() > 0.1, preempt_notice=rng.random() < 0.1))
    gpus, workers = random_workers(rng, gpus, 0.7, lambda role: tps[ROLES.index(role)] if rng.random() < 0.9 else rng.choice([1, 2]))
    trainer = TrainerPhase(rng.choice(["training", "waiting"]), rng.choice([0.0, 5.0, 1000.0]))
    unfinished = rng.choice([1.0, 1.0, 0.6, 0.25, 0.05, 0.0])  # R/B: fresh, mid-batch, nearly done, complete
    return ClusterState(tuple(gpus), tuple(workers), trainer, unfinished_fraction=unfinished)


def _ms(x: float) -> int:
    return int(round(x * 1000.0))


# ------------------------------------------------------------------------------------------- oracle
# Everything below is written from the definitions (planner/milp.py docstring, DESIGN.md "The
# integer program", PAPER.md), never from planner code: no planner function is called.

ALL_POOLS = ("rollout", "elastic", "training")
ALL_MODES = ("colocated", "disaggregated")


def borrow_window_is_open(trainer: TrainerPhase, costs: ActionCosts, now_s: float) -> bool:
    """Training GPUs may be lent only between updates (the trainer is waiting) and only if
    lending them now and returning them completes by the time the trainer needs them back
    (DESIGN.md: "lent only between updates and only if the return completes before the
    trainer needs them"; milp.py: "lend + return fit before it needs its GPUs")."""
    if trainer.phase != "waiting":
        return False
    return now_s + costs.lend_s + costs.return_s <= trainer.next_needs_gpus_at_s


def allowed_pools(options: object | None) -> set[str]:
    """Pools whose GPUs the plan may use under the policy options (before the borrow window)."""
    pools = set(getattr(options, "pools", ALL_POOLS))
    if not getattr(options, "allow_elastic", True):
        pools.discard("elastic")
    if not getattr(options, "allow_borrow", True):
        pools.discard("training")
    return pools


def work_share(state: ClusterState, inputs: PlanningInputs) -> float:
    """The share of a fresh batch's completion the objective prices: the R/B left of this batch
    (R = 0: complete, the next one is fresh) and H - 1 fresh batches, per batch of the horizon H
    (a horizon shorter than a batch counts at most H of what is left)."""
    h = inputs.weights.horizon_batches
    left = state.unfinished_fraction if state.unfinished_fraction > 0.0 else 1.0
    return (min(left, h) + max(h - 1.0, 0.0)) / h


def oracle(state: ClusterState, inputs: PlanningInputs, now_s: float = 0.0, options: object | None = None) -> int | None:
    """Best objective (ms) by enumerating every per-node role assignment; None if none is feasible.

    Written from the semantics, not from the program: completion = running-min table
    (extra instances idle), disaggregated = max(prefill, decode) + the prefill queue of the
    prefill instances that serve (models/predictor.py, Q(N_P)); each node's current
    instances are kept, switched (same TP), or stopped, and missing ones started, at the
    cheapest mix found by enumerating keeps and switches.

    The completion term prices the work left: the tables predict a fresh batch, and with R of
    B trajectories unfinished and a horizon of H batches the configuration serves the rest of
    this batch and H - 1 fresh ones, counted per batch of the horizon; a horizon shorter than
    a batch counts at most H of what is left. A complete batch (R = 0) means the next one is
    fresh. Transition prices are not scaled (milp.py docstring, "Objective").

    `options` is read by attribute (any object with the fields of planner.milp.Options, or
    None for no restriction): `pools` / `allow_elastic` / `allow_borrow` decide which pools'
    GPUs may host instances, `modes` the serving modes allowed, `fixed_pd` the exact
    (prefill, decode) instance counts, `max_gpus` the most GPUs all instances together may
    occupy (borrowed training GPUs included), `toggle_in_objective` False makes an instance
    started on a training GPU free (the lend + return is charged elsewhere, by the Eq. 7 gate).
    """
    modes = tuple(getattr(options, "modes", ALL_MODES))
    fixed_pd = getattr(options, "fixed_pd", None)
    max_gpus = getattr(options, "max_gpus", None)
    toggle_priced = getattr(options, "toggle_in_objective", True)
    pools = allowed_pools(options)
    if not borrow_window_is_open(state.trainer, inputs.costs, now_s):
        pools.discard("training")
    tp = [inputs.tp(r) for r in ROLES]

    # nodes of interchangeable GPUs: same node, pool and type
    members: dict[tuple[str, str, str], list[GPU]] = {}
    for gpu in state.gpus:
        members.setdefault((gpu.node, gpu.pool, gpu.type), []).append(gpu)
    keys = sorted(members)
    key_of = {gpu.id: k for k, gs in members.items() for gpu in gs}
    gpu_by_id = {gpu.id: gpu for gpu in state.gpus}

    def usable(gid: str) -> bool:  # up and without a preemption notice
        return gpu_by_id[gid].available and not gpu_by_id[gid].preempt_notice

    held = {gid for wk in state.workers if wk.draining for gid in wk.gpus}  # free only once drained
    caps = {k: (sum(1 for g in gs if usable(g.id) and g.id not in held) if k[1] in pools else 0) for k, gs in members.items()}
    # transition prices: GPU-seconds blocked, spread over the dedicated (non-training) usable GPUs
    # the plan may place instances on (so a pool the options exclude does not dilute them)
    denom = max(sum(v for k, v in caps.items() if k[1] != "training"), 1)
    w = inputs.weights.transition_weight / inputs.weights.horizon_batches
    c = inputs.costs
    cur = {k: [0, 0, 0] for k in keys}
    constant = 0
    for wk in state.workers:
        if wk.draining:
            continue
        k = key_of[wk.gpus[0]]
        r = ROLES.index(wk.role)
        if wk.tp == tp[r] and all(usable(gid) for gid in wk.gpus) and k[1] in pools:
            cur[k][r] += 1  # may stay as it is
        else:
            constant += _ms(w * c.stop_s * wk.tp / denom)  # lost, mis-sized or recalled: must stop

    def node_cost(k: tuple[str, str, str], x: tuple[int, ...]) -> int:
        cu = cur[k]
        start_s = 0.0 if k[1] == "training" and not toggle_priced else c.start_s[k[1]]
        start = [_ms(w * start_s * t / denom) for t in tp]
        stop = [_ms(w * c.stop_s * t / denom) for t in tp]
        switch = [_ms(w * c.switch_s * t / denom) for t in tp]
        moves = [(a, b) for a in range(3) for b in range(3) if a != b and tp[a] == tp[b]]
        best = None
        for keep in itertools.product(*[range(min(cu[r], x[r]) + 1) for r in range(3)]):
            left_cur = [cu[r] - keep[r] for r in range(3)]
            left_tgt = [x[r] - keep[r] for r in range(3)]
            # switches: enumerate a matrix of moves a -> b (same TP), tiny counts
            for counts in itertools.product(*[range(min(left_cur[a], left_tgt[b]) + 1) for a, b in moves]):
                out = [0, 0, 0]
                inn = [0, 0, 0]
                for (a, b), n in zip(moves, counts):
                    out[a] += n
                    inn[b] += n
                if any(out[r] > left_cur[r] or inn[r] > left_tgt[r] for r in range(3)):
                    continue
                cost = sum(start[r] * (left_tgt[r] - inn[r]) + stop[r] * (left_cur[r] - out[r]) + switch[r] * inn[r] for r in range(3))
                best = cost if best is None else min(best, cost)
        return best  # type: ignore[return-value]

    def envelope(r: int, n: int) -> int | None:
        if n < 1:
            return None
        s = inputs.table(ROLES[r]).seconds
        vals = [_ms(float(s[i])) for i in range(1, min(n, len(s) - 1) + 1) if math.isfinite(s[i])]
        return min(vals) if vals else None

    share = work_share(state, inputs)
    queue = getattr(inputs.table("prefill"), "queue", None)  # prefill queueing on top of the slower path

    def disaggregated(n_p: int, n_d: int) -> int | None:
        """Priced max(prefill, decode) + queue: the j <= n_p prefill instances that serve (extra
        ones idle) bring their own queue; every term priced for the work left, in whole ms."""
        d = envelope(2, n_d)
        s = inputs.table("prefill").seconds
        vals = [
            int(round(share * max(_ms(float(s[j])), d))) + int(round(share * (_ms(float(queue[j])) if queue is not None else 0)))
            for j in range(1, min(n_p, len(s) - 1) + 1) if math.isfinite(s[j])
        ]
        return min(vals) if vals and d is not None else None

    mem = inputs.memory
    choices = []  # per node: (x, transition ms, GPUs used)
    for k in keys:
        gib = mem.gpu_memory_gib[k[2]]
        # KV room of one instance: its GPUs' memory at the utilization cap minus the weights
        kv_tokens = [max(gib * 2**30 * t * MEMORY_UTILIZATION - mem.weight_bytes, 0.0) / mem.kv_bytes_per_token for t in tp]
        fits = [v >= mem.max_seq_tokens for v in kv_tokens]
        opts = []
        for x in itertools.product(*[range((caps[k] // tp[r] if fits[r] else 0) + 1) for r in range(3)]):
            used = sum(tp[r] * x[r] for r in range(3))
            if used <= caps[k]:
                opts.append((x, node_cost(k, x), used))
        choices.append(opts)
    best = None
    for combo in itertools.product(*choices):
        tot = [sum(o[0][r] for o in combo) for r in range(3)]
        if max_gpus is not None and sum(o[2] for o in combo) > max_gpus:
            continue
        if fixed_pd is not None and (tot[1], tot[2]) != tuple(fixed_pd):
            continue
        if tot[0] > 0 and tot[1] == 0 and tot[2] == 0 and "colocated" in modes:
            t = envelope(0, tot[0])
            priced = None if t is None else int(round(share * t))
        elif tot[0] == 0 and tot[1] > 0 and tot[2] > 0 and "disaggregated" in modes:
            priced = disaggregated(tot[1], tot[2])
        else:
            continue
        if priced is None:
            continue
        obj = priced + sum(o[1] for o in combo) + constant
        best = obj if best is None else min(best, obj)
    return best


# ------------------------------------------------------------------------------------------- options
def random_now(rng: random.Random, state: ClusterState, inputs: PlanningInputs) -> float:
    """A decision time around the borrow window's edge as often as away from it."""
    toggle = inputs.costs.lend_s + inputs.costs.return_s
    edge = state.trainer.next_needs_gpus_at_s - toggle
    return rng.choice([0.0, max(0.0, edge - rng.uniform(0.0, 2.0)), max(0.0, edge + rng.uniform(0.0, 2.0)), rng.uniform(0.0, 1000.0)])


def random_option_fields(rng: random.Random, focus: str, tps: tuple[int, int, int], gpus: int) -> dict:
    """Keyword arguments for planner.milp.Options exercising `focus` (all fields at random for "mixed").

    `gpus` (the usable GPUs) sizes the P:D counts and GPU caps so that many of them fit. A
    fixed P:D never comes with a mode set that excludes disaggregation (that contradiction
    has its own test).
    """

    def modes(fixed: bool = False) -> tuple[str, ...]:
        if fixed:
            return rng.choice([("disaggregated",), ("colocated", "disaggregated")])
        return rng.choice([("colocated",), ("disaggregated",), ("disaggregated",), ("colocated", "disaggregated")])

    def pools() -> tuple[str, ...]:
        return tuple(sorted(rng.sample(ALL_POOLS, rng.choice([1, 1, 2, 2, 2]))))

    def fixed_pd() -> tuple[int, int]:
        if rng.random() < 0.2:
            return (rng.randint(1, 4), rng.randint(1, 4))
        p = rng.randint(1, max(1, (gpus - tps[2]) // tps[1]))
        return (p, rng.randint(1, max(1, (gpus - tps[1] * p) // tps[2])))

    def max_gpus() -> int:
        return rng.randint(0, max(gpus, 1))

    kw: dict = {}
    if focus == "modes":
        kw["modes"] = modes()
    elif focus == "pools":
        kw["pools"] = pools()
    elif focus == "fixed_pd":
        kw["fixed_pd"] = fixed_pd()
        if rng.random() < 0.3:
            kw["modes"] = modes(fixed=True)
    elif focus == "max_gpus":
        kw["max_gpus"] = max_gpus()
    elif focus == "borrow":
        kw[rng.choice(["allow_borrow", "allow_elastic", "toggle_in_objective"])] = False
    else:
        if rng.random() < 0.5:
            kw["fixed_pd"] = fixed_pd()
        if rng.random() < 0.5:
            kw["modes"] = modes(fixed="fixed_pd" in kw)
        for name, draw in (("pools", pools), ("max_gpus", max_gpus)):
            if rng.random() < 0.5:
                kw[name] = draw()
        for name in ("allow_borrow", "allow_elastic", "toggle_in_objective"):
            if rng.random() < 0.2:
                kw[name] = False
    return kw
