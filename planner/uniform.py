"""The single-type program solved exactly without a solver, where its groups are plain slots.

When every role has the same TP degree and a group prices every role alike (start, stop,
switch), each group is a number of interchangeable instance slots, and a layout's transition
price depends only on how many instances of each role it asks for:
  - a current instance of a role that the layout keeps costs nothing (keeping one beyond the
    count asked for is free too: extra instances may idle);
  - the other mode's current instances are stopped (forced), and a start on a slot one of
    them left is a switch (the program's saving, once per stop in that group);
  - a new instance takes the cheapest free slot (a training GPU's start is priced 0 under the
    Eq. 7 gate, a reserved one's below an elastic one's);
  - a surplus instance of the other role is stopped only where its slot (its stop + a start
    there, as a switch) is cheaper than the next free one.
So the optimum is the best table entry (colocated) or entry pair (disaggregated) priced by
prefix sums of sorted slot prices, with no search: ~1 ms where the MILP takes 15-30 ms at
256 GPUs (the Eq. 7 gate's borrowing program). Anything else (several TP degrees, prices
per role, a switch cheaper than a stop, fixed P:D counts, a GPU cap, a class whose GPUs do
not divide into slots, relaxed families) returns None and the MILP (planner/backends.py)
solves it. The result is checked against `evaluate`, the program's own pricing, before it
is returned; tests hold it to brute force (tests/test_planner_milp.py, _oracle_options.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from planner.milp import GroupData, PlanningProblem, Solution, completion_ms, evaluate

BACKEND = "slots"
UNFIT = np.iinfo(np.int64).max // 4  # the price of an entry pair that does not fit: never chosen


def slots(g: GroupData, tp: int) -> int | None:
    """The class's instance slots, or None where the program's capacity is not plain slots: a
    role-specific fit, or GPUs whose sum holds more instances than each node does (3 GPUs at TP2)."""
    per_role = {g.ub(r, tp) for r in range(3)}
    if len(per_role) > 1:
        return None
    (ub,) = per_role
    if ub and (g.cap * g.mult) // tp != ub:
        return None
    if sum(g.total_cur(r) for r in range(3)) > ub:
        return None
    return ub


def shape(p: PlanningProblem) -> list[int] | None:
    """Each group's slots where the program is plain slots (see the module docstring), else None."""
    tp = p.tp[0]
    if p.tp != (tp, tp, tp) or p.fixed_pd is not None or p.max_gpus is not None or p.relax:
        return None
    out = []
    for g in p.groups:
        n = slots(g, tp)
        if n is None or len(set(g.start_ms)) > 1 or len(set(g.stop_ms)) > 1 or len(set(g.switch_ms)) > 1 or p.switch_saving(g, [0, 1, 2]) > g.start_ms[0]:
            return None
        out.append(n)
    return out


def _prefix(prices: list[tuple[int, int]]) -> np.ndarray:
    """Cumulative price of the cheapest 0, 1, 2, ... of (price, group) slots."""
    return np.concatenate([[0], np.cumsum([c for c, _ in prices], dtype=np.int64)])


def _entries(p: PlanningProblem, r: int) -> list[tuple[int, int, int]]:
    k_max = p.max_instances(r)
    return [e for e in p.entries[r] if 1 <= e[0] <= k_max]


@dataclass(frozen=True)
class SlotPrices:
    """The (price, group) lists, cheapest first, that both the pricing and the layout read."""

    cur: list[list[int]]  # per group, per role: current instances
    free_colocated: list[tuple[int, int]]  # slots a colocated layout may start on
    free_split: list[tuple[int, int]]  # slots a disaggregated layout may start on
    held: dict[int, list[tuple[int, int]]]  # prefill / decode: the slots their current instances hold

    def have(self, r: int) -> int:
        """Role r's current instances."""
        return sum(c[r] for c in self.cur)

    def with_surplus(self, role: int, surplus: int) -> list[tuple[int, int, bool]]:
        """(price, group, held) of the free split slots and the cheapest `surplus` slots that
        `role`'s current instances hold (their stop + a start there), cheapest first: where the
        other role starts when `role` asks for fewer instances than it has."""
        return sorted([(c, i, False) for c, i in self.free_split] + [(c, i, True) for c, i in self.held[role][:surplus]])


def solve_slots(p: PlanningProblem) -> Solution | None:
    """The program's optimum by pricing every entry (pair), or None outside its shape."""
    cap = shape(p)
    if cap is None:
        return None
    t0 = time.perf_counter()
    sp = slot_prices(p, cap)
    best: tuple[int, tuple] | None = None
    if "colocated" in p.modes:
        best = _colocated(p, sp)
    if "disaggregated" in p.modes:
        got = _disaggregated(p, sp)
        if got is not None and (best is None or got[0] < best[0]):
            best = got
    if best is None:  # nothing fits: the MILP proves it and diagnoses the family
        return None
    x = _layout(p, sp, best[1])
    obj = evaluate(p, x)
    if obj != best[0]:  # the shortcut's own price disagrees with the program's: let the MILP decide
        return None
    t = completion_ms(p, tuple(sum(v[r] for v in x) for r in range(3)))  # type: ignore[arg-type]
    return Solution("optimal", x, t or 0, obj, float(obj), (time.perf_counter() - t0) * 1000, BACKEND)


def slot_prices(p: PlanningProblem, cap: list[int]) -> SlotPrices:
    """The slot lists of a plain-slot program whose groups hold `cap` slots each (`shape`)."""
    cur = [[g.total_cur(r) for r in range(3)] for g in p.groups]
    return SlotPrices(cur, _free(p, cap, cur, (0,)), _free(p, cap, cur, (1, 2)), {r: _held(p, cur, r) for r in (1, 2)})


def _stop_ms(p: PlanningProblem, cur: list[list[int]], roles: tuple[int, ...]) -> int:
    return sum(g.stop_ms[0] * c[r] for g, c in zip(p.groups, cur) for r in roles)


def _free(p: PlanningProblem, cap: list[int], cur: list[list[int]], kept: tuple[int, ...]) -> list[tuple[int, int]]:
    """(start price, group) of every slot not held by a kept role's current instance, cheapest
    first. A slot the other mode's stopped instance left is started as a switch (its saving off
    the start: the program saves once per stop that a start in the same group pairs with)."""
    out = []
    for i, (g, c) in enumerate(zip(p.groups, cur)):
        stopped = sum(c[r] for r in range(3) if r not in kept)
        save = p.switch_saving(g, [0, 1, 2])
        out += [(g.start_ms[0] - save, i)] * stopped + [(g.start_ms[0], i)] * (cap[i] - sum(c))
    return sorted(out)


def _held(p: PlanningProblem, cur: list[list[int]], r: int) -> list[tuple[int, int]]:
    """(price, group) of every slot role r's current instances hold, cheapest first: its stop and
    a start there, as a switch (the stop pairs with that start)."""
    return sorted((g.stop_ms[0] + g.start_ms[0] - p.switch_saving(g, [0, 1, 2]), i) for i, (g, c) in enumerate(zip(p.groups, cur)) for _ in range(c[r]))


def _colocated(p: PlanningProblem, sp: SlotPrices) -> tuple[int, tuple] | None:
    have = sp.have(0)
    free = _prefix(sp.free_colocated)
    forced = _stop_ms(p, sp.cur, (1, 2)) + p.constant_ms
    best = None
    for k, t, q in _entries(p, 0):
        need = max(0, k - have)
        if need < len(free):
            obj = t + q + forced + int(free[need])
            if best is None or obj < best[0]:
                best = (obj, ("colocated", k))
    return best


ROWS_AT_ONCE = 64  # prefill entries priced together against every decode entry


@dataclass(frozen=True)
class PairPrices:
    """What pricing a (prefill, decode) entry pair needs: the entries, the slots each pair must
    start, and the price of those slots (`both`: the cheapest n free ones; a role below its
    current instances lends the other its surplus slots, `row_lines` / `col_lines`)."""

    kp: np.ndarray
    tp: np.ndarray
    qp: np.ndarray
    kd: np.ndarray
    td: np.ndarray
    qd: np.ndarray
    need_p: np.ndarray
    need_d: np.ndarray
    both: np.ndarray  # the cheapest n free slots, UNFIT past them
    rows: np.ndarray  # prefill entries below the current prefill instances
    cols: np.ndarray  # decode entries below the current decode instances
    row_lines: np.ndarray | None  # per such row, per decode entry: its slots' price
    col_lines: np.ndarray | None  # per such column, per prefill entry
    line_of: np.ndarray  # per prefill entry: its row in row_lines (-1: none)
    forced: int

    @classmethod
    def of(cls, p: PlanningProblem, sp: SlotPrices) -> PairPrices | None:
        pre, dec = _entries(p, 1), _entries(p, 2)
        if not pre or not dec:
            return None
        have = (sp.have(1), sp.have(2))
        kp, tp, qp = (np.array(v, dtype=np.int64) for v in zip(*pre))
        kd, td, qd = (np.array(v, dtype=np.int64) for v in zip(*dec))
        need_p, need_d = np.maximum(kp - have[0], 0), np.maximum(kd - have[1], 0)
        free = _prefix(sp.free_split)
        rows, cols = np.flatnonzero(have[0] > kp), np.flatnonzero(have[1] > kd)
        row_lines = _cheapest_with_held(free, _prefix(sp.held[1]), have[0] - kp[rows], need_d) if rows.size else None
        col_lines = _cheapest_with_held(free, _prefix(sp.held[2]), have[1] - kd[cols], need_p) if cols.size else None
        line_of = np.full(kp.size, -1)
        line_of[rows] = np.arange(rows.size)
        return cls(kp, tp, qp, kd, td, qd, need_p, need_d, np.append(free, UNFIT), rows, cols, row_lines, col_lines, line_of,
                   _stop_ms(p, sp.cur, (0,)) + p.constant_ms)

    def block(self, idx: np.ndarray) -> np.ndarray:
        """The objective of prefill entries `idx` paired with every decode entry (UNFIT and more: no fit)."""
        cost = self.both[np.minimum(self.need_p[idx, None] + self.need_d[None, :], self.both.size - 1)]
        held = self.line_of[idx] >= 0
        if held.any():
            cost[held] = self.row_lines[self.line_of[idx[held]]]
        if self.cols.size:
            cost[:, self.cols] = self.col_lines[:, idx].T
        return np.maximum(self.tp[idx, None], self.td[None, :]) + self.qp[idx, None] + self.qd[None, :] + cost + self.forced

    def bound(self) -> np.ndarray:
        """Per prefill entry, at most its best pair's objective: its own path and queue against the
        decode entries' least time and queue, plus its least price (`both` grows with the slots
        taken, so at the fewest decode slots; a surplus row's or column's line at its minimum)."""
        least = self.both[np.minimum(self.need_p + self.need_d.min(), self.both.size - 1)]
        if self.rows.size:
            least[self.rows] = self.row_lines.min(axis=1)
        if self.cols.size:
            least = np.minimum(least, self.col_lines.min(axis=0))
        return np.maximum(self.tp, self.td.min()) + self.qp + self.qd.min() + least + self.forced


def _disaggregated(p: PlanningProblem, sp: SlotPrices) -> tuple[int, tuple] | None:
    """The best (prefill, decode) entry pair: the first in row-major order among the cheapest,
    as an argmin over the whole pair matrix would pick it.

    Why by blocks of rows, best bound first: at 4096 GPUs and 16,384 trajectories each role keeps
    over a thousand entries, and the whole matrix took 17-35 ms per decision. Rows are priced in
    order of their bound (`PairPrices.bound`) until the next bound exceeds the best pair found;
    every row that could hold a cheapest pair, or tie one, is priced."""
    pp = PairPrices.of(p, sp)
    if pp is None:
        return None
    bound = pp.bound()
    order = np.argsort(bound, kind="stable")
    best: tuple[int, int, int] | None = None  # (objective, prefill entry, decode entry)
    for at in range(0, order.size, ROWS_AT_ONCE):
        idx = order[at:at + ROWS_AT_ONCE]
        if best is not None and bound[idx[0]] > best[0]:
            break
        obj = pp.block(idx)
        low = int(obj.min())
        if best is not None and low > best[0]:
            continue
        r, c = np.nonzero(obj == low)
        i, j = min(zip(idx[r].tolist(), c.tolist()))
        if best is None or (low, i, j) < best:
            best = (low, i, j)
    assert best is not None
    if best[0] >= UNFIT:
        return None
    return best[0], ("disaggregated", int(pp.kp[best[1]]), int(pp.kd[best[2]]))


def _cheapest_with_held(free: np.ndarray, held: np.ndarray, surplus: np.ndarray, need: np.ndarray) -> np.ndarray:
    """[a, b]: the price of the cheapest need[b] slots among the free ones and the cheapest
    surplus[a] held ones (UNFIT where there are too few), from both lists' prefix sums.

    Why not merge the lists per surplus (`SlotPrices.with_surplus`, as `_layout` does for the one
    choice it lays out): both are sorted, so the cheapest m of the two take some j from the held
    ones and m - j from the free ones, and the price is min over j <= min(surplus, m) of
    free[m - j] + held[j], one cumulative minimum over j for every m at once. A merge per
    surplus cost a sort per entry: at 4096 GPUs and 16,384 trajectories a third of a decision."""
    most = int(surplus.max())
    ms, back = np.unique(need, return_inverse=True)
    j = np.arange(most + 1)
    i = ms[:, None] - j[None, :]  # free slots taken with j held ones
    ok = (i >= 0) & (i < free.size)
    price = np.where(ok, free[np.clip(i, 0, free.size - 1)] + held[np.minimum(j, held.size - 1)][None, :], UNFIT)
    best = np.minimum.accumulate(price, axis=1)  # [m, s]: the cheapest with at most s held ones
    return best[np.ix_(back, surplus)].T


def _layout(p: PlanningProblem, sp: SlotPrices, choice: tuple) -> tuple[tuple[int, int, int], ...]:
    """The per-group instances of the priced choice: current ones kept, the cheapest slots taken."""
    cur = sp.cur
    x = [[0, 0, 0] for _ in p.groups]
    if choice[0] == "colocated":
        k = choice[1]
        for i, c in enumerate(cur):
            x[i][0] = c[0]
        for _, i in sp.free_colocated[:max(0, k - sp.have(0))]:
            x[i][0] += 1
        return tuple(tuple(v) for v in x)  # type: ignore[return-value]
    _, kp, kd = choice
    for i, c in enumerate(cur):
        x[i][1], x[i][2] = c[1], c[2]
    have = (sp.have(1), sp.have(2))
    need = (max(0, kp - have[0]), max(0, kd - have[1]))
    if need[0] and need[1]:
        taken = sp.free_split[:need[0] + need[1]]
        for n, (_, i) in enumerate(taken):
            x[i][1 if n < need[0] else 2] += 1
        return tuple(tuple(v) for v in x)  # type: ignore[return-value]
    for role, other in ((1, 2), (2, 1)):
        want = need[other - 1]
        if not want:
            continue
        surplus = max(0, have[role - 1] - (kp, kd)[role - 1])
        for _, i, held in sp.with_surplus(role, surplus)[:want]:
            if held:
                x[i][role] -= 1
            x[i][other] += 1
    return tuple(tuple(v) for v in x)  # type: ignore[return-value]
