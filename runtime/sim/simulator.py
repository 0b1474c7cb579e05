"""Discrete-event simulation of asynchronous agentic RL on a virtual clock.

Engines are `models.engine.Engine` instances (the same engine model the emulated Ray
engine uses), advanced analytically between request events. Around them:

- trajectories of several turns: prefill the new context on the instance that caches the
  prefix (sticky routing, power-of-two choices otherwise), decode, wait on the tool (no
  decode slot held), repeat; in disaggregated mode prefill and decode run on different
  instances with the KV of the new tokens sent over the inter-node link;
- a trainer that takes batches in launch order, bounded staleness (batch j is launched
  once weights version >= j - staleness), training step time from models.training and a
  weight sync that pauses every engine;
- GPUs in three pools: training (lent to rollout only while the trainer waits, recalled
  and returned before its next step), reserved rollout, and elastic GPUs following an
  availability trace. Expansion prepares in the background then pauses admission while
  the group joins atomically; a preemption evicts the instance's requests, which keep
  their generated tokens and resume elsewhere with one extra prefill;
- the policy is consulted on availability changes, batch completion and trainer phase
  changes; its changes are applied with the modelled delays (models.transition).

Deterministic per seed: one numpy Generator, ordered containers, a sequence number
breaking heap ties.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from models import architecture as arch
from models.builder import ExperimentModels, step_model
from models.engine import Engine, EngineConfig, Request
from models.training import training_step_s
from runtime.sim.layout import Change, InstanceView, NodeView, PolicyStep, SimPolicy, Snapshot
from runtime.sim.metrics import SimResult
from runtime.sim.workload import TrajectoryPlan, TrajectorySampler

E_ENGINE, E_ENV, E_KV, E_READY, E_TRACE, E_TRAIN_DONE, E_SYNC_DONE, E_RETURN_DONE, E_FINALIZE, E_PAUSE_END, E_SAMPLE = range(11)
ROLES = ("colocated", "prefill", "decode")


@dataclass
class Node:
    nid: int
    name: str
    pool: str
    gpu: str
    size: int
    available: bool = True
    slots: list = field(default_factory=list)  # owner iid per GPU, or None

    def free(self) -> list[int]:
        return [i for i, o in enumerate(self.slots) if o is None]


@dataclass
class Instance:
    iid: int
    nid: int
    slots: tuple[int, ...]
    role: str
    pool: str
    state: str  # starting | ready | switching
    engine: Engine | None = None
    gen: int = 0  # engine incarnation (a prefix cache lives as long as one engine)
    version: int = 0  # invalidates stale engine events
    token: int = 0  # invalidates stale READY events
    group: int = -1  # expansion group while starting on elastic GPUs
    busy_before: float = 0.0


class Traj:
    __slots__ = ("tid", "batch", "plan", "turn", "ctx", "g", "home", "dhome", "where", "inst", "width")

    def __init__(self, tid: int, batch: int, plan: TrajectoryPlan, width: int = 1) -> None:
        self.tid, self.batch, self.plan, self.width = tid, batch, plan, width
        self.turn, self.ctx, self.g = 0, 0, 0
        self.home: tuple[int, int] | None = None  # (iid, gen) caching this trajectory's prefix
        self.dhome: tuple[int, int] | None = None  # decode instance holding its KV (PD)
        self.where = "new"  # queued | engine | kv | env | done
        self.inst = -1


@dataclass
class Batch:
    index: int
    tids: list[int]
    launched_at: float
    tokens: int
    size: int  # trajectories (a cohort counts its width)
    done: int = 0
    done_at: float | None = None


class Simulator:
    def __init__(
        self,
        models: ExperimentModels,
        policy: SimPolicy,
        availability: object | None = None,
        hours: float = 1.0,
        seed: int | None = None,
        sample_s: float = 60.0,
        warm_start: bool = True,
        progress: Callable[[float], None] | None = None,
        memory_utilization: float = 0.9,
        rollout_only: bool = False,
        cohort: int = 1,
        max_batched_tokens: int = 8192,
    ) -> None:
        spec = models.spec
        self.m, self.spec, self.policy = models, spec, policy
        self.horizon = hours * 3600.0
        self.seed = spec.seed if seed is None else seed
        self.rng = np.random.default_rng(self.seed)
        self.prng = random.Random(self.seed)  # router draws: stdlib is ~20x cheaper per draw than numpy
        self.sampler = TrajectorySampler(spec.workload, self.rng)
        self.sample_s, self.warm, self.progress = sample_s, warm_start, progress
        self.rollout_only = rollout_only  # replays of rollout batches: training and sync take no time
        self.costs = models.costs
        self.tp = {"colocated": models.tp_colocated, "prefill": models.tp_prefill, "decode": models.tp_decode}
        self.cfg = {r: EngineConfig.for_model(step_model(spec, models.profile, self.tp[r]), r, memory_utilization, max_batched_tokens=max_batched_tokens) for r in ROLES}  # type: ignore[arg-type]
        self.kv_bytes = float(arch.kv_bytes_per_token(spec.model))
        self.hit = spec.workload.prefix_cache_hit
        self.link_bps = spec.cluster.inter_node_gb_s * 1e9 * self.tp["prefill"]
        self.B = spec.workload.trajectories_per_batch
        # Granularity: a cohort is `cohort` members of one GRPO group simulated as identical
        # sequences (one request of that width). 1 = every trajectory on its own.
        if cohort < 1 or spec.workload.group_size % cohort:
            from models.config import ConfigError

            raise ConfigError(spec.source, "cohort", cohort, f"a divisor of group_size ({spec.workload.group_size})")
        self.cohort = cohort
        self.staleness = spec.training.staleness
        train_groups = [g for g in spec.cluster.nodes if g.pool == "training"]
        self.train_gpu = spec.gpu(train_groups[0].gpu) if train_groups else spec.gpu(models.rollout_gpu)
        self.train_gpus = spec.cluster.gpus_in_pool("training")
        # nodes
        self.nodes: list[Node] = []
        for gi, g in enumerate(spec.cluster.nodes):
            for n in range(g.count):
                self.nodes.append(Node(len(self.nodes), f"{g.pool}{gi}-{n}", g.pool, g.gpu, g.gpus_per_node, True, [None] * g.gpus_per_node))
        self.avail_times: list[float] = []
        self.avail_gpus: list[int] = []
        if availability is not None:
            self.avail_times = [float(x) for x in availability.times_s]  # type: ignore[attr-defined]
            self.avail_gpus = [int(x) for x in availability.gpus]  # type: ignore[attr-defined]
        # dynamic state
        self.now = 0.0
        self.heap: list = []
        self.seq = 0
        self.instances: dict[int, Instance] = {}
        self.ready: dict[str, list[int]] = {r: [] for r in ROLES}
        self.next_iid = 0
        self.trajs: dict[int, Traj] = {}
        self.pending: list[int] = []
        self.paused_until = 0.0
        self.groups: dict[int, list[int]] = {}
        self.next_group = 0
        self.batches: list[Batch] = []
        self.version = 0
        self.next_step = 0
        self.phase = "idle"
        self.mode = "colocated"
        # metrics
        self.r = SimResult(policy=policy.name, hours=hours, seed=self.seed)
        self.busy_retired = {r: 0.0 for r in ROLES}
        self.last_busy = {r: 0.0 for r in ROLES}
        self.batch_durations: list[float] = []

    # ================================================================== heap
    def _push(self, t: float, kind: int, a: int = 0, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def _touch(self, inst: Instance) -> None:
        inst.version += 1
        t = inst.engine.next_event() if inst.engine is not None else math.inf
        if t < math.inf:
            self._push(t, E_ENGINE, inst.iid, inst.version)

    # ================================================================== run
    def run(self) -> SimResult:
        if self.avail_times:  # the pool as the trace has it when the run starts, before the first decision
            self._set_elastic(self.avail_gpus[0])
        for i, t in enumerate(self.avail_times[1:], start=1):
            if t <= self.horizon:
                self._push(max(t, 0.0), E_TRACE, i)
        self._push(self.sample_s, E_SAMPLE)
        self._consult("start")
        self._launch_admissible()
        n_events = 0
        next_progress = 0.0
        heap = self.heap
        while heap:
            t, _, kind, a, b = heapq.heappop(heap)
            if t > self.horizon:
                break
            self.now = t
            n_events += 1
            if kind == E_ENGINE:
                inst = self.instances.get(a)
                if inst is None or inst.version != b or inst.engine is None:
                    continue
                outs = inst.engine.on_event(t)
                self._touch(inst)
                for o in outs:
                    if o.kind == "decoded":
                        self._turn_done(self.trajs[o.rid])
                    else:
                        self._prefilled(self.trajs[o.rid])
            elif kind == E_ENV:
                self._env_done(self.trajs[a])
            elif kind == E_KV:
                self._kv_arrived(self.trajs[a], b)
            elif kind == E_READY:
                self._ready(a, b)
            elif kind == E_TRACE:
                self._set_elastic(self.avail_gpus[a])
                self._consult("availability")
            elif kind == E_TRAIN_DONE:
                self._train_done()
            elif kind == E_SYNC_DONE:
                self._sync_done()
            elif kind == E_RETURN_DONE:
                self._start_training()
            elif kind == E_FINALIZE:
                self._finalize(a)
            elif kind == E_PAUSE_END:
                if self.now >= self.paused_until:
                    self._flush()
            elif kind == E_SAMPLE:
                self._sample()
                self._push(t + self.sample_s, E_SAMPLE)
                if self.progress is not None and t >= next_progress:
                    self.progress(t)
                    next_progress = t + 600.0
        self.now = self.horizon
        self._finish(n_events)
        return self.r

    # ================================================================== trajectories
    def _launch_admissible(self) -> None:
        while len(self.batches) <= self.version + self.staleness:
            j = len(self.batches)
            k = self.cohort
            plans = self.sampler.sample(self.B // k)
            tids = []
            for p in plans:
                tid = len(self.trajs)
                tr = Traj(tid, j, p, k)
                self.trajs[tid] = tr
                tids.append(tid)
            self.batches.append(Batch(j, tids, self.now, k * sum(p.total_tokens() for p in plans), self.B))
            self.r.launched += self.B
            for tid in tids:
                self._dispatch(self.trajs[tid])

    def _pick(self, role: str, home: tuple[int, int] | None) -> Instance | None:
        ids = self.ready[role]
        if not ids:
            return None
        best: Instance | None = None
        if len(ids) == 1:
            best = self.instances[ids[0]]
        else:
            n = len(ids)
            x, y = self.instances[ids[self.prng.randrange(n)]], self.instances[ids[self.prng.randrange(n)]]
            best = x if x.engine.load() <= y.engine.load() else y  # type: ignore[union-attr]
        if home is not None:
            h = self.instances.get(home[0])
            if h is not None and h.gen == home[1] and h.state == "ready" and h.role == role:
                if h.engine.load() <= 2 * best.engine.load() + 4:  # type: ignore[union-attr]
                    return h
        return best

    def _path(self, tr: Traj) -> str | None:
        has_c = bool(self.ready["colocated"])
        has_pd = bool(self.ready["prefill"]) and bool(self.ready["decode"])
        if has_c and has_pd:
            h = self.instances.get(tr.home[0]) if tr.home else None
            if h is not None and h.role in ("colocated", "prefill"):
                return "colocated" if h.role == "colocated" else "pd"
            return "pd" if self.mode == "disaggregated" else "colocated"
        return "colocated" if has_c else ("pd" if has_pd else None)

    def _pd_new(self, tr: Traj) -> int:
        """Tokens a PD prefill engine prefills on top of its cache: the new ones plus the previous
        response, which was decoded on a decode engine and so never entered this prefix cache."""
        k = tr.turn
        again = tr.plan.response_tokens[k - 1] if k > 0 else 0
        return tr.plan.new_tokens[k] + tr.g + again

    def _request(self, tr: Traj, inst: Instance, decode: bool) -> Request:
        """On the trajectory's home engine, the workload's `prefix_cache_hit` share of the
        earlier context it holds is a cache hit and the rest is prefilled again (as the
        predictor assumes); elsewhere the whole context is prefilled."""
        k = tr.turn
        new = tr.plan.new_tokens[k] + tr.g if decode else self._pd_new(tr)
        fresh = tr.plan.new_tokens[k] + tr.g
        cached = tr.home is not None and tr.home == (inst.iid, inst.gen)
        prefix = int(self.hit * (tr.ctx + fresh - new)) if cached else 0
        return Request(tr.tid, tr.ctx + fresh - prefix, prefix, max(tr.plan.response_tokens[k] - tr.g, 1) if decode else 0, tr.width)

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
        same = tr.dhome is not None and tr.dhome == (d.iid, d.gen)
        tokens = self._pd_new(tr) if same else tr.ctx + tr.plan.new_tokens[k] + tr.g
        tr.where, tr.inst = "kv", d.iid
        self._push(self.now + tr.width * tokens * self.kv_bytes / self.link_bps, E_KV, tr.tid, d.gen * 1_000_000 + d.iid)

    def _kv_arrived(self, tr: Traj, key: int) -> None:
        iid, gen = key % 1_000_000, key // 1_000_000
        d = self.instances.get(iid)
        if d is None or d.gen != gen or d.state != "ready" or d.role != "decode":
            tr.home = None  # the KV had nowhere to land: prefill again elsewhere
            self._dispatch(tr)
            return
        k = tr.turn
        new = tr.plan.new_tokens[k] + tr.g
        tr.dhome = (d.iid, d.gen)
        tr.where = "engine"
        d.engine.submit(Request(tr.tid, new, tr.ctx, max(tr.plan.response_tokens[k] - tr.g, 1), tr.width), self.now)  # type: ignore[union-attr]
        self._touch(d)

    def _turn_done(self, tr: Traj) -> None:
        k = tr.turn
        p = tr.plan
        self.r.generated_tokens += p.response_tokens[k] * tr.width
        tr.ctx += p.new_tokens[k] + p.response_tokens[k]
        tr.g = 0
        tr.turn += 1
        tr.where, tr.inst = "env", -1
        self._push(self.now + p.env_s[k], E_ENV, tr.tid)

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
            self.batch_durations.append(self.now - b.launched_at)
            self.r.batch_times_s.append(round(self.now - b.launched_at, 3))
            before = self.phase
            self._maybe_train()
            if self.phase == before:  # the trainer does not start on it now: a batch-boundary decision
                self._consult("batch")

    def _evict(self, inst: Instance) -> list[int]:
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

    def _flush(self) -> None:
        if self.now < self.paused_until or not self.pending:
            return
        waiting, self.pending = self.pending, []
        for tid in waiting:
            self._dispatch(self.trajs[tid])

    # ================================================================== instances
    def _retire_engine(self, inst: Instance) -> None:
        if inst.engine is not None:
            self.busy_retired[inst.role] += inst.engine.stats.busy_s
            inst.engine = None
        if inst.iid in self.ready[inst.role]:
            self.ready[inst.role].remove(inst.iid)

    def _remove(self, inst: Instance) -> list[int]:
        resume = self._evict(inst)
        self._retire_engine(inst)
        node = self.nodes[inst.nid]
        for s in inst.slots:
            node.slots[s] = None
        inst.version += 1
        inst.token += 1
        del self.instances[inst.iid]
        return resume

    def _new_instance(self, role: str, nid: int, slots: tuple[int, ...]) -> Instance | None:
        node = self.nodes[nid]
        tp = self.tp[role]
        if not node.available:
            return None
        if not slots or any(node.slots[s] is not None for s in slots):
            free = node.free()
            if len(free) < tp:
                return None
            slots = tuple(free[:tp])
        inst = Instance(self.next_iid, nid, slots, role, node.pool, "starting")
        self.next_iid += 1
        for s in slots:
            node.slots[s] = inst.iid
        self.instances[inst.iid] = inst
        return inst

    def _ready(self, iid: int, token: int) -> None:
        inst = self.instances.get(iid)
        if inst is None or inst.token != token or inst.state == "ready":
            return
        inst.state = "ready"
        inst.gen += 1
        inst.engine = Engine(self.cfg[inst.role], t=self.now)
        self.ready[inst.role].append(inst.iid)
        self._flush()

    def _schedule_ready(self, inst: Instance, delay: float) -> None:
        inst.token += 1
        if delay <= 0:
            self._ready(inst.iid, inst.token)
        else:
            self._push(self.now + delay, E_READY, inst.iid, inst.token)

    def _finalize(self, gid: int) -> None:
        members = [self.instances[i] for i in self.groups.pop(gid, []) if i in self.instances]
        if not members:
            return
        fin = self.costs.expand_finalize_s
        self.paused_until = max(self.paused_until, self.now + fin)
        self.r.admission_pause_s += fin
        for inst in members:
            inst.group = -1
            self._schedule_ready(inst, fin)
        self._push(self.now + fin, E_PAUSE_END)

    def _set_elastic(self, gpus: int) -> None:
        """Make `gpus` elastic GPUs available: new nodes join in order, preempted ones are drawn at random."""
        el = [n for n in self.nodes if n.pool == "elastic"]
        up = [n for n in el if n.available]
        have = sum(n.size for n in up)
        resume: list[int] = []
        if gpus < have:
            order = self.rng.permutation(len(up))
            for i in order:
                if have <= gpus:
                    break
                node = up[int(i)]
                node.available = False
                have -= node.size
                for iid in sorted({o for o in node.slots if o is not None}):
                    inst = self.instances[iid]
                    if inst.group >= 0:  # all-or-nothing: cancel the whole expansion group
                        for other in self.groups.pop(inst.group, []):
                            if other in self.instances and other != iid:
                                resume += self._remove(self.instances[other])
                    resume += self._remove(inst)
                    self.r.preempted_instances += 1
        else:
            for node in el:
                if node.available:
                    continue
                if have + node.size > gpus:
                    break
                node.available = True
                have += node.size
        self.r.elastic_series.append((round(self.now, 1), have))
        for tid in resume:
            self._dispatch(self.trajs[tid])

    # ================================================================== policy
    def _snapshot(self, event: str) -> Snapshot:
        lendable = self.phase == "idle"
        nodes = tuple(NodeView(n.nid, n.pool, n.gpu, n.size, n.available, n.pool == "training" and lendable) for n in self.nodes)
        insts = tuple(InstanceView(i.iid, i.nid, len(i.slots), i.role, i.state, i.pool, i.pool == "training", i.slots) for i in self.instances.values())
        j = self.next_step
        b = self.batches[j] if j < len(self.batches) else None
        unfinished = (b.size - b.done) if b is not None else self.B
        tokens = b.tokens if b is not None else self.B * 20000
        t_train = training_step_s(self.spec.model, self.train_gpu, self.train_gpus, tokens, self.spec.training.mfu, self.spec.training.optimizer_overhead_s)
        nxt = None
        if self.phase == "idle" and self.batch_durations and b is not None:
            elapsed = self.now - b.launched_at
            nxt = max(float(np.mean(self.batch_durations[-4:])) - elapsed, 0.0)
        return Snapshot(self.now, event, nodes, insts, self.phase, self.version, self.B, unfinished, t_train, nxt)  # type: ignore[arg-type]

    def _consult(self, event: str) -> None:
        snap = self._snapshot(event)
        t0 = time.perf_counter()
        step: PolicyStep = self.policy.decide(snap)
        self.r.policy_wall_s += time.perf_counter() - t0
        self.r.decisions += 1
        if "error" in step.info:
            self.r.policy_failures += 1
        if step.changes:
            if step.mode != self.mode and event != "start":
                self.r.mode_switches += 1  # the initial layout is a choice, not a switch
            self.mode = step.mode
        self._apply(step.changes, warm=self.warm and event == "start")
        self.r.decision_log.append((round(self.now, 2), event, step.mode, dict(step.info)))

    def _apply(self, changes: tuple[Change, ...], warm: bool) -> None:
        resume: list[int] = []
        group: list[int] = []
        lend_ok = self.phase == "idle"
        for ch in changes:
            if ch.kind == "stop":
                inst = self.instances.get(ch.iid)  # type: ignore[arg-type]
                if inst is not None:
                    resume += self._remove(inst)
                    self.r.stops += 1
            elif ch.kind == "switch":
                inst = self.instances.get(ch.iid)  # type: ignore[arg-type]
                if inst is None or inst.role == ch.role:
                    continue
                if inst.pool == "training" and not lend_ok:
                    continue
                resume += self._evict(inst)
                self._retire_engine(inst)
                inst.role = ch.role  # type: ignore[assignment]
                self.r.role_switches += 1
                if inst.state == "ready" or inst.state == "switching":
                    inst.state = "switching"
                    self._schedule_ready(inst, 0.0 if warm else self.costs.role_switch_s)
        for ch in changes:
            if ch.kind != "start":
                continue
            node = self.nodes[ch.nid]  # type: ignore[index]
            if node.pool == "training" and not lend_ok:
                continue
            inst = self._new_instance(ch.role, ch.nid, ch.gpu_slots)  # type: ignore[arg-type]
            if inst is None:
                continue
            self.r.starts += 1
            if warm:
                self._schedule_ready(inst, 0.0)
            elif node.pool == "training":
                self.r.lends += 1
                self._schedule_ready(inst, self.costs.borrow_s)
            elif node.pool == "elastic":
                inst.group = self.next_group
                group.append(inst.iid)
            else:
                self._schedule_ready(inst, self.costs.engine_start_s)
        if group:
            gid = self.next_group
            self.next_group += 1
            self.groups[gid] = group
            self._push(self.now + self.costs.expand_prepare_s, E_FINALIZE, gid)
        for tid in resume:
            self._dispatch(self.trajs[tid])

    # ================================================================== trainer
    def _maybe_train(self) -> None:
        if self.phase != "idle" or self.next_step >= len(self.batches):
            return
        b = self.batches[self.next_step]
        if b.done_at is None:
            return
        lent = [i for i in self.instances.values() if i.pool == "training"]
        self.phase = "returning"
        if lent:
            resume: list[int] = []
            for inst in lent:
                resume += self._remove(inst)
                self.r.returns += 1
            for tid in resume:
                self._dispatch(self.trajs[tid])
            self._push(self.now + self.costs.return_s, E_RETURN_DONE)
            self.r.return_wait_s += self.costs.return_s
        else:
            self._start_training()

    def _start_training(self) -> None:
        if any(i.pool == "training" for i in self.instances.values()):
            self.r.late_returns += 1  # a lent GPU still serving rollout when the step begins
        b = self.batches[self.next_step]
        self.phase = "training"
        self.r.train_wait_s.append(round(self.now - b.done_at, 3))  # type: ignore[operator]
        dt = 0.0 if self.rollout_only else training_step_s(self.spec.model, self.train_gpu, self.train_gpus, b.tokens, self.spec.training.mfu, self.spec.training.optimizer_overhead_s)
        self.r.train_busy_s += dt
        self.r.train_times_s.append(round(dt, 3))
        self._push(self.now + dt, E_TRAIN_DONE)
        self._consult("train_begin")

    def _train_done(self) -> None:
        self.phase = "syncing"
        sync = 0.0 if self.rollout_only else self.costs.weight_load_peer_s
        for inst in list(self.instances.values()):
            if inst.engine is not None:
                inst.engine.stall(self.now, sync)
                self._touch(inst)
        self._push(self.now + sync, E_SYNC_DONE)

    def _sync_done(self) -> None:
        b = self.batches[self.next_step]
        self.r.trained_tokens += b.tokens
        self.r.steps += 1
        self.r.step_end_times_s.append(round(self.now, 3))
        self.next_step += 1
        self.version += 1
        self.phase = "idle"
        self._launch_admissible()
        self._consult("train_end")
        self._maybe_train()

    # ================================================================== metrics
    def _sample(self) -> None:
        by: dict[str, int] = {}
        busy = dict(self.busy_retired)
        for inst in self.instances.values():
            key = f"{inst.pool}:{inst.role if inst.state == 'ready' else 'transitioning'}"
            by[key] = by.get(key, 0) + len(inst.slots)
            if inst.engine is not None:
                busy[inst.role] += inst.engine.stats.busy_s
        if self.phase in ("training", "syncing"):
            by["training:training"] = self.train_gpus
        util = {}
        for role in ROLES:
            gpus = sum(v for k, v in by.items() if k.endswith(":" + role))
            inst_s = gpus / max(self.tp[role], 1) * self.sample_s
            util[role] = round(min((busy[role] - self.last_busy[role]) / inst_s, 1.0), 4) if inst_s > 0 else 0.0
        self.last_busy = busy
        self.r.series.append({
            "t": round(self.now, 1), "generated_tokens": self.r.generated_tokens, "trained_tokens": self.r.trained_tokens,
            "steps": self.r.steps, "gpus": by, "util": util,
        })

    def _finish(self, n_events: int) -> None:
        in_flight = 0
        for tr in self.trajs.values():
            if tr.where == "done":
                continue
            if tr.where == "engine":
                inst = self.instances.get(tr.inst)
                if inst is None or inst.engine is None or not inst.engine.holds(tr.tid):
                    continue  # claimed to be on an engine that does not hold it: lost
            elif tr.where not in ("env", "kv", "queued"):
                continue
            elif tr.where == "queued" and tr.tid not in self.pending:
                continue
            in_flight += tr.width
        self.r.in_flight = in_flight
        self.r.lost_trajectories = self.r.launched - self.r.finished - in_flight
        self.r.events = n_events
        self.r.sim_s = self.horizon
