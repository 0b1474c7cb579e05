"""The integer program for mixed layouts: several GPU types and TP degrees in one decision.

Used when the planning inputs carry one prediction table per (role, GPU type, TP degree)
(`PlanningInputs.variants`); a single type with one TP degree per role keeps the program of
planner/milp.py unchanged. Same families, pricing and objective as there; what changes:

  slots s = (role r, TP t)  what an instance on a group can be; the group fixes the GPU type,
                            so an instance never spans types or nodes (TP stays inside a node)
  kinds j of role r         (GPU type, TP) with its own table of undominated entries (k, t, q):
                            the role's path t and queue q when k instances of that kind alone
                            split the batch, each carrying 1/k of it
  x[g,s], d, s              instances / starts / stops per group and slot; switches only between
                            roles of one TP on one group (u[g,t]); a TP change is a stop + a start

The mixed completion (the router's load split; the slowest trajectory's path). Each kind runs
at one operating point, an entry (k_j, t_j, q_j) of its own table: its instances each carry at
most 1/k_j of the batch, and then (the predictor's load is per instance) its trajectories'
path is at most t_j and their queueing at most q_j. The router gives kind j a whole number of
units, at most floor(S N_j / k_j) of the S units a batch has (`share_units`: 64 x the power of
two >= K, the role's largest table); kinds it gives nothing idle. A layout's role path is the best over operating
points whose units cover the batch of

    T_r = max over serving kinds of t_j,   Q_r = max over serving kinds of q_j

(the slowest trajectory's path and the longest queue); colocated completes in T + Q,
disaggregated in max(T_P, T_D) + Q_P, as in planner/milp.py. With one kind this is exactly
the homogeneous rule (floor(S N / k) >= S iff N >= k), so a single-kind role is predicted as
today; nothing averages GPU counts. `RoleKinds.options` computes it from the definition.

How it is solved: `solve_mixed` runs the exact threshold search of planner/mixed_search.py
(thresholds (T, Q) outside, a covering program with fixed coefficients inside) on every
backend; the one-hot program below is the second formulation (`method="onehot"`), kept so a
test can check the two agree.

The program, per role and kind: a one-hot w[j,e] over the kind's entries (e = 0: idle), units
sigma[j,e] <= S w[j,e], S N_j >= sum_e k_e sigma[j,e] (the floor rule, integer units), and
sum sigma = S when the role serves (a kind may carry less than it could); T >= sum_e t_e w[j,e]
and Q_r >= sum_e q_e w[j,e] per kind (the max), and S T >= sum t_e sigma[j,e] over the colocated and
one P/D role's units (their mean path: valid since only one mode serves and every serving
unit's path is <= T; same for the queues): it keeps the LP relaxation from idling half of
each kind or serving half in each mode. With one kind, sigma = S w and the rows reduce to milp.py's
N >= sum k y: the LP relaxation is the table's convex envelope, as there. Exact pruning: kinds that m instances of the same type
at 1/m of the degree replace at no loss (where none runs at that degree), and entries whose
time + queue alone exceed the current layout's objective.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from planner.backends import INF, LinearModel, read_back, solve_model
from planner.inputs import Entry, PlanningInputs
from planner.milp import FoldedNodes, Options, Solution, _ms, current_instances, group_caps, price_entries, work_fraction
from planner.state import ROLES, ClusterState

Slot = tuple[int, int]  # (role index, TP degree)
Kind = tuple[str, int]  # (GPU type, TP degree)


@dataclass(frozen=True)
class MixedGroup(FoldedNodes):
    """Interchangeable GPUs (one pool and type; nodes folded when exact, as in milp.GroupData)."""

    nodes: tuple[str, ...]
    pool: str
    gpu_type: str
    cap: int  # usable GPUs per node
    slots: tuple[Slot, ...]  # allowed here: TP fits the node, weights + one sequence fit the TP group
    cur: tuple[int, ...]  # per slot, per node
    start_ms: tuple[int, ...]
    stop_ms: tuple[int, ...]
    switch_ms: tuple[int, ...]

    def ub(self, i: int) -> int:
        return (self.cap // self.slots[i][1]) * self.mult




@dataclass(frozen=True)
class KindTable:
    """One kind's undominated entries (k > 0) in milliseconds, as arrays."""

    kind: Kind
    k: np.ndarray = field(compare=False)
    t: np.ndarray = field(compare=False)
    q: np.ndarray = field(compare=False)
    falling: bool = field(init=False, compare=False)  # t and q both non-increasing with k (so far every shipped table's)

    def __post_init__(self) -> None:
        object.__setattr__(self, "falling", bool((self.t[1:] <= self.t[:-1]).all() and (self.q[1:] <= self.q[:-1]).all()))

    @classmethod
    def of(cls, kind: Kind, entries: tuple[Entry, ...]) -> KindTable:
        rows = [e for e in entries if e[0] > 0]
        arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
        return cls(kind, arr[:, 0], arr[:, 1], arr[:, 2])

    def fewest_by_t(self, t_max: np.ndarray) -> np.ndarray:
        """Per t_max: the fewest instances of an entry with t <= t_max, whatever its queue (0: none)."""
        if self.k.size == 0:
            return np.zeros(np.shape(t_max), dtype=np.int64)
        if self.falling:
            return self.fewest_meeting(self.t, t_max)
        order = np.argsort(self.t, kind="stable")
        best = np.minimum.accumulate(self.k[order])
        i = np.searchsorted(self.t[order], t_max, side="right") - 1
        return np.where(i >= 0, best[np.maximum(i, 0)], 0)

    def fewest_meeting(self, of: np.ndarray, values: np.ndarray) -> np.ndarray:
        """For a falling kind and `of` its t or q: per value, the fewest instances of an entry with
        `of` <= value (0: none). Those entries are a suffix, and k grows along it."""
        i = np.searchsorted(-of, -np.asarray(values), side="left")
        return np.where(i < self.k.size, self.k[np.minimum(i, self.k.size - 1)], 0)

    def keep(self, mask: np.ndarray) -> KindTable:
        return KindTable(self.kind, self.k[mask], self.t[mask], self.q[mask])

    def fewest(self, t_max: np.ndarray, q_max: np.ndarray) -> np.ndarray:
        """Per (t_max, q_max) pair: the fewest instances k of an entry with t <= t_max and q <= q_max (0: none)."""
        if self.k.size == 0:
            return np.zeros(np.broadcast(t_max, q_max).shape, dtype=np.int64)
        if self.falling:  # the entries meeting t_max and those meeting q_max are suffixes: the later start wins
            t_max, q_max = np.broadcast_arrays(np.asarray(t_max), np.asarray(q_max))
            i = np.maximum(np.searchsorted(-self.t, -t_max, side="left"), np.searchsorted(-self.q, -q_max, side="left"))
            return np.where(i < self.k.size, self.k[np.minimum(i, self.k.size - 1)], 0)
        ok = (self.t <= np.asarray(t_max)[..., None]) & (self.q <= np.asarray(q_max)[..., None])
        return np.where(ok.any(axis=-1), np.where(ok, self.k, np.iinfo(np.int64).max).min(axis=-1), 0)


@dataclass(frozen=True)
class RoleKinds:
    """One role's kinds with their entries (priced or fresh) and S, the batch's units."""

    kinds: tuple[KindTable, ...]
    units: int
    # options() per layout's counts: a search prices the same counts again and again (the seeds
    # in the entry pruning and in the search, a layout's check and its value, the decision read back)
    _options: dict[tuple[tuple[Kind, int], ...], list[tuple[int, int]]] = field(default_factory=dict, init=False, compare=False, repr=False)

    def index(self) -> dict[Kind, int]:
        return {kt.kind: i for i, kt in enumerate(self.kinds)}

    def options(self, counts: dict[Kind, int]) -> list[tuple[int, int]]:
        """The (T, Q) pairs, undominated, that a layout with `counts` instances per kind meets
        (`_meets`, remembered per counts)."""
        key = tuple(sorted((kind, n) for kind, n in counts.items() if n > 0))
        out = self._options.get(key)
        if out is None:
            out = self._options[key] = self._meets(dict(key))
        return list(out)

    def _meets(self, counts: dict[Kind, int]) -> list[tuple[int, int]]:
        """The (T, Q) pairs, undominated, that a layout with `counts` instances per kind meets.

        Per queue bound Q (some serving kind's q), the fastest path T (some serving kind's t)
        whose units cover the batch: units only grow with T, so T is found by bisection, for a
        block of Q bounds at once (each kind's fewest instances with t <= T and q <= Q is a
        running minimum over its entries in order of t, masked by q <= Q)."""
        used = [kt for kt in self.kinds if counts.get(kt.kind, 0) > 0 and kt.k.size]
        if not used:
            return []
        ts = np.unique(np.concatenate([kt.t for kt in used]))
        qs = np.unique(np.concatenate([kt.q for kt in used]))
        big = np.iinfo(np.int64).max
        fastest = np.full(qs.size, ts.size, dtype=np.int64)  # index into ts; ts.size: never met
        if all(kt.falling for kt in used):
            # t and q both fall with k: the fewest instances meeting (T, Q) is the larger of the
            # fewest meeting T and the fewest meeting Q (two bisections per kind)
            def fewest_at(kt: KindTable, values: np.ndarray, of: np.ndarray) -> np.ndarray:
                i = np.searchsorted(-of, -values, side="left")
                return np.where(i < kt.k.size, kt.k[np.minimum(i, kt.k.size - 1)], big)

            by_q = [fewest_at(kt, qs, kt.q) for kt in used]
            lo = np.zeros(qs.size, dtype=np.int64)
            hi = np.full(qs.size, ts.size, dtype=np.int64)
            while np.any(lo < hi):
                mid = (lo + hi) // 2
                t_max = ts[np.minimum(mid, ts.size - 1)]
                units = np.zeros(qs.size, dtype=np.int64)
                for kt, kq in zip(used, by_q):
                    k = np.maximum(fewest_at(kt, t_max, kt.t), kq)
                    units += np.where(k < big, (self.units * counts[kt.kind]) // np.maximum(k, 1), 0)
                met = (units >= self.units) & (lo < hi)
                hi = np.where(met, mid, hi)
                lo = np.where(~met & (lo < hi), mid + 1, lo)
            fastest = lo
        for lo_q in range(0, qs.size if not all(kt.falling for kt in used) else 0, 512):
            block = qs[lo_q : lo_q + 512]
            tables = []
            for kt in used:
                order = np.argsort(kt.t, kind="stable")
                k = np.where(kt.q[order][None, :] <= block[:, None], kt.k[order][None, :], big)
                tables.append((kt.t[order], np.minimum.accumulate(k, axis=1), counts[kt.kind]))
            lo = np.zeros(block.size, dtype=np.int64)
            hi = np.full(block.size, ts.size, dtype=np.int64)
            rows = np.arange(block.size)
            while np.any(lo < hi):
                mid = (lo + hi) // 2
                t_max = ts[np.minimum(mid, ts.size - 1)]
                units = np.zeros(block.size, dtype=np.int64)
                for t_sorted, fewest, n in tables:
                    pos = np.searchsorted(t_sorted, t_max, side="right") - 1
                    k = np.where(pos >= 0, fewest[rows, np.maximum(pos, 0)], big)
                    units += np.where(k < big, (self.units * n) // np.maximum(k, 1), 0)
                met = (units >= self.units) & (lo < hi)
                hi = np.where(met, mid, hi)
                lo = np.where(~met & (lo < hi), mid + 1, lo)
            fastest[lo_q : lo_q + block.size] = lo
        out, best = [], ts.size
        for i, q in zip(fastest, qs):  # Q ascending: keep the staircase of falling T
            if i < best:
                best = int(i)
                out.append((int(ts[i]), int(q)))
        return out


@dataclass(frozen=True)
class MixedProblem:
    groups: tuple[MixedGroup, ...]
    roles: tuple[RoleKinds, RoleKinds, RoleKinds]  # priced (the objective's)
    batch_roles: tuple[RoleKinds, RoleKinds, RoleKinds]  # a fresh batch's, unpriced (what a Decision reports)
    modes: tuple[str, ...]
    fixed_pd: tuple[int, int] | None
    max_gpus: int | None
    constant_ms: int
    cost_gpus: int
    work: float
    # the best seed layout and its objective, priced once by the entry pruning (its value is the
    # same on the pruned entries: see `_prune_entries`); None: the search prices the seeds itself
    seed: tuple[tuple[tuple[int, ...], ...], int] | None = None
    # `roles` before the entry pruning (None: not pruned), for layouts it cannot price (`exact_for`)
    unpruned: tuple[RoleKinds, RoleKinds, RoleKinds] | None = field(default=None, compare=False, repr=False)

    def counts(self, x: tuple[tuple[int, ...], ...]) -> tuple[dict[Kind, int], dict[Kind, int], dict[Kind, int]]:
        out: tuple[dict[Kind, int], ...] = ({}, {}, {})
        for g, v in zip(self.groups, x):
            for (r, t), n in zip(g.slots, v):
                if n:
                    out[r][(g.gpu_type, t)] = out[r].get((g.gpu_type, t), 0) + n
        return out  # type: ignore[return-value]


def share_units(largest_table: int) -> int:
    """S = 64 x the power of two >= K: one kind alone is exact at any S (floor(S N / k) >= S iff
    N >= k); a mix loses under one unit per kind, 1/(64 K) of a batch, and S N stays < 2^31
    for K <= 4096 (LP backends keep integrality at that scale)."""
    return 64 * 2 ** max(0, math.ceil(math.log2(max(largest_table, 1))))


# ------------------------------------------------------------------------------------- build
def build_mixed_problem(state: ClusterState, inputs: PlanningInputs, now_s: float, options: Options = Options(), prune: bool = True) -> MixedProblem:
    """Fold the state into groups, slots and per-role levels (pure); see the module docstring.
    prune=False keeps the entries no optimum selects (`_prune_entries`): for pricing layouts
    worse than the current one (`degree_alternatives`)."""
    relax = options.relax
    tables = {(t.role, t.gpu_type, t.tp): t for t in inputs.variants}
    raw = group_caps(state, inputs, now_s, options)
    denom = max(sum(c for grp, c in raw if grp.pool != "training"), 1)
    w = inputs.weights.transition_weight / inputs.weights.horizon_batches
    c = inputs.costs

    @functools.cache
    def slots_of(typ: str, cap: int) -> tuple[Slot, ...]:
        out = []
        for r, role in enumerate(ROLES):
            for (ro, ty, t) in sorted(tables):
                if ro == role and ty == typ and t <= cap and (inputs.memory.fits(typ, t) or "memory" in relax):
                    out.append((r, t))
        return tuple(out)

    cur, constant = current_instances(state, raw, lambda wk, cap: slot if (slot := (ROLES.index(wk.role), wk.tp)) in slots_of(state.gpu(wk.gpus[0]).type, cap) else None,
                                      lambda wk: _ms(w * c.stop_s * wk.tp / denom))

    @functools.cache
    def divides(cap: int, slots: tuple[Slot, ...]) -> bool:
        return all(cap % t == 0 for _, t in slots)

    classes: dict[tuple, list[str]] = {}
    for grp, cap in raw:  # one per node: at 4096 GPUs 512 of them, so the idle ones take the short way
        slots = slots_of(grp.type, cap)
        held = cur.get(grp.key)
        cu = tuple(held.get(s, 0) for s in slots) if held else (0,) * len(slots)
        # folding nodes is exact when no instance is current and every TP that fits divides the
        # node (powers of two then pack node by node, largest first); nodes running the same
        # instances fold only on request (`Options.fold_running`: a relaxation, see splits_at_price)
        fold = options.aggregate and divides(cap, slots) and (not any(cu) or options.fold_running)
        key = (grp.pool, grp.type, cap, slots, cu, "" if fold else grp.node)
        classes.setdefault(key, []).append(grp.node)
    groups = []
    for (pool, typ, cap, slots, cu, _), nodes in classes.items():
        start_s = 0.0 if pool == "training" and not options.toggle_in_objective else c.start_s[pool]
        groups.append(MixedGroup(
            tuple(nodes), pool, typ, cap, slots, cu,
            tuple(_ms(w * start_s * t / denom) for _, t in slots),
            tuple(_ms(w * c.stop_s * t / denom) for _, t in slots),
            tuple(_ms(w * c.switch_s * t / denom) for _, t in slots),
        ))
    work = work_fraction(state.unfinished_fraction, inputs.weights.horizon_batches)
    priced, batch = [], []
    for r in range(3):
        rl = _role_tables(groups, r, tables, work)
        if options.fixed_pd is None or "policy" in relax:  # a fixed P:D counts instances: TP2 is not two TP1
            drop = _dominated(rl, groups)
            if drop:
                groups = [_without(g, r, drop) for g in groups]
                rl = _role_tables(groups, r, tables, work)
        priced.append(rl)
    batch = [_role_tables(groups, r, tables, None) for r in range(3)]
    modes = options.modes if "policy" not in relax else ("colocated", "disaggregated")
    fixed = options.fixed_pd if "policy" not in relax else None
    mx = options.max_gpus if "policy" not in relax else None
    problem = MixedProblem(tuple(groups), tuple(priced), tuple(batch), modes, fixed, mx, constant, denom, work)  # type: ignore[arg-type]
    return _prune_entries(problem) if prune else problem




def _role_tables(groups: list[MixedGroup], r: int, tables: dict, work: float | None) -> RoleKinds:
    """Role r's kinds the groups can host, their entries priced by `work` (None: a fresh batch)."""
    role = ROLES[r]
    kinds = sorted({(g.gpu_type, t) for g in groups for i, (ro, t) in enumerate(g.slots) if ro == r and g.ub(i) > 0})
    configured = [t for (ro, _, _), t in tables.items() if ro == role]
    units = share_units(max((t.max_instances for t in configured), default=1))

    def table(kind: Kind) -> KindTable:
        # every entry, not only k <= what fits of the kind: a mix runs kinds at shares they cannot reach alone
        rows = tables[(role, *kind)].improving_rows
        kt = KindTable(kind, rows[:, 0], rows[:, 1], rows[:, 2])
        if work is None or work == 1.0:
            return kt
        if kt.falling:  # rounding keeps t and q falling, so an entry is dominated exactly when it repeats the one before
            t, q = np.round(work * kt.t).astype(np.int64), np.round(work * kt.q).astype(np.int64)
            keep = np.ones(kt.k.size, dtype=bool)
            keep[1:] = (t[1:] != t[:-1]) | (q[1:] != q[:-1])
            return KindTable(kind, kt.k[keep], t[keep], q[keep])
        return KindTable.of(kind, price_entries(tables[(role, *kind)].improving, work))

    return RoleKinds(tuple(table(k) for k in kinds), units)


def _dominated(rk: RoleKinds, groups: list[MixedGroup]) -> set[Kind]:
    """Kinds (type, m t) that m instances of (type, t) replace on the same GPUs at no loss: for
    each of its entries (k, t, q) the smaller degree has one with at most m k instances and no
    larger t or q (m of its instances then carry at least the share), at the same price per GPU
    and wherever it fits. Only where no current instance runs at that degree on that type (a
    keep or a switch there is cheaper than any replacement). Exact."""
    running = {(g.gpu_type, t) for g in groups for (_, t), c in zip(g.slots, g.cur) if c}
    out: set[Kind] = set()
    for big in rk.kinds:
        ty, t2 = big.kind
        if big.kind in running:
            continue
        for small in rk.kinds:
            ty1, t1 = small.kind
            if ty1 == ty and t1 < t2 and (big.k.size == 0 or np.all((0 < (k := small.fewest(big.t, big.q))) & (k <= (t2 // t1) * big.k))):
                out.add(big.kind)
                break
    return out


def _without(g: MixedGroup, r: int, drop: set[Kind]) -> MixedGroup:
    keep = [i for i, (ro, t) in enumerate(g.slots) if not (ro == r and (g.gpu_type, t) in drop)]
    if len(keep) == len(g.slots):
        return g
    pick = lambda v: tuple(v[i] for i in keep)  # noqa: E731
    return MixedGroup(g.nodes, g.pool, g.gpu_type, g.cap, pick(g.slots), pick(g.cur), pick(g.start_ms), pick(g.stop_ms), pick(g.switch_ms))


def _prune_entries(p: MixedProblem) -> MixedProblem:
    """Drop entries no optimum can select (exact):
    - above: an entry's t + q alone bounds the completion of any layout that runs it, so above
      a feasible layout's objective (the current one, or every GPU colocated at one degree) it
      cannot be chosen;
    - below: T is at least `_floors` (prefill and decode share it and the GPUs), so below it
      only t's place in the order is moot: of those entries one with fewer instances and no
      longer queue does at least as well (without a queue: the slowest one).
    Neither changes the best seed's objective (dropping entries never lowers a layout's value;
    its own operating point's entries stay, as do the entries above the floor, or ones at least
    as good below it), so the pruned problem carries it as `seed` for the search."""
    floors = _floors(p)
    seed = _best_seed(p, floors[0])
    ub = seed[1] if seed is not None else None
    roles = []
    for rk, floor in zip(p.roles, floors):
        kinds = []
        for kt in rk.kinds:
            keep = np.ones(kt.k.size, dtype=bool) if ub is None else kt.t + kt.q + p.constant_ms <= ub
            below = np.flatnonzero(keep & (kt.t < floor))
            order = below[np.argsort(kt.k[below], kind="stable")]  # fewest instances first: keep while the queue falls
            q = kt.q[order]
            keep[order[q >= np.minimum.accumulate(np.r_[np.iinfo(np.int64).max, q[:-1]])]] = False
            kinds.append(kt.keep(keep))
        roles.append(RoleKinds(tuple(kinds), rk.units))
    return MixedProblem(p.groups, tuple(roles), p.batch_roles, p.modes, p.fixed_pd, p.max_gpus, p.constant_ms, p.cost_gpus, p.work, seed, p.roles)  # type: ignore[arg-type]


def exact_for(p: MixedProblem, x: tuple[tuple[int, ...], ...]) -> MixedProblem:
    """`p`, or `p` on its unpruned entries where the entry pruning cannot price layout x.

    Why: the pruning keeps only entries an optimum can select, those with t + q within the best
    seed's objective. A layout worse than that seed (a current one the planner should leave) may
    have lost the entries its operating point needs, and then prices as infeasible or too slow:
    the gate read it as "current configuration infeasible" and switched without weighing the
    margin. A layout priced within the seed's objective is priced exactly (its own entries have
    t + q no larger than its objective, so they were kept), so only the others are priced again."""
    if p.unpruned is None or p.seed is None:
        return p
    v = evaluate_mixed(p, x)
    if v is not None and v <= p.seed[1]:
        return p
    return replace(p, roles=p.unpruned, unpruned=None)


def seed_layouts(p: MixedProblem) -> list[tuple[tuple[int, ...], ...]]:
    """A few layouts that are always feasible to price: the current one, and every group filled
    with colocated instances at one degree (the largest that fits where it does not)."""
    layouts = [tuple(tuple(g.total_cur(i) for i in range(len(g.slots))) for g in p.groups)]
    for tp in sorted({t for g in p.groups for r, t in g.slots if r == 0}):
        x = []
        for g in p.groups:
            col = [(t, i) for i, (r, t) in enumerate(g.slots) if r == 0 and t <= max(tp, 1) and g.ub(i)]
            v = [0] * len(g.slots)
            if col:
                t, i = max(col)
                v[i] = g.ub(i)
            x.append(tuple(v))
        layouts.append(tuple(x))
    return layouts


def _best_seed(p: MixedProblem, colocated_floor: int = 0) -> tuple[tuple[tuple[int, ...], ...], int] | None:
    """The seed layout with the best objective, and that objective (None: none is feasible); the
    first of equals, in `seed_layouts`' order.

    A colocated seed whose transition cost plus `colocated_floor` (a lower bound on its path T,
    `_floors`; its queue is at least 0) already exceeds the best seed priced so far is not
    priced: its objective could only be higher. Pricing a layout finds its operating point, the
    costly part; at 4096 GPUs 79 of the bench walk's 81 colocated seeds were skipped so."""
    best: tuple[tuple[tuple[int, ...], ...], int] | None = None
    for x in seed_layouts(p):
        if not any(any(c) for c in x):
            continue
        moves = sum(group_transition_ms(g, v) for g, v in zip(p.groups, x)) + p.constant_ms
        colocated = all(n == 0 or r == 0 for g, v in zip(p.groups, x) for (r, _), n in zip(g.slots, v))
        if best is not None and colocated and colocated_floor + moves > best[1]:
            continue
        t = _feasible_completion(p, x)  # `evaluate_mixed`, its transition cost already summed
        if t is not None and (best is None or t + moves < best[1]):
            best = (x, t + moves)
    return best


class _GroupRates:
    """Per group, per T: the most units per GPU role r's kinds there carry (each kind's units
    S / k at its fewest instances k with t <= T, over its TP degree), as one array for
    `_floors`' rounds. Each falling kind's fewest instances come from one search over all of
    them, their times laid out in blocks offset apart, not one search per kind, and the groups
    from one mask (a loop over kinds and groups took ~2 ms a build at 4096 GPUs)."""

    def __init__(self, p: MixedProblem, r: int, top: int) -> None:
        rk = p.roles[r]
        self.units = rk.units
        self.kinds = tuple(kt for kt in rk.kinds if kt.k.size)
        self.tp = np.array([kt.kind[1] for kt in self.kinds], dtype=float)
        # per group, per kind: it may run there (a slot of its degree with room on a group of its type)
        at = {kt.kind: j for j, kt in enumerate(self.kinds)}
        self.on = np.zeros((len(p.groups), len(self.kinds)), dtype=bool)
        for gi, g in enumerate(p.groups):
            for i, (ro, t) in enumerate(g.slots):
                if ro == r and (j := at.get((g.gpu_type, t))) is not None and g.ub(i):
                    self.on[gi, j] = True
        self.falling = np.array([kt.falling for kt in self.kinds], dtype=bool)
        self.span = 2 * (top + 1)  # farther apart than any t and any asked T in [0, top]: the blocks never mix
        fall = [kt for kt in self.kinds if kt.falling]
        self.keys = np.concatenate([-kt.t + j * self.span for j, kt in enumerate(fall)] + [np.zeros(0, dtype=np.int64)])
        self.ks = np.concatenate([kt.k for kt in fall] + [np.zeros(1, dtype=np.int64)])
        self.starts = np.cumsum([0] + [kt.k.size for kt in fall])

    def __call__(self, ts: np.ndarray) -> np.ndarray:
        """Per group, per T in `ts`: the most units per GPU the role's kinds there carry."""
        k = np.zeros((len(self.kinds), ts.size), dtype=np.int64)
        if self.falling.any():  # a kind's entries with t <= T are a suffix: the first of them has the fewest
            n = int(self.falling.sum())
            at = np.searchsorted(self.keys, -np.asarray(ts)[None, :] + (np.arange(n) * self.span)[:, None], side="left")
            k[self.falling] = np.where(at < self.starts[1:, None], self.ks[np.minimum(at, self.ks.size - 1)], 0)
        for j in np.flatnonzero(~self.falling):
            k[j] = self.kinds[j].fewest_by_t(ts)
        per_kind = np.where(k > 0, self.units / np.maximum(k, 1), 0.0) / self.tp[:, None]
        return np.where(self.on[:, :, None], per_kind[None, :, :], 0.0).max(axis=1, initial=0.0)


def _floors(p: MixedProblem) -> tuple[int, int, int]:
    """Lower bounds on the path T per role: the smallest entry time at which the usable GPUs, each
    at its best units per GPU for that time, could cover the batch (queues ignored); prefill and
    decode together: their GPU needs at the best rate anywhere add up to at most all GPUs.

    Coverage only grows with T and changes only at entry times, so the smallest such T is the
    smallest whole ms that covers (`first_true` over [0, the largest t]: 4-5 rounds of 64
    points, where every entry time at 4096 GPUs, 28k of them, took 13 ms per decision)."""
    col, pd, top = _path_floors(p)
    return (top if col is None else col), (top if pd is None else pd), (top if pd is None else pd)


def _path_floors(p: MixedProblem) -> tuple[int | None, int | None, int]:
    """`_floors`' colocated and prefill/decode floors, None where no T covers the batch, and the
    largest entry time."""
    units = [rk.units for rk in p.roles]
    total = sum(g.total_cap for g in p.groups)
    top = int(max((int(kt.t.max()) for rk in p.roles for kt in rk.kinds if kt.t.size), default=0))
    rates = [_GroupRates(p, r, top) for r in range(3)]
    caps = [g.total_cap for g in p.groups]

    def colocated(ts: np.ndarray) -> np.ndarray:
        covered = np.zeros(ts.size)
        for cap, rate in zip(caps, rates[0](ts)):
            covered = covered + cap * rate
        return covered >= units[0]

    def split(ts: np.ndarray) -> np.ndarray:
        best = [rates[r](ts).max(axis=0, initial=0.0) for r in (1, 2)]
        with np.errstate(divide="ignore"):
            return units[1] / best[0] + units[2] / best[1] <= total

    return first_true(colocated, top + 1), first_true(split, top + 1), top


def batch_completion_floor_ms(p: MixedProblem) -> int | None:
    """A lower bound on the fresh-batch completion (`batch_completion_ms`) of every layout of `p`
    in a mode it allows: the paths' floors on the fresh tables (a colocated layout completes in
    T + Q with T at least its floor; a disaggregated one in max(T_P, T_D) + Q_P + Q_D, and at
    that max both roles are covered on GPUs that add up, so it is at least theirs). None where
    no allowed mode covers the batch even fractionally. Costs one `_floors`, no search."""
    col, pd, _ = _path_floors(replace(p, roles=p.batch_roles))
    modes = allowed_modes(p)
    floors = [f for f, mode in ((col, "colocated"), (pd, "disaggregated")) if mode in modes and f is not None]
    return min(floors) if floors else None


def allowed_modes(p: MixedProblem) -> list[str]:
    """The serving modes a layout of `p` may take: colocated only without a fixed P:D."""
    out = []
    if "colocated" in p.modes and p.fixed_pd is None:
        out.append("colocated")
    if "disaggregated" in p.modes:
        out.append("disaggregated")
    return out


def first_true(ok: Callable[[np.ndarray], np.ndarray], n: int, ways: int = 64) -> int | None:
    """The smallest i in [0, n) where `ok` holds (monotone: false, then true), asked of up to
    `ways` points at once; None where it holds nowhere."""
    lo, hi = 0, n - 1
    while lo <= hi:
        at = np.unique(np.linspace(lo, hi, min(ways, hi - lo + 1)).astype(np.int64))
        hit = np.flatnonzero(ok(at))
        if hit.size == 0:
            return None  # only in the first round: later rounds end at a point known to hold
        j = int(hit[0])
        if j == 0 or int(at[j - 1]) + 1 == int(at[j]):
            return int(at[j])
        lo, hi = int(at[j - 1]) + 1, int(at[j])
    return None


# ------------------------------------------------------------------------------------- evaluation
def _operating_point(roles: tuple[RoleKinds, ...], modes: tuple[str, ...], counts: tuple[dict[Kind, int], ...],
                     queue: bool = True) -> tuple[int, dict[int, tuple[int, int]]] | None:
    """A layout's completion and, per serving role, the (T, Q) it is met at; None if its mode is invalid."""
    n = [sum(c.values()) for c in counts]
    if n[0] > 0 and n[1] == 0 and n[2] == 0:
        col = roles[0].options(counts[0])
        if not col or "colocated" not in modes:
            return None
        t, q = min(col, key=lambda o: o[0] + o[1] * queue)
        return t + q * queue, {0: (t, q)}
    if n[0] == 0 and n[1] > 0 and n[2] > 0 and "disaggregated" in modes:
        a, b = roles[1].options(counts[1]), roles[2].options(counts[2])
        if not a or not b:
            return None
        (ta, qa), (tb, qb) = min(((oa, ob) for oa in a for ob in b), key=lambda o: max(o[0][0], o[1][0]) + (o[0][1] + o[1][1]) * queue)
        return max(ta, tb) + (qa + qb) * queue, {1: (ta, qa), 2: (tb, qb)}
    return None


def _completion(roles: tuple[RoleKinds, ...], modes: tuple[str, ...], counts: tuple[dict[Kind, int], ...], queue: bool = True) -> int | None:
    point = _operating_point(roles, modes, counts, queue)
    return None if point is None else point[0]


def completion_ms(p: MixedProblem, x: tuple[tuple[int, ...], ...]) -> int | None:
    """The objective's (priced) completion of a layout; None if its mode is invalid."""
    return _completion(p.roles, p.modes, p.counts(x))


def batch_completion_ms(p: MixedProblem, x: tuple[tuple[int, ...], ...]) -> int | None:
    """A fresh batch's predicted completion with this layout (what a Decision reports)."""
    return _completion(p.batch_roles, p.modes, p.counts(x))


def routing_shares(p: MixedProblem, x: tuple[tuple[int, ...], ...]) -> tuple[tuple[str, str, int, float], ...]:
    """Per (role, GPU type, TP) kind that layout x runs: the share of a fresh batch one of its
    instances carries where the prediction (`batch_completion_ms`) puts each serving role, 1/k
    for its fewest instances k meeting that role's (T, Q) (0: the prediction idles the kind).

    Why: the completion assumes the router gives each kind at most its share; a router that
    spreads trajectories evenly over instances of different speeds makes the slow ones the
    stragglers (a simulated batch took 18% longer with 4 TP1 A100 decode instances beside 3 TP4
    H20 ones than without them, where the prediction idles them)."""
    counts = p.counts(x)
    roles = p.batch_roles
    point = _operating_point(roles, p.modes, counts)
    out = []
    for r, (t, q) in sorted(point[1].items() if point is not None else ()):
        for kt in roles[r].kinds:
            if counts[r].get(kt.kind, 0) > 0:
                k = int(kt.fewest(np.array(t), np.array(q))) if kt.k.size else 0
                out.append((ROLES[r], kt.kind[0], kt.kind[1], 1.0 / k if k > 0 else 0.0))
    return tuple(out)


def batch_paths_ms(p: MixedProblem, x: tuple[tuple[int, ...], ...]) -> int | None:
    """The paths alone (no queue term): the earliest the model lets the batch end."""
    return _completion(p.batch_roles, p.modes, p.counts(x), queue=False)


def group_transition_ms(g: MixedGroup, v: tuple[int, ...]) -> int:
    """Keep, switch (same TP, another role), stop, start: the cheapest way to reach v on the group."""
    d = [max(0, v[i] - g.total_cur(i)) for i in range(len(v))]
    s = [max(0, g.total_cur(i) - v[i]) for i in range(len(v))]
    total = sum(g.start_ms[i] * d[i] + g.stop_ms[i] * s[i] for i in range(len(v)))
    for t in sorted({t for _, t in g.slots}):
        idx = [i for i, (_, tt) in enumerate(g.slots) if tt == t]
        if len(idx) < 2:
            continue
        save = max(0, g.start_ms[idx[0]] + g.stop_ms[idx[0]] - g.switch_ms[idx[0]])
        total -= save * min(sum(d[i] for i in idx), sum(s[i] for i in idx))
    return total


def feasible(p: MixedProblem, x: tuple[tuple[int, ...], ...]) -> bool:
    return _feasible_completion(p, x) is not None


def _feasible_completion(p: MixedProblem, x: tuple[tuple[int, ...], ...]) -> int | None:
    """Layout x's (priced) completion if it is feasible, else None."""
    for g, v in zip(p.groups, x):
        if any(n < 0 or n > g.ub(i) for i, n in enumerate(v)) or sum(t * n for (_, t), n in zip(g.slots, v)) > g.total_cap:
            return None
    counts = p.counts(x)
    if p.fixed_pd is not None and (sum(counts[1].values()), sum(counts[2].values())) != p.fixed_pd:
        return None
    if p.max_gpus is not None and sum(tp * n for g, v in zip(p.groups, x) for (_, tp), n in zip(g.slots, v)) > p.max_gpus:
        return None
    return _completion(p.roles, p.modes, counts)


def evaluate_mixed(p: MixedProblem, x: tuple[tuple[int, ...], ...]) -> int | None:
    """The objective of a layout computed from its definition (None if infeasible)."""
    t = _feasible_completion(p, x)
    if t is None:
        return None
    return t + sum(group_transition_ms(g, v) for g, v in zip(p.groups, x)) + p.constant_ms


@dataclass(frozen=True)
class DegreeAlternative:
    """Layout x with one group's instances of one role moved to another TP degree on the same
    GPUs (as many instances as fit on them), everything else kept, priced by the definition."""

    group: int
    role: int
    tp: int  # the degree x runs there
    instances: int
    alt_tp: int
    alt_instances: int
    objective_ms: int | None  # None: the alternative breaks a rule of the program (mode, fixed P:D, ...)
    completion_ms: int | None
    transition_ms: int


def degree_alternatives(p: MixedProblem, x: tuple[tuple[int, ...], ...]) -> list[DegreeAlternative]:
    """Why each group runs the degrees it does: every (group, role, degree) of x against the
    role's other allowed degrees there. What a user asks of a mixed decision ("why TP1 on the
    A100s?"); an optimal x is never beaten by one of these. Build `p` with prune=False: a pruned
    problem prices a layout worse than its seeds as infeasible."""
    out = []
    for gi, (g, v) in enumerate(zip(p.groups, x)):
        for i, (r, t) in enumerate(g.slots):
            if not v[i]:
                continue
            for j, (r2, t2) in enumerate(g.slots):
                if r2 != r or t2 == t or v[i] * t < t2:
                    continue
                w = list(v)
                w[i], w[j] = 0, w[j] + v[i] * t // t2
                y = x[:gi] + (tuple(w),) + x[gi + 1 :]
                out.append(DegreeAlternative(gi, r, t, v[i], t2, v[i] * t // t2, evaluate_mixed(p, y), completion_ms(p, y),
                                             sum(group_transition_ms(h, u) for h, u in zip(p.groups, y)) + p.constant_ms))
    return out


def layout_of(p: MixedProblem, targets: tuple) -> tuple[tuple[int, ...], ...]:
    """A decision's targets (`GroupTarget`s with per-node layouts) as x of `p`, per group one count per slot."""
    by_node = {t.node: t.layout for t in targets}
    x = []
    for g in p.groups:
        v = [0] * len(g.slots)
        for node in g.nodes:
            for role, tp, n in by_node.get(node, ()):
                v[g.slots.index((ROLES.index(role), tp))] += n
        x.append(tuple(v))
    return tuple(x)


# ------------------------------------------------------------------------------------- the program
def add_group(lm: LinearModel, gi: int, g: MixedGroup, ubs: list[int], prune: bool = False) -> list[int | None]:
    """Group gi's instances per slot, x[gi, slot] <= ubs[slot], with their transition costs:
    starts on a fresh group; else starts / stops (`LinearModel.flow`) and, inside one TP, the
    switch saving u <= starts, u <= stops. The group's GPU capacity row. `prune` leaves out
    the slots that may hold nothing and hold nothing now (None in the returned list)."""
    xs: list[int | None] = []
    cap_terms = []
    ds: dict[int, int] = {}
    ss: dict[int, int] = {}
    fresh = not any(g.cur)
    for i, (r, t) in enumerate(g.slots):
        if prune and ubs[i] == 0 and g.cur[i] == 0:
            xs.append(None)
            continue
        v = lm.var(f"x[{gi},{r},{t}]", 0, ubs[i])
        xs.append(v)
        cap_terms.append((v, t))
        if fresh:
            lm.cost(v, g.start_ms[i])
            continue
        ds[i], ss[i] = lm.flow(f"{gi},{r},{t}", v, ubs[i], g.total_cur(i), g.start_ms[i], g.stop_ms[i])
    if cap_terms:
        lm.row(cap_terms, -INF, g.total_cap)
    if not fresh:
        for t in sorted({t for _, t in g.slots}):
            idx = [i for i, (_, tt) in enumerate(g.slots) if tt == t and i in ds]
            if len(idx) < 2 or not any(g.cur[i] for i in idx):
                continue
            save = max(0, g.start_ms[idx[0]] + g.stop_ms[idx[0]] - g.switch_ms[idx[0]])
            if save <= 0:
                continue
            u = lm.var(f"u[{gi},{t}]", 0, sum(g.total_cur(i) for i in idx))
            lm.row([(u, 1)] + [(ds[i], -1) for i in idx], -INF, 0)
            lm.row([(u, 1)] + [(ss[i], -1) for i in idx], -INF, 0)
            lm.cost(u, -save)
    lm.x.append(xs)
    return xs


def mixed_linear_model(p: MixedProblem) -> LinearModel:
    lm = LinearModel(const=p.constant_ms)
    kind_terms: list[dict[Kind, list[int]]] = [{}, {}, {}]  # per role, per kind: x vars
    role_terms: list[list[tuple[int, int]]] = [[], [], []]
    gpu_terms: list[tuple[int, int]] = []
    for gi, g in enumerate(p.groups):
        xs = add_group(lm, gi, g, [g.ub(i) for i in range(len(g.slots))])
        for (r, t), v in zip(g.slots, xs):
            assert v is not None
            kind_terms[r].setdefault((g.gpu_type, t), []).append(v)
            role_terms[r].append((v, 1))
            gpu_terms.append((v, t))
    lo_m = 0 if "colocated" in p.modes and p.fixed_pd is None else 1
    hi_m = 1 if "disaggregated" in p.modes else 0
    m = lm.var("m", lo_m, hi_m)
    t_max = max([int(kt.t.max()) for rk in p.roles for kt in rk.kinds if kt.t.size] + [0])
    T = lm.var("T", 0, t_max)
    lm.T = T
    lm.cost(T, 1)
    means_t: list[list[tuple[int, int]]] = []
    means_q: list[list[tuple[int, int]]] = []
    queues: list[int | None] = []
    for r, rk in enumerate(p.roles):
        n_max = max(sum(lm.ub[v] for v, _ in role_terms[r]), 1)
        serve = [(m, -1)] if r == 0 else [(m, 1)]  # the role serves: 1 - m (colocated) or m
        serve_const = 1 if r == 0 else 0
        if role_terms[r]:
            lm.row(role_terms[r] + [(v, -c * n_max) for v, c in serve], -INF, serve_const * n_max)  # N_r <= M * serves
        q_max = max([int(kt.q.max()) for kt in rk.kinds if kt.q.size] + [0])
        Q = lm.var(f"Q[{r}]", 0, q_max) if q_max else None
        if Q is not None:
            lm.cost(Q, 1)
            lm.queue.append((Q, 1))
        cover: list[tuple[int, int]] = []
        avg_t: list[tuple[int, int]] = []  # S T >= sum t_e sigma: the units' mean path (tightens the LP)
        avg_q: list[tuple[int, int]] = []
        for kt in rk.kinds:
            terms = kind_terms[r].get(kt.kind, [])
            if not terms or kt.k.size == 0:
                continue
            ws = [lm.var(f"w[{r},{kt.kind},{e}]", 0, 1) for e in range(kt.k.size + 1)]  # ws[0]: idle
            lm.row([(w, 1) for w in ws], 1, 1)
            link = [(v, rk.units) for v in terms]
            for e in range(kt.k.size):
                sg = lm.var(f"sigma[{r},{kt.kind},{e}]", 0, rk.units)
                lm.row([(sg, 1), (ws[e + 1], -rk.units)], -INF, 0)
                link.append((sg, -int(kt.k[e])))
                cover.append((sg, 1))
                avg_t.append((sg, -int(kt.t[e])))
                avg_q.append((sg, -int(kt.q[e])))
            lm.row(link, 0, INF)  # S N_j >= sum k sigma
            lm.row([(T, 1)] + [(w, -int(t)) for w, t in zip(ws[1:], kt.t) if t], 0, INF)
            if Q is not None:
                lm.row([(Q, 1)] + [(w, -int(q)) for w, q in zip(ws[1:], kt.q) if q], 0, INF)
        # the units cover the batch exactly when the role serves (a kind may carry less than it could)
        lm.row(cover + [(v, -c * rk.units) for v, c in serve], serve_const * rk.units, serve_const * rk.units)
        means_t.append(avg_t)
        means_q.append([(v, c) for v, c in avg_q if c])
        queues.append(Q)
    # the units' mean path and queue: colocated units and one P/D role's units cover one batch
    # together (only one mode serves), so S T >= their t-weighted sum, and S (sum of Q) likewise
    units = p.roles[0].units if p.roles[0].units == p.roles[1].units == p.roles[2].units else None
    if units is not None:
        for r in (1, 2):
            if means_t[0] or means_t[r]:
                lm.row([(T, units)] + means_t[0] + means_t[r], 0, INF)
        qs = [(Q, units) for Q in queues if Q is not None]
        if qs and (means_q[0] or means_q[1] or means_q[2]):
            lm.row(qs + means_q[0] + means_q[1] + means_q[2], 0, INF)
    lm.policy_rows(role_terms[1], role_terms[2], gpu_terms, p.fixed_pd, p.max_gpus)
    return lm


def solve_mixed(p: MixedProblem, backend: str, time_limit_s: float = 1.0, workers: int = 8, seed: int = 0, method: str = "search",
                gap: float = 0.0, exact_backend: str | None = None) -> Solution:
    """Solve the mixed program; `Solution.x` holds per group one count per slot (`MixedGroup.slots`).

    method "search" (every backend's default): the exact threshold search of
    planner/mixed_search.py, its small inner programs on `backend`; "onehot": the one-hot
    program below in one solve (kept as a second, independent formulation for the tests).
    "optimal" is proven within the relative `gap` (0: exact). `exact_backend`: where the search
    solves its exact-units programs (None: on `backend`; `SolverSettings.exact_backend`)."""
    if (bad := _contradiction(p, backend)) is not None:
        return bad
    if method == "search":
        from planner.mixed_search import search_mixed

        return search_mixed(p, backend, time_limit_s, workers, seed, gap, exact_backend)
    lm = mixed_linear_model(p)
    raw = solve_model(lm, backend, time_limit_s, workers, seed, gap)
    sol = read_back(lm, raw, len(p.groups))
    if raw.values is None:
        return Solution(sol.status, tuple(tuple(0 for _ in g.slots) for g in p.groups), 0, 0, sol.best_bound_ms, sol.solve_ms, backend)  # type: ignore[arg-type]
    # T, Q and the units are auxiliary: the layout x fixes the objective. CBC may leave them
    # above their minimum within its tolerances, so the objective is recomputed from x
    obj = evaluate_mixed(p, sol.x)
    if obj is None:
        return replace(sol, status="no_solution")
    completion = completion_ms(p, sol.x)
    return replace(sol, objective_ms=obj, completion_ms=completion or 0, best_bound_ms=min(sol.best_bound_ms, float(obj)))


def _contradiction(p: MixedProblem, backend: str) -> Solution | None:
    allowed = {m for m in p.modes if m in ("colocated", "disaggregated")}
    if allowed and (p.fixed_pd is None or "disaggregated" in allowed):
        return None
    return Solution("infeasible", tuple(tuple(0 for _ in g.slots) for g in p.groups), 0, 0, -math.inf, 0.0, backend, "policy")  # type: ignore[arg-type]



def split_mixed(g: MixedGroup, v: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """Per-node counts of a class total `v` at the class's transition cost (`_split`); a class
    that cannot host `v` node by node is a bug of the fold (solve paths check `splits_at_price`)."""
    parts = _split(g, v)
    if parts is None:
        raise AssertionError(f"class of {g.mult} nodes cannot host {v}: folding was not exact")
    return parts


def _split(g: MixedGroup, v: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]] | None:
    """Per-node counts of a class total `v`, None where they do not fit.

    Survivors stay; a slot's surplus leaves the first nodes first (freed room gathers on few
    nodes, where a larger TP then fits); freed room on a node is refilled first by another role
    of the same TP (a switch there), then new instances go largest TP first where there is room
    (powers of two that divide an empty node pack exactly)."""
    n_slots = len(g.slots)
    if all(v[i] == g.total_cur(i) for i in range(n_slots)):
        return [(node, g.cur) for node in g.nodes]
    per = [list(g.cur) for _ in g.nodes]
    for i in range(n_slots):
        extra = g.total_cur(i) - v[i]
        for n in range(g.mult):
            take = min(max(extra, 0), per[n][i])
            per[n][i] -= take
            extra -= take
    need = [max(0, v[i] - g.total_cur(i)) for i in range(n_slots)]
    freed = [[g.cur[i] - per[n][i] for i in range(n_slots)] for n in range(g.mult)]
    for n in range(g.mult):
        for i in range(n_slots):
            for j in range(n_slots):
                while need[i] and freed[n][j] and g.slots[j][1] == g.slots[i][1] and i != j:
                    per[n][i] += 1
                    freed[n][j] -= 1
                    need[i] -= 1
    for i in sorted(range(n_slots), key=lambda i: -g.slots[i][1]):
        for n in range(g.mult):
            while need[i] and sum(t * c for (_, t), c in zip(g.slots, per[n])) + g.slots[i][1] <= g.cap:
                per[n][i] += 1
                need[i] -= 1
    if any(need):
        return None
    return [(node, tuple(c)) for node, c in zip(g.nodes, per)]


def splits_at_price(p: MixedProblem, x: tuple[tuple[int, ...], ...]) -> bool:
    """Does every class of nodes running instances split layout x back onto its nodes at the
    price the program charged the class?

    A class's price (`group_transition_ms` on its totals) is at most the sum of its nodes'
    prices for any split, and its capacity row is weaker than theirs, so a program whose nodes
    that run the same instances are folded (`Options.fold_running`) is a relaxation: its optimum
    bounds the true one from below, and is the true one when it splits at the price charged."""
    for g, v in zip(p.groups, x):
        if g.mult == 1 or not any(g.cur) or all(v[i] == g.total_cur(i) for i in range(len(v))):
            continue  # a class that keeps its instances splits as it is, at no cost
        parts = _split(g, v)
        if parts is None:
            return False
        # every node of a class starts from the same instances: one price per distinct node layout
        node = replace(g, nodes=g.nodes[:1])
        if sum(n * group_transition_ms(node, nv) for nv, n in Counter(nv for _, nv in parts).items()) != group_transition_ms(g, v):
            return False
    return True
