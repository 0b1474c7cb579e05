"""Controller: the online loop of `pearl train` (solver in the loop) over Ray actors.

It owns the cluster's state (stable GPU slots, their workers, roles, weight versions, the
trainer's phase, elastic availability), turns it into a planner `ClusterState` whenever an
event happens (a rollout batch boundary, training begins or finishes, elastic GPUs come or
go, a worker dies), asks the policy for a decision, applies the `TransitionPlan` to the
actors and logs the decision with its solve time and gap.

Execution mechanisms (the paper's):
  - stable slots, fixed bindings: a worker is `w:<gpu id>`; only its role and membership
    change; a dead worker is restarted on the same slot;
  - expansion: new engines start in the background, load the newest weights, and are
    admitted together only if all of them started (all or nothing);
  - shrink / drain: dispatch stops, in-flight requests are aborted with their generated
    prefix kept, and each trajectory continues its turn on another worker with its
    environment state untouched;
  - borrowed training GPUs keep their rollout process alive between loans and are handed
    back before the training step (a late hand-back is counted).
Rollout is asynchronous: batch b may start while the trainer trains batch b-1, as long as
the newest weights are at most `training.staleness` versions behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from models.config import ConfigError, ExperimentSpec
from models.step_latency import load_profile
from models.config import profile_path
from runtime.ray_runtime.engines import EngineSettings, GenRequest, GenResult
from runtime.ray_runtime.resources import AvailabilityChange, Slot, elastic_schedule, make_slots, ray_resources, resolve_device, slot_env
from runtime.ray_runtime.telemetry import MetricsWriter, RuntimeTracker, StepTelemetry
from runtime.ray_runtime.trainer import TrainSample

REPO_ROOT = Path(__file__).resolve().parents[2]


class RuntimeStartError(RuntimeError):
    """Something the run needs could not start (an engine, the model, Ray): one clear line."""


class RunFailed(RuntimeError):
    """The run stopped early for a stated cause (a slot past its restart bound): one clear line."""


class TrajectoryFailed(RuntimeError):
    """A trajectory given up with a recorded reason (its request killed engines repeatedly)."""


@dataclass(frozen=True)
class EngineDied:
    """A request's engine died under it (not stopped by us): the error it died with."""

    worker: str
    error: str


WEIGHTS_MATCH_TOL = 1e-3  # max |log p| difference between an engine and the trainer at equal weights (fp32)
POISON_KILLS = 2  # a request in flight on this many engine deaths of one role never goes to that role again


@dataclass
class SlotRuntime:
    """Mutable runtime record of one stable GPU slot."""

    slot: Slot
    actor: Any = None
    slot_no: int = 0
    role: str | None = None
    status: str = "down"  # down | starting | active | draining
    load: int = 0
    version: int = 0
    borrowed: bool = False
    served: int = 0
    gpus: tuple[str, ...] = ()  # the worker's TP group when this slot leads one
    target_role: str | None = None  # a committed role switch not yet executed
    pending_stop: bool = False  # a committed stop not yet executed
    parked: bool = False  # a returned training slot: process and engine alive, serving nothing
    failures: int = 0  # unplanned deaths of this slot's worker (bounded: runtime.max_restarts_per_slot)
    last_error: str = ""

    @property
    def worker_id(self) -> str:
        return f"w:{self.slot.gpu}"


@dataclass
class Trajectory:
    id: str
    batch: int
    group: int
    task_seed: int
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    min_version: int = 1 << 30
    max_version: int = -1  # > min_version: weights changed under it (in-flight update)
    turns: int = 0
    prompt_len: int = 0
    new_tokens: list[int] = field(default_factory=list)
    env_s: float = 0.0
    reward: float | None = None
    resumes: int = 0
    last: dict[str, str] = field(default_factory=dict)  # role -> gpu of the previous turn (prefix reuse)
    state: str = "queued"  # queued | generating | env | done | failed (what it waits on, for diagnostics)


@dataclass(frozen=True)
class RunSummary:
    steps: int
    weight_version: int
    mean_reward: float
    transitions_applied: int
    modes_used: list[str]
    lost_trajectories: int
    late_returns: int
    decisions: int
    solve_ms_p95: float
    resumed_turns: int
    worker_versions: dict[str, int]
    kv_handoffs: int
    rewards: list[float]
    failed_trajectories: list[dict[str, str]] = field(default_factory=list)
    worker_failures: dict[str, int] = field(default_factory=dict)
    weights_verified: int = 0  # (push, engine) pairs whose probe log-probs matched the trainer's
    weights_mismatched: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps, "weight_version": self.weight_version, "mean_reward": round(self.mean_reward, 6),
            "transitions_applied": self.transitions_applied, "modes_used": self.modes_used,
            "lost_trajectories": self.lost_trajectories, "failed_trajectories": self.failed_trajectories,
            "worker_failures": self.worker_failures, "late_returns": self.late_returns,
            "decisions": self.decisions, "solve_ms_p95": round(self.solve_ms_p95, 3), "kv_handoffs": self.kv_handoffs,
            "weights_verified": self.weights_verified, "weights_mismatched": self.weights_mismatched,
        }


def _error_text(exc: BaseException) -> str:
    """One line for an engine's error: the exception raised inside the actor, not Ray's wrapper."""
    cause = getattr(exc, "cause", None) or exc
    return f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"[:400]


def _actor_errors() -> tuple[type[BaseException], ...]:
    import ray.exceptions as rex

    return (rex.RayActorError, rex.ActorUnavailableError)


def resolve_model_path(spec: ExperimentSpec) -> str:
    p = Path(spec.runtime.model_path)
    if not p.is_absolute():
        p = REPO_ROOT / p
    if not (p / "config.json").exists():
        raise ConfigError(spec.source, "runtime.model_path", spec.runtime.model_path, "a model directory with config.json (build the tiny one: make model)")
    return str(p)


class Controller:
    def __init__(self, spec: ExperimentSpec, backend: str | None = None, address: str | None = None, metrics_path: str | None = None, on_step: Callable[[dict[str, Any]], None] | None = None, log: Callable[[str], None] | None = None) -> None:
        from planner.state import TrainerPhase, state_from_cluster_spec

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
        self.base_state = state_from_cluster_spec(spec.cluster, TrainerPhase("waiting", 0.0))
        self.device = resolve_device(self.rt.device) if self.backend == "vllm" else "cpu"
        self.slots = make_slots(self.base_state, self.rt.bindings, device=self.device)
        self.rec: dict[str, SlotRuntime] = {s.gpu: SlotRuntime(s, slot_no=s.index) for s in self.slots}
        self.elastic_total = sum(1 for s in self.slots if s.pool == "elastic")
        self.elastic_available = self.elastic_total
        self.metrics = MetricsWriter(metrics_path or (REPO_ROOT / self.rt.metrics_path))
        self.kv_store = f"/tmp/pearl-kv-{uuid.uuid4().hex[:8]}"
        self.version = 0
        self.blob_ref: Any = None
        self.lock = asyncio.Lock()
        self.capacity = asyncio.Event()
        self.t0 = time.monotonic()
        self.mode = "colocated"
        self.ratio = ""
        self.trainer_phase = "waiting"
        self.unfinished = 1.0
        self.batch_size = spec.workload.trajectories_per_batch
        self.response_tokens = int(round(spec.workload.response_tokens_per_turn.expected()))
        self.decisions: list[dict[str, Any]] = []
        self.transitions = 0
        self.modes_used: list[str] = []
        self.lost = 0
        self.late_returns = 0
        self.resumed_turns = 0
        self.kv_handoffs = 0
        self.failed_trajectories: list[dict[str, str]] = []
        self.weights_verified = 0
        self.weights_mismatched = 0
        self.fatal: str | None = None  # why the run must stop (set once; run() raises RunFailed)
        self.fatal_event = asyncio.Event()
        self.quarantine = asyncio.Semaphore(1)  # suspect requests (in flight on an engine death) retry one at a time
        self.weights_lock = asyncio.Lock()  # a push and an engine start's weight load never interleave
        self.rewards: list[float] = []
        self.dead: set[str] = set()
        self.predicted_s = float("nan")
        self.hosts: list[Any] = []
        self.tracker: RuntimeTracker | None = None
        self.inputs: Any = None
        self.policy: Any = None
        self._bg: set[asyncio.Task] = set()
        self._plans: set[asyncio.Future] = set()
        self._repairing = False
        self._repair_again = False
        self.wanted_mode = "colocated"
        self.slot_locks: dict[str, asyncio.Lock] = {}
        self.batch_started: dict[int, float] = {}
        self.current_batch = -1
        self.trajectories: list[Trajectory] = []
        self.trajectories_in_flight: list[Trajectory] = []

    # ------------------------------------------------------------------ clock
    def now(self) -> float:
        """Planner time: wall seconds since start x time scale (virtual seconds when emulated)."""
        return (time.monotonic() - self.t0) * self.scale

    # ------------------------------------------------------------------ setup
    def _ray_init(self) -> None:
        import ray

        env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "TOKENIZERS_PARALLELISM": "false", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO_ROOT)}
        if ray.is_initialized():
            return
        try:
            if self.address:
                ray.init(address=self.address, runtime_env={"env_vars": env}, log_to_driver=False)
            else:
                ray.init(address="local", num_cpus=os.cpu_count() or 1, resources=ray_resources(self.slots), include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env}, object_store_memory=256 * 2**20)
        except Exception as exc:  # connection refused, bad address, ...
            raise RuntimeStartError(f"Ray failed to start or connect (address {self.address!r}): {exc}") from None

    def _remote(self, cls: type, **opts: Any) -> Any:
        import ray

        return ray.remote(cls).options(num_cpus=0, **opts)

    async def setup(self) -> None:
        from planner.inputs import planning_inputs
        from planner.policies import get_policy
        from runtime.ray_runtime.env_worker import EnvWorker
        from runtime.ray_runtime.fsdp_trainer import FSDPTrainer
        from runtime.ray_runtime.rollout_worker import EmulatedSettings, RolloutWorker
        from runtime.ray_runtime.trainer import Trainer

        self._ray_init()
        self.lock = asyncio.Lock()
        self.capacity = asyncio.Event()
        self.fatal_event = asyncio.Event()
        self.quarantine = asyncio.Semaphore(1)
        self.weights_lock = asyncio.Lock()
        self.slot_locks = {s.gpu: asyncio.Lock() for s in self.slots}
        spec = self.spec
        w = spec.workload
        self.tracker = RuntimeTracker(spec, load_profile(profile_path(spec)), env_scale=1.0)
        self.policy = get_policy(spec.policy.name)
        self.inputs = planning_inputs(self.tracker.models(), max_gpus=len(self.slots))
        if self.trainer_backend == "fsdp":  # same interface; the actor spawns its rank processes
            self.trainer = self._remote(FSDPTrainer).remote(self.model_path, self.rt.lr, self.rt.clip_eps, spec.training.staleness, spec.seed, 1, world_size=self.rt.trainer_world_size)
        else:
            self.trainer = self._remote(Trainer).remote(
                self.model_path if self.trainer_backend == "torch" else None, self.rt.lr, self.rt.clip_eps, spec.training.staleness, spec.seed, 1, self.trainer_backend, self._emulated_train_s(), self.scale
            )
        tok = self.model_path if self.backend == "vllm" else None
        self.env = self._remote(EnvWorker, max_concurrency=100000).remote(tok, w.turns, w.env_latency_s, w.initial_prompt_tokens, w.new_tokens_per_turn, self.scale, spec.seed)
        if self.backend == "emulated":
            models = self.tracker.models()
            costs = models.costs
            em = EmulatedSettings(models.predictor.colocated_engine, self.scale, spec.model.vocab, costs.role_switch_s, costs.engine_start_s, spec.workload.prefix_cache_hit)
            self.hosts = [self._remote(RolloutWorker, max_concurrency=100000).remote("emulated", None, em, self._faults()) for _ in range(self.rt.hosts)]
            for r in self.rec.values():
                r.actor = self.hosts[r.slot.index % len(self.hosts)]
        self.blob_ref = self.trainer.weights.remote()
        self.metrics.write("setup", backend=self.backend, trainer=self.trainer_backend, slots=[s.__dict__ for s in self.slots], kv_store=self.kv_store)

    def _emulated_train_s(self) -> float:
        from models.training import training_step_s

        spec = self.spec
        n_train = spec.cluster.gpus_in_pool("training")
        if n_train == 0:
            return 1.0
        gpu = next(g.gpu for g in spec.cluster.nodes if g.pool == "training")
        b = spec.workload.trajectories_per_batch
        tokens = b * (spec.workload.initial_prompt_tokens.expected() + spec.workload.turns.expected() * (spec.workload.new_tokens_per_turn.expected() + spec.workload.response_tokens_per_turn.expected()))
        return float(training_step_s(spec.model, spec.gpu(gpu), n_train, tokens, spec.training.mfu, spec.training.optimizer_overhead_s))

    def _faults(self) -> tuple[tuple[str, str], ...]:
        return tuple((f.request, f.role) for f in self.rt.faults)

    def _engine_settings(self) -> EngineSettings:
        rt = self.rt
        assert self.model_path is not None
        return EngineSettings(self.model_path, rt.dtype, rt.max_model_len, rt.block_size, kv_connector=rt.kv_connector, kv_store=self.kv_store, kv_buffer_device=rt.kv_buffer_device, seed=self.spec.seed)

    # ------------------------------------------------------------------ planner state
    def cluster_state(self) -> Any:
        from planner.state import GPU, ClusterState, TrainerPhase, Worker

        gone = self._gone_elastic()
        gpus, workers = [], []
        for g in self.base_state.gpus:
            r = self.rec[g.id]
            gpus.append(replace(g, available=g.id not in gone, borrowed=r.borrowed and g.pool == "training"))
            if r.status in ("active", "draining", "starting", "switching") and r.role is not None and r.gpus and not set(r.gpus) & gone and g.id not in self.dead:
                if g.pool == "training" and not r.borrowed:
                    continue
                role = r.target_role or r.role
                leaving = (r.status == "draining" or r.pending_stop) and r.target_role is None  # draining to re-role is not leaving
                workers.append(Worker(r.worker_id, role, r.gpus, len(r.gpus), r.version, leaving))  # type: ignore[arg-type]
        needs_at = self.now() + (self.predicted_s if np.isfinite(self.predicted_s) else 0.0) * self.unfinished
        return ClusterState(tuple(gpus), tuple(workers), TrainerPhase(self.trainer_phase, needs_at), self.version, float(np.clip(self.unfinished, 0.0, 1.0)))  # type: ignore[arg-type]

    def _gone_elastic(self) -> set[str]:
        return set([s.gpu for s in self.slots if s.pool == "elastic"][self.elastic_available :])

    async def decide(self, event: str, wait: bool = False, raise_errors: bool | None = None) -> None:
        """Ask the policy, log the decision, start applying its plan (awaited only if `wait`;
        a failed plan then raises unless `raise_errors` is False)."""
        task = None
        async with self.lock:
            state = self.cluster_state()
            now = self.now()
            try:
                step = self.policy.decide(state, self.inputs, now, event)
            except Exception as exc:  # no feasible plan (e.g. nothing available): keep what runs, say why
                self.metrics.write("decision_failed", event=event, at_s=round(now, 3), error=f"{type(exc).__name__}: {exc}")
                self.log(f"decision[{event}] failed: {exc}; keeping the current configuration")
                return
            d = step.decision
            extras = {k: (round(float(v), 4) if isinstance(v, (int, float)) and not isinstance(v, bool) else v) for k, v in d.extras.items() if k != "event"}
            seen = {"workers": [f"{w.id}:{w.role}{'(draining)' if w.draining else ''}" for w in state.workers], "elastic_available": self.elastic_available, "trainer": state.trainer.phase, "unfinished": round(state.unfinished_fraction, 3)}
            rec = {"event": event, "at_s": round(now, 3), **d.to_json(), "extras": extras, "state": seen, "plan": {"actions": len(step.plan.actions), "joins": step.plan.joins, "leaves": step.plan.leaves, "role_changes": step.plan.role_changes, "lent": step.plan.lent, "returned": step.plan.returned}}
            self.decisions.append(rec)
            self.metrics.write("decision", **rec)
            self.log(f"decision[{event}] {d.ratio} applied={d.applied} pred={d.predicted_completion_s:.2f}s solve={d.proof.solve_ms:.1f}ms gap={d.proof.gap:.3g} actions={len(step.plan.actions)}")
            if np.isfinite(d.predicted_completion_s):
                self.predicted_s = d.predicted_completion_s
            self.wanted_mode = d.mode
            task: asyncio.Future | None = None
            if not step.plan.empty:  # a held (gated) decision still carries its mandatory part: recalls, returns, forced shrinks
                self._commit(step.plan)
                task = asyncio.ensure_future(self._apply(step.plan, raise_errors=wait if raise_errors is None else raise_errors))
                self._plans.add(task)
                task.add_done_callback(self._plans.discard)
            self._update_mode()
        if task is not None and wait:
            await task

    def _update_mode(self) -> None:
        self.mode = self._current_mode(self.wanted_mode)
        self.ratio = self._ratio()
        if any(r.status == "active" for r in self.rec.values()) and self.mode not in self.modes_used:
            self.modes_used.append(self.mode)

    def _commit(self, plan: Any) -> None:
        """Record what the plan will do before it runs, so the next decision plans from it.

        Plans execute in the background (an expansion takes an engine start); decisions stay
        serialized, and operations on one slot run in order (per-slot locks).
        """
        for a in plan.actions:
            r = self._slot_of(a)
            if a.kind == "start" and r.status in ("down", "parked"):
                r.parked = r.parked or r.status == "parked"
                r.role, r.gpus, r.status = a.role, tuple(a.gpus) or (r.slot.gpu,), "starting"
            elif a.kind == "start":  # the slot's current worker stops first (same plan): net effect, a new role
                r.target_role, r.pending_stop = a.role, False
            elif a.kind == "switch_role":
                r.target_role = a.role
            elif a.kind == "stop":
                r.pending_stop = True

    def _current_mode(self, wanted: str) -> str:
        roles = Counter(r.role for r in self.rec.values() if r.status == "active")
        if roles["prefill"] and roles["decode"] and (wanted == "disaggregated" or not roles["colocated"]):
            return "disaggregated"
        return "colocated"

    def _ratio(self) -> str:
        roles = Counter(r.role for r in self.rec.values() if r.status == "active")
        if self.mode == "disaggregated":
            return f"{roles['prefill']}P{roles['decode']}D"
        return f"{roles['colocated']}C"

    # ------------------------------------------------------------------ applying plans
    async def _apply(self, plan: Any, raise_errors: bool = False) -> None:
        tasks: dict[int, asyncio.Task] = {}
        started: list[SlotRuntime] = []
        t0 = time.monotonic()

        async def run(a: Any) -> bool:
            for dep in a.after:
                if dep in tasks and not await tasks[dep]:
                    return False
            return await self._action(a, started)

        for a in plan.actions:
            tasks[a.id] = asyncio.ensure_future(run(a))
        results = await asyncio.gather(*tasks.values(), return_exceptions=True)
        failed = [r for r in results if r is not True]
        if started:
            if failed:
                # all or nothing: one new worker failed, so none of the group is admitted
                for r in started:
                    await self._stop_slot(r)
                self.metrics.write("expansion_cancelled", workers=[r.worker_id for r in started], errors=[str(f) for f in failed])
                self.log(f"expansion cancelled: {failed}")
            else:
                # A later plan may have superseded part of the group (stopped or re-roled a slot
                # it started): that is no failure, so the members still wanted are admitted
                # together and only the superseded ones stay out.
                superseded = [r for r in started if r.status != "starting"]
                for r in started:  # atomic admission
                    if r.status == "starting":
                        r.status = "active"
                if superseded:
                    self.metrics.write("expansion_superseded", workers=[r.worker_id for r in superseded])
        self.transitions += sum(1 for r in results if r is True)
        self.metrics.write("plan_applied", actions=len(plan.actions), ok=sum(1 for r in results if r is True), seconds=round(time.monotonic() - t0, 3))
        errors = [exc for exc in failed if isinstance(exc, BaseException)]
        if failed:
            self._roll_back(plan, list(zip(plan.actions, results)))
        self._update_mode()
        self.capacity.set()
        if errors and raise_errors:
            raise RuntimeStartError(f"applying a plan failed: {type(errors[0]).__name__}: {errors[0]}")

    def _roll_back(self, plan: Any, outcome: list[tuple[Any, Any]]) -> None:
        """A plan failed part-way (a worker died, an engine did not start): forget what it
        committed but did not reach, mark dead actors, and decide again from the real state."""
        for a, res in outcome:
            r = self._slot_of(a)
            if isinstance(res, BaseException):
                self.metrics.write("plan_error", action=a.kind, worker=r.worker_id, error=f"{type(res).__name__}: {res}")
                if isinstance(res, _actor_errors()):
                    self.dead.add(r.slot.gpu)
                    r.status, r.role = "down", None
            r.target_role, r.pending_stop = None, False
            if r.status in ("starting", "switching"):
                r.status, r.role = "down", None
        self._repair("plan failed")

    def _repair(self, why: str) -> None:
        """Schedule a fresh decision in the background (the planner restores capacity)."""
        if self._repairing:
            self._repair_again = True
            return
        self._repairing = True

        async def again() -> None:
            try:
                while True:
                    self._repair_again = False
                    await asyncio.sleep(0.1)
                    self.metrics.write("repair", reason=why)
                    await self.decide("availability")
                    if not self._repair_again:
                        break
            finally:
                self._repairing = False

        task = asyncio.ensure_future(again())
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def _slot_of(self, a: Any) -> SlotRuntime:
        if a.gpus:
            return self.rec[a.gpus[0]]
        gpu = str(a.worker).split(":", 1)[1] if a.worker and ":" in str(a.worker) else None
        for r in self.rec.values():
            if r.worker_id == a.worker or r.slot.gpu == gpu:
                return r
        raise KeyError(f"plan action {a} names an unknown worker")

    async def _action(self, a: Any, started: list[SlotRuntime]) -> bool:
        r = self._slot_of(a)
        async with self.slot_locks[r.slot.gpu]:
            return await self._action_locked(a, r, started)

    async def _action_locked(self, a: Any, r: SlotRuntime, started: list[SlotRuntime]) -> bool:
        t0 = time.monotonic()
        kind = a.kind
        if kind == "lend":
            for g in a.gpus or (r.slot.gpu,):
                self.rec[g].borrowed = True
        elif kind == "return":
            for g in a.gpus or (r.slot.gpu,):
                rr = self.rec[g]
                await self._drain(rr)
                rr.status = "down" if rr.actor is None else "parked"  # process kept alive between loans
                rr.parked = rr.actor is not None and rr.role is not None
                rr.borrowed = False
        elif kind == "drain":
            await self._drain(r)
        elif kind == "stop":
            await self._stop_slot(r)
            r.pending_stop = False
        elif kind == "switch_role":
            await self._drain(r)
            r.status = "switching"
            info = await r.actor.switch_role.remote(r.slot_no, a.role)
            if not info.get("ok"):
                r.status, r.target_role = "down", None
                raise RuntimeStartError(f"role switch of {r.worker_id} to {a.role} failed: {info.get('error')}")
            r.role, r.status, r.version, r.target_role = a.role, "active", info.get("version", r.version), None
            self.capacity.set()
            self.tracker.record_transition("switch_role", (time.monotonic() - t0) * self.scale)  # type: ignore[union-attr]
        elif kind == "start":
            r.gpus = tuple(a.gpus) or (r.slot.gpu,)
            ok = await self._start_slot(r, a.role)
            if ok:
                started.append(r)
                self.tracker.record_transition("start", (time.monotonic() - t0) * self.scale)  # type: ignore[union-attr]
            return ok
        elif kind == "load_weights":
            if r.actor is not None and self.version > 0:
                await r.actor.load_weights.remote(self.blob_ref, self.version)
                r.version = self.version
        self.metrics.write("action", kind=kind, worker=r.worker_id, role=a.role, seconds=round(time.monotonic() - t0, 3))
        return True

    async def _drain(self, r: SlotRuntime) -> None:
        if r.status in ("active", "draining") and r.actor is not None:
            r.status = "draining"
            try:
                await r.actor.drain.remote(r.slot_no)
            except _actor_errors():
                pass

    async def _start_slot(self, r: SlotRuntime, role: str) -> bool:
        """Background part of an expansion: process + engine + newest weights; admission comes later."""
        from runtime.ray_runtime.rollout_worker import RolloutWorker

        if self.fatal is not None:
            return False
        if r.failures:  # a restart after a death: back off, doubling per death (a crash loop slows, then stops)
            delay = min(self.rt.restart_backoff_s * 2 ** (r.failures - 1), 60.0)
            self.metrics.write("restart_backoff", worker=r.worker_id, failures=r.failures, seconds=delay)
            await asyncio.sleep(delay)
        if r.parked and r.actor is not None:  # a lent training slot coming back: reuse its live engine
            r.parked = False
            info = await r.actor.switch_role.remote(r.slot_no, role)
        else:
            if self.backend == "vllm" and (r.actor is None or r.slot.gpu in self.dead):
                r.actor = self._remote(RolloutWorker, resources={r.slot.resource: 1.0}, runtime_env={"env_vars": slot_env(r.slot, self.device)}, max_concurrency=1000).remote("vllm", self._engine_settings(), None, self._faults())
            r.status = "starting"
            info = await r.actor.start_slot.remote(r.slot_no, role)
        if not info.get("ok"):
            self.metrics.write("start_failed", worker=r.worker_id, error=info.get("error"))
            self.start_error = info.get("error")
            r.status = "down"
            return False
        self.dead.discard(r.slot.gpu)
        r.role, r.status, r.target_role = role, "starting", None
        async with self.weights_lock:  # never interleaved with a push: the engine ends at the newest weights
            version = self.version
            if version > 0:
                await r.actor.load_weights.remote(self.blob_ref, version)
            r.version = version
            await self._verify_weights([r], version, "start")
        self.metrics.write("started", worker=r.worker_id, role=role, seconds=round(float(info.get("seconds", 0.0)), 3), bind=r.slot.binding)
        return True

    async def _stop_slot(self, r: SlotRuntime) -> None:
        import ray

        r.status = "down"
        actor = r.actor
        if actor is None:
            return
        try:
            await actor.stop_slot.remote(r.slot_no)
        except _actor_errors():
            pass
        if self.backend == "vllm" and r.slot.pool != "training":
            ray.kill(actor)
            if r.actor is actor:
                r.actor = None
        if r.status == "down":
            r.role = None

    # ------------------------------------------------------------------ routing
    def _pick(self, role: str, prefer: str | None) -> SlotRuntime | None:
        cands = [r for r in self.rec.values() if r.status == "active" and r.role == role and r.slot.gpu not in self.dead]
        if not cands:
            return None
        best = min(cands, key=lambda r: r.load)
        if prefer is not None:
            p = self.rec[prefer]
            if p in cands and p.load <= best.load + 2:
                return p  # prefix reuse: the previous turn's engine still holds the context
        return best

    async def _route(self, t: Trajectory, colocated_only: bool = False) -> tuple[SlotRuntime | None, SlotRuntime | None]:
        """(prefill, decode) for disaggregated, (colocated, None) for colocated; waits for capacity.
        `colocated_only` (a request that killed P/D engines): a colocated engine now, or (None, None)."""
        waited_since: float | None = None
        while True:
            if self.fatal is not None:
                raise RunFailed(self.fatal)
            if colocated_only:
                return self._pick("colocated", t.last.get("colocated")), None
            if self.mode == "disaggregated":
                p, d = self._pick("prefill", t.last.get("prefill")), self._pick("decode", t.last.get("decode"))
                if p and d:
                    return p, d
            c = self._pick("colocated", t.last.get("colocated"))
            if c:
                return c, None
            p, d = self._pick("prefill", t.last.get("prefill")), self._pick("decode", t.last.get("decode"))
            if p and d:
                return p, d
            if waited_since is None:
                waited_since = time.monotonic()
            elif time.monotonic() - waited_since > 10.0 and not self._plans and not self.lock.locked():
                self._repair("requests waiting with no worker for their role")  # self-healing: nothing is on its way
                waited_since = time.monotonic()
            self.capacity.clear()
            try:
                await asyncio.wait_for(self.capacity.wait(), timeout=0.5)
            except asyncio.TimeoutError:
                pass

    async def _call(self, r: SlotRuntime, req: GenRequest) -> GenResult | EngineDied | None:
        """The request's result; EngineDied if its engine died under it; None if we stopped it."""
        r.load += 1
        actor = r.actor
        try:
            res: GenResult = await actor.generate.remote(r.slot_no, req)
            r.served += 1
            return res
        except _actor_errors() as exc:
            if r.actor is actor and r.status in ("active", "draining"):
                error = f"worker process died: {type(exc).__name__}"
                self._mark_dead(r, error)  # not one we stopped ourselves: it died
                return EngineDied(r.worker_id, error)
            return EngineDied(r.worker_id, r.last_error) if r.slot.gpu in self.dead else None
        except Exception as exc:  # the engine inside a live actor failed (e.g. vLLM EngineDeadError)
            error = _error_text(exc)
            if r.actor is actor and r.status in ("active", "draining"):
                self.metrics.write("engine_failed", worker=r.worker_id, request=req.request_id, error=error)
                self._mark_dead(r, error)
                await self._discard_engine(r, actor)
                return EngineDied(r.worker_id, error)
            return EngineDied(r.worker_id, error) if r.slot.gpu in self.dead else None
        finally:
            r.load -= 1

    async def _discard_engine(self, r: SlotRuntime, actor: Any) -> None:
        """A failed engine never serves again: its process goes (vLLM: one slot per actor) or,
        on a host of many emulated slots, only its engine; the repair decision restarts the slot."""
        import ray

        if self.backend == "vllm":
            ray.kill(actor)
            if r.actor is actor:
                r.actor = None
            return
        try:
            await actor.stop_slot.remote(r.slot_no)
        except _actor_errors():
            pass

    def _mark_dead(self, r: SlotRuntime, error: str) -> None:
        if r.slot.gpu in self.dead:
            return
        self.dead.add(r.slot.gpu)
        r.status, r.role = "down", None
        r.failures += 1
        r.last_error = error
        bound = self.rt.max_restarts_per_slot
        self.metrics.write("worker_died", worker=r.worker_id, failures=r.failures, error=error)
        if r.failures > bound:
            self._fail_run(f"worker {r.worker_id} died {r.failures} times (runtime.max_restarts_per_slot is {bound}); last error: {error}")
            return
        self.log(f"worker {r.worker_id} died ({r.failures} of at most {bound + 1}): {error}; its requests resume elsewhere")
        self._repair(f"worker {r.worker_id} died")  # restore capacity on the same slot

    def _fail_run(self, reason: str) -> None:
        """Stop the run for a stated cause: run() raises RunFailed, the metrics record it."""
        if self.fatal is not None:
            return
        self.fatal = reason
        self.metrics.write("run_failed", reason=reason)
        self.log(f"run failed: {reason}")
        self.fatal_event.set()
        self.capacity.set()

    async def _turn(self, t: Trajectory, max_tokens: int) -> tuple[list[int], list[float], int]:
        """One policy turn: routed by mode; interrupted requests resume elsewhere with their prefix.

        Every request in flight dies with its engine, so a request in flight on an engine death
        is a suspect: suspects retry one at a time (`quarantine`), so the next death names its
        cause. A request in flight on POISON_KILLS deaths of one kind never goes to that kind
        again: a P/D request re-prefills on a colocated engine; otherwise its trajectory fails.
        """
        got: list[int] = []
        lps: list[float] = []
        version = 1 << 30
        newest = -1
        kills: Counter[str] = Counter()  # engine deaths this turn's request was in flight for, per phase
        while len(got) < max_tokens:
            poisoned = [phase for phase, n in kills.items() if n >= POISON_KILLS]
            if "full" in poisoned:
                raise TrajectoryFailed(f"its turn {t.turns} request was in flight when {kills['full']} colocated engines died")
            async with self.quarantine if kills else contextlib.nullcontext():
                res = await self._attempt(t, got, max_tokens, kills, colocated_only=bool(poisoned))
            if res is None:
                self.resumed_turns += 1
                t.resumes += 1
                continue
            got.extend(res.token_ids)
            lps.extend(res.logprobs)
            if res.token_ids:
                version = min(version, res.weight_version, res.first_version if res.first_version >= 0 else res.weight_version)
                newest = max(newest, res.weight_version)
                t.max_version = max(t.max_version, newest)
            if res.finish_reason == "abort":
                self.resumed_turns += 1
                t.resumes += 1
                continue
            break
        return got, lps, version if version != 1 << 30 else self.version

    async def _attempt(self, t: Trajectory, got: list[int], max_tokens: int, kills: Counter[str], colocated_only: bool) -> GenResult | None:
        """One try at the rest of a turn on the engines the router picks; None if it was cut
        off (the engine stopped or died: an engine death is counted in `kills`)."""
        first, second = await self._route(t, colocated_only=colocated_only)
        if first is None:
            poisoned = "/".join(p for p, n in kills.items() if n >= POISON_KILLS)
            raise TrajectoryFailed(f"its turn {t.turns} request was in flight when {max(kills.values())} {poisoned} engines died and no colocated engine can re-prefill it")
        rid = f"{t.id}-t{t.turns}-{uuid.uuid4().hex[:6]}"
        ctx = tuple(t.tokens + got)
        want = max_tokens - len(got)
        t.state = "generating"
        if second is None:
            res = await self._call(first, GenRequest(rid, ctx, want, "full", self.rt.temperature))
            t.last["colocated"] = first.slot.gpu
            phase = "full"
        else:
            pre = await self._call(first, GenRequest(rid + "-p", ctx, 1, "prefill", self.rt.temperature))
            if not isinstance(pre, GenResult) or pre.finish_reason == "abort":
                kills["prefill"] += isinstance(pre, EngineDied)
                return None
            t.last["prefill"] = first.slot.gpu
            res = await self._call(second, GenRequest(rid + "-d", ctx, want, "decode", self.rt.temperature, kv_params=pre.kv_params))
            t.last["decode"] = second.slot.gpu
            phase = "decode"
            # a handoff is KV the decode engine's connector loaded (not its own prefix cache)
            if isinstance(res, GenResult) and res.token_ids and res.loaded_tokens > 0:
                self.kv_handoffs += 1
        if not isinstance(res, GenResult):
            kills[phase] += isinstance(res, EngineDied)
            return None
        return res

    async def _trajectory(self, t: Trajectory) -> Trajectory:
        t0 = time.monotonic()
        prompt = await self.env.reset.remote(t.id, t.task_seed)
        t.tokens, t.mask, t.prompt_len = list(prompt), [0] * len(prompt), len(prompt)
        limit = (self.rt.max_model_len if self.backend == "vllm" else self.spec.workload.max_trajectory_tokens) - 2
        while True:
            room = limit - len(t.tokens)
            try:
                got, lps, v = await self._turn(t, max(1, min(self.response_tokens, room)))
            except TrajectoryFailed:
                t.state = "failed"
                await self.env.forget.remote(t.id)
                raise
            t.tokens += got
            t.mask += [1] * len(got)
            t.logprobs += lps
            t.min_version = min(t.min_version, v)
            t.turns += 1
            e0 = time.monotonic()
            t.state = "env"
            obs, done, reward = await self.env.step.remote(t.id, got)
            t.env_s += time.monotonic() - e0
            if done or len(t.tokens) + len(obs) + 2 >= limit:
                if not done:
                    await self.env.forget.remote(t.id)
                    reward = 0.0
                t.reward = float(reward)
                break
            t.new_tokens.append(len(obs))
            t.tokens += obs
            t.mask += [0] * len(obs)
        t.env_s = t.env_s * self.scale
        t.state = "done"
        self.metrics.write("trajectory", id=t.id, batch=t.batch, turns=t.turns, tokens=len(t.tokens), reward=t.reward, resumes=t.resumes, min_version=t.min_version, max_version=t.max_version, seconds=round(time.monotonic() - t0, 3))
        return t

    # ------------------------------------------------------------------ the loops
    async def _rollout_batch(self, b: int) -> tuple[list[Trajectory], float]:
        g = self.spec.workload.group_size
        n = self.batch_size
        trajs = [Trajectory(f"b{b}-{i}", b, i // g, self.spec.seed * 100003 + b * 1009 + i // g) for i in range(n)]
        self.trajectories_in_flight = trajs
        t0 = time.monotonic()
        self.batch_started[b] = t0
        self.current_batch = b
        remaining = [n]

        async def one(t: Trajectory) -> Trajectory | None:
            try:
                return await self._trajectory(t)
            finally:
                remaining[0] -= 1
                self.unfinished = remaining[0] / n

        done = await asyncio.gather(*(one(t) for t in trajs), return_exceptions=True)
        ok = [t for t in done if isinstance(t, Trajectory) and t.reward is not None]
        self.trajectories.extend(ok)
        self.lost += n - len(ok)
        for t, e in zip(trajs, done):
            if isinstance(e, TrajectoryFailed):
                self.failed_trajectories.append({"id": t.id, "reason": str(e)})
                self.metrics.write("trajectory_failed", id=t.id, reason=str(e))
                self.log(f"trajectory {t.id} failed: {e}")
            elif isinstance(e, BaseException) and not isinstance(e, RunFailed):
                self.metrics.write("trajectory_lost", id=t.id, error=repr(e))
                self.log(f"trajectory lost: {e!r}")
        return ok, time.monotonic() - t0

    def _telemetry(self, b: int, trajs: list[Trajectory], seconds: float) -> StepTelemetry:
        new = [x for t in trajs for x in t.new_tokens]
        gen = sum(sum(t.mask) for t in trajs)
        turns = [t.turns for t in trajs]
        return StepTelemetry(
            step=b, trajectories=len(trajs), mean_turns=float(np.mean(turns)) if turns else 0.0,
            mean_initial_tokens=float(np.mean([t.prompt_len for t in trajs])) if trajs else 0.0,
            mean_new_tokens=float(np.mean(new)) if new else 0.0,
            mean_response_tokens=gen / max(sum(turns), 1), mean_env_s=float(sum(t.env_s for t in trajs) / max(sum(max(t.turns - 1, 0) for t in trajs), 1)),
            generated_tokens=int(gen), rollout_s=seconds * self.scale, predicted_s=self.predicted_s, mode=self.mode, ratio=self.ratio,
        )

    def _apply_load_change(self, b: int) -> bool:
        changed = False
        for ch in self.rt.load_changes:
            if ch.at_step == b and ch.policy:
                from planner.policies import get_policy

                self.policy = get_policy(ch.policy)
                self.metrics.write("policy_change", step=b, policy=ch.policy)
                self.log(f"policy change at step {b}: {ch.policy}")
            if ch.at_step == b and ch.workload:
                w = self.spec.workload.model_validate({**self.spec.workload.model_dump(), **ch.workload})
                self.spec = self.spec.model_copy(update={"workload": w})
                assert self.tracker is not None
                self.tracker.spec = self.tracker.spec.model_copy(update={"workload": w})
                self.batch_size = w.trajectories_per_batch
                self.response_tokens = int(round(w.response_tokens_per_turn.expected()))
                self.metrics.write("load_change", step=b, workload=ch.workload)
                self.log(f"load change at step {b}: {ch.workload}")
                changed = True
        return changed

    def _refresh_inputs(self) -> None:
        from planner.inputs import planning_inputs

        assert self.tracker is not None
        self.inputs = planning_inputs(self.tracker.models(), max_gpus=len(self.slots))

    async def _elastic_loop(self, schedule: tuple[AvailabilityChange, ...]) -> None:
        for ch in schedule:
            origin = self.t0
            if ch.after_step is not None:
                while ch.after_step not in self.batch_started:
                    await asyncio.sleep(0.05)
                origin = self.batch_started[ch.after_step]
            delay = ch.at_s - (time.monotonic() - origin)
            if delay > 0:
                await asyncio.sleep(delay)
            if ch.available == self.elastic_available:
                continue
            self.metrics.write("availability", elastic=ch.available, at_s=round(time.monotonic() - self.t0, 3))
            self.log(f"elastic GPUs: {self.elastic_available} -> {ch.available}")
            self.elastic_available = ch.available
            gone = self._gone_elastic()
            for r in self.rec.values():  # shrink is urgent: stop dispatch and interrupt now; requests resume elsewhere
                if set(r.gpus) & gone and r.status in ("active", "starting", "switching", "draining"):
                    await self._drain(r)  # before taking the lock: an in-flight start must not delay it
                    async with self.slot_locks[r.slot.gpu]:
                        await self._stop_slot(r)
            await self.decide("availability")

    async def _push_weights(self, blob_ref: Any, version: int) -> None:
        async with self.weights_lock:
            await self._push_weights_locked(blob_ref, version)

    async def _push_weights_locked(self, blob_ref: Any, version: int) -> None:
        actors = {id(r.actor): r.actor for r in self.rec.values() if r.actor is not None and r.slot.gpu not in self.dead}
        import ray

        res = await asyncio.gather(*(a.load_weights.remote(blob_ref, version) for a in actors.values()), return_exceptions=True)
        failed = 0  # pushes that failed on a worker still meant to serve (not one being stopped)
        errors: list[str] = []
        for a, x in zip(actors.values(), res):
            if isinstance(x, BaseException):
                live = [r for r in self.rec.values() if r.actor is a and r.status in ("active", "draining", "switching")]
                failed += bool(live)
                if live:
                    errors.append(f"{live[0].worker_id}: {type(x).__name__}: {x}"[:500])
                    self.log(f"weight push to {live[0].worker_id} failed: {type(x).__name__}: {x}")
                for r in live:
                    if isinstance(x, _actor_errors()):
                        self._mark_dead(r, f"died during a weight push: {type(x).__name__}")
        self.blob_ref, self.version = blob_ref, version
        for r in self.rec.values():
            if r.actor is not None and r.status in ("active", "parked", "starting") and r.slot.gpu not in self.dead:
                r.version = version
        self.metrics.write("weights_pushed", version=version, workers=len(actors), errors=failed, stopped_meanwhile=sum(isinstance(x, BaseException) for x in res) - failed, error_messages=errors)
        live = [r for r in self.rec.values() if r.actor is not None and r.status in ("active", "parked") and r.slot.gpu not in self.dead]
        await self._verify_weights(live, version, "push")
        del ray

    async def _verify_weights(self, slots: list[SlotRuntime], version: int, when: str) -> None:
        """Every engine that serves must score a fixed probe as the trainer does at the weights
        it was given (weight_sync.PROBE_TOKENS): after each push, and when an engine starts."""
        from runtime.ray_runtime.weight_sync import PROBE_TOKENS

        if not slots:
            return
        expected = np.asarray(await self.trainer.probe_logprobs.remote(version))
        answers = await asyncio.gather(*(r.actor.probe_logprobs.remote(r.slot_no, PROBE_TOKENS) for r in slots), return_exceptions=True)
        compared, mismatched, max_diff = 0, [], 0.0
        for r, got in zip(slots, answers):
            if isinstance(got, BaseException) or len(got) != len(expected):
                continue  # stopped or re-roled meanwhile: it is checked again when it starts
            compared += 1
            diff = float(np.max(np.abs(np.asarray(got) - expected)))
            max_diff = max(max_diff, diff)
            if diff > WEIGHTS_MATCH_TOL:
                mismatched.append(r.worker_id)
        self.weights_verified += compared - len(mismatched)
        self.weights_mismatched += len(mismatched)
        self.metrics.write("weights_check", when=when, version=version, engines=len(slots), compared=compared, mismatched=mismatched, probe_max_diff=round(max_diff, 9))
        if mismatched:
            self.log(f"weights check ({when}, v{version}): {mismatched} differ from the trainer by up to {max_diff:.3g} in log-prob")

    async def _kv_stats(self, r: SlotRuntime) -> dict[str, float]:
        try:
            return await r.actor.kv_stats.remote(r.slot_no)
        except _actor_errors():
            return {}

    async def probe_kv_handoff(self, tokens: int = 200) -> dict[str, int]:
        """Prefill a never-seen prompt on a prefill worker, decode it on a decode worker.

        The decode engine cannot have this prompt in its own prefix cache, so cached tokens
        on its side (ExampleConnector) can only be KV handed over from the prefill engine.
        NixlConnector's decode side reports the prefill side's cache hits instead; there the
        decode engine's transfer counters (KV bytes pulled during the probe) are the evidence.
        """
        p, d = self._pick("prefill", None), self._pick("decode", None)
        if p is None or d is None:
            return {"prefill_workers": int(p is not None), "decode_workers": int(d is not None), "decode_cached_tokens": 0}
        rng = np.random.default_rng(int(time.time_ns() % 2**32))
        ids = tuple(int(x) for x in rng.integers(10, 1000, tokens))
        rid = f"probe-{uuid.uuid4().hex[:8]}"
        before = await self._kv_stats(d)
        pre = await self._call(p, GenRequest(rid + "-p", ids, 1, "prefill", 0.0))
        pre = pre if isinstance(pre, GenResult) else None
        res = await self._call(d, GenRequest(rid + "-d", ids, 4, "decode", 0.0, kv_params=pre.kv_params if pre else None))
        res = res if isinstance(res, GenResult) else None
        after = await self._kv_stats(d)
        out = {
            "prompt_tokens": tokens,
            "decode_cached_tokens": int(res.cached_tokens) if res else 0,
            "decode_loaded_tokens": int(res.loaded_tokens) if res else 0,
            "decode_generated": len(res.token_ids) if res else 0,
            "decode_kv_transfers": int(after.get("transfers", 0) - before.get("transfers", 0)),
            "decode_kv_bytes": int(after.get("bytes", 0.0) - before.get("bytes", 0.0)),
        }
        self.metrics.write("kv_probe", prefill=p.worker_id, decode=d.worker_id, **out)
        return out

    async def worker_versions(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rec.values():
            if r.actor is not None and r.status == "active":
                try:
                    vs = await r.actor.versions.remote()
                    out[r.worker_id] = int(vs.get(r.slot_no, -1))
                except _actor_errors():
                    pass
        return out

    async def run(self, steps: int) -> RunSummary:
        await self.setup()
        self.t0 = time.monotonic()
        schedule = elastic_schedule(self.spec, self.elastic_total) if self.elastic_total else ()
        if schedule and schedule[0].at_s == 0 and schedule[0].after_step is None:
            self.elastic_available = schedule[0].available
        await self.decide("initial", wait=True)
        if not any(r.status == "active" for r in self.rec.values()):
            raise RuntimeStartError(f"no rollout worker could start: {getattr(self, 'start_error', 'the initial plan started none')}")
        staleness = self.spec.training.staleness
        queue: asyncio.Queue = asyncio.Queue()
        version_event = asyncio.Event()
        elastic = asyncio.ensure_future(self._elastic_loop(schedule)) if schedule else None

        async def rollout_loop() -> None:
            for b in range(steps):
                while self.version < b - staleness:
                    version_event.clear()
                    await version_event.wait()
                policy_before = self.policy
                changed = self._apply_load_change(b)
                if changed:
                    self._refresh_inputs()
                self.unfinished = 1.0  # a new batch: all of it is still to run (R/B = 1 for the borrow gate)
                if b > 0:
                    # a scripted policy change takes effect before its batch starts (the batch
                    # runs on the layout it asked for, however long the engines take to switch)
                    await self.decide("rollout_step", wait=self.policy is not policy_before, raise_errors=False)
                trajs, seconds = await self._rollout_batch(b)
                tel = self._telemetry(b, trajs, seconds)
                assert self.tracker is not None
                self.tracker.observe(tel)
                self._refresh_inputs()
                self.metrics.write("rollout_step", **tel.__dict__, error=tel.error, gen_tok_per_s=tel.generated_tokens / max(seconds, 1e-9), resumed_turns=self.resumed_turns, kv_handoffs=self.kv_handoffs)
                await queue.put((b, trajs, tel))

        async def train_loop() -> None:
            for _ in range(steps):
                b, trajs, tel = await queue.get()
                self.trainer_phase = "training"
                await self.decide("training_begin")
                deadline = time.monotonic() + 2.0 * max(self.inputs.costs.return_s, 1.0) / self.scale + 5.0
                while any(r.borrowed for r in self.rec.values()) and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)  # the plan's returns run in the background: wait for them, not for its starts
                late = [r for r in self.rec.values() if r.borrowed]
                if late:  # borrowed GPUs must be back before the step: take them back now, count it
                    self.late_returns += len(late)
                    for r in late:
                        await self._drain(r)
                        r.status, r.borrowed, r.parked = "parked", False, r.actor is not None
                samples = [TrainSample(t.id, t.group, tuple(t.tokens), tuple(t.mask), tuple(t.logprobs), float(t.reward or 0.0), t.min_version if t.min_version < 1 << 29 else self.version, max(t.max_version, -1)) for t in trajs]
                metrics_ref, blob_ref = self.trainer.train_step.options(num_returns=2).remote(samples, self.version)
                m = await metrics_ref
                await self._push_weights(blob_ref, int(m["version"]))
                version_event.set()
                self.trainer_phase = "waiting"
                rewards = [float(t.reward or 0.0) for t in trajs]
                self.rewards.extend(rewards)
                row = {"step": b, "weight_version": self.version, "mean_reward": float(np.mean(rewards)) if rewards else 0.0, "rollout_s": tel.rollout_s, "gen_tokens": tel.generated_tokens, "tok_per_s": tel.generated_tokens / max(tel.rollout_s / self.scale, 1e-9), "mode": tel.mode, "ratio": tel.ratio, "predicted_s": tel.predicted_s, "pred_error": tel.error, **{f"train_{k}": v for k, v in m.items()}}
                self.metrics.write("train_step", **row)
                if self.on_step:
                    self.on_step(row)
                await self.decide("training_end")

        try:
            await self._until_fatal(asyncio.gather(rollout_loop(), train_loop()))
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
        versions = await self.worker_versions()
        solve = [d["proof"]["solve_ms"] for d in self.decisions]
        failures = {r.worker_id: r.failures for r in self.rec.values() if r.failures}
        summary = RunSummary(steps, self.version, float(np.mean(self.rewards)) if self.rewards else 0.0, self.transitions, self.modes_used, self.lost, self.late_returns, len(self.decisions), float(np.percentile(solve, 95)) if solve else 0.0, self.resumed_turns, versions, self.kv_handoffs, self.rewards,
                             list(self.failed_trajectories), failures, self.weights_verified, self.weights_mismatched)
        self.metrics.write("summary", **summary.to_json(), resumed_turns=self.resumed_turns, worker_versions=versions)
        return summary

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
            "plans_pending": len(self._plans), "repairing": self._repairing, "deciding": self.lock.locked(), "fatal": self.fatal,
        }

    async def shutdown(self) -> None:
        import shutil

        import ray

        for r in self.rec.values():
            if r.actor is not None:
                try:
                    await asyncio.wait_for(r.actor.shutdown.remote(), timeout=30)
                except Exception:
                    pass
        self.metrics.close()
        shutil.rmtree(self.kv_store, ignore_errors=True)
        if not self.address and ray.is_initialized():
            ray.shutdown()
