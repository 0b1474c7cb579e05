"""The simulator's rollout side: trajectories of several turns, routed to engines, waiting on tools.

A trajectory prefills its new context on the engine that caches its prefix (or another one
by the shared router, `runtime/router.py`), decodes, waits on its environment with no
decode slot held, and repeats. In disaggregated mode prefill and decode run on different
engines and the KV of the new tokens crosses the inter-node link. A request cut off by a
drain, a stop or a preemption keeps its generated tokens and resumes elsewhere with one
extra prefill. Mixed into `Simulator`; it reads the simulator's engines and clock.
"""

from __future__ import annotations

from models.engine import Request
from runtime import router
from runtime.sim.workload import TrajectoryPlan

E_ENGINE, E_ENV, E_KV, E_ACTION, E_TRACE, E_TRAIN_DONE, E_SYNC_DONE, E_DUE, E_FORCED_BACK, E_PAUSE_END, E_SAMPLE = range(11)


class Traj:
    __slots__ = ("tid", "batch", "plan", "turn", "ctx", "g", "home", "dhome", "where", "inst", "width")

    def __init__(self, tid: int, batch: int, plan: TrajectoryPlan, width: int = 1) -> None:
        self.tid, self.batch, self.plan, self.width = tid, batch, plan, width
        self.turn, self.ctx, self.g = 0, 0, 0
        self.home: tuple[int, int] | None = None  # (iid, gen) caching this trajectory's prefix
        self.dhome: tuple[int, int] | None = None  # decode instance holding its KV (PD)
        self.where = "new"  # queued | engine | kv | env | done
        self.inst = -1


class Batch:
    __slots__ = ("index", "tids", "launched_at", "tokens", "size", "done", "done_at")

    def __init__(self, index: int, tids: list[int], launched_at: float, tokens: int, size: int) -> None:
        self.index, self.tids, self.launched_at, self.tokens, self.size = index, tids, launched_at, tokens, size
        self.done = 0
        self.done_at: float | None = None


class RolloutSide:
    """Trajectory handling for `Simulator` (attributes are the simulator's)."""

    def _launch_admissible(self) -> None:
        """Start the next batch once the last one is done and the weights are at most
        `staleness` versions behind (the Ray runtime's rollout loop: one batch at a time)."""
        j = len(self.batches)
        if (j > 0 and self.batches[-1].done_at is None) or j > self.version + self.staleness:
            return
        if j > 0:
            self._consult("rollout_step")  # a batch boundary: R/B is 1 again
        k = self.cohort
        plans = self.sampler.sample(self.B // k)
        tids = []
        for p in plans:
            tid = len(self.trajs)
            self.trajs[tid] = Traj(tid, j, p, k)
            tids.append(tid)
        self.batches.append(Batch(j, tids, self.now, k * sum(p.total_tokens() for p in plans), self.B))
        self.r.launched += self.B
        self._batch_launched(j)
        for tid in tids:
            self._dispatch(self.trajs[tid])

    def _home(self, role: str, home: tuple[int, int] | None):
        if home is None:
            return None
        h = self.instances.get(home[0])
        return h if h is not None and h.gen == home[1] and h.state == "ready" and h.role == role else None

    def _pick(self, role: str, home: tuple[int, int] | None):
        h = self._home(role, home)
        inst = self.instances
        shares = self.shares
        share = (lambda i: shares.get((role, self.nodes[inst[i].nid].gpu, len(inst[i].slots)), 0.0)) if shares else None
        iid = router.pick(self.ready[role], lambda i: inst[i].engine.load(), h.iid if h is not None else None, self.prng.randrange, share)
        return None if iid is None else inst[iid]

    def _path(self, tr: Traj) -> str | None:
        h = self.instances.get(tr.home[0]) if tr.home else None
        return router.path(bool(self.ready["colocated"]), bool(self.ready["prefill"]) and bool(self.ready["decode"]), self.mode, h.role if h is not None else None)

    def _pd_new(self, tr: Traj) -> int:
        """Tokens a PD prefill engine prefills on top of its cache: the new ones plus the previous
        response, which was decoded on a decode engine and so never entered this prefix cache."""
        k = tr.turn
        again = tr.plan.response_tokens[k - 1] if k > 0 else 0
        return tr.plan.new_tokens[k] + tr.g + again

    def _request(self, tr: Traj, inst, decode: bool) -> Request:
        """On the trajectory's home engine, the workload's `prefix_cache_hit` share of the
        earlier context is asked for as a cached prefix, and the engine grants it as far as
        its prefix cache still holds it (evicted under memory pressure: prefilled again);
        elsewhere the whole context is prefilled."""
        k = tr.turn
        new = tr.plan.new_tokens[k] + tr.g if decode else self._pd_new(tr)
        fresh = tr.plan.new_tokens[k] + tr.g
        cached = tr.home is not None and tr.home == (inst.iid, inst.gen)
        prefix = int(self.hit * (tr.ctx + fresh - new)) if cached else 0
        return Request(tr.tid, tr.ctx + fresh - prefix, prefix, max(tr.plan.response_tokens[k] - tr.g, 1) if decode else 0, tr.width, tr.tid)

    def _dispatch(self, tr: Traj) -> None:
        path = None if self.now < self.paused_until else self._path(tr)
        if path is None:
            tr.where = "queued"
            self.pending.append(tr.tid)
            return
        role = "colocated" if path == "colocated" else "prefill"
        inst = self._pick(role, tr.home)
        assert inst is not None and inst.engine is not None
        req = self._request(tr, inst, decode=path == "colocated")
        tr.home = (inst.iid, inst.gen)
        tr.where, tr.inst = "engine", inst.iid
        inst.engine.submit(req, self.now)
        self._touch(inst)

    def _prefilled(self, tr: Traj) -> None:
        d = self._pick("decode", tr.dhome)
        if d is None:  # no decode instance left: redo the turn where possible
            tr.home = None
            self._dispatch(tr)
            return
        k = tr.turn
        same = self._decode_holds(tr, d)
        tokens = self._pd_new(tr) if same else tr.ctx + tr.plan.new_tokens[k] + tr.g
        tr.where, tr.inst = "kv", d.iid
        self._push(self.now + tr.width * tokens * self.kv_bytes / self.link_bps, E_KV, tr.tid, d.gen * 1_000_000 + d.iid)

    @staticmethod
    def _decode_holds(tr: Traj, d) -> bool:
        """Does decode instance d still cache this trajectory's earlier context (only the new KV need cross)?"""
        return tr.dhome is not None and tr.dhome == (d.iid, d.gen) and d.engine.cache.peek(tr.tid) >= tr.ctx

    def _kv_arrived(self, tr: Traj, key: int) -> None:
        iid, gen = key % 1_000_000, key // 1_000_000
        d = self.instances.get(iid)
        if d is None or d.gen != gen or d.state != "ready" or d.role != "decode":
            tr.home = None  # the KV had nowhere to land: prefill again elsewhere
            self._dispatch(tr)
            return
        k = tr.turn
        new = tr.plan.new_tokens[k] + tr.g
        # the earlier context is either still cached here or arrived with this transfer
        held = tr.ctx if self._decode_holds(tr, d) else 0
        tr.dhome = (d.iid, d.gen)
        tr.where = "engine"
        d.engine.submit(Request(tr.tid, new + tr.ctx - held, held, max(tr.plan.response_tokens[k] - tr.g, 1), tr.width, tr.tid), self.now)
        self._touch(d)

    def _outside_engine_s(self, tr: Traj) -> float:
        """The turn's time outside its engine (driver -> actor -> engine core and back), where
        the engine's profile measured it (`pearl profile --clock runtime`), at the requests in
        flight on the engine that served it, this one included; the predictor's term."""
        inst = self.instances.get(tr.inst)
        if inst is None or inst.engine is None:
            return 0.0
        return float(inst.engine.cfg.step.profile.outside_engine_s(inst.engine.load() + 1))

    def _turn_done(self, tr: Traj) -> None:
        k = tr.turn
        p = tr.plan
        self.r.generated_tokens += p.response_tokens[k] * tr.width
        tr.ctx += p.new_tokens[k] + p.response_tokens[k]
        tr.g = 0
        tr.turn += 1
        outside = self._outside_engine_s(tr)
        tr.where, tr.inst = "env", -1
        self._push(self.now + outside + p.env_s[k], E_ENV, tr.tid)

    def _env_done(self, tr: Traj) -> None:
        if tr.turn < tr.plan.turns:
            self._dispatch(tr)
            return
        tr.where = "done"
        self.r.finished += tr.width
        b = self.batches[tr.batch]
        b.done += tr.width
        if b.done == b.size:
            b.done_at = self.now
            self.timeline.batch_done(self.now - b.launched_at)
            self.r.batch_times_s.append(round(self.now - b.launched_at, 3))
            self._launch_admissible()  # the next batch (if the weights allow), then the trainer
            self._maybe_train()

    def _evict(self, inst) -> list[int]:
        """Take every request off the instance; return the trajectories to resume."""
        if inst.engine is None:
            return []
        out = []
        for ev in inst.engine.evict_all(self.now):
            tr = self.trajs[ev.rid]
            tr.g = min(tr.g + ev.generated, tr.plan.response_tokens[tr.turn] - 1)
            tr.home = None
            out.append(tr.tid)
            self.r.resumed += 1
        self._touch(inst)
        return out

    def _resume(self, tids: list[int]) -> None:
        for tid in tids:
            self._dispatch(self.trajs[tid])

    def _flush(self) -> None:
        if self.now < self.paused_until or not self.pending:
            return
        waiting, self.pending = self.pending, []
        self._resume(waiting)
