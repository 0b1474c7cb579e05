"""The integer program of one planning step: GPU-to-role assignment, exact w.r.t. the predictor.

Data (`PlanningProblem`, integers in milliseconds so every backend sees the same numbers):
  groups g    interchangeable GPUs (node, pool, type) with `cap` usable GPUs and `cur[r]`
              current instances of role r whose GPUs stay usable.
  tables      per role r: entries (k, t_ms, q_ms) = "with at least k instances the role's
              path completes in t_ms and adds q_ms of queueing on top of the completion"
              (q: the prefill role's queue Q(N_P), models/predictor.py; 0 for the other
              roles). Extra instances may idle, so an entry is dominated, and pruned, when
              one with fewer instances is no worse in both t and q (with q = 0: the running
              minimum of the predictor's table). Entry (0, 0, 0) means "role unused".
Variables:
  x[g,r]      instances of role r on group g (TP GPUs each, inside the group: TP within node)
  d[g,r], s[g,r]  instances started / stopped;  d - s = x - cur
  u[g,c]      survivors that switch role inside TP class c (same TP): u <= sum d, u <= sum s
  m           1 = disaggregated; y[r,k] one-hot selection of table entry k of role r
  T           priced slower path (ms, see Objective): T >= sum_k t_ms[r,k] y[r,k] for every role;
              the completion is T + sum_r,k q_ms[r,k] y[r,k] (disaggregated: max(T_P, T_D) + Q)
Constraints (families, named when infeasible):
  availability    sum_r tp_r x[g,r] <= cap[g]   (preempted / noticed GPUs have cap 0)
  borrow_window   training groups have cap 0 unless the trainer waits and lend + return fit
                  before it needs its GPUs (decided from data; see build_problem)
  memory          role r only where its weights and one max-length sequence fit (what vLLM
                  checks at start). KV pressure is a rate, not a wall: it is priced in the
                  predictor's tables (fewer resident trajectories, evicted prefixes prefilled again)
  mode            y[C,0] = m, y[P,0] = y[D,0] = 1 - m; N_r >= sum_k k y[r,k]; N_C <= M(1-m) ...
  policy          fixed mode / fixed P:D counts / allowed pools (baselines, ablations)
Objective: T + sum_r,k q_ms y + sum_g,r (start_ms d + stop_ms s) - sum_g,c save_ms u + constant,
  per batch of the horizon (H = horizon_batches): a change's gain counts over H batches, its
  cost once. The completion prices the work the configuration will serve: the tables predict
  a fresh batch of B trajectories, but mid-batch only R of them are left, so every table
  entry is priced at round(f * t_ms) and round(f * q_ms) with f = (min(R/B, H) + max(H - 1, 0))
  / H (the rest of this batch, then H - 1 fresh ones, per batch). f = 1 for a fresh batch (R/B = 1) or R/B = 0 (the batch is
  complete: the configuration next serves a fresh one); for H = 1, f = R/B as in Eq. 7,
  which weighs completion differences by R/B. Pricing is monotone, so pruning stays exact
  and the completion term is round(f * the slower path) + round(f * the queue), within 1 ms
  of round(f * the predicted batch completion); `Decision` reports the latter. Transition
  prices are not scaled by f: a switch mid-batch costs what it costs at a batch boundary, so
  its gain shrinks with what is left and its cost does not.
  Start/stop/switch are priced as seconds of blocked GPUs spread over the dedicated usable
  GPUs, times transition_weight / H; `constant_ms` prices unavoidable stops. Training-GPU
  starts are priced at lend + return unless `Options.toggle_in_objective` is off: gated
  policies charge the toggle once, in the Eq. 7 borrow gate (planner/policies.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from planner.inputs import Entry, PlanningInputs, RoleTable, pareto_entries
from planner.state import ROLES, ClusterState, GPUGroup, TrainerPhase, Worker

FAMILIES = ("availability", "borrow_window", "memory", "policy")


@dataclass(frozen=True)
class Options:
    """Policy-level restrictions of the program."""

    allow_borrow: bool = True
    allow_elastic: bool = True
    pools: tuple[str, ...] = ("rollout", "elastic", "training")
    modes: tuple[str, ...] = ("colocated", "disaggregated")
    fixed_pd: tuple[int, int] | None = None  # exact (prefill, decode) instance counts
    max_gpus: int | None = None  # at most this many GPUs in rollout (roll's fixed size)
    relax: tuple[str, ...] = ()  # constraint families switched off (infeasibility diagnosis)
    aggregate: bool = True  # fold identical nodes into classes (exact; off only to test that it is)
    # mixed programs: fold nodes that run the same instances too. A relaxation (a class's price is
    # at most its nodes'), kept only when its layout splits back at that price (planner/solve.py)
    fold_running: bool = False
    # price a training-GPU start at lend + return; off where the Eq. 7 gate charges the toggle
    # instead (gated policies), so it is not counted twice
    toggle_in_objective: bool = True


class FoldedNodes:
    """Counts of a class of `nodes` identical nodes: `cap` and `cur` are per node."""

    nodes: tuple[str, ...]
    cap: int
    cur: tuple[int, ...]

    @property
    def mult(self) -> int:
        return len(self.nodes)

    @property
    def total_cap(self) -> int:
        return self.cap * self.mult

    def total_cur(self, i: int) -> int:
        return self.cur[i] * self.mult


@dataclass(frozen=True)
class GroupData(FoldedNodes):
    """Identical interchangeable-GPU groups folded into one class of `mult` nodes.

    Nodes of one pool and type with the same usable count and the same current instances
    per role are exchangeable; with one TP degree for all roles (or no current instances
    and capacity a multiple of every TP) a class-level solution splits back into per-node
    ones of the same cost (`split_to_nodes`), so the class is exact, not an approximation.
    `cap` and `cur` are per node.
    """

    nodes: tuple[str, ...]
    pool: str
    gpu_type: str
    cap: int
    cur: tuple[int, int, int]  # colocated, prefill, decode (per node)
    allowed: tuple[bool, bool, bool]  # weights fit on this group's GPUs
    start_ms: tuple[int, int, int]
    stop_ms: tuple[int, int, int]
    switch_ms: tuple[int, int, int]  # cost of switching INTO role r (drain + restart)

    def ub(self, r: int, tp: int) -> int:
        return (self.cap // tp) * self.mult if self.allowed[r] else 0


@dataclass(frozen=True)
class PlanningProblem:
    groups: tuple[GroupData, ...]
    tp: tuple[int, int, int]
    entries: tuple[tuple[Entry, ...], ...]  # per role: (k, priced t_ms, priced q_ms), k=0 first
    modes: tuple[str, ...]
    fixed_pd: tuple[int, int] | None
    max_gpus: int | None
    constant_ms: int  # unavoidable stops (lost / mis-sized / recalled workers)
    usable_gpus: int
    cost_gpus: int = 1  # the denominator of every transition price (dedicated usable GPUs)
    relax: tuple[str, ...] = ()
    borrow_closed: bool = False  # training GPUs exist but the borrow window is shut
    work: float = 1.0  # f: the share of a fresh batch's completion the objective prices (see Objective)
    # per role: the undominated (k, t_ms, q_ms) entries of a fresh batch, unpriced and unpruned by
    # cost: what `batch_completion_ms` reports (the predicted batch time, whatever f is)
    batch_entries: tuple[tuple[Entry, ...], ...] = ((), (), ())
    notes: dict = field(default_factory=dict, compare=False, hash=False)

    def max_instances(self, r: int) -> int:
        return sum(g.ub(r, self.tp[r]) for g in self.groups)

    def tp_classes(self) -> list[list[int]]:
        classes: dict[int, list[int]] = {}
        for r, t in enumerate(self.tp):
            classes.setdefault(t, []).append(r)
        return [rs for rs in classes.values() if len(rs) > 1]

    def switch_saving(self, g: GroupData, roles: list[int]) -> int:
        """ms saved by one switch instead of a stop + start (same for all roles in a TP class)."""
        r_in = roles[0]
        return max(0, g.start_ms[r_in] + g.stop_ms[r_in] - g.switch_ms[r_in])


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000.0))


def prune_table(table: RoleTable, k_max: int) -> tuple[Entry, ...]:
    """The table's undominated (k, t_ms, q_ms) entries with at most `k_max` instances."""
    return tuple(e for e in table.improving if e[0] <= k_max)


def remaining_fraction(unfinished: float) -> float:
    """R/B as the planner weighs it. R/B = 0 means the batch is complete: what runs next is a
    fresh batch, so it counts as 1 (both runtimes report 0 between a batch's end and the next
    launch, e.g. at the simulator's `rollout_step` and `training_begin` events)."""
    return unfinished if unfinished > 0.0 else 1.0


def work_fraction(unfinished: float, horizon_batches: float) -> float:
    """f, the share of a fresh batch's completion the objective prices (module docstring, Objective)."""
    r, h = remaining_fraction(unfinished), horizon_batches
    return (min(r, h) + max(h - 1.0, 0.0)) / h


def price_entries(entries: tuple[Entry, ...], work: float) -> tuple[Entry, ...]:
    """(k, round(work * t_ms), round(work * q_ms)) of undominated entries, keeping those still undominated.

    Rounding a scaled value is monotone, so dominance survives; of two entries that round to
    the same values the one with fewer instances is never worse (more instances cost more)."""
    return pareto_entries(e if e[0] == 0 else (e[0], int(round(work * e[1])), int(round(work * e[2]))) for e in entries)


def _prune_against_partner(pre: tuple[Entry, ...], dec: tuple[Entry, ...]) -> tuple[tuple[Entry, ...], tuple[Entry, ...]]:
    """Disaggregated completion is max(prefill, decode) + queue, and the max is at least the
    partner's best time: a role's t below that floor changes nothing, so with t raised to the
    floor an entry that one with fewer instances dominates (no worse in t and q) cannot be
    chosen by an optimum (more instances cost more). Without queues: only the first entry at
    or below the floor survives. Exact."""

    def cut(own: tuple[Entry, ...], floor: int | None) -> tuple[Entry, ...]:
        if floor is None:
            return own
        kept = {k for k, _, _ in pareto_entries((k, max(t, floor) if k else t, q) for k, t, q in own)}
        return tuple(e for e in own if e[0] in kept)

    best_p = min((t for k, t, _ in pre if k > 0), default=None)
    best_d = min((t for k, t, _ in dec if k > 0), default=None)
    return cut(pre, best_d), cut(dec, best_p)


def _completion_floor(entries: tuple[tuple[Entry, ...], ...]) -> int:
    """A lower bound on T (the slower path; queues come on top) whichever mode is chosen."""
    best = [min((t for k, t, _ in e if k > 0), default=None) for e in entries]
    cands = []
    if best[0] is not None:
        cands.append(best[0])
    if best[1] is not None and best[2] is not None:
        cands.append(max(best[1], best[2]))
    return min(cands) if cands else 0


def borrow_window_closes_at(trainer: TrainerPhase, inputs: PlanningInputs) -> float:
    """The last moment a loan still pays its way back before the trainer needs its GPUs."""
    return trainer.next_needs_gpus_at_s - inputs.costs.lend_s - inputs.costs.return_s


def borrow_window_open(state: ClusterState, inputs: PlanningInputs, now_s: float) -> bool:
    return state.trainer.phase == "waiting" and now_s <= borrow_window_closes_at(state.trainer, inputs)


def group_caps(state: ClusterState, inputs: PlanningInputs, now_s: float, options: Options) -> list[tuple[GPUGroup, int]]:
    """Every GPU group with the GPUs the plan may use: usable, not held by a draining worker, in
    an allowed pool, and training GPUs only inside the borrow window (families relaxed aside)."""
    relax = options.relax
    lendable = borrow_window_open(state, inputs, now_s) and options.allow_borrow
    pools = set(options.pools)
    if not options.allow_elastic:
        pools.discard("elastic")
    if not options.allow_borrow:
        pools.discard("training")
    raw = []
    held = {gid for wk in state.workers if wk.draining for gid in wk.gpus}  # free only once drained
    for grp in state.groups():
        cap = grp.usable - sum(1 for gid in grp.gpu_ids if gid in held and state.gpu(gid).usable)
        if grp.pool not in pools and "policy" not in relax:
            cap = 0
        if grp.pool == "training" and not lendable and "borrow_window" not in relax:
            cap = 0
        raw.append((grp, cap))
    return raw


def current_instances(state: ClusterState, raw: list[tuple[GPUGroup, int]], slot_of: Callable[[Worker, int], object | None],
                      stop_ms: Callable[[Worker], int]) -> tuple[dict[tuple[str, str, str], dict], int]:
    """Running (not draining) workers per group and slot, where `slot_of(worker, group cap)` lets
    them stay on usable GPUs (None: they must stop), and the summed price of those stops."""
    cur: dict[tuple[str, str, str], dict] = {}
    constant = 0
    cap_of = {grp.key: cap for grp, cap in raw}
    for wk in state.workers:
        if wk.draining:
            continue
        key = state.group_key_of(wk)
        slot = slot_of(wk, cap_of.get(key, 0)) if all(state.gpu(gid).usable for gid in wk.gpus) else None
        if slot is not None:
            cur.setdefault(key, {})[slot] = cur.get(key, {}).get(slot, 0) + 1
        else:
            constant += stop_ms(wk)
    return cur, constant


def build_problem(state: ClusterState, inputs: PlanningInputs, now_s: float, options: Options = Options()) -> PlanningProblem:
    """Fold the state into group data and integer costs (pure)."""
    tp = tuple(inputs.tp(r) for r in ROLES)
    relax = options.relax
    lendable = borrow_window_open(state, inputs, now_s) and options.allow_borrow
    raw = group_caps(state, inputs, now_s, options)
    usable = sum(c for _, c in raw)
    # prices spread blocked GPU-seconds over the dedicated (non-training) GPUs, so lending
    # training GPUs does not rescale every other cost: the program with borrowing allowed
    # then prices a no-lend solution exactly as the program without borrowing does
    denom = max(sum(c for grp, c in raw if grp.pool != "training"), 1)
    w = inputs.weights.transition_weight / inputs.weights.horizon_batches  # cost per batch of the horizon
    c = inputs.costs
    # current instances per group/role, and the price of the ones that cannot stay
    cur, constant = current_instances(state, raw, lambda wk, cap: ROLES.index(wk.role) if wk.tp == tp[ROLES.index(wk.role)] and cap >= wk.tp else None,
                                      lambda wk: _ms(w * c.stop_s * wk.tp / denom))
    classes: dict[tuple, list[str]] = {}
    single_tp = len(set(tp)) == 1
    for grp, cap in raw:
        cu = tuple(cur.get(grp.key, {}).get(r, 0) for r in range(3))
        exact = single_tp or (not any(cu) and all(cap % t == 0 for t in tp))
        key = (grp.pool, grp.type, cap, cu, "" if (exact and options.aggregate) else grp.node)
        classes.setdefault(key, []).append(grp.node)
    groups = []
    for (pool, typ, cap, cu, _), nodes in classes.items():
        allowed = tuple(inputs.memory.fits(typ, t) or "memory" in relax for t in tp)
        start_s = 0.0 if pool == "training" and not options.toggle_in_objective else c.start_s[pool]
        start = tuple(_ms(w * start_s * t / denom) for t in tp)
        stop = tuple(_ms(w * c.stop_s * t / denom) for t in tp)
        switch = tuple(_ms(w * c.switch_s * t / denom) for t in tp)
        groups.append(GroupData(tuple(nodes), pool, typ, cap, cu, allowed, start, stop, switch))  # type: ignore[arg-type]
    probe = PlanningProblem(tuple(groups), tp, ((), (), ()), options.modes, options.fixed_pd, options.max_gpus, 0, usable)
    batch = tuple(prune_table(inputs.table(r), probe.max_instances(i)) for i, r in enumerate(ROLES))
    work = work_fraction(state.unfinished_fraction, inputs.weights.horizon_batches)
    entries = tuple(price_entries(e, work) for e in batch)
    entries = (entries[0], *_prune_against_partner(entries[1], entries[2]))
    # the "role unused" entry may carry any valid lower bound on T instead of 0: it tightens
    # the LP relaxation (T >= lower bound whichever mode is chosen) without cutting solutions
    floor = _completion_floor(entries)
    entries = tuple(((0, floor, 0),) + e[1:] for e in entries)
    modes = options.modes if "policy" not in relax else ("colocated", "disaggregated")
    fixed = options.fixed_pd if "policy" not in relax else None
    mx = options.max_gpus if "policy" not in relax else None
    closed = any(g.pool == "training" and g.usable for g in state.groups()) and options.allow_borrow and not lendable
    problem = PlanningProblem(tuple(groups), tp, entries, modes, fixed, mx, constant, usable, denom, relax, closed, work, batch)
    return bound_prune(problem)


def bound_prune(problem: PlanningProblem) -> PlanningProblem:
    """Drop table entries no optimum can select, using the current configuration as incumbent.

    Selecting entry (k, t, q) of role r needs at least k instances of r; beyond the C_r current
    ones each costs at least the cheapest start or switch. The completion is at least t + q, so
    if that + the start lower bound (+ the unavoidable constant) exceeds the current
    configuration's objective, the entry cannot be optimal. Exact; shrinks the one-hot when
    the cluster changes little.
    """
    cur = tuple((g.total_cur(0), g.total_cur(1), g.total_cur(2)) for g in problem.groups)
    if not any(any(v) for v in cur):
        return problem
    ub = evaluate(problem, cur)
    if ub is None:
        return problem
    out = []
    for r, entries in enumerate(problem.entries):
        have = sum(v[r] for v in cur)
        prices = [min(g.start_ms[r], g.switch_ms[r]) for g in problem.groups if g.ub(r, problem.tp[r]) > 0]
        unit = min(prices) if prices else 0
        kept = [entries[0]] + [(k, t, q) for k, t, q in entries[1:] if t + q + max(0, k - have) * unit + problem.constant_ms <= ub]
        out.append(tuple(kept))
    return replace(problem, entries=tuple(out))


def policy_contradiction(problem: PlanningProblem) -> str | None:
    """Why the policy options admit no mode (no plan can exist), or None.

    `fixed_pd` pins the prefill and decode counts, so it needs the disaggregated mode; an
    empty (or unknown-only) `modes` allows nothing. Checked before any solver model is built.
    """
    allowed = {m for m in problem.modes if m in ("colocated", "disaggregated")}
    if not allowed:
        return f"no rollout mode allowed (modes={problem.modes!r})"
    if problem.fixed_pd is not None and "disaggregated" not in allowed:
        return f"fixed_pd={problem.fixed_pd!r} needs the disaggregated mode (modes={problem.modes!r})"
    return None


# ------------------------------------------------------------------------------------- solution
@dataclass(frozen=True)
class Solution:
    status: str  # optimal | feasible | infeasible | no_solution
    x: tuple[tuple[int, int, int], ...]  # per group
    completion_ms: int  # the objective's (priced) completion term: T + the selected queue cost
    objective_ms: int
    best_bound_ms: float
    solve_ms: float
    backend: str
    infeasible_family: str | None = None

    @classmethod
    def contradictory(cls, problem: PlanningProblem, backend: str) -> Solution | None:
        """The answer for options that admit no mode at all, before any model is built.

        Every backend calls this first: the program would need a mode variable with lower
        bound above upper bound, which some solvers reject as invalid instead of proving
        infeasibility, so all of them answer "infeasible" (family "policy") here instead."""
        if policy_contradiction(problem) is None:
            return None
        return cls("infeasible", tuple((0, 0, 0) for _ in problem.groups), 0, 0, -math.inf, 0.0, backend, "policy")

    @property
    def gap(self) -> float:
        if self.status not in ("optimal", "feasible"):
            return math.inf
        return max(0.0, (self.objective_ms - self.best_bound_ms) / max(abs(self.objective_ms), 1))

    def totals(self) -> tuple[int, int, int]:
        return tuple(sum(v[r] for v in self.x) for r in range(3))  # type: ignore[return-value]


# ------------------------------------------------------------------------------------- evaluation
def _pair_best(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """min over (t, q) options of two roles of max(t_a, t_b) + q_a + q_b (extra instances idle)."""
    if not any(q for _, q in b):
        tb = min(t for t, _ in b)
        return min(max(t, tb) + q for t, q in a)
    if not any(q for _, q in a):
        return _pair_best(b, a)
    return min(max(ta, tb) + qa + qb for ta, qa in a for tb, qb in b)


def _completion(entries: tuple[tuple[Entry, ...], ...], modes: tuple[str, ...], totals: tuple[int, int, int]) -> int | None:
    n_c, n_p, n_d = totals

    def options(r: int, n: int) -> list[tuple[int, int]]:
        return [(t, q) for k, t, q in entries[r] if 1 <= k <= n]

    if n_c > 0 and n_p == 0 and n_d == 0:
        col = options(0, n_c)
        return min(t + q for t, q in col) if col and "colocated" in modes else None
    if n_c == 0 and n_p > 0 and n_d > 0:
        if "disaggregated" not in modes:
            return None
        a, b = options(1, n_p), options(2, n_d)
        return _pair_best(a, b) if a and b else None
    return None


def completion_ms(problem: PlanningProblem, totals: tuple[int, int, int]) -> int | None:
    """The objective's completion term of role totals (priced tables, extra instances idle), None if the mode is invalid."""
    return _completion(problem.entries, problem.modes, totals)


def batch_completion_ms(problem: PlanningProblem, totals: tuple[int, int, int]) -> int | None:
    """Predicted completion of a fresh batch with these role totals (what a Decision reports)."""
    return _completion(problem.batch_entries, problem.modes, totals)


def batch_paths_ms(problem: PlanningProblem, totals: tuple[int, int, int]) -> int | None:
    """A fresh batch's completion with these role totals from the paths alone (no prefill queue):
    the earliest the model lets it end."""
    paths = tuple(tuple((k, t, 0) for k, t, _ in e) for e in problem.batch_entries)
    return _completion(paths, problem.modes, totals)


def group_transition_ms(problem: PlanningProblem, g: GroupData, x: tuple[int, int, int]) -> int:
    """Cheapest way to turn the class's current instances into x: keep, switch (same TP), stop, start."""
    d = [max(0, x[r] - g.total_cur(r)) for r in range(3)]
    s = [max(0, g.total_cur(r) - x[r]) for r in range(3)]
    total = sum(g.start_ms[r] * d[r] + g.stop_ms[r] * s[r] for r in range(3))
    for roles in problem.tp_classes():
        u = min(sum(d[r] for r in roles), sum(s[r] for r in roles))
        total -= problem.switch_saving(g, roles) * u
    return total


def feasible(problem: PlanningProblem, x: tuple[tuple[int, int, int], ...]) -> bool:
    tp = problem.tp
    for g, v in zip(problem.groups, x):
        if any(n < 0 for n in v) or sum(tp[r] * v[r] for r in range(3)) > g.total_cap:
            return False
        if any(v[r] > g.ub(r, tp[r]) for r in range(3)):
            return False
    tot = tuple(sum(v[r] for v in x) for r in range(3))
    if completion_ms(problem, tot) is None:  # type: ignore[arg-type]
        return False
    if problem.fixed_pd is not None and (tot[1], tot[2]) != problem.fixed_pd:
        return False
    if problem.max_gpus is not None and sum(tp[r] * tot[r] for r in range(3)) > problem.max_gpus:
        return False
    return True


def split_to_nodes(problem: PlanningProblem, g: GroupData, x: tuple[int, int, int]) -> list[tuple[str, tuple[int, int, int]]]:
    """Per-node counts of a class total x with the class's transition cost.

    Survivors stay where they are; a role's surplus is removed node by node; the freed
    slots on a node are refilled first with deficit roles of the same TP (a switch on the
    same node), then new instances go, largest TP first, where there is room.
    """
    tp = problem.tp
    if all(x[r] == g.total_cur(r) for r in range(3)):  # unchanged class: every node keeps its instances
        return [(node, g.cur) for node in g.nodes]
    per = [list(g.cur) for _ in g.nodes]
    for r in range(3):
        extra = g.total_cur(r) - x[r]
        i = 0
        while extra > 0:
            if per[i % g.mult][r] > 0:
                per[i % g.mult][r] -= 1
                extra -= 1
            i += 1
    need = [max(0, x[r] - g.total_cur(r)) for r in range(3)]
    freed = [[g.cur[r] - per[n][r] for r in range(3)] for n in range(g.mult)]
    # switches: reuse slots freed on the same node by a role of the same TP
    for n in range(g.mult):
        for r in range(3):
            for q in range(3):
                while need[r] and freed[n][q] and tp[q] == tp[r] and q != r:
                    per[n][r] += 1
                    freed[n][q] -= 1
                    need[r] -= 1
    for r in sorted(range(3), key=lambda r: -tp[r]):
        for n in range(g.mult):
            while need[r] and sum(tp[q] * per[n][q] for q in range(3)) + tp[r] <= g.cap:
                per[n][r] += 1
                need[r] -= 1
    if any(need):
        raise AssertionError(f"class of {g.mult} nodes cannot host {x}: aggregation was not exact")
    return [(node, (v[0], v[1], v[2])) for node, v in zip(g.nodes, per)]


def evaluate(problem: PlanningProblem, x: tuple[tuple[int, int, int], ...]) -> int | None:
    """The objective of an assignment computed from scratch (None if infeasible)."""
    if not feasible(problem, x):
        return None
    tot = tuple(sum(v[r] for v in x) for r in range(3))
    t = completion_ms(problem, tot)  # type: ignore[arg-type]
    assert t is not None
    return t + sum(group_transition_ms(problem, g, v) for g, v in zip(problem.groups, x)) + problem.constant_ms


def diagnose(problem: PlanningProblem, rebuild, solve_fn) -> str:
    """Name the constraint family that makes `problem` infeasible.

    Options that contradict each other (`policy_contradiction`) are 'policy' outright.
    `rebuild(relax)` builds the same problem with families switched off; the first family
    whose relaxation restores feasibility is reported. Otherwise the GPUs themselves are
    missing: 'tp_within_node' when enough GPUs exist but no node holds a TP group, else
    'availability'.
    """
    if policy_contradiction(problem) is not None:
        return "policy"  # the options contradict each other, whatever else is wrong
    for fam in ("policy", "borrow_window", "memory"):
        sol = solve_fn(rebuild((fam,)))
        if sol.status in ("optimal", "feasible"):
            return fam
    need = min(problem.tp) * (1 if "colocated" in problem.modes else 2)
    if sum(g.total_cap for g in problem.groups) >= need:
        return "tp_within_node"
    return "availability"
