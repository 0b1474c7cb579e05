"""Plans on Ray actors: the shared executor (`runtime/executor.py`) says which action may begin;
this module performs it on the actors, reports its end, and keeps slots alive.

Execution mechanisms (the paper's):
  - stable slots, fixed bindings: a worker is `w:<lead gpu>`; only its role and membership
    change; a dead worker is restarted on the same slot, with a bounded number of restarts
    and a doubling back-off;
  - expansion: new engines start in the background with the newest weights and join
    together, or not at all (the executor decides; the runner stops the cancelled ones);
  - drain: dispatch stops, in-flight requests are aborted with their generated prefix kept,
    and each trajectory continues its turn on another worker;
  - lend / return: a training GPU is recorded on loan (`runtime/loans.py`); a returned
    training slot keeps its process alive for the next loan (parked).
Mixed into `Controller`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from planner.transition import Action, TransitionPlan
from runtime.executor import Progress
from runtime.ray_runtime.records import RuntimeStartError, actor_errors
from runtime.ray_runtime.resources import group_env
from runtime.ray_runtime.slot_table import SlotRuntime


class PlanRunner:
    """Plan actuation, restarts and repair for `Controller` (attributes are the controller's)."""

    def _submit(self, plan: TransitionPlan, raise_errors: bool) -> asyncio.Future:
        """Hand a plan to the executor; the future resolves when every action has ended."""
        rid, progress = self.executor.submit(plan)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._plan_state[rid] = (fut, [], time.monotonic(), len(plan.actions), raise_errors)
        self._plans.add(fut)
        fut.add_done_callback(self._plans.discard)
        self._execute(progress)
        self._settle(rid)
        return fut

    def _execute(self, progress: Progress) -> None:
        for a in progress.cancelled:
            self._spawn(self._stop_slot(self.table.of(a)))
            self.metrics.write("expansion_cancelled", worker=a.worker)
        gone = self.table.gone_elastic()
        for a in progress.admitted + progress.serving:
            r = self.table.of(a)
            if set(r.gpus) & gone:
                self._spawn(self._stop_slot(r))  # preempted while it started or switched: it never serves
            elif r.status in ("starting", "switching"):
                r.status = "active"  # admitted together with its group, or back in its new role
        if progress.admitted or progress.serving:
            self._update_mode()
            self.capacity.set()
        for rid, a in progress.begin:
            self._claim(a)
            self._spawn(self._run_action(rid, a))

    def _claim(self, a: Action) -> None:
        """An action the executor has begun is the runtime's state from now on, not from when its
        task first runs: a decision scheduled in between would otherwise see a restarting slot as
        down (not yet "starting") and plan the same start again, or a switching worker in its old
        role (the executor's contract: `Executor.committed` applies only actions not yet begun)."""
        r = self.table.of(a)
        if a.kind == "start":
            r.gpus = tuple(a.gpus) or (r.slot.gpu,)
            r.role, r.status = a.role, "starting"
        elif a.kind == "switch_role" and r.status == "active":
            r.status = "draining"  # what its drain sets first: dispatch stops, its GPUs are held

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def _run_action(self, rid: int, a: Action) -> None:
        t0 = time.monotonic()
        try:
            ok = await self._perform(a)
        except Exception as exc:  # an actor died or an engine failed to start: the plan is repaired
            ok = False
            self._plan_state[rid][1].append(exc)
            r = self.table.of(a)
            self.metrics.write("plan_error", action=a.kind, worker=r.worker_id, error=f"{type(exc).__name__}: {exc}")
            if isinstance(exc, actor_errors()):
                self.table.dead.add(r.slot.gpu)
                r.status, r.role = "down", None
        if ok:
            self.transitions += 1
            self.metrics.write("action", kind=a.kind, worker=a.worker, role=a.role, seconds=round(time.monotonic() - t0, 3))
        self._execute(self.executor.complete(rid, a.id, ok))
        self._settle(rid)

    def _settle(self, rid: int) -> None:
        """A plan whose actions have all ended: log it; a failed one is repaired by a new decision."""
        if self.executor.running(rid) or rid not in self._plan_state:
            return
        fut, errors, t0, n, raise_errors = self._plan_state.pop(rid)
        self.metrics.write("plan_applied", actions=n, errors=len(errors), seconds=round(time.monotonic() - t0, 3))
        if errors and not self.executor.busy:  # what a failed plan left half-way no longer serves
            for r in self.rec.values():
                if r.status == "starting":
                    r.status, r.role = "down", None
        self._update_mode()
        self.capacity.set()
        if errors:
            self._repair("plan failed")
        if fut.done():
            return
        if errors and raise_errors:
            fut.set_exception(RuntimeStartError(f"applying a plan failed: {type(errors[0]).__name__}: {errors[0]}"))
        else:
            fut.set_result(None)

    async def _perform(self, a: Action) -> bool:
        r = self.table.of(a)
        async with self.slot_locks[r.slot.gpu]:
            if a.kind == "lend":
                if self.trainer_phase != "waiting":
                    return False  # the trainer needs its GPUs again: the loan is off
                self.ledger.lend(a.gpus, self.now())
                self._arm_return_due()  # the loan must be back before the trainer needs it
            elif a.kind == "return":
                for g in a.gpus:
                    rr = self.rec[g]
                    await self._drain(rr)
                    rr.status = "down" if rr.actor is None else "parked"  # process kept alive between loans
                    rr.parked = rr.actor is not None and rr.role is not None
                if self.ledger.returned(a.gpus, self.now()):
                    self.gpus_home.set()
            elif a.kind == "drain":
                await self._drain(r)
            elif a.kind == "stop":
                await self._stop_slot(r)
            elif a.kind == "switch_role":
                t0 = time.monotonic()
                await self._drain(r)
                # the planner sees a worker by the role it is becoming (the executor's contract:
                # an action under way is the runtime's state), else the next decision switches it again
                r.status, r.role = "switching", a.role
                info = await r.actor.switch_role.remote(r.slot_no, a.role)
                if not info.get("ok"):
                    r.status = "down"
                    raise RuntimeStartError(f"role switch of {r.worker_id} to {a.role} failed: {info.get('error')}")
                r.role, r.version = a.role, info.get("version", r.version)
                self.tracker.record_transition("switch_role", (time.monotonic() - t0) * self.scale)
            elif a.kind == "start":
                t0 = time.monotonic()
                if not await self._start_slot(r, a.role):  # type: ignore[arg-type]
                    return False
                if set(r.gpus) & self.table.gone_elastic():  # preempted while it started: it never joins
                    await self._stop_slot(r)
                    return False
                self.tracker.record_transition("start", (time.monotonic() - t0) * self.scale)
            elif a.kind == "load_weights":
                if r.actor is not None and self.version > r.version:
                    async with self.weights_lock:
                        await r.actor.load_weights.remote(self.blob_ref, self.version)
                        r.version = self.version
        return True

    async def _drain(self, r: SlotRuntime) -> None:
        if r.status in ("active", "draining") and r.actor is not None:
            r.status = "draining"
            try:
                await r.actor.drain.remote(r.slot_no)
            except actor_errors():
                pass

    async def _start_slot(self, r: SlotRuntime, role: str) -> bool:
        """Background part of an expansion: process + engine + newest weights; admission comes later."""
        from runtime.ray_runtime.rollout_worker import RolloutWorker

        if self.fatal is not None or r.slot.gpu in self.table.lost:
            r.status, r.role = "down", None  # claimed when it began (`_claim`): it never starts
            return False
        # the planner sees the worker it is becoming (`_claim`, see switch_role), backoff included
        r.role, r.status = role, "starting"
        if r.failures:  # a restart after a death: back off, doubling per death (a crash loop slows, then stops)
            delay = min(self.rt.restart_backoff_s * 2 ** (r.failures - 1), 60.0)
            self.metrics.write("restart_backoff", worker=r.worker_id, failures=r.failures, seconds=delay)
            await asyncio.sleep(delay)
        group = self.table.group_slots(r)
        gpus = tuple(s.gpu for s in group)
        if r.parked and r.actor is not None and self._engine_group.get(r.slot.gpu) == gpus:  # a lent training slot coming back: reuse its live engine
            r.parked = False
            info = await r.actor.switch_role.remote(r.slot_no, role)
        else:
            r.parked = False
            await self._free_gpus(r, gpus)
            if self.backend == "vllm" and (r.actor is None or r.slot.gpu in self.table.dead):
                # a TP group's process holds every slot of the group, bound to all their cores / devices
                r.actor = self._remote(RolloutWorker, resources={s.resource: 1.0 for s in group}, runtime_env={"env_vars": group_env(group, self.device)}, max_concurrency=1000).remote("vllm", self._engine_settings(), None, self._faults())
            r.status = "starting"
            info = await r.actor.start_slot.remote(r.slot_no, role, self.table.kind_of(r))
            self._engine_group[r.slot.gpu] = gpus
        if not info.get("ok"):
            self.metrics.write("start_failed", worker=r.worker_id, error=info.get("error"))
            self.start_error = info.get("error")
            r.status = "down"
            return False
        self.table.dead.discard(r.slot.gpu)
        r.role, r.status = role, "starting"
        await self._check_placement(r)
        async with self.weights_lock:  # never interleaved with a push: the engine ends at the newest weights
            version = self.version
            if version > 0:
                await r.actor.load_weights.remote(self.blob_ref, version)
            r.version = version
            await self._verify_weights([r], version, "start")
        gpu_type, tp = self.table.kind_of(r)
        self.metrics.write("started", worker=r.worker_id, role=role, gpu_type=gpu_type, tp=tp, seconds=round(float(info.get("seconds", 0.0)), 3), bind=r.slot.binding, node=self.placements.get(r.worker_id, "")[:12])
        return True

    async def _free_gpus(self, r: SlotRuntime, gpus: tuple[str, ...]) -> None:
        """Before a start on `gpus`: engines that still hold any of them go, a parked one of another
        TP group (a returned training slot) or this slot's own at another degree (a TP change is a
        stop and a start; a vLLM process holds its group's Ray resources until it ends)."""
        for o in self.rec.values():
            held = self._engine_group.get(o.slot.gpu, ())
            if o.actor is None or not set(held) & set(gpus) or (o is r and held == gpus):
                continue
            if o is not r and o.status not in ("down", "parked"):
                continue  # a serving worker: the plan stops it first (the executor orders GPU reuse)
            await self._discard_engine(o, o.actor)
            o.parked = False
            self._engine_group.pop(o.slot.gpu, None)

    async def _stop_slot(self, r: SlotRuntime) -> None:
        import ray

        r.status = "down"
        actor = r.actor
        if actor is None:
            return
        try:
            await actor.stop_slot.remote(r.slot_no)
        except actor_errors():
            pass
        if self.backend == "vllm" and r.slot.pool != "training":
            ray.kill(actor)
            if r.actor is actor:
                r.actor = None
        if r.status == "down":
            r.role = None

    async def preempt(self, gone: set[str]) -> None:
        """Elastic GPUs vanished: their workers stop now (urgent); requests resume elsewhere."""
        for r in self.rec.values():
            if set(r.gpus) & gone and r.status in ("active", "starting", "switching", "draining"):
                await self._drain(r)
                if self.slot_locks[r.slot.gpu].locked():
                    continue  # an action is under way on it (an engine start): it stops when that ends
                async with self.slot_locks[r.slot.gpu]:
                    await self._stop_slot(r)

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

        self._spawn(again())

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
        except actor_errors():
            pass

    def _mark_dead(self, r: SlotRuntime, error: str) -> None:
        if r.slot.gpu in self.table.dead:
            return
        self.table.dead.add(r.slot.gpu)
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
