"""Discrete-event simulation of asynchronous agentic RL on a virtual clock.

Engines are `models.engine.Engine` instances (the same engine model the emulated Ray
engine uses), advanced analytically between request events. What the simulator shares
with the Ray runtime is written once and given this clock: plan execution
(`runtime/executor.py`), routing (`runtime/router.py`), the trainer's timeline
(`runtime/timeline.py`), loans of training GPUs (`runtime/loans.py`), and names
(`runtime/naming.py`). Its own parts:

- rollout (`runtime/sim/rollout.py`): trajectories of several turns, sticky routing,
  tool waits with no decode slot held, PD handoff over the inter-node link;
- the cluster (`runtime/sim/cluster.py`): GPUs in three pools (training GPUs lent to
  rollout only while the trainer waits, reserved rollout GPUs, elastic GPUs following an
  availability trace), instances, and plan actions lasting their modelled durations;
- the trainer (here): batches in launch order under bounded staleness, a training step
  from models.training and a weight sync that pauses every engine. When its batch is
  ready it needs its GPUs: the policy decides (`training_begin`) and the plan's returns
  bring lent GPUs back; the step starts when the last one is home, and lateness is
  measured by the loan ledger.

The policy is consulted on availability changes, batch completion, trainer phase changes
and when the borrow window is about to close (`return_due`). Deterministic per seed: one
numpy Generator, ordered containers, a sequence number breaking heap ties.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from typing import Callable

import numpy as np

from models import architecture as arch
from models.builder import ExperimentModels
from models.config import ConfigError
from models.engine import EngineConfig
from planner.inputs import planning_inputs
from runtime.executor import Executor
from runtime.loans import LoanLedger
from runtime.naming import gpu_name
from runtime.sim.cluster import ROLES, ClusterSide, make_nodes
from runtime.sim.layout import PolicyStep, SimPolicy
from runtime.sim.metrics import SimResult
from runtime.sim.rollout import (E_ACTION, E_DUE, E_ENGINE, E_ENV, E_FORCED_BACK, E_KV, E_PAUSE_END, E_SAMPLE, E_SYNC_DONE,
                                 E_TRACE, E_TRAIN_DONE, RolloutSide)
from runtime.sim.workload import TrajectorySampler
from runtime.timeline import TrainerTimeline, return_due_at, train_step_s



class Simulator(RolloutSide, ClusterSide):
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
        max_batched_tokens: int | None = None,  # None: each engine's profiled step budget
        elastic_events: tuple = (),
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
        # one engine per (role, GPU type, TP degree): the predictor's own (models.engines), as the
        # Ray runtime's emulated engines; mixed clusters start any of them, others the rollout type's
        self.kind_cfg: dict[tuple[str, str, int], EngineConfig] = {
            key: EngineConfig.for_model(engine, key[0], memory_utilization, max_batched_tokens=max_batched_tokens)  # type: ignore[arg-type]
            for key, engine in models.engines().items()
        }
        self.cfg = {r: self.kind_cfg[(r, models.rollout_gpu, self.tp[r])] for r in ROLES}
        # colocated engines measured with fewer engines on a node than a full one runs, by count (`_rerate`)
        self.colocated_by_engines = {n: EngineConfig.for_model(engine, "colocated", memory_utilization, max_batched_tokens=max_batched_tokens)
                                     for n, engine in models.predictor.colocated_by_engines}
        self.kv_bytes = float(arch.kv_bytes_per_token(spec.model))
        self.hit = spec.workload.prefix_cache_hit
        self.link_bps = spec.cluster.inter_node_gb_s * 1e9 * self.tp["prefill"]
        self.B = spec.workload.trajectories_per_batch
        # Granularity: a cohort is `cohort` members of one GRPO group simulated as identical
        # sequences (one request of that width). 1 = every trajectory on its own.
        if cohort < 1 or spec.workload.group_size % cohort:
            raise ConfigError(spec.source, "cohort", cohort, f"a divisor of group_size ({spec.workload.group_size})")
        self.cohort = cohort
        self.staleness = spec.training.staleness
        self.nodes = make_nodes(spec)
        self.gpu_at = {gpu_name(n.name, i): (n.nid, i) for n in self.nodes for i in range(n.size)}
        self.inputs = planning_inputs(models, len(self.gpu_at))
        self.avail_times: list[float] = []
        self.avail_gpus: list[int] = []
        # scripted availability (runtime/scenarios.py): (virtual seconds, elastic GPUs, after batch or None)
        self.elastic_events = tuple(elastic_events)
        self.avail_types: list[str | None] = []  # per availability change: the elastic GPU type it concerns (None: all)
        if isinstance(availability, dict):  # one trace per elastic GPU type, merged in time order
            merged = sorted((float(t), typ, int(g)) for typ, tr in availability.items() for t, g in zip(tr.times_s, tr.gpus))
            self.avail_times = [t for t, _, _ in merged]
            self.avail_types = [typ for _, typ, _ in merged]
            self.avail_gpus = [g for _, _, g in merged]
        elif availability is not None:
            self.avail_times = [float(x) for x in availability.times_s]  # type: ignore[attr-defined]
            self.avail_gpus = [int(x) for x in availability.gpus]  # type: ignore[attr-defined]
            self.avail_types = [None] * len(self.avail_gpus)
        # dynamic state
        self.now = 0.0
        self.heap: list = []
        self.seq = 0
        self.instances: dict = {}
        self.ready: dict[str, list[int]] = {r: [] for r in ROLES}
        self.next_iid = 0
        self.trajs: dict = {}
        self.pending: list[int] = []
        self.paused_until = 0.0
        self.batches: list = []
        self.version = 0
        self.next_step = 0
        self.phase = "waiting"  # runtime.naming.TRAINER_PHASES
        self.mode = "colocated"
        self.shares: dict[tuple[str, str, int], float] = {}  # the decision's batch share per (role, GPU type, TP) kind (empty: equal)
        self.executor = Executor()
        self.acting: dict = {}  # (plan, action) -> (action, instance) for actions in progress
        self.ledger = LoanLedger()
        self.timeline = TrainerTimeline()
        self.predicted_s = getattr(policy, "predicted_s", math.nan)  # the policy's view until it decides
        self.due_token = 0
        # metrics
        self.r = SimResult(policy=policy.name, hours=hours, seed=self.seed)
        self.busy_retired = {r: 0.0 for r in ROLES}
        self.last_busy = {r: 0.0 for r in ROLES}

    # ================================================================== heap
    def _push(self, t: float, kind: int, a: int = 0, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def _touch(self, inst) -> None:
        inst.version += 1
        t = inst.engine.next_event() if inst.engine is not None else math.inf
        if t < math.inf:
            self._push(t, E_ENGINE, inst.iid, inst.version)

    # ================================================================== run
    def run(self) -> SimResult:
        # the pool as the trace has it when the run starts, before the first decision (each elastic
        # type's first entry where one trace drives each type)
        first = {typ: self.avail_types.index(typ) for typ in dict.fromkeys(self.avail_types)}
        for typ, i in first.items():
            self._set_elastic(self.avail_gpus[i], typ)
        for i, t in enumerate(self.avail_times):
            if i not in first.values() and t <= self.horizon:
                self._push(max(t, 0.0), E_TRACE, i)
        for at, gpus, after in self.elastic_events:
            if after is None and at <= 0:  # the pool as the run starts, before the first decision
                self._set_elastic(gpus)
            elif after is None:
                self._availability_at(at, gpus)
        self._push(self.sample_s, E_SAMPLE)
        self._consult("initial")
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
            elif kind == E_ACTION:
                self._action_done(a, b // 2, ok=True, warm=bool(b % 2))
            elif kind == E_TRACE:
                self._set_elastic(self.avail_gpus[a], self.avail_types[a])
                self._consult("availability")
            elif kind == E_TRAIN_DONE:
                self._train_done()
            elif kind == E_SYNC_DONE:
                self._sync_done()
            elif kind == E_DUE:
                if a == self.due_token and self.phase == "waiting" and self.ledger.out:
                    self._consult("return_due")
            elif kind == E_FORCED_BACK:
                if self.ledger.returned(self.ledger.lent, self.now) and self.phase == "returning":
                    self._start_training()
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

    def _availability_at(self, t: float, gpus: int) -> None:
        """A scripted availability change at time t (an E_TRACE event like a trace's: the policy decides)."""
        self.avail_gpus.append(gpus)
        self.avail_types.append(None)
        self._push(max(t, self.now), E_TRACE, len(self.avail_gpus) - 1)

    def _batch_launched(self, j: int) -> None:
        for at, gpus, after in self.elastic_events:
            if after == j:
                self._availability_at(self.now + at, gpus)

    # ================================================================== policy
    def _consult(self, event: str) -> None:
        state = self.cluster_state()
        t0 = time.perf_counter()
        step: PolicyStep = self.policy.decide(state, self.inputs, self.now, event)
        self.r.policy_wall_s += time.perf_counter() - t0
        self.r.decisions += 1
        if "error" in step.info:
            self.r.policy_failures += 1
            self.r.failure = self.r.failure or str(step.info["error"])
        if math.isfinite(step.predicted_s):
            self.predicted_s = step.predicted_s
        if step.shares or "error" not in step.info:  # a failed decision keeps the layout, and its split
            self.shares = {(r, ty, t): w for r, ty, t, w in step.shares}
        if not step.plan.empty:  # a held decision's plan carries its mandatory part (recalls, returns)
            if step.mode != self.mode and event != "initial":
                self.r.mode_switches += 1  # the initial layout is a choice, not a switch
            self.mode = step.mode
            _, progress = self.executor.submit(step.plan)
            self._execute(progress, warm=self.warm and event == "initial")
        self.r.decision_log.append((round(self.now, 2), event, step.mode, {**step.info, "kinds": [a.kind for a in step.plan.actions]}))
        self._arm_return_due()

    def _arm_return_due(self) -> None:
        """While GPUs are lent, decide again when the borrow window closes (the recall must start)."""
        at = return_due_at(self.trainer_view(), self.inputs, self.now, bool(self.ledger.out))
        if at is not None:
            self.due_token += 1
            self._push(at, E_DUE, self.due_token)

    # ================================================================== trainer
    def _maybe_train(self) -> None:
        if self.phase != "waiting" or self.next_step >= len(self.batches):
            return
        b = self.batches[self.next_step]
        if b.done_at is None:
            return
        self.phase = "returning"
        home = self.ledger.trainer_needs(self.now)
        self._consult("training_begin")  # the planner recalls what is lent; the step waits for it
        if home:
            self._start_training()
            return
        returning = {g for a in self.executor.pending_kinds("return") for g in a.gpus}
        stray = [g for g in self.ledger.lent if g not in returning]
        if stray and self.phase == "returning":  # nothing brings them back: take them (counted late already)
            for g in stray:
                inst = self._instance_on(g)
                if inst is not None:
                    self._resume(self._remove(inst))
            self.r.forced_returns += len(stray)
            self._push(self.now + self.costs.return_s, E_FORCED_BACK)

    def _start_training(self) -> None:
        b = self.batches[self.next_step]
        self.phase = "training"
        self.r.train_wait_s.append(round(self.now - b.done_at, 3))  # type: ignore[operator]
        dt = 0.0 if self.rollout_only else train_step_s(self.spec, b.tokens)
        self.r.train_busy_s += dt
        self.r.train_times_s.append(round(dt, 3))
        self._push(self.now + dt, E_TRAIN_DONE)

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
        for inst in self.instances.values():
            inst.weights = self.version  # the sync reached every engine
        self.phase = "waiting"
        self._consult("training_end")
        self._launch_admissible()
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
            by["training:training"] = self.spec.cluster.gpus_in_pool("training")
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
        self.r.late_returns = self.ledger.late_returns
        self.r.train_delay_s = self.ledger.train_delay_s
        self.r.events = n_events
        self.r.sim_s = self.horizon
