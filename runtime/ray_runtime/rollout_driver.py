"""The rollout driver: agent trajectories on the serving engines, one turn at a time.

A trajectory resets its environment, then per turn generates on the engines the shared
router picks (`runtime/router.py`: colocated, or prefill then decode with the KV handed
over), steps its environment with the answer, and repeats. An engine stopped or lost under
a request cuts it off; the turn resumes on another engine with what it generated. A request
in flight on several engine deaths is isolated (see `_turn`). Mixed into `Controller`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from runtime import router
from runtime.calibration.trajectory_log import TrajectoryRecord
from runtime.ray_runtime.engines import GenRequest, GenResult
from runtime.ray_runtime.records import EngineDied, RunFailed, TrajectoryFailed, actor_errors, error_text
from runtime.ray_runtime.slot_table import SlotRuntime
from runtime.ray_runtime.telemetry import StepTelemetry, disruption

POISON_KILLS = 2  # a request in flight on this many engine deaths of one role never goes to that role again
REPAIR_AFTER_S = 10.0  # requests waiting this long with nothing on its way ask for a fresh decision


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
    response_tokens: list[int] = field(default_factory=list)  # per turn (the trajectory log's, with env_turn_s)
    env_turn_s: list[float] = field(default_factory=list)  # per environment step, virtual seconds
    truncated: bool = False  # ended at the token budget, not by the environment
    reward: float | None = None
    resumes: int = 0
    last: dict[str, str] = field(default_factory=dict)  # role -> gpu of the previous turn (prefix reuse)
    last_role: str | None = None  # where its prefix lives: colocated or prefill
    state: str = "queued"  # queued | generating | env | done | failed (what it waits on, for diagnostics)


class RolloutDriver:
    """Trajectories, routing and engine calls for `Controller` (attributes are the controller's)."""

    def _pick(self, role: str, prefer: str | None) -> SlotRuntime | None:
        cands = self.table.serving(role)
        home = self.rec.get(prefer) if prefer is not None else None
        shares = self.shares
        share = (lambda r: shares.get((role, *self.table.kind_of(r)), 0.0)) if shares else None
        return router.pick(cands, lambda r: r.load, home if home in cands else None, self.rng.randrange, share)

    async def _route(self, t: Trajectory, colocated_only: bool = False) -> tuple[SlotRuntime | None, SlotRuntime | None]:
        """(prefill, decode) for disaggregated, (colocated, None) for colocated; waits for capacity.
        `colocated_only` (a request that killed P/D engines): a colocated engine now, or (None, None)."""
        waited_since: float | None = None
        while True:
            if self.fatal is not None:
                raise RunFailed(self.fatal)
            if colocated_only:
                return self._pick("colocated", t.last.get("colocated")), None
            has_pd = bool(self.table.serving("prefill")) and bool(self.table.serving("decode"))
            way = router.path(bool(self.table.serving("colocated")), has_pd, self.mode, t.last_role)
            if way == "colocated":
                return self._pick("colocated", t.last.get("colocated")), None
            if way == "pd":
                return self._pick("prefill", t.last.get("prefill")), self._pick("decode", t.last.get("decode"))
            if waited_since is None:
                waited_since = time.monotonic()
                self.starved_batches.add(t.batch)  # no worker served its role: a transition, not the layout's speed
            elif time.monotonic() - waited_since > REPAIR_AFTER_S and not self._plans and not self.lock.locked():
                self._repair("requests waiting with no worker for their role")  # self-healing: nothing is on its way
                waited_since = time.monotonic()
            self.capacity.clear()
            try:
                await asyncio.wait_for(self.capacity.wait(), timeout=0.5)
            except asyncio.TimeoutError:
                pass

    async def _call(self, r: SlotRuntime, req: GenRequest) -> GenResult | EngineDied | None:
        """The request's result; EngineDied if its engine died under it; None if we stopped it."""
        sent = time.monotonic()
        area = r.add_load(1, sent)
        actor = r.actor
        try:
            res: GenResult = await actor.generate.remote(r.slot_no, req)
            r.served += 1
            back = time.monotonic()
            if back > sent and res.finish_reason != "abort":
                self.type_times.add(r, req.phase, len(req.prompt_ids), res.cached_tokens, len(res.token_ids), (r.add_load(0, back) - area) / (back - sent))
            if self.rt.request_log:  # the engine's own timestamps (one clock per machine: `sent` and `back` read it too)
                self.metrics.write("request", worker=r.worker_id, phase=req.phase, prompt_tokens=len(req.prompt_ids), generated=len(res.token_ids), cached=res.cached_tokens,
                                   loaded=res.loaded_tokens, in_flight=r.load, sent=round(sent, 6), back=round(back, 6), actor_s=round(res.elapsed_s, 6), engine_times=res.engine_times)
            return res
        except actor_errors() as exc:
            if await self._lost_with_node(r):
                return None  # its node left the cluster: an availability event (node_watch), the turn resumes elsewhere
            if r.actor is actor and r.status in ("active", "draining"):
                error = f"worker process died: {type(exc).__name__}"
                self._mark_dead(r, error)  # not one we stopped ourselves: it died
                return EngineDied(r.worker_id, error)
            return EngineDied(r.worker_id, r.last_error) if r.slot.gpu in self.table.dead else None
        except Exception as exc:  # the engine inside a live actor failed (e.g. vLLM EngineDeadError)
            error = error_text(exc)
            if r.actor is actor and r.status in ("active", "draining"):
                self.metrics.write("engine_failed", worker=r.worker_id, request=req.request_id, error=error)
                self._mark_dead(r, error)
                await self._discard_engine(r, actor)
                return EngineDied(r.worker_id, error)
            return EngineDied(r.worker_id, error) if r.slot.gpu in self.table.dead else None
        finally:
            r.add_load(-1, time.monotonic())

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
            t.last_role = "colocated"
            phase = "full"
        else:
            pre = await self._call(first, GenRequest(rid + "-p", ctx, 1, "prefill", self.rt.temperature))
            if not isinstance(pre, GenResult) or pre.finish_reason == "abort":
                kills["prefill"] += isinstance(pre, EngineDied)
                return None
            t.last["prefill"] = first.slot.gpu
            t.last_role = "prefill"
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
            t.response_tokens.append(len(got))
            t.mask += [1] * len(got)
            t.logprobs += lps
            t.min_version = min(t.min_version, v)
            t.turns += 1
            e0 = time.monotonic()
            t.state = "env"
            obs, done, reward = await self.env.step.remote(t.id, got)
            dt = time.monotonic() - e0
            t.env_s += dt
            t.env_turn_s.append(dt * self.scale)
            if done or len(t.tokens) + len(obs) + 2 >= limit:
                if not done:
                    t.truncated = True
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
        self.trajectory_log.write(trajectory_record(t, limit))
        return t

    async def _rollout_batch(self, b: int) -> tuple[list[Trajectory], float]:
        g = self.spec.workload.group_size
        n = self.batch_size
        trajs = [Trajectory(f"b{b}-{i}", b, i // g, self.spec.seed * 100003 + b * 1009 + i // g) for i in range(n)]
        self.trajectories_in_flight = trajs
        self.type_times.reset(self.rec.values())
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
            mean_response_tokens=gen / max(sum(turns), 1), mean_env_s=float(sum(t.env_s for t in trajs) / max(sum(t.turns for t in trajs), 1)),
            generated_tokens=int(gen), rollout_s=seconds * self.scale, predicted_s=self.predicted_s, mode=self.mode, ratio=self.ratio,
            fitted_on_steps=self.predicted_from, disrupted=disruption(sum(t.resumes for t in trajs), b in self.starved_batches), kinds=self.kinds,
            type_seconds=self.type_times.rows(),
        )

    async def _kv_stats(self, r: SlotRuntime) -> dict[str, float]:
        try:
            return await r.actor.kv_stats.remote(r.slot_no)
        except actor_errors():
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


def trajectory_record(t: Trajectory, budget: int) -> TrajectoryRecord:
    """A finished trajectory as `pearl calibrate --logs` reads it (runtime/calibration/trajectory_log.py)."""
    return TrajectoryRecord(turns=t.turns, initial_prompt_tokens=t.prompt_len, new_tokens=tuple(t.new_tokens), response_tokens=tuple(t.response_tokens),
                            env_latency_s=tuple(t.env_turn_s), truncated=t.truncated, token_budget=budget, id=t.id, batch=t.batch, group=t.group)
