"""Exact search for the mixed program of planner/mixed.py: thresholds outside, small covering programs inside.

Why: the one-hot program (`mixed.mixed_linear_model`) selects one entry per kind among
hundreds to thousands; its LP relaxation is weak and CBC needs seconds at 256-4096 GPUs. The
completion has structure it leaves unused: a role's path is T = the largest t of its serving
kinds and its queue Q = the largest q, and for fixed thresholds (T, Q) a kind's best operating
point is simply the fewest instances k among its entries with t <= T and q <= Q (the largest
share: floor(S N / k) only grows as k falls). With the thresholds fixed, the covering rule is
linear in the instance counts with fixed coefficients, and what is left (capacity, slots,
starts / stops / switches, the mode, the policy rows) is a small integer program with no entry
selection at all (`_inner_model`).

The search, per mode (disaggregated shares T: its completion is max(T_P, T_D) + Q_P + Q_D and
raising a threshold only helps), over the grid of candidate thresholds: every T among the
serving kinds' t at or above the floor where the usable GPUs can cover every role at all, and
per serving role every Q among its q (0 without a queue). Best-first over boxes of that grid,
each bounded by its tightest corner's T + sum Q plus its loosest corner's transition cost (a
box's points all have thresholds at most that corner's, so they cost at least its cost):
  1. `_lp_bound`: the optimum of that cost's fractional relaxation (each GPU at its slot's
     start or switch unless a current instance keeps it, and a kept GPU that leaves its
     instance at its share of the stop), from its dual, no solver call;
  2. for a box of at most MILP_BOX candidates, the corner's covering program, relaxed (one
     scaled row per role) and cut off at what could still beat the incumbent anywhere in the
     box: infeasible, the box goes; its layout is priced by the definition
     (`mixed.evaluate_mixed`) and may become the incumbent;
  3. else the box splits on its widest side (both halves inherit the cost as a floor); a
     single candidate gets the exact program (units floor(S N / k)) if the relaxed layout
     misses the floors. Where the exact programs go to CP-SAT (the default) every corner gets
     the exact program in step 2 instead of the relaxed one (`search_mixed`, exact_backend).
     What is known per corner (`Corner`: an exact cost, or only a bound) is kept across boxes
     that share it, and lent as a floor to every corner that needs at
     least as many instances of every kind (`Looser`); a single candidate ends only with an
     exact cost.
The search ends when the best remaining bound is no better than the incumbent. Exact: a
layout's objective is at most T + sum Q + its transition cost at any candidate it covers, and
the optimum covers its own (T*, Q*); every pruned box holds only candidates whose bound is no
better than a layout already found, and a candidate left unpruned has had its exact program,
whose layout (priced, at most that candidate's bound) the incumbent already matches. A
decision is proven optimal when every program solved was proven (optimal or infeasible) and
the time limit did not cut the search.
"""

from __future__ import annotations

import functools
import heapq
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from planner.backends import INF, LinearModel, solve_model
from planner.milp import Solution
from planner.mixed import KindTable, MixedGroup, MixedProblem, add_group, allowed_modes, completion_ms, evaluate_mixed, first_true, seed_layouts

# boxes of more candidates than this get only the fractional bound: their corner programs (loose
# thresholds, generous budgets) were the slow ones, and CBC overran its time limit on some.
# Measured on 8 decisions of the 256-GPU bench walk (2026-12-01, load ~3.8): 57 s in all with a
# program at every box, 17 s with this limit; on 8 at 4096 GPUs about even (the fresh first one slower).
# Re-measured once corners kept what they know (2026-12-02, the same 8 + 8 problems replayed, two
# runs each, ms in all at 256 / 4096 GPUs): 8: 3479-4029 / 2173-2465; 16: 2659-3171 / 1806-1827;
# 32: 3140-3242 / 2038-2436; 64: 2672-2946 / 2358-2369; 256: 3987 / 3280. Once the CP-SAT programs were
# written as protos with a light presolve (2026-12-05, 84 recorded searches, ms in all at 256 GPUs (three sets) / 4096):
# 16: 2018-2053, 1520-1571, 1245-1287 / 103; 32: 1924-1952, 1415-1472, 1120-1146 / 107; 48 and 64 no better
MILP_BOX = 32
MODE_ROLES = {"colocated": (0,), "disaggregated": (1, 2)}


def _fewest_grid(kt: KindTable, ts: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """The kind's fewest instances meeting (T, Q) for every T in ts and Q in qs (0: none)."""
    if kt.k.size == 0:
        return np.zeros((ts.size, qs.size), dtype=np.int64)
    if kt.falling:  # entries meeting T and those meeting Q are both suffixes: the later start wins
        i_t = np.searchsorted(-kt.t, -ts, side="left")
        i_q = np.searchsorted(-kt.q, -qs, side="left")
        i = np.maximum(i_t[:, None], i_q[None, :])
        return np.where(i < kt.k.size, kt.k[np.minimum(i, kt.k.size - 1)], 0)
    return kt.fewest(ts[:, None], qs[None, :])


@dataclass(frozen=True)
class Space:
    """One mode's candidate thresholds: T values and, per serving role, Q values (ascending).

    `fewest` holds per serving role, per kind, the fewest instances meeting each T (over ts)
    and each Q (over that role's qs): for a kind whose t and q both fall with k, the entries
    meeting (T, Q) are the later of two suffixes, so its fewest is the larger of the two
    (None for other kinds, looked up directly)."""

    mode: str
    roles: tuple[int, ...]
    ts: np.ndarray
    qs: tuple[np.ndarray, ...]
    fewest: tuple[tuple[tuple[KindTable, np.ndarray | None, np.ndarray | None], ...], ...] = field(compare=False)

    @classmethod
    def of(cls, p: MixedProblem, mode: str, roles: tuple[int, ...], ts: np.ndarray, qs: tuple[np.ndarray, ...]) -> Space:
        per_role = []
        for r, q in zip(roles, qs):
            kinds = []
            for kt in p.roles[r].kinds:
                if kt.k.size and kt.falling:
                    kinds.append((kt, kt.fewest_meeting(kt.t, ts), kt.fewest_meeting(kt.q, q)))
                else:
                    kinds.append((kt, None, None))
            per_role.append(tuple(kinds))
        return cls(mode, roles, ts, qs, tuple(per_role))

    def value(self, at: tuple[int, ...]) -> int:
        """T + sum Q at grid coordinates `at`."""
        return int(self.ts[at[0]]) + sum(int(q[i]) for q, i in zip(self.qs, at[1:]))

    def kvec(self, at: tuple[int, ...]) -> dict[int, dict]:
        """Per serving role, per kind: its fewest instances meeting the thresholds at `at` (0: none)."""
        out = {}
        for r, kinds, q, i in zip(self.roles, self.fewest, self.qs, at[1:]):
            row = {}
            for kt, by_t, by_q in kinds:
                if by_t is None:
                    row[kt.kind] = int(_fewest_grid(kt, self.ts[at[0] : at[0] + 1], q[i : i + 1])[0, 0]) if kt.k.size else 0
                else:
                    a, b = int(by_t[at[0]]), int(by_q[i])
                    row[kt.kind] = max(a, b) if a and b else 0
            out[r] = row
        return out


def _space(p: MixedProblem, mode: str, cap: float, gp: GroupPrices | None = None) -> Space | None:
    """The mode's candidates with T + sum Q below `cap` and T no lower than the serving roles'
    floor: the smallest T at which the usable GPUs, each at its best share per GPU with the
    loosest queue, cover every role (`_coverable_along`); None when there is none.

    Coverage only grows with T, so the floor is found by `first_true` (a few rounds of 64 T),
    not at every T: at 4096 GPUs the disaggregated grid has ~9k T, and where the incumbent
    leaves none coverable (a fresh cluster's colocated seed) that took 3 ms for nothing."""
    roles = MODE_ROLES[mode]
    gp = gp or GroupPrices.of(p)
    qs = [np.unique(np.concatenate([kt.q for kt in p.roles[r].kinds] + [np.zeros(1, dtype=np.int64)])) for r in roles]
    q_min = sum(int(q[0]) for q in qs)
    ts = np.concatenate([kt.t for r in roles for kt in p.roles[r].kinds] + [np.zeros(0, dtype=np.int64)])
    ts = np.unique(ts[ts + q_min < cap])
    if ts.size == 0:
        return None
    loosest = tuple(q[-1:] for q in qs)
    first = first_true(lambda at: _coverable_along(gp, Space.of(p, mode, roles, ts[at], loosest)), ts.size)
    if first is None:
        return None
    ts = ts[first:]
    qs = [q[q + int(ts[0]) + q_min - int(q[0]) < cap] for q in qs]
    if any(q.size == 0 for q in qs):
        return None
    return Space.of(p, mode, roles, ts, tuple(qs))


@dataclass(frozen=True)
class GroupPrices:
    """What the transition bound needs per group and per slot (slots of all groups, flattened,
    group by group): usable GPUs, the least a GPU of an instance started in a slot costs there,
    the GPUs a slot's current instances occupy (kept, they cost nothing), and the least a GPU of
    such an instance costs to leave it for another slot (its share of the stop)."""

    cap: np.ndarray  # per group
    slot_group: np.ndarray  # per slot
    slot_role: np.ndarray
    slot_tp: np.ndarray
    slot_occ: np.ndarray
    slot_price: np.ndarray  # per GPU: a start, or a switch where a stop pairs with it (never on a fresh group)
    slot_leave: np.ndarray  # per GPU of a current instance: its stop net of what a pairing with a start saves
    first: np.ndarray = field(compare=False)  # per group that has slots: its first slot
    pairs: tuple[np.ndarray, np.ndarray] = field(compare=False)  # every two slots (i < j) of one group
    slots_of: dict[tuple[int, tuple[str, int]], tuple[int, ...]] = field(compare=False)  # per (role, kind): its slots

    @classmethod
    def of(cls, p: MixedProblem) -> GroupPrices:
        cap, sg, sr, st, so, sk, sp, sl = [], [], [], [], [], [], [], []
        for gi, g in enumerate(p.groups):
            fresh = not any(g.cur)
            cap.append(g.total_cap)
            save = _switch_saving(g)
            for i, (r, t) in enumerate(g.slots):
                sg.append(gi), sr.append(r), st.append(t), so.append(g.total_cur(i) * t), sk.append((g.gpu_type, t))
                sp.append(min(g.start_ms[i], g.start_ms[i] if fresh else g.switch_ms[i]) / t)
                sl.append(max(0, g.stop_ms[i] - save[t]) / t)
        group = np.array(sg, dtype=np.int64)
        first = np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if group.size else np.zeros(0, dtype=np.int64)
        i, j = np.triu_indices(group.size, 1)
        same = group[i] == group[j]
        slots_of: dict[tuple[int, tuple[str, int]], list[int]] = {}
        for s, key in enumerate(zip(sr, sk)):
            slots_of.setdefault(key, []).append(s)
        return cls(np.array(cap, dtype=float), group, np.array(sr, dtype=np.int64), np.array(st, dtype=float),
                   np.array(so, dtype=float), np.array(sp, dtype=float), np.array(sl, dtype=float), first, (i[same], j[same]),
                   {key: tuple(v) for key, v in slots_of.items()})


def _switch_saving(g: MixedGroup) -> dict[int, int]:
    """Per TP degree of group g: the most that pairing a start with a stop there saves (start +
    stop - switch, at least 0; `mixed.add_group`'s u)."""
    save: dict[int, int] = {}
    for i, (_, t) in enumerate(g.slots):
        save[t] = max(save.get(t, 0), g.start_ms[i] + g.stop_ms[i] - g.switch_ms[i])
    return save


def forced_stops_ms(p: MixedProblem, roles: tuple[int, ...]) -> int:
    """What stopping every current instance of a role outside `roles` costs: a mode that serves
    only `roles` must (the corner program lets those slots hold nothing)."""
    return sum(g.total_cur(i) * g.stop_ms[i] for g in p.groups for i, (r, _) in enumerate(g.slots) if r not in roles)


def net_of_stops(p: MixedProblem, gp: GroupPrices) -> GroupPrices:
    """`gp` with each start priced net of a possible pairing with a stop: a start whose TP degree
    has current instances in its group may pair with one, which saves up to the group's largest
    start + stop - switch of that degree. With `forced_stops_ms` added, a mode's second
    transition bound.

    Why: `_lp_bound` counts only the serving roles' stops, so where the mode changes, the
    fractional bound misses every stop the change forces; on a 1024-GPU walk at 4 trajectories
    per GPU 96% of the corner programs that found nothing within the budget were programs this
    bound spares (516 of 536).
    Sound: a layout pays the forced stops, each start at least its price here (paired or not; a
    pair with a stop the mode does not force costs that stop too, left out), its other stops at
    least 0."""
    price = gp.slot_price.copy()
    at = 0
    for g in p.groups:
        save = _switch_saving(g)
        held: dict[int, bool] = {}
        for i, (_, t) in enumerate(g.slots):
            held[t] = held.get(t, False) or g.cur[i] > 0
        for i, (_, t) in enumerate(g.slots):
            price[at] = (g.start_ms[i] - (save[t] if held[t] else 0)) / t
            at += 1
    return replace(gp, slot_price=price)


def _slot_rates(gp: GroupPrices, kvec: dict[int, dict]) -> np.ndarray:
    """Per serving role (rows), per slot: the share of a batch one GPU of that slot carries, 1 / (k tp) (0: not this role's, or no entry)."""
    out = np.zeros((len(kvec), gp.slot_group.size))
    for j, (r, ks) in enumerate(kvec.items()):
        for kind, k in ks.items():
            if k > 0:
                for i in gp.slots_of.get((r, kind), ()):
                    out[j, i] = 1.0 / (k * gp.slot_tp[i])
    return out


def _coverable_pair(cap: np.ndarray, vp: np.ndarray, vd: np.ndarray) -> bool:
    """Can GPUs y_P + y_D <= cap carry a whole batch of each role (fractionally)? By Farkas, iff
    sum_g cap_g max(a v_P,g, (1 - a) v_D,g) >= 1 for every a in [0, 1]; convex in a, so checked
    at 0, 1 and where the two terms cross on some group."""
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = np.where(vp + vd > 0, vd / (vp + vd), 0.0)
    a = np.concatenate([[0.0, 1.0], cross])[:, None]
    return bool(np.all((cap * np.maximum(a * vp, (1 - a) * vd)).sum(axis=1) >= 1.0 - 1e-12))


Pieces = dict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray]]  # `_role_pieces` of one search's `GroupPrices`, per row of shares


def _lp_bound(gp: GroupPrices, kvec: dict[int, dict], pieces: Pieces | None = None) -> float:
    """A lower bound on the transition cost of covering every serving role at these fewest
    counts: the optimum of its fractional relaxation (inf: not even fractionally coverable).

    The relaxation: a GPU in slot s carries w_s = 1 / (k t) of its role's batch (floor(S N / k)
    <= S N / k), is free where a current instance of that slot keeps it and costs at least the
    slot's price per GPU otherwise; a kept GPU of a serving role's slot s that goes to another
    slot pays leave_s too, its stop net of what pairing it with a start saves
    (`GroupPrices.slot_leave`; the other roles' stops are left out); fractional. Its dual, for
    multipliers a >= 0 per serving role, is
        sum_r a_r - sum_g [ sum_kept occ_s max(a_r(s) w_s, b_g - leave_s) + free_g b_g ],
        b_g = max(0, max_s in g (a_r(s) w_s - price_s)),
    (each GPU takes its best use), a bound for every a by weak duality; concave and piecewise
    linear, so its maximum, the relaxation's optimum, sits where its kinks cross: per role, the
    values of a_r where a slot starts to pay (a w = price), where two of a group's slots of the
    role tie, where a started slot overtakes a kept one, or where a kept GPU that serves no role
    here leaves for a started slot; for two roles, also the lines where a P piece and a D piece
    of one group tie; every crossing of those with each other and with the axis values is tried
    (`_vertices`). A slot that another of its group beats (at least the share per GPU at no
    higher price) never sets b_g and gives no kink.

    Sound: per group and TP degree the program pays start D + stop S - save min(D, S) for D
    starts and S stops (`mixed.add_group`'s u, save = start + stop - switch), which is at least
    min(start, switch) D + max(0, stop - save) S: the two prices sum to at most the switch, and
    each is at most its own (the prices are the group's per degree).

    Counting those stops (2026-12-06): before, a kept GPU left for free, and in the slowest
    4096-GPU search at 4 trajectories per GPU, 1,217 of 1,352 corner programs only proved that
    nothing fits within the budget; sampled, their LP relaxations sat up to 6% above the bound,
    all of it stops. On that walk's 26 recorded searches: 3,792 corner programs -> 1,933 and
    25.9 -> 15.2 s in all; that search 8.3 -> 0.7 s, the slowest now 4.4 s (was 6.6). At 256
    and 1024 GPUs about the same.

    Pricing each slot matters: a TP4 start can cost 45 / 4 per GPU where TP1 costs 11, and a
    bound at the group's cheapest price with its best share sat 2-5% below the optimum; on the
    fresh 4096-GPU bench decision, 673 corner programs went to proving what this proves.
    `pieces`: the search's memo of `_role_pieces` for this `gp` (None: none kept)."""
    w = _slot_rates(gp, kvec)  # (roles, slots)
    if gp.first.size == 0:
        return math.inf
    sg, price, occ, first = gp.slot_group, gp.slot_price, gp.slot_occ, gp.first
    cap = gp.cap[sg[first]]  # per group that has slots
    v = np.maximum.reduceat(w, first, axis=1)  # per role, per group: the best share per GPU
    if w.shape[0] == 1:
        if (cap * v[0]).sum() < 1.0 - 1e-12:
            return math.inf
    elif not _coverable_pair(cap, v[0], v[1]):
        return math.inf
    parts = [_role_pieces(gp, wr, {} if pieces is None else pieces) for wr in w]
    live, kept = np.array([lv for lv, _, _ in parts]), np.array([kp for _, kp, _ in parts])
    axes = [axis for _, _, axis in parts]
    serves = (w > 0).any(axis=0)
    leave = _leave(gp, kvec)
    idle = (gp.slot_occ > 0) & ~serves & (leave > 0)
    if idle.any():  # a kept GPU that serves no role here leaves for a live slot once a w_i - p_i - leave_j = 0
        i, j = gp.pairs
        for r in range(len(axes)):
            go_i, go_j = live[r, i] & idle[j], live[r, j] & idle[i]
            more = np.concatenate([(price[i[go_i]] + leave[j[go_i]]) / w[r, i[go_i]], (price[j[go_j]] + leave[i[go_j]]) / w[r, j[go_j]]])
            if more.size:
                axes[r] = np.unique(np.concatenate([axes[r], more]))
    if w.shape[0] == 1:
        a = axes[0][:, None]
    else:
        a = _vertices(gp, w, live, kept, axes)
    a = a[a.min(axis=1) >= 0]
    act = np.flatnonzero(serves | (occ > 0))  # the other slots add nothing
    g = sg[act]
    new_group = g[1:] != g[:-1]
    lead = np.flatnonzero(np.concatenate(([True], new_group)))  # per group with such a slot: its first
    own = a @ w[:, act]  # (candidates, slots): a GPU's value for its slot's role
    gain = np.where(serves[act], np.maximum(own - price[act], 0.0), 0.0)
    bought = np.maximum.reduceat(gain, lead, axis=1)  # (candidates, groups)
    kept_value = (occ[act] * np.maximum(own, bought[:, np.cumsum(np.concatenate(([False], new_group)))] - leave[act])).sum(axis=1)
    free = np.maximum(gp.cap[g[lead]] - np.add.reduceat(occ[act], lead), 0.0)
    dual = a.sum(axis=1) - kept_value - bought @ free
    return max(0.0, float(dual.max()))


def _leave(gp: GroupPrices, kvec: dict[int, dict]) -> np.ndarray:
    """Per slot: what a kept GPU pays to leave for another slot (`GroupPrices.slot_leave`), on
    the serving roles' slots only: a mode's forced stops are either left out of the bound or
    counted whole beside it (`forced_stops_ms`), never both."""
    serving = np.zeros(3, dtype=bool)  # per role (C, P, D); a lookup, not np.isin: this runs once per bound
    serving[list(kvec)] = True
    return np.where(serving[gp.slot_role], gp.slot_leave, 0.0)


def _role_pieces(gp: GroupPrices, wr: np.ndarray, memo: Pieces) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One serving role's part of `_lp_bound`, from its shares per slot `wr`: per slot, is a
    started GPU's piece live (a w - price that no other slot of its group beats: at least the
    share at no higher price) and is a kept GPU's piece there (w at no price); and the role's
    kink values of a, where a slot starts to pay (a w = price), two live slots tie, or a started
    slot overtakes a kept one. Remembered in `memo` (one search's, for its `gp`) per row: the
    corners of one search share a role's row about three times in four (the other role's
    thresholds moved)."""
    key = wr.tobytes()
    got = memo.get(key)
    if got is not None:
        return got
    price, leave, (i, j) = gp.slot_price, gp.slot_leave, gp.pairs
    kp = wr * (gp.slot_occ > 0) > 0
    lv = wr > 0
    beats_i = (wr[j] >= wr[i]) & (price[j] <= price[i]) & ((wr[j] > wr[i]) | (price[j] < price[i])) & lv[j]
    beats_j = (wr[i] >= wr[j]) & (price[i] <= price[j]) & ((wr[i] > wr[j]) | (price[i] < price[j])) & lv[i]
    lv[i[beats_i]] = False
    lv[j[beats_j]] = False
    dw = np.where(wr[i] != wr[j], wr[i] - wr[j], np.inf)
    ties = lv[i] & lv[j]
    over_i, over_j = lv[i] & kp[j] & (wr[i] > wr[j]), lv[j] & kp[i] & (wr[j] > wr[i])  # a w_i - p_i - leave_j = a w_j
    axis = np.unique(np.concatenate([np.zeros(1), price[lv] / wr[lv], ((price[i] - price[j]) / dw)[ties],
                                     ((price[i] + leave[j]) / dw)[over_i], (-(price[j] + leave[i]) / dw)[over_j]]))
    for a in (lv, kp, axis):
        a.flags.writeable = False
    memo[key] = (lv, kp, axis)
    return lv, kp, axis


@functools.lru_cache(maxsize=256)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """np.triu_indices(n, 1), remembered per n: it builds an n x n mask, a third of `_vertices`' time."""
    i, j = np.triu_indices(n, 1)
    i.flags.writeable = j.flags.writeable = False
    return i, j


def _vertices(gp: GroupPrices, w: np.ndarray, live: np.ndarray, kept: np.ndarray, axes: list[np.ndarray]) -> np.ndarray:
    """The two-role dual's candidate multipliers (a_P, a_D) (`_lp_bound`), one per row."""
    price, leave = gp.slot_price, gp.slot_leave
    ap, ad = axes
    # the lines a_D = alpha a_P + beta where a P piece and a D piece of one group tie
    i, j = gp.pairs
    sp, sd = np.concatenate([i, j]), np.concatenate([j, i])
    al, be = [], []
    for p_at, d_at, use in ((1.0, 1.0, live[0, sp] & live[1, sd]), (0.0, 1.0, kept[0, sp] & live[1, sd]),
                            (1.0, 0.0, live[0, sp] & kept[1, sd]), (0.0, 0.0, kept[0, sp] & kept[1, sd])):
        # a kept GPU that goes over to a live slot of the other role also pays its leave
        al.append(w[0, sp[use]] / w[1, sd[use]])
        be.append((d_at * (price[sd[use]] + (1 - p_at) * leave[sp[use]]) - p_at * (price[sp[use]] + (1 - d_at) * leave[sd[use]])) / w[1, sd[use]])
    al, be = np.concatenate(al), np.concatenate(be)
    i, j = _pairs(al.size)
    i, j = i[al[i] != al[j]], j[al[i] != al[j]]
    x = (be[j] - be[i]) / (al[i] - al[j])  # two lines cross
    a_p = np.concatenate([np.repeat(ap, ad.size), np.repeat(ap, al.size), ((ad[:, None] - be[None, :]) / al[None, :]).ravel(), x])
    a_d = np.concatenate([np.tile(ad, ap.size), (ap[:, None] * al[None, :] + be[None, :]).ravel(), np.repeat(ad, al.size), al[i] * x + be[i]])
    return np.stack([a_p, a_d], -1)


SHARE = 2**20  # the relaxed covering row's scale: sum_j ceil(SHARE / k_j) N_j >= SHARE (2**24 made CBC ~5x slower on it)


def _coverable_along(gp: GroupPrices, sp: Space) -> np.ndarray:
    """Per T of `sp` (at its first Q per role): can the usable GPUs cover every serving role, fractionally?"""
    v = np.zeros((len(sp.roles), gp.cap.size, sp.ts.size))
    for j, (r, kinds) in enumerate(zip(sp.roles, sp.fewest)):
        for kt, by_t, by_q in kinds:
            if kt.k.size == 0:
                continue
            k = np.where((by_t > 0) & (by_q[0] > 0), np.maximum(by_t, by_q[0]), 0) if by_t is not None else _fewest_grid(kt, sp.ts, sp.qs[j][:1])[:, 0]
            for i in gp.slots_of.get((r, kt.kind), ()):
                share = np.where(k > 0, 1.0 / (np.maximum(k, 1) * gp.slot_tp[i]), 0.0)
                v[j, gp.slot_group[i]] = np.maximum(v[j, gp.slot_group[i]], share)
    cap = gp.cap[:, None]
    if len(sp.roles) == 1:
        return (cap * v[0]).sum(axis=0) >= 1.0 - 1e-12
    vp, vd = v
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = np.where(vp + vd > 0, vd / (vp + vd), 0.0)
    a = np.concatenate([np.zeros((1, sp.ts.size)), np.ones((1, sp.ts.size)), cross])[:, None, :]  # (a values, 1, T)
    return ((cap[None] * np.maximum(a * vp[None], (1 - a) * vd[None])).sum(axis=1) >= 1.0 - 1e-12).all(axis=0)


def _inner_model(p: MixedProblem, roles: tuple[int, ...], kvec: dict[int, dict], exact: bool = True) -> LinearModel:
    """The layout program at fixed thresholds: serving roles' slots only, each kind's units
    floor(S N_j / k_j) (integer sigma_j, k_j sigma_j <= S N_j) covering S per role, the
    transition cost as in `mixed.mixed_linear_model` (starts, stops, switches inside one TP).

    exact=False drops the units: one row per role, sum_j ceil(SHARE / k_j) N_j >= SHARE, which
    every exact cover meets (floor(S N / k) <= S N / k). A relaxation, and a much easier one
    (no wide integer units to branch on): its infeasibility and its optimum bound the exact
    program, and its layout is exact when it also meets the floors (`_covers`)."""
    lm = LinearModel(const=p.constant_ms)
    kind_terms: dict[int, dict] = {r: {} for r in roles}
    role_terms: list[list[tuple[int, int]]] = [[], [], []]
    gpu_terms: list[tuple[int, int]] = []
    for gi, g in enumerate(p.groups):
        # a kind that meets no entry at these thresholds carries nothing: its instances may stay, never start
        ubs = [(g.ub(i) if kvec[r].get((g.gpu_type, t), 0) > 0 else min(g.ub(i), g.total_cur(i))) if r in roles else 0
               for i, (r, t) in enumerate(g.slots)]
        xs = add_group(lm, gi, g, ubs, prune=True)
        for (r, t), v in zip(g.slots, xs):
            if v is not None and r in roles:
                kind_terms[r].setdefault((g.gpu_type, t), []).append(v)
                role_terms[r].append((v, 1))
                gpu_terms.append((v, t))
    for r in roles:
        units = p.roles[r].units
        cover = []
        for kind, k in kvec[r].items():
            terms = kind_terms[r].get(kind)
            if not terms or k <= 0:
                continue
            if not exact:
                cover.extend((v, -(-SHARE // k)) for v in terms)
                continue
            n_max = sum(lm.ub[v] for v in terms)
            sg = lm.var(f"sigma[{r},{kind}]", 0, min(units, (units * n_max) // k))
            lm.row([(v, units) for v in terms] + [(sg, -k)], 0, INF)
            cover.append((sg, 1))
        lm.row(cover, units if exact else SHARE, INF)
    lm.policy_rows(role_terms[1], role_terms[2], gpu_terms, p.fixed_pd, p.max_gpus)
    return lm


@dataclass
class Corner:
    """What the search knows of one corner's (mode, k-vector) transition cost: `known`, its exact
    value (a layout that pays it was priced); `lower`, a bound (the fractional optimum once
    `bounded`, raised by the relaxed program's optimum once `relaxed`); `tried`, the largest
    budget nothing fits within."""

    lower: float
    at: int  # its row in the mode's `Looser`
    known: float | None = None
    tried: float = -math.inf
    relaxed: bool = False
    bounded: bool = False  # `_lp_bound` is asked for only where the floors given free do not prune
    netted: bool = False  # the bound net of the mode's forced stops (`net_of_stops`, `forced_stops_ms`) too, only where `_lp_bound` does not prune

    @property
    def cost(self) -> float:
        return self.known if self.known is not None else self.lower

    @property
    def floor(self) -> float:
        """The least its cost can be: costs are whole ms, so past a budget tried means at least one more."""
        return max(self.cost, self.tried + 1 if math.isfinite(self.tried) else 0.0)


class Looser:
    """One mode's corners, each as its k-vector (a kind that meets no entry: needs infinitely many).

    Why: a corner that needs at least as many instances of every kind as another can only cost
    as much or more (every layout that covers it covers the other: units floor(S N / k) and the
    relaxed row's ceil(SHARE / k) both fall as k grows, and a kind with no entry may start
    nothing). So whatever bounds the looser corner's cost (its bound, its exact cost, or a
    budget nothing fits within) bounds every corner that dominates it, wherever it lies in the
    grid; the split alone passes a bound only from a block to its own halves."""

    def __init__(self) -> None:
        self.vecs = np.zeros((0, 0))  # per corner, rows past `n` unused (grown by doubling)
        self.floors = np.zeros(0)  # per corner, the least its cost can be (`Corner.floor`)
        self.n = 0

    def add(self, kvec: dict[int, dict]) -> int:
        k = np.array([k for ks in kvec.values() for k in ks.values()], dtype=float)
        if self.n == self.floors.size:
            grow = max(self.n, 16)
            self.vecs = np.concatenate([self.vecs.reshape(-1, k.size), np.zeros((grow, k.size))])
            self.floors = np.concatenate([self.floors, np.zeros(grow)])
        self.vecs[self.n] = np.where(k > 0, k, math.inf)
        self.n += 1
        return self.n - 1

    def floor(self, i: int) -> float:
        """The best lower bound on corner i's cost that corners no tighter than it give (0: none)."""
        if self.n < 2:
            return 0.0
        below = np.all(self.vecs[: self.n] <= self.vecs[i], axis=1)
        return float(self.floors[: self.n][below].max())


def search_mixed(p: MixedProblem, backend: str, time_limit_s: float = 1.0, workers: int = 8, seed: int = 0, gap: float = 0.0,
                 exact_backend: str | None = None) -> Solution:
    """The exact optimum of `p` by threshold search (module docstring); `Solution.x` as `mixed.solve_mixed`'s.

    exact_backend: the backend of the exact-units programs (None: `backend`), on one worker. On
    an LP-based backend they are hard and the relaxed ones easy: on the 256-GPU bench walks CBC
    solved the exact ones of two walks in 2.0 and 9.7 s where CP-SAT (one worker) took 1.1 and
    2.3 s. So the relaxed program comes first, and the exact one only where its layout misses
    the floors. Where the exact programs go to CP-SAT (the default), the search solves the
    exact program at every corner instead, never the relaxed one (`relaxed_first` False): CP-SAT
    proves it about as fast as CBC proves the relaxed one, and its optimum is the corner's
    exact cost, so no corner needs a second program and a box's bound is the cost itself. On 50
    recorded searches of two 256-GPU walks (2026-12-05): 4.6-5.0 s in all instead of 6.6-6.8,
    the slowest 0.38-0.44 s instead of 1.06-1.08, the same optima; on a 6-event walk's 6 it
    cost more (1.7 s instead of 1.3-1.5), at 4096 GPUs about the same. Everything on CBC that
    way took 16.5 s.

    gap > 0: a box goes once its bound reaches (1 - gap) x the incumbent, so the layout found is
    proven within the relative gap (its objective x (1 - gap) bounds the optimum from below).
    The corner programs stay exact: what they prove about a corner is reused as a floor."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    relaxed_first = (exact_backend or backend) != "cpsat"
    zero = tuple(tuple(0 for _ in g.slots) for g in p.groups)
    if p.seed is not None:  # priced by the entry pruning
        best_x, inc = p.seed
    else:
        best_x, inc = None, math.inf
        for x in seed_layouts(p):
            v = evaluate_mixed(p, x)
            if v is not None and v < inc:
                best_x, inc = x, v
    gp = GroupPrices.of(p)
    pieces: Pieces = {}  # `_role_pieces` per row of shares, for this search's `gp`
    forced = {mode: forced_stops_ms(p, MODE_ROLES[mode]) for mode in allowed_modes(p)}  # per mode: the stops it forces
    net = net_of_stops(p, gp) if any(forced.values()) else gp
    net_pieces: Pieces = {}  # `_role_pieces` for `net`
    heap: list = []  # (bound, tie, space, lo, hi, a floor on the cost at hi)
    tie = 0
    for mode in allowed_modes(p):
        sp = _space(p, mode, inc - p.constant_ms, gp)
        if sp is not None:
            lo, hi = (0,) * (1 + len(sp.roles)), (sp.ts.size - 1, *(q.size - 1 for q in sp.qs))
            heapq.heappush(heap, (sp.value(lo) + p.constant_ms, tie, sp, lo, hi, 0.0))
            tie += 1
    corners: dict = {}  # (mode, k-vector) -> Corner: what is known about its transition cost
    looser = {mode: Looser() for mode in allowed_modes(p)}  # what corners needing fewer instances teach the others
    proven, cut = True, math.inf
    while heap:
        bound, _, sp, lo, hi, floor = heapq.heappop(heap)
        if bound >= inc * (1.0 - gap):
            break
        if time.perf_counter() >= deadline:
            proven, cut = False, bound
            break
        # bound the block by its loosest corner: every point of it costs at least that
        kvec = sp.kvec(hi)
        key = (sp.mode, tuple(tuple(v.items()) for v in kvec.values()))
        c = corners.get(key)
        if c is None:
            c = corners[key] = Corner(lower=0.0, at=looser[sp.mode].add(kvec))
        floor = max(floor, looser[sp.mode].floor(c.at))
        if sp.value(lo) + max(floor, c.cost) + p.constant_ms >= inc * (1.0 - gap):
            continue  # what the block inherited, or a looser corner, is bound enough
        if not c.bounded:
            c.bounded, c.lower = True, max(c.lower, _lp_bound(gp, kvec, pieces))
            looser[sp.mode].floors[c.at] = c.floor
        if forced[sp.mode] and not c.netted and sp.value(lo) + max(floor, c.cost) + p.constant_ms < inc * (1.0 - gap):
            # the mode stops current instances, and the plain bound does not prune: the bound net of those stops may
            c.netted, c.lower = True, max(c.lower, forced[sp.mode] + _lp_bound(net, kvec, net_pieces))
            looser[sp.mode].floors[c.at] = c.floor
        cost = max(floor, c.cost)
        if sp.value(lo) + cost + p.constant_ms >= inc * (1.0 - gap):
            continue
        # then solve the corner's layout program, cut off at what could still beat the incumbent
        # anywhere in the block: infeasible, the block goes; else its optimum bounds the block.
        # A single candidate is settled only by an exact cost: a bound alone never ends it
        budget = math.ceil(inc * (1.0 - gap)) - sp.value(lo) - p.constant_ms - 1 if math.isfinite(inc) else math.inf
        size = math.prod(h - l + 1 for l, h in zip(lo, hi))
        if c.known is None and c.tried < budget and size <= MILP_BOX and (lo == hi or not c.relaxed):
            # the relaxed program first (`_inner_model`, exact=False); the exact one only where
            # its layout misses the floors and the block is one candidate. On CP-SAT the exact
            # one alone (`relaxed_first`)
            for exact in ((True,) if c.relaxed or not relaxed_first else (False, True)):
                lm = _inner_model(p, sp.roles, kvec, exact)
                if math.isfinite(budget) and not lm.obj and budget < 0:
                    c.tried = max(c.tried, budget)  # nothing costs anything here, and the budget is below zero
                    break
                if math.isfinite(budget) and lm.obj:
                    lm.row([(v, w) for v, w in lm.obj.items()], -INF, budget)
                on, threads = (exact_backend, 1) if exact and exact_backend else (backend, workers)
                raw = solve_model(lm, on, max(deadline - time.perf_counter(), 0.01), threads, seed, small=True)
                x = None
                if raw.values is not None:
                    x = tuple(tuple(int(round(raw.values[v])) if v is not None else 0 for v in xs) for xs in lm.x)
                    v = evaluate_mixed(p, x)
                    if v is not None and v < inc:
                        best_x, inc = x, v
                if raw.status not in ("optimal", "infeasible"):
                    proven = False
                    break
                if raw.status == "infeasible":
                    c.tried = max(c.tried, budget)
                    break
                if exact or _covers(p, x, kvec):
                    c.known = raw.objective - p.constant_ms
                    break
                # the relaxed optimum (the budget row does not cut it: it is within the budget) bounds the corner
                c.relaxed, c.lower = True, max(c.lower, raw.objective - p.constant_ms)
                if lo != hi:
                    break
        looser[sp.mode].floors[c.at] = c.floor
        cost = max(floor, c.cost)
        if c.known is None and c.tried >= budget:
            continue  # nothing within the budget covers even the loosest corner
        if sp.value(lo) + cost + p.constant_ms >= inc * (1.0 - gap) or lo == hi:
            continue  # a single candidate here has its exact cost, and the incumbent its layout (or better)
        # split the widest side; both halves inherit the cost as a floor (their loosest corners
        # are this one or tighter), and each settles its own corner when popped
        d = max(range(len(lo)), key=lambda d: _span(sp, d, lo, hi))
        mid = (lo[d] + hi[d]) // 2
        lo_hi = hi[:d] + (mid,) + hi[d + 1 :]
        up_lo = lo[:d] + (mid + 1,) + lo[d + 1 :]
        heapq.heappush(heap, (sp.value(lo) + cost + p.constant_ms, tie, sp, lo, lo_hi, cost))
        heapq.heappush(heap, (sp.value(up_lo) + cost + p.constant_ms, tie + 1, sp, up_lo, hi, cost))
        tie += 2
    ms = (time.perf_counter() - t0) * 1000.0
    if best_x is None:
        status = "infeasible" if proven else "no_solution"
        return Solution(status, zero, 0, 0, -math.inf, ms, backend)  # type: ignore[arg-type]
    status = "optimal" if proven else "feasible"
    return Solution(status, best_x, completion_ms(p, best_x) or 0, int(inc), inc * (1.0 - gap) if proven else min(cut, inc), ms, backend)  # type: ignore[arg-type]


def _covers(p: MixedProblem, x: tuple[tuple[int, ...], ...], kvec: dict[int, dict]) -> bool:
    """Do layout x's instances cover every serving role at these fewest-instance counts (floor(S N / k) summed >= S)?"""
    counts = p.counts(x)
    for r, ks in kvec.items():
        units = p.roles[r].units
        if sum((units * counts[r].get(kind, 0)) // k for kind, k in ks.items() if k > 0) < units:
            return False
    return True


def _span(sp: Space, d: int, lo: tuple[int, ...], hi: tuple[int, ...]) -> float:
    if hi[d] == lo[d]:
        return -1.0
    axis = sp.ts if d == 0 else sp.qs[d - 1]
    return float(axis[hi[d]] - axis[lo[d]])
