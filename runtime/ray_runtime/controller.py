"""Controller: the online loop of `pearl train` (solver in the loop) over Ray actors.

It turns the run's state into a planner `ClusterState` whenever an event happens (a rollout
batch boundary, training begins or ends, elastic GPUs come or go, a worker dies, the borrow
window closes), asks the policy for a decision on a worker thread (routing goes on while it
solves), hands the plan to the shared executor and logs the decision with its proof.

Its parts, each with one job: the slot table (`slot_table.py`, pure), plan actuation
(`plan_runner.py`), the rollout driver (`rollout_driver.py`), the trainer loop and weight
sync (`trainer_loop.py`), Ray bring-up (`bootstrap.py`), and scripted scenarios for tests
and experiments (`scenarios.py`). What it shares with the simulator is written once:
`runtime/executor.py`, `router.py`, `timeline.py`, `loans.py`, `naming.py`.

Rollout is asynchronous: batch b may start while the trainer trains batch b-1, as long as
the newest weights are at most `training.staleness` versions behind.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from typing import Any, Callable

import numpy as np

from models.config import ExperimentSpec
from planner.state import TrainerPhase, state_from_cluster_spec
from runtime.calibration.trajectory_log import TrajectoryLogWriter, log_path_for
from runtime.executor import Executor
from runtime.gc_pause import gc_deferred
from runtime.loans import LoanLedger
from runtime.ray_runtime.bootstrap import REPO_ROOT, Bootstrap, resolve_model_path
from runtime.ray_runtime.node_watch import NodeWatch
from runtime.ray_runtime.plan_runner import PlanRunner
from runtime.ray_runtime.records import RunFailed, RunSummary, RuntimeStartError, TrajectoryFailed  # noqa: F401 (public)
from runtime.ray_runtime.resources import elastic_schedule, make_slots, resolve_device
from runtime.ray_runtime.rollout_driver import RolloutDriver
from runtime.ray_runtime.scenarios import apply_load_change, elastic_loop
from runtime.ray_runtime.slot_table import SlotRuntime, SlotTable
from runtime.ray_runtime.telemetry import MetricsWriter, StepTelemetry, TypeTimes
from runtime.ray_runtime.trainer_loop import TrainerLoop
from runtime.sim.metrics import layout_label
from runtime.timeline import TrainerTimeline, return_due_at


class Controller(Bootstrap, PlanRunner, RolloutDriver, TrainerLoop, NodeWatch):
    def __init__(self, spec: ExperimentSpec, backend: str | None = None, address: str | None = None, metrics_path: str | None = None, on_step: Callable[[dict[str, Any]], None] | None = None, log: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self.rt = spec.runtime
        self.backend = backend or self.rt.backend
        self.address = address
        self.on_step = on_step
        self.log = log or (lambda _m: None)
        self.scale = self.rt.time_scale
        self.model_path = resolve_model_path(spec) if self.backend == "vllm" else None
        self.trainer_backend = self.rt.trainer_backend or ("torch" if self.backend == "vllm" else "emulated")
        if self.trainer_backend in ("torch", "fsdp") and self.model_path is None:
            self.model_path = resolve_model_path(spec)
        self.device = resolve_device(self.rt.device) if self.backend == "vllm" else "cpu"
        base = state_from_cluster_spec(spec.cluster, TrainerPhase("waiting", 0.0))
        self.table = SlotTable(base, make_slots(base, self.rt.bindings, device=self.device))
        self.metrics = MetricsWriter(metrics_path or (REPO_ROOT / self.rt.metrics_path))
        self.trajectory_log = TrajectoryLogWriter(log_path_for(self.metrics.path))  # per-trajectory turns, for `pearl calibrate --logs`
        self.kv_store = f"/tmp/pearl-kv-{uuid.uuid4().hex[:8]}"
        self.executor = Executor()
        self.ledger = LoanLedger()
        self.timeline = TrainerTimeline()
        self.rng = random.Random(spec.seed)  # router draws
        self.version = 0
        self.blob_ref: Any = None
        self.initial_blob_ref: Any = None  # step 0 weights: what runtime.control frozen_engines keeps pushing
        self.t0 = time.monotonic()
        self.mode, self.ratio, self.wanted_mode = "colocated", "", "colocated"
        self.shares: dict[tuple[str, str, int], float] = {}  # the decision's batch share per (role, GPU type, TP) kind (empty: equal)
        self.kinds = ""  # serving workers per GPU type, role and TP degree, e.g. 'H20 3C@TP4; H800 1C@TP4'
        self.trainer_phase = "waiting"  # runtime.naming.TRAINER_PHASES
        self.ready_batches = 0  # rolled out, not yet taken by the trainer
        self.unfinished = 1.0
        self.batch_size = spec.workload.trajectories_per_batch
        self.response_tokens = int(round(spec.workload.response_tokens_per_turn.expected()))
        self.decisions: list[dict[str, Any]] = []
        self.transitions = 0
        self.modes_used: list[str] = []
        self.lost = self.resumed_turns = self.kv_handoffs = self.forced_returns = 0
        self.failed_trajectories: list[dict[str, str]] = []
        self.weights_verified = self.weights_mismatched = 0
        self.fatal: str | None = None  # why the run must stop (set once; run() raises RunFailed)
        self.rewards: list[float] = []
        self.predicted_s = float("nan")
        self.timeline_s = float("nan")  # what the trainer's timeline assumes (Decision.timeline_s)
        self.predicted_from = 0  # measured steps the models behind predicted_s were refitted on
        self.steps_seen: list[StepTelemetry] = []
        self.steps_detail: list[dict[str, Any]] = []  # per training step: reward, loss, ratio, rollout (trainer_loop.step_detail)
        self.hosts: list[Any] = []
        self.emulated: Any = None  # EmulatedSettings of the emulated backend's hosts
        self._init_nodes()
        self.tracker: Any = None
        self.inputs: Any = None
        self.type_times = TypeTimes({}, self.table.kind_of, self.scale)  # per GPU type: a batch's engine seconds, measured vs predicted
        self.policy: Any = None
        self._bg: set[asyncio.Task] = set()
        self._plans: set[asyncio.Future] = set()
        self._plan_state: dict[int, tuple] = {}
        self._engine_group: dict[str, tuple[str, ...]] = {}  # per lead GPU: the GPUs its started engine (and vLLM process) holds
        self._repairing = self._repair_again = False
        self._due: asyncio.Task | None = None
        self.batch_started: dict[int, float] = {}
        self.starved_batches: set[int] = set()  # batches whose requests waited for a worker of their role
        self.current_batch = -1
        self.trajectories: list = []
        self.trajectories_in_flight: list = []
        self._make_sync_primitives()

    def _make_sync_primitives(self) -> None:
        """asyncio primitives bind to the loop that runs the controller: made again in setup()."""
        self.lock = asyncio.Lock()  # one decision at a time
        self.capacity = asyncio.Event()  # an engine joined: waiting requests look again
        self.gpus_home = asyncio.Event()  # the last lent GPU is back
        self.fatal_event = asyncio.Event()
        self.quarantine = asyncio.Semaphore(1)  # suspect requests (in flight on an engine death) retry one at a time
        self.weights_lock = asyncio.Lock()  # a push and an engine start's weight load never interleave
        self.slot_locks = {s.gpu: asyncio.Lock() for s in self.table.slots}

    @property
    def rec(self) -> dict[str, SlotRuntime]:
        return self.table.rec

    def now(self) -> float:
        """Planner time: wall seconds since start x time scale (virtual seconds when emulated)."""
        return (time.monotonic() - self.t0) * self.scale

    # ------------------------------------------------------------------ decisions
    def cluster_state(self) -> Any:
        """The planner's view: slots, loans, the trainer's timeline, and what running plans will do."""
        return self.executor.committed(self.table.state(self.trainer_view(), self.version, self.unfinished, set(self.ledger.out)))

    def trainer_view(self) -> TrainerPhase:
        """The trainer as the planner sees it: waiting or not, and when it needs its GPUs."""
        waiting = self.trainer_phase == "waiting" and not self.ready_batches  # a finished batch: needed now
        started = self.batch_started.get(self.current_batch)
        elapsed = (time.monotonic() - started) * self.scale if started is not None else 0.0
        return TrainerPhase("waiting" if waiting else "training", self.timeline.needs_gpus_at(self.now(), waiting, elapsed, self.timeline_s))

    async def decide(self, event: str, wait: bool = False, raise_errors: bool | None = None) -> None:
        """Ask the policy (off the event loop), log the decision, hand its plan to the executor
        (awaited only if `wait`; a failed plan then raises unless `raise_errors` is False)."""
        task = None
        async with self.lock:
            now = self.now()
            try:
                state, elastic = self.cluster_state(), self.table.elastic_now()  # as the policy sees them (the solve runs off the loop)
                step = await asyncio.to_thread(_decide, self.policy, state, self.inputs, now, event)
            except Exception as exc:  # no feasible plan (e.g. nothing available): keep what runs, say why
                self.metrics.write("decision_failed", event=event, at_s=round(now, 3), error=f"{type(exc).__name__}: {exc}")
                self.log(f"decision[{event}] failed: {exc}; keeping the current configuration")
                return
            d = step.decision
            extras = {k: (round(float(v), 4) if isinstance(v, (int, float)) and not isinstance(v, bool) else v) for k, v in d.extras.items() if k != "event"}
            seen = {"workers": [f"{w.id}:{w.role}{'(draining)' if w.draining else ''}" for w in state.workers], "elastic_available": elastic, "unavailable": sorted(g.id for g in state.gpus if not g.available), "trainer": state.trainer.phase, "unfinished": round(state.unfinished_fraction, 3)}
            plan = step.plan
            rec = {"event": event, "at_s": round(now, 3), **d.to_json(), "extras": extras, "state": seen,
                   "plan": {"actions": len(plan.actions), "joins": plan.joins, "leaves": plan.leaves, "role_changes": plan.role_changes, "lent": plan.lent, "returned": plan.returned,
                            "kinds": [a.kind for a in plan.actions]}}
            self.decisions.append(rec)
            self.metrics.write("decision", **rec)
            self.log(f"decision[{event}] {d.ratio} applied={d.applied} pred={d.predicted_completion_s:.2f}s solve={d.proof.solve_ms:.1f}ms gap={d.proof.gap:.3g} actions={len(plan.actions)}")
            if np.isfinite(d.predicted_completion_s):
                self.predicted_s = d.predicted_completion_s
                self.timeline_s = d.timeline_s
                self.predicted_from = len(self.tracker.history)
            self.wanted_mode = d.mode
            self.shares = {(r, ty, t): w for r, ty, t, w in d.shares}
            if not plan.empty:  # a held (gated) decision still carries its mandatory part: recalls, returns, forced shrinks
                task = self._submit(plan, raise_errors=wait if raise_errors is None else raise_errors)
            self._update_mode()
            self._arm_return_due()
        if task is not None and wait:
            await task

    def _arm_return_due(self) -> None:
        """While GPUs are lent, decide again when the borrow window closes (the recall must start)."""
        if self._due is not None:
            self._due.cancel()
            self._due = None
        now = self.now()
        at = return_due_at(self.trainer_view(), self.inputs, now, bool(self.ledger.out))
        if at is None:
            return
        delay = (at - now) / self.scale

        async def due() -> None:
            await asyncio.sleep(delay)
            self._due = None
            if self.trainer_phase == "waiting" and self.ledger.out:
                await self.decide("return_due")

        self._due = asyncio.ensure_future(due())

    def _update_mode(self) -> None:
        self.mode = self.table.mode(self.wanted_mode)
        self.ratio = self.table.ratio(self.mode)
        self.kinds = "; ".join(f"{typ} {label}" for typ, label in layout_label(self.table.layout_by_type()).items())
        if any(r.status == "active" for r in self.rec.values()) and self.mode not in self.modes_used:
            self.modes_used.append(self.mode)

    # ------------------------------------------------------------------ the run
    async def run(self, steps: int) -> RunSummary:
        await self.setup()
        self.t0 = time.monotonic()
        table = self.table
        schedule = elastic_schedule(self.spec, table.elastic_total) if table.elastic_total else ()
        for ch in schedule:  # what exists at the start (one change, or one per GPU type)
            if ch.at_s == 0 and ch.after_step is None:
                table.set_elastic(ch.available, ch.gpu_type)
        await self.decide("initial", wait=True)
        if not any(r.status == "active" for r in self.rec.values()):
            raise RuntimeStartError(f"no rollout worker could start: {getattr(self, 'start_error', 'the initial plan started none')}")
        staleness = self.spec.training.staleness
        queue: asyncio.Queue = asyncio.Queue()
        version_event = asyncio.Event()
        elastic = asyncio.ensure_future(elastic_loop(self, schedule)) if schedule else None
        nodes = asyncio.ensure_future(self.watch_nodes()) if self.address else None

        async def rollout_loop() -> None:
            for b in range(steps):
                while self.version < b - staleness:
                    version_event.clear()
                    await version_event.wait()
                policy_before = self.policy
                if apply_load_change(self, b):
                    self._refresh_inputs()
                self.unfinished = 1.0  # a new batch: all of it is still to run (R/B = 1 for the borrow gate)
                if b > 0:
                    # a scripted policy change takes effect before its batch starts (the batch
                    # runs on the layout it asked for, however long the engines take to switch)
                    await self.decide("rollout_step", wait=self.policy is not policy_before, raise_errors=False)
                trajs, seconds = await self._rollout_batch(b)
                self.timeline.batch_done(seconds * self.scale)
                tel = self._telemetry(b, trajs, seconds)
                self.steps_seen.append(tel)
                if self.rt.refit:  # else the configured models plan throughout (as in the simulator)
                    self.tracker.observe(tel)
                    self._refresh_inputs()
                self.metrics.write("rollout_step", **tel.__dict__, error=tel.error, speed=round(self.tracker.speed, 4), type_speeds={k: round(v, 4) for k, v in self.tracker.type_speeds.items()}, gen_tok_per_s=tel.generated_tokens / max(seconds, 1e-9), resumed_turns=self.resumed_turns, kv_handoffs=self.kv_handoffs)
                self.ready_batches += 1
                await queue.put((b, trajs, tel))

        try:
            await self._until_fatal(asyncio.gather(rollout_loop(), self._train_loop(steps, queue, version_event)))
            if self._due is not None:
                self._due.cancel()
            if elastic is not None and self.lock.locked():
                await asyncio.wait([elastic], timeout=300)  # an expansion in flight: let it admit or cancel
            for _ in range(20):  # a finished plan may schedule a repair: wait until nothing is pending
                pending = list(self._bg) + list(self._plans)
                if not pending:
                    break
                await asyncio.wait(pending, timeout=300)
        finally:
            if elastic is not None:
                elastic.cancel()
            if nodes is not None:
                nodes.cancel()
        return await self._summary(steps)

    async def _summary(self, steps: int) -> RunSummary:
        versions = await self.worker_versions()
        solve = [d["proof"]["solve_ms"] for d in self.decisions]
        failures = {r.worker_id: r.failures for r in self.rec.values() if r.failures}
        summary = RunSummary(steps, self.version, float(np.mean(self.rewards)) if self.rewards else 0.0, self.transitions, self.modes_used, self.lost, self.ledger.late_returns, len(self.decisions),
                             float(np.percentile(solve, 95)) if solve else 0.0, self.resumed_turns, versions, self.kv_handoffs, self.rewards,
                             list(self.failed_trajectories), failures, self.weights_verified, self.weights_mismatched, self.ledger.train_delay_s, self.forced_returns,
                             [{**t.prediction(), "layout": t.ratio, "profile": self.spec.profile_of_layout(t.ratio)} for t in self.steps_seen], self.spec.profile_name, list(self.steps_detail), self.rt.control,
                             self.node_report(), list(self.node_events), self.placement_mismatches, {k: v[:12] for k, v in self.services.items()},
                             self.spec.pd_profile_name, self.tracker.speed, dict(self.tracker.type_speeds))
        self.metrics.write("summary", **summary.to_json(), resumed_turns=self.resumed_turns, worker_versions=versions)
        return summary

    def _refresh_inputs(self) -> None:
        from planner.inputs import planning_inputs

        models = self.tracker.models()
        self.inputs = planning_inputs(models, max_gpus=len(self.table.slots))
        self.type_times.engines = models.engines()

    async def _until_fatal(self, work: Any) -> None:
        """Await `work` unless the run fails first (a slot past its restart bound): then cancel
        it and raise RunFailed with the cause, never wait on engines that will not come."""
        work = asyncio.ensure_future(work)
        fatal = asyncio.ensure_future(self.fatal_event.wait())
        try:
            await asyncio.wait({work, fatal}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            fatal.cancel()
        if self.fatal is not None:
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            raise RunFailed(self.fatal)
        await work

    def progress(self) -> dict[str, Any]:
        """What the run is waiting for right now: printed when a deadline passes."""
        active = [t for t in self.trajectories_in_flight if t.state not in ("done", "failed")]
        return {
            "batch": self.current_batch, "weight_version": self.version, "trainer": self.trainer_phase, "mode": self.mode,
            "trajectories_waiting": dict(Counter(t.state for t in active)),
            "oldest_waiting": [{"id": t.id, "turn": t.turns, "state": t.state, "resumes": t.resumes} for t in active[:5]],
            "slots": {r.worker_id: {"status": r.status, "role": r.role, "load": r.load, "failures": r.failures} for r in self.rec.values()},
            "lent": list(self.ledger.lent), "plans_pending": len(self._plans), "repairing": self._repairing, "deciding": self.lock.locked(), "fatal": self.fatal,
        }


def _decide(policy: Any, state: Any, inputs: Any, now: float, event: str) -> Any:
    """One decision on a worker thread (the event loop keeps routing), GC deferred around it."""
    with gc_deferred():
        return policy.decide(state, inputs, now, event)


__all__ = ["Controller", "RunFailed", "RunSummary", "RuntimeStartError", "TrajectoryFailed"]
