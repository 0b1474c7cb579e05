"""The integer program for mixed layouts: several GPU types and TP degrees in one decision.

Used when the planning inputs carry one prediction table per (role, GPU type, TP degree)
(`PlanningInputs.variants`); a single type with one TP degree per role keeps the program of
planner/milp.py unchanged. Same families, pricing and objective as there; what changes:

  slots s = (role r, TP t)  what an instance on a group can be; the group fixes the GPU type,
                            so an instance never spans types or nodes (TP stays inside a node)
  kinds j of role r         (GPU type, TP) with its own table (k, t_ms, q_ms): the role's path and
                            queue with k instances of that kind alone serving the batch
  x[g,s], d, s              instances / starts / stops per group and slot; switches only between
                            roles of one TP on one group (u[g,t]); a TP change is a stop + a start
  levels ℓ of role r        the union of the kinds' undominated (t, q) entries; need_j(ℓ) = the
                            fewest kind-j instances whose own table reaches t <= t_ℓ and q <= q_ℓ

The mixed completion (the router's load split; the slowest trajectory's path). Levels are the
points every configured kind reaches alone (used in this state or not), so the level set is
fixed by the inputs, not by what is available. One of need_j
instances that share a batch carries 1/need_j of it and finishes within t_ℓ (its slowest
trajectory's path, queueing <= q_ℓ); an instance given no more than that share behaves no
worse (a smaller load is never slower in the predictor). The router gives each instance at
most that share, so a layout N meets level ℓ when the shares cover the batch:

    sum_j N_j * ceil(S / need_j(ℓ)) >= S      (S = 4^ceil(log2 K), K the role's largest table)

Shares are counted in whole units of 1/S of the batch, each instance's rounded up: with one
kind this is exactly N >= need (S >= K^2 > (need - 1) need), so a homogeneous role keeps
today's semantics; a mix is at most one unit per instance optimistic. The role's path is the
smallest level met: `role_options` is that definition and the program's rows are it too, so
the program stays exact with respect to it (no average of GPU counts anywhere). Disaggregated:
max(prefill level t, decode level t) + prefill level q, as in planner/milp.py.

Rows per role: a single kind keeps milp.py's one row N >= sum_ℓ need_ℓ y_ℓ; several kinds get
one coverage row per level, sum_j c_j(ℓ) N_j >= S y_ℓ (the others hold trivially at y_ℓ = 0).
Levels are dropped only when no optimum can select them (exact): ones the usable GPUs cannot
cover even at the best per-GPU share, ones whose time + queue exceed the current layout's
objective, and, in the disaggregated mode, ones below the partner role's floor that another
level below it beats (the max hides the difference).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from planner.backends import INF, LinearModel, read_back, solve_model
from planner.inputs import Entry, PlanningInputs
from planner.milp import Options, Solution, _ms, borrow_window_open, price_entries, work_fraction
from planner.state import ROLES, ClusterState

Slot = tuple[int, int]  # (role index, TP degree)
Kind = tuple[str, int]  # (GPU type, TP degree)


@dataclass(frozen=True)
class MixedGroup:
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

    @property
    def mult(self) -> int:
        return len(self.nodes)

    @property
    def total_cap(self) -> int:
        return self.cap * self.mult

    def total_cur(self, i: int) -> int:
        return self.cur[i] * self.mult

    def ub(self, i: int) -> int:
        return (self.cap // self.slots[i][1]) * self.mult


@dataclass(frozen=True)
class RoleLevels:
    """One role's kinds and the levels its layouts can meet; row 0 is 'role unused'.

    t, q: (L,) priced or fresh milliseconds; need: (L, kinds) (0 = the kind cannot reach it)."""

    kinds: tuple[Kind, ...]
    t: np.ndarray = field(compare=False)
    q: np.ndarray = field(compare=False)
    need: np.ndarray = field(compare=False)
    units: int = 1

    @property
    def size(self) -> int:
        return int(self.t.size)

    def shares(self) -> np.ndarray:
        """(L, kinds): ceil(S / need), the units of the batch one instance of each kind carries."""
        return np.where(self.need > 0, -(-self.units // np.maximum(self.need, 1)), 0)

    def met(self, counts: dict[Kind, int]) -> np.ndarray:
        """Indices (not 0) of the levels a layout with `counts` instances per kind meets."""
        n = np.array([counts.get(k, 0) for k in self.kinds], dtype=np.int64)
        if len(self.kinds) == 1:
            ok = (self.need[:, 0] > 0) & (n[0] >= self.need[:, 0])
        else:
            ok = self.shares() @ n >= self.units
        ok[0] = False
        return np.flatnonzero(ok)

    def select(self, keep: np.ndarray, floor: int | None = None) -> RoleLevels:
        """The levels where `keep` is true (row 0 always), row 0's t set to `floor` if given."""
        keep = keep.copy()
        keep[0] = True
        t = self.t[keep].copy()
        if floor is not None:
            t[0] = floor
        return RoleLevels(self.kinds, t, self.q[keep], self.need[keep], self.units)


@dataclass(frozen=True)
class MixedProblem:
    groups: tuple[MixedGroup, ...]
    roles: tuple[RoleLevels, RoleLevels, RoleLevels]  # priced (the objective's)
    batch_roles: tuple[RoleLevels, RoleLevels, RoleLevels]  # a fresh batch's, unpriced (what a Decision reports)
    modes: tuple[str, ...]
    fixed_pd: tuple[int, int] | None
    max_gpus: int | None
    constant_ms: int
    cost_gpus: int
    work: float

    def counts(self, x: tuple[tuple[int, ...], ...]) -> tuple[dict[Kind, int], dict[Kind, int], dict[Kind, int]]:
        out: tuple[dict[Kind, int], ...] = ({}, {}, {})
        for g, v in zip(self.groups, x):
            for (r, t), n in zip(g.slots, v):
                if n:
                    out[r][(g.gpu_type, t)] = out[r].get((g.gpu_type, t), 0) + n
        return out  # type: ignore[return-value]


def share_units(largest_table: int) -> int:
    """S: a power of two >= K^2, so that one kind alone is exact (module docstring)."""
    return 4 ** max(0, math.ceil(math.log2(max(largest_table, 1))))


def _needs(lt: np.ndarray, lq: np.ndarray, entries: tuple[Entry, ...]) -> np.ndarray:
    """need per level: the fewest instances among `entries` (k > 0) with t <= t_ℓ and q <= q_ℓ (0: none).

    Undominated entries whose t and q both fall with k (always so without a queue) reach a
    level from the later of the two thresholds on: two bisections. Otherwise a full comparison."""
    ks = np.array([k for k, _, _ in entries if k], dtype=np.int64)
    if ks.size == 0 or lt.size == 0:
        return np.zeros(lt.size, dtype=np.int64)
    ts = np.array([t for k, t, _ in entries if k], dtype=np.int64)
    qs = np.array([q for k, _, q in entries if k], dtype=np.int64)
    if np.all(np.diff(ts) <= 0) and np.all(np.diff(qs) <= 0):
        i = np.maximum(np.searchsorted(-ts, -lt, side="left"), np.searchsorted(-qs, -lq, side="left"))
        return np.where(i < ks.size, ks[np.minimum(i, ks.size - 1)], 0)
    ok = (ts[None, :] <= lt[:, None]) & (qs[None, :] <= lq[:, None])
    return np.where(ok.any(axis=1), ks[np.argmax(ok, axis=1)], 0)


def role_levels(kinds: list[Kind], entries: list[tuple[Entry, ...]], units: int, others: list[tuple[Entry, ...]] = ()) -> RoleLevels:
    """All levels of a role: the union of its configured kinds' (t, q) entries (`others`: kinds
    with no room in this state, levels only), each with the needs of `kinds`."""
    pts = np.array(sorted({(t, q) for e in (*entries, *others) for k, t, q in e if k}), dtype=np.int64).reshape(-1, 2)
    lt = np.concatenate([[0], pts[:, 0]]).astype(np.int64)
    lq = np.concatenate([[0], pts[:, 1]]).astype(np.int64)
    need = np.stack([_needs(lt, lq, e) for e in entries], axis=1) if entries else np.zeros((lt.size, 0), dtype=np.int64)
    need[0] = 0
    return RoleLevels(tuple(kinds), lt, lq, need, units)


# ------------------------------------------------------------------------------------- build
def build_mixed_problem(state: ClusterState, inputs: PlanningInputs, now_s: float, options: Options = Options()) -> MixedProblem:
    """Fold the state into groups, slots and per-role levels (pure); see the module docstring."""
    relax = options.relax
    lendable = borrow_window_open(state, inputs, now_s) and options.allow_borrow
    pools = set(options.pools)
    if not options.allow_elastic:
        pools.discard("elastic")
    if not options.allow_borrow:
        pools.discard("training")
    tables = {(t.role, t.gpu_type, t.tp): t for t in inputs.variants}
    held = {gid for wk in state.workers if wk.draining for gid in wk.gpus}
    raw = []
    for grp in state.groups():
        cap = grp.usable - sum(1 for gid in grp.gpu_ids if gid in held and state.gpu(gid).usable)
        if grp.pool not in pools and "policy" not in relax:
            cap = 0
        if grp.pool == "training" and not lendable and "borrow_window" not in relax:
            cap = 0
        raw.append((grp, cap))
    denom = max(sum(c for grp, c in raw if grp.pool != "training"), 1)
    w = inputs.weights.transition_weight / inputs.weights.horizon_batches
    c = inputs.costs

    def slots_of(typ: str, cap: int) -> tuple[Slot, ...]:
        out = []
        for r, role in enumerate(ROLES):
            for (ro, ty, t) in sorted(tables):
                if ro == role and ty == typ and t <= cap and (inputs.memory.fits(typ, t) or "memory" in relax):
                    out.append((r, t))
        return tuple(out)

    cur: dict[tuple[str, str, str], dict[Slot, int]] = {}
    constant = 0
    cap_of = {grp.key: cap for grp, cap in raw}
    for wk in state.workers:
        if wk.draining:
            continue
        key = state.group_key_of(wk)
        slot = (ROLES.index(wk.role), wk.tp)
        ok = slot in slots_of(key[2], cap_of.get(key, 0)) and all(state.gpu(gid).usable for gid in wk.gpus)
        if ok:
            cur.setdefault(key, {}).setdefault(slot, 0)
            cur[key][slot] += 1
        else:
            constant += _ms(w * c.stop_s * wk.tp / denom)
    classes: dict[tuple, list[str]] = {}
    for grp, cap in raw:
        slots = slots_of(grp.type, cap)
        cu = tuple(cur.get(grp.key, {}).get(s, 0) for s in slots)
        # folding nodes is exact when no instance is current and every TP that fits divides the
        # node (powers of two then pack node by node, largest first)
        exact = not any(cu) and all(cap % t == 0 for _, t in slots)
        key = (grp.pool, grp.type, cap, slots, cu, "" if (exact and options.aggregate) else grp.node)
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
    for r, role in enumerate(ROLES):
        kinds: list[Kind] = []
        ub: dict[Kind, int] = {}
        for g in groups:
            for i, (ro, t) in enumerate(g.slots):
                if ro == r and g.ub(i) > 0:
                    ub[(g.gpu_type, t)] = ub.get((g.gpu_type, t), 0) + g.ub(i)
        kinds = sorted(ub)
        configured = sorted((ty, t) for ro, ty, t in tables if ro == role)
        units = share_units(max((tables[(role, ty, t)].max_instances for ty, t in configured), default=1))
        # every entry, not only k <= what fits of the kind alone: a mix uses kinds at shares they cannot reach alone
        fresh = [tables[(role, ty, t)].improving for ty, t in kinds]
        absent = [tables[(role, ty, t)].improving for ty, t in configured if (ty, t) not in ub]
        batch.append(role_levels(kinds, fresh, units, absent))
        priced.append(role_levels(kinds, [price_entries(e, work) for e in fresh], units, [price_entries(e, work) for e in absent]))
    modes = options.modes if "policy" not in relax else ("colocated", "disaggregated")
    fixed = options.fixed_pd if "policy" not in relax else None
    mx = options.max_gpus if "policy" not in relax else None
    problem = MixedProblem(tuple(groups), tuple(priced), tuple(batch), modes, fixed, mx, constant, denom, work)  # type: ignore[arg-type]
    return _prune_levels(problem)


def _prune_levels(p: MixedProblem) -> MixedProblem:
    """Drop levels no optimum can select (module docstring), then put a valid lower bound on
    T in the 'role unused' row (tightens the LP relaxation, cuts nothing)."""
    keep = [_reachable(p, r, rl) for r, rl in enumerate(p.roles)]
    ub = _incumbent(p)
    if ub is not None:
        keep = [k & (rl.t + rl.q + p.constant_ms <= ub) for k, rl in zip(keep, p.roles)]
    if "disaggregated" in p.modes:
        best = [_best_t(rl, k) for rl, k in zip(p.roles, keep)]
        keep[1] = keep[1] & _beats_below(p.roles[1], keep[1], best[2])
        keep[2] = keep[2] & _beats_below(p.roles[2], keep[2], best[1])
    best = [_best_t(rl, k) for rl, k in zip(p.roles, keep)]
    cands = [best[0]] if best[0] is not None else []
    if best[1] is not None and best[2] is not None:
        cands.append(max(best[1], best[2]))
    floor = min(cands) if cands else 0
    roles = tuple(rl.select(k, floor) for rl, k in zip(p.roles, keep))
    return MixedProblem(p.groups, roles, p.batch_roles, p.modes, p.fixed_pd, p.max_gpus, p.constant_ms, p.cost_gpus, p.work)  # type: ignore[arg-type]


def _best_t(rl: RoleLevels, keep: np.ndarray) -> int | None:
    k = keep.copy()
    k[0] = False
    return int(rl.t[k].min()) if k.any() else None


def _reachable(p: MixedProblem, r: int, rl: RoleLevels) -> np.ndarray:
    """(L,) can the usable GPUs cover the level at all (each GPU at its group's best share per GPU)?"""
    index = {k: i for i, k in enumerate(rl.kinds)}
    shares = rl.shares().astype(float)
    total = np.zeros(rl.size)
    for g in p.groups:
        per_gpu = np.zeros(rl.size)
        for i, (ro, t) in enumerate(g.slots):
            if ro == r and g.ub(i) and (g.gpu_type, t) in index:
                per_gpu = np.maximum(per_gpu, shares[:, index[(g.gpu_type, t)]] / t)
        total += per_gpu * g.total_cap
    ok = total >= rl.units
    ok[0] = True
    return ok


def _beats_below(rl: RoleLevels, keep: np.ndarray, floor: int | None) -> np.ndarray:
    """At or below the partner's best time the max hides t: of those levels drop each one that
    another one there beats, queueing no longer and needing no more instances of any kind."""
    out = np.ones(rl.size, dtype=bool)
    if floor is None:
        return out
    low = np.flatnonzero(keep & (rl.t <= floor))
    low = low[low > 0]
    if low.size < 2:
        return out
    if not rl.q[low].any():  # no queue: needs only fall with t, so the largest t beats the rest
        out[low[:-1]] = False
        return out
    if low.size > 1500:  # the pairwise test costs O(n^2): skip (keeping levels is always exact)
        return out
    need = np.where(rl.need[low] > 0, rl.need[low], np.iinfo(np.int64).max)
    q = rl.q[low]
    # j beats i: q_j <= q_i and need_j <= need_i everywhere; ties keep the larger t (the last)
    no_worse = (q[:, None] <= q[None, :]) & np.all(need[:, None, :] <= need[None, :, :], axis=2)
    same = (q[:, None] == q[None, :]) & np.all(need[:, None, :] == need[None, :, :], axis=2)
    later = np.arange(low.size)[:, None] > np.arange(low.size)[None, :]
    beaten = no_worse & (~same | later)
    np.fill_diagonal(beaten, False)
    out[low[beaten.any(axis=0)]] = False
    return out


def _incumbent(p: MixedProblem) -> int | None:
    cur = tuple(tuple(g.total_cur(i) for i in range(len(g.slots))) for g in p.groups)
    if not any(any(v) for v in cur):
        return None
    return evaluate_mixed(p, cur)


# ------------------------------------------------------------------------------------- evaluation
def _completion(roles: tuple[RoleLevels, ...], modes: tuple[str, ...], counts: tuple[dict[Kind, int], ...]) -> int | None:
    n = [sum(c.values()) for c in counts]
    if n[0] > 0 and n[1] == 0 and n[2] == 0:
        col = roles[0].met(counts[0])
        return int((roles[0].t[col] + roles[0].q[col]).min()) if col.size and "colocated" in modes else None
    if n[0] == 0 and n[1] > 0 and n[2] > 0 and "disaggregated" in modes:
        a, b = roles[1].met(counts[1]), roles[2].met(counts[2])
        if not a.size or not b.size:
            return None
        ta, qa, tb = roles[1].t[a], roles[1].q[a], roles[2].t[b]
        if not roles[2].q[b].any():  # the decode role queues nothing: its best time is all that counts
            return int((np.maximum(ta, tb.min()) + qa).min())
        return int((np.maximum(ta[:, None], tb[None, :]) + qa[:, None] + roles[2].q[b][None, :]).min())
    return None


def completion_ms(p: MixedProblem, x: tuple[tuple[int, ...], ...]) -> int | None:
    """The objective's (priced) completion of a layout; None if its mode is invalid."""
    return _completion(p.roles, p.modes, p.counts(x))


def batch_completion_ms(p: MixedProblem, x: tuple[tuple[int, ...], ...]) -> int | None:
    """A fresh batch's predicted completion with this layout (what a Decision reports)."""
    return _completion(p.batch_roles, p.modes, p.counts(x))


def batch_paths_ms(p: MixedProblem, x: tuple[tuple[int, ...], ...]) -> int | None:
    """The paths alone (no prefill queue): the earliest the model lets the batch end."""
    roles = tuple(RoleLevels(rl.kinds, rl.t, np.zeros_like(rl.q), rl.need, rl.units) for rl in p.batch_roles)
    return _completion(roles, p.modes, p.counts(x))


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
    for g, v in zip(p.groups, x):
        if any(n < 0 or n > g.ub(i) for i, n in enumerate(v)) or sum(t * n for (_, t), n in zip(g.slots, v)) > g.total_cap:
            return False
    counts = p.counts(x)
    if completion_ms(p, x) is None:
        return False
    if p.fixed_pd is not None and (sum(counts[1].values()), sum(counts[2].values())) != p.fixed_pd:
        return False
    used = sum(t * n for g, v in zip(p.groups, x) for (_, t), n in zip(g.slots, v))
    return p.max_gpus is None or used <= p.max_gpus


def evaluate_mixed(p: MixedProblem, x: tuple[tuple[int, ...], ...]) -> int | None:
    """The objective of a layout computed from its definition (None if infeasible)."""
    if not feasible(p, x):
        return None
    t = completion_ms(p, x)
    assert t is not None
    return t + sum(group_transition_ms(g, v) for g, v in zip(p.groups, x)) + p.constant_ms


# ------------------------------------------------------------------------------------- the program
def mixed_linear_model(p: MixedProblem) -> LinearModel:
    lm = LinearModel(const=p.constant_ms)
    kind_terms: list[dict[Kind, list[int]]] = [{}, {}, {}]  # per role, per kind: x vars
    role_terms: list[list[tuple[int, int]]] = [[], [], []]
    gpu_terms: list[tuple[int, int]] = []
    for gi, g in enumerate(p.groups):
        xs: list[int | None] = []
        cap_terms = []
        ds: dict[int, int] = {}
        ss: dict[int, int] = {}
        fresh = not any(g.cur)
        for i, (r, t) in enumerate(g.slots):
            v = lm.var(f"x[{gi},{r},{t}]", 0, g.ub(i))
            xs.append(v)
            kind_terms[r].setdefault((g.gpu_type, t), []).append(v)
            role_terms[r].append((v, 1))
            gpu_terms.append((v, t))
            cap_terms.append((v, t))
            if fresh:
                lm.cost(v, g.start_ms[i])
                continue
            d = lm.var(f"d[{gi},{r},{t}]", 0, g.ub(i))
            s = lm.var(f"s[{gi},{r},{t}]", 0, g.total_cur(i))
            ds[i], ss[i] = d, s
            lm.row([(d, 1), (s, -1), (v, -1)], -g.total_cur(i), -g.total_cur(i))
            lm.cost(d, g.start_ms[i])
            lm.cost(s, g.stop_ms[i])
        if cap_terms:
            lm.row(cap_terms, -INF, g.total_cap)
        for t in sorted({t for _, t in g.slots}):
            idx = [i for i, (_, tt) in enumerate(g.slots) if tt == t]
            save = max(0, g.start_ms[idx[0]] + g.stop_ms[idx[0]] - g.switch_ms[idx[0]]) if idx else 0
            if len(idx) < 2 or save <= 0 or not any(g.cur[i] for i in idx) or fresh:
                continue
            u = lm.var(f"u[{gi},{t}]", 0, sum(g.total_cur(i) for i in idx))
            lm.row([(u, 1)] + [(ds[i], -1) for i in idx], -INF, 0)
            lm.row([(u, 1)] + [(ss[i], -1) for i in idx], -INF, 0)
            lm.cost(u, -save)
        lm.x.append(xs)
    lo_m = 0 if "colocated" in p.modes and p.fixed_pd is None else 1
    hi_m = 1 if "disaggregated" in p.modes else 0
    m = lm.var("m", lo_m, hi_m)
    t_max = max([int(rl.t.max()) for rl in p.roles if rl.size] + [0])
    T = lm.var("T", 0, t_max)
    lm.T = T
    lm.cost(T, 1)
    for r, rl in enumerate(p.roles):
        n_max = sum(lm.ub[v] for v, _ in role_terms[r])
        ys = []
        for li in range(rl.size):
            y = lm.var(f"y[{r},{li}]", 0, 1)
            ys.append(y)
            q = int(rl.q[li])
            if li and q:
                lm.cost(y, q)
                lm.queue.append((y, q))
        lm.row([(y, 1) for y in ys], 1, 1)
        if r == 0:
            lm.row([(ys[0], 1), (m, -1)], 0, 0)
            if role_terms[r]:
                lm.row(role_terms[r] + [(m, max(n_max, 1))], -INF, max(n_max, 1))
        else:
            lm.row([(ys[0], 1), (m, 1)], 1, 1)
            if role_terms[r]:
                lm.row(role_terms[r] + [(m, -max(n_max, 1))], -INF, 0)
        if len(rl.kinds) == 1:
            terms = [(v, 1) for v in kind_terms[r].get(rl.kinds[0], [])]
            lm.row(terms + [(y, -int(rl.need[li, 0])) for li, y in enumerate(ys) if li], 0, INF)
        else:  # several kinds (or none: then only 'role unused' can be selected)
            shares = rl.shares()
            for li, y in enumerate(ys):
                if li:
                    terms = [(v, int(shares[li, j])) for j, k in enumerate(rl.kinds) if shares[li, j] for v in kind_terms[r].get(k, [])]
                    lm.row(terms + [(y, -rl.units)], 0, INF)
        lm.row([(T, 1)] + [(y, -int(rl.t[li])) for li, y in enumerate(ys) if rl.t[li]], 0, INF)
    if p.fixed_pd is not None:
        lm.row(role_terms[1], p.fixed_pd[0], p.fixed_pd[0])
        lm.row(role_terms[2], p.fixed_pd[1], p.fixed_pd[1])
    if p.max_gpus is not None:
        lm.row(gpu_terms, -INF, p.max_gpus)
    return lm


def solve_mixed(p: MixedProblem, backend: str, time_limit_s: float = 1.0, workers: int = 8, seed: int = 0) -> Solution:
    """Solve the mixed program; `Solution.x` holds per group one count per slot (`MixedGroup.slots`)."""
    if (bad := _contradiction(p, backend)) is not None:
        return bad
    lm = mixed_linear_model(p)
    raw = solve_model(lm, backend, time_limit_s, workers, seed)
    sol = read_back(lm, raw, len(p.groups))
    if raw.values is None:
        return Solution(sol.status, tuple(tuple(0 for _ in g.slots) for g in p.groups), 0, 0, sol.best_bound_ms, sol.solve_ms, backend)  # type: ignore[arg-type]
    return sol


def _contradiction(p: MixedProblem, backend: str) -> Solution | None:
    allowed = {m for m in p.modes if m in ("colocated", "disaggregated")}
    if allowed and (p.fixed_pd is None or "disaggregated" in allowed):
        return None
    return Solution("infeasible", tuple(tuple(0 for _ in g.slots) for g in p.groups), 0, 0, -math.inf, 0.0, backend, "policy")  # type: ignore[arg-type]

