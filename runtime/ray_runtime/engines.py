"""Engine backends behind one interface: a real vLLM `AsyncLLM`, or an emulated engine.

A rollout worker owns one engine per GPU slot and never needs to know which backend it
drives. Requests carry token ids (the trajectory's whole context, so prefix caching reuses
earlier turns) and a phase:
  full     colocated: prefill and decode on this engine;
  prefill  the prefill half of a disaggregated turn: compute the prompt's KV and hand it
           to the connector (ExampleConnector: a shared folder; NixlConnector: the decode
           engine pulls it), generating one token;
  decode   the decode half: the prompt's KV comes from the connector, then decode.
Outputs stream (DELTA) inside the engine, so an aborted request still returns the tokens
it generated: the controller keeps that prefix and resumes the turn elsewhere.
What a vLLM engine is built from (settings, KV connector, scheduling limits) is `vllm_args`;
`EngineSettings` is re-exported here because every engine owner passes it in.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from runtime.ray_runtime.vllm_args import ENGINE_EXIT_GRACE_S, EngineSettings, engine_args, engine_core_env, kv_transfer_logger, sampling_params
from runtime.ray_runtime.weight_sync import EMULATED_WEIGHTS

Role = Literal["colocated", "prefill", "decode"]
Phase = Literal["full", "prefill", "decode"]

LOADED_TOKENS = "pearl_loaded_tokens"  # kv_transfer_params key: KV tokens the connector loaded (kv_connector)


class EngineStartError(RuntimeError):
    """An engine could not start (bad model path, out of memory, bad connector settings)."""


@dataclass(frozen=True)
class GenRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    phase: Phase = "full"
    temperature: float = 1.0
    seed: int | None = None
    kv_params: dict[str, Any] | None = None  # NixlConnector hand-off from the prefill result
    ignore_eos: bool = False  # fixed-length requests: `pearl profile --clock runtime` times steps with them


@dataclass(frozen=True)
class GenResult:
    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # sampled-token log-probabilities under the behaviour policy
    finish_reason: str | None  # "stop" | "length" | "abort"
    cached_tokens: int  # prompt tokens not recomputed (local prefix cache + KV from the connector)
    weight_version: int  # version when the request finished (pauses may update it mid-request)
    kv_params: dict[str, Any] | None = None
    elapsed_s: float = 0.0
    loaded_tokens: int = 0  # prompt tokens whose KV the connector loaded from a prefill engine
    first_version: int = -1  # version when the request arrived (< weight_version: updated mid-request)
    # vLLM's per-request stats (queued, scheduled, first token, last token timestamps: one clock per
    # engine; tokens generated), what profiles time steps with; None when the engine kept none
    engine_times: tuple[float, float, float, float, int] | None = None


def engine_times(stats: Any) -> tuple[float, float, float, float, int] | None:
    """(queued, scheduled, first token, last token, generated tokens) of vLLM's per-request stats, if it kept them."""
    if stats is None or not getattr(stats, "first_token_ts", 0.0):
        return None
    return (float(stats.queued_ts), float(stats.scheduled_ts), float(stats.first_token_ts), float(stats.last_token_ts), int(stats.num_generation_tokens))


class Engine(Protocol):
    role: Role
    weight_version: int

    async def start(self) -> dict[str, Any]: ...
    async def generate(self, req: GenRequest) -> GenResult: ...
    async def abort(self, request_id: str) -> None: ...
    async def load_weights(self, blob: bytes, version: int) -> dict[str, float]: ...
    async def probe_logprobs(self, tokens: tuple[int, ...]) -> tuple[float, ...]: ...
    async def kv_stats(self) -> dict[str, float]: ...
    async def shutdown(self) -> None: ...


# ----------------------------------------------------------------------------- vLLM
class VLLMEngine:
    """One vLLM AsyncLLM in a role. Role changes rebuild the engine (the connector is fixed at start)."""

    def __init__(self, settings: EngineSettings, role: Role) -> None:
        self.settings, self.role = settings, role
        self.weight_version = 0
        self._engine: Any = None
        self._blob: bytes | None = None  # latest weights, reloaded after a restart
        self.kv_tally = {"transfers": 0, "bytes": 0.0, "failed": 0, "seconds": 0.0}  # KV this engine pulled

    async def start(self) -> dict[str, Any]:
        if not os.path.exists(os.path.join(self.settings.model, "config.json")):
            raise EngineStartError(f"model path {self.settings.model!r} has no config.json")
        from vllm.v1.engine.async_llm import AsyncLLM

        if self.role != "colocated" and self.settings.kv_connector == "ExampleConnector":
            os.makedirs(self.settings.kv_store, exist_ok=True)
        t0 = time.perf_counter()
        try:
            with engine_core_env(self.settings.tensor_parallel_size):
                self._engine = AsyncLLM.from_engine_args(engine_args(self.settings, self.role), stat_loggers=[kv_transfer_logger(self.kv_tally)])
        except Exception as exc:  # vLLM raises many types; the caller needs one clear line
            raise EngineStartError(f"vLLM engine ({self.role}, model {self.settings.model!r}) failed to start: {type(exc).__name__}: {exc}") from None
        start_s = time.perf_counter() - t0
        if self._blob is not None and self._blob != EMULATED_WEIGHTS:
            await self._engine.collective_rpc("pearl_load_weights", args=(self._blob,))
        return {"start_s": start_s, "pid": os.getpid(), "bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "")}

    def _sampling(self, req: GenRequest) -> Any:
        return sampling_params(req.max_tokens, req.temperature, req.seed, req.phase, self.settings.kv_connector, req.kv_params, ignore_eos=req.ignore_eos)

    async def generate(self, req: GenRequest) -> GenResult:
        from vllm import TokensPrompt

        t0 = time.perf_counter()
        first_version = self.weight_version
        toks: list[int] = []
        lps: list[float] = []
        finish, cached, kv_out, stats = None, 0, None, None
        async for out in self._engine.generate(TokensPrompt(prompt_token_ids=list(req.prompt_ids)), self._sampling(req), request_id=req.request_id):
            stats = out.metrics or stats
            o = out.outputs[0]
            toks.extend(o.token_ids)
            if o.logprobs:
                lps.extend(float(d[t].logprob) for t, d in zip(o.token_ids, o.logprobs))
            finish = o.finish_reason or finish
            cached = out.num_cached_tokens or cached
            kv_out = getattr(out, "kv_transfer_params", None) or kv_out
        if len(lps) != len(toks):
            lps = (lps + [0.0] * len(toks))[: len(toks)]
        kv_out = dict(kv_out) if kv_out else None
        loaded = int(kv_out.pop(LOADED_TOKENS, 0)) if kv_out else 0
        return GenResult(req.request_id, tuple(toks), tuple(lps), finish, int(cached or 0), self.weight_version, kv_out or None, time.perf_counter() - t0, loaded, first_version, engine_times(stats))

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    def _pause_mode(self) -> str:
        """'keep' freezes in-flight requests (they continue after the reload). A NIXL P/D
        engine cannot freeze: a frozen scheduler never completes the asynchronous KV pulls
        its requests wait on (decode side) or hold blocks for (prefill side), so the pause
        never finishes and, paused together, the two engines deadlock. Those engines pause
        with 'wait': new requests queue, in-flight ones finish on the old weights."""
        return "wait" if self.settings.kv_connector == "NixlConnector" and self.role != "colocated" else "keep"

    async def hold(self) -> None:
        """Pause the scheduler with requests kept and prefixes cached: a profiler releases a
        point's requests together, so that their prefills share one step."""
        await self._engine.pause_generation(mode="keep", clear_cache=False)

    async def release(self) -> None:
        await self._engine.resume_generation()

    async def load_weights(self, blob: bytes, version: int) -> dict[str, float]:
        """pause -> reload -> resume; in-flight requests survive (see _pause_mode)."""
        t0 = time.perf_counter()
        if blob == EMULATED_WEIGHTS:  # an emulated trainer: keep these weights, count the version
            self.weight_version, self._blob = version, blob
            return {"pause_s": 0.0, "total_s": 0.0}
        try:
            await self._engine.pause_generation(mode=self._pause_mode(), clear_cache=True)
            t1 = time.perf_counter()
            await self._engine.collective_rpc("pearl_load_weights", args=(blob,))
            self.weight_version = version
            self._blob = blob
            await self._engine.update_weight_version(str(version))
        finally:
            await self._engine.resume_generation()
        return {"pause_s": t1 - t0, "total_s": time.perf_counter() - t0}

    async def kv_stats(self) -> dict[str, float]:
        return dict(self.kv_tally)

    async def probe_logprobs(self, tokens: tuple[int, ...]) -> tuple[float, ...]:
        """log p(token_i | tokens_<i), i >= 1, at the engine's current weights (weight_sync)."""
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
        final = None
        async for out in self._engine.generate(TokensPrompt(prompt_token_ids=list(tokens)), params, request_id=f"probe-{time.monotonic_ns()}"):
            final = out
        assert final is not None and final.prompt_logprobs is not None
        return tuple(float(d[t].logprob) for t, d in zip(tokens[1:], final.prompt_logprobs[1:]))

    async def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown(timeout=ENGINE_EXIT_GRACE_S)
            self._engine = None


# ----------------------------------------------------------------------------- emulated
@dataclass
class _Pending:
    req: GenRequest
    rid: int
    cached: int
    carried: int  # tokens generated before an eviction of another request forced a resubmit
    done: asyncio.Future


class EmulatedEngine:
    """The project's engine model (models.engine.Engine) driven on the wall clock.

    Virtual time = wall seconds since start x `time_scale`. A driver task sleeps until the
    model's next event, completes it and resolves the requests that finished. Token ids are
    drawn from a seeded generator with a uniform log-probability: emulation is for
    scheduling and scale (many virtual GPUs in one process), not for learning.
    """

    def __init__(self, step_model: Any, role: Role, vocab: int = 1024, time_scale: float = 1.0, seed: int = 0, block: int = 32, prefix_cache_hit: float = 1.0) -> None:
        import numpy as np

        from models.engine import Engine as EngineModel
        from models.engine import EngineConfig

        self.role = role
        self.weight_version = 0
        self._step_model = step_model
        self._model = EngineModel(EngineConfig.for_model(step_model, role))
        self._vocab, self._scale, self._block = vocab, time_scale, block
        self._hit = prefix_cache_hit  # the workload's share of a held prefix that hits (as simulator and predictor)
        self._rng = np.random.default_rng(seed)
        self._pending: dict[int, _Pending] = {}
        self._by_name: dict[str, int] = {}
        self._next = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._t0 = time.monotonic()

    @property
    def busy_s(self) -> float:
        return float(self._model.stats.busy_s)

    def _now(self) -> float:
        return (time.monotonic() - self._t0) * self._scale

    async def start(self) -> dict[str, Any]:
        self._task = asyncio.get_running_loop().create_task(self._drive())
        return {"start_s": 0.0, "pid": os.getpid(), "bind": "emulated"}

    def _cached_prefix(self, ids: tuple[int, ...]) -> int:
        """Longest prefix of whole blocks the engine model's prefix cache still holds (vLLM's
        block-level prefix caching); the workload's hit share of it counts."""
        cache = self._model.cache
        best = 0
        for n in range(self._block, len(ids), self._block):
            if not cache.touch(hash(ids[:n])):
                break
            best = n
        return int(self._hit * best)

    def _remember(self, ids: tuple[int, ...]) -> None:
        """Cache this sequence's blocks in the KV the running requests leave free (LRU out)."""
        cache = self._model.cache
        for n in range(self._block, len(ids), self._block):
            cache.put(hash(ids[:n]), self._block)
        cache.shrink(self._model.free_kv_tokens())

    def _submit(self, p: _Pending, already: int = 0) -> None:
        from models.engine import Request

        n = len(p.req.prompt_ids) + already
        decode = 0 if p.req.phase == "prefill" else max(p.req.max_tokens - already, 1)
        prefix = n - 1 if p.req.phase == "decode" else (p.cached if already == 0 else n - 1)
        self._model.submit(Request(p.rid, max(n - prefix, 1), prefix, decode), self._now())
        self._wake.set()

    async def generate(self, req: GenRequest) -> GenResult:
        t0 = time.perf_counter()
        first_version = self.weight_version
        rid = self._next
        self._next += 1
        cached = len(req.prompt_ids) - 1 if req.phase == "decode" else self._cached_prefix(req.prompt_ids)
        p = _Pending(req, rid, cached, 0, asyncio.get_running_loop().create_future())
        self._pending[rid] = p
        self._by_name[req.request_id] = rid
        self._submit(p)
        generated, aborted = await p.done
        self._by_name.pop(req.request_id, None)
        self._remember(req.prompt_ids)
        n = 1 if req.phase == "prefill" else generated
        toks = tuple(int(x) for x in self._rng.integers(4, self._vocab, n))
        lp = tuple([-math.log(self._vocab)] * n)
        return GenResult(req.request_id, toks, lp, "abort" if aborted else "length", cached, self.weight_version, None, time.perf_counter() - t0, 0, first_version)

    async def _drive(self) -> None:
        while True:
            t_next = self._model.next_event()
            self._wake.clear()
            if math.isinf(t_next):
                await self._wake.wait()
                continue
            delay = (t_next - self._now()) / self._scale
            if delay > 0:
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=delay)
                    continue  # new work arrived: the model re-planned; look again
                except asyncio.TimeoutError:
                    pass
            for out in self._model.on_event(t_next):
                p = self._pending.pop(out.rid, None)
                if p is not None and not p.done.done():
                    p.done.set_result((p.carried + out.generated, False))

    def retime(self, step_model: Any) -> None:
        """Run at `step_model` from the next step on (the engines sharing this one's node changed in number)."""
        from models.engine import EngineConfig

        if step_model is self._step_model:
            return
        self._step_model = step_model
        self._model.retime(EngineConfig.for_model(step_model, self.role), self._now())
        self._wake.set()

    async def abort(self, request_id: str) -> None:
        rid = self._by_name.get(request_id)
        if rid is None or rid not in self._pending:
            return
        evicted = {e.rid: e.generated for e in self._model.evict_all(self._now())}
        target = self._pending.pop(rid)
        target.done.set_result((target.carried + evicted.get(rid, 0), True))
        for other in self._pending.values():  # the model evicts everyone: put the others back with their progress
            got = evicted.get(other.rid, 0)
            other.carried += got
            self._submit(other, other.carried)

    async def load_weights(self, blob: bytes, version: int) -> dict[str, float]:
        self.weight_version = version
        return {"pause_s": 0.0, "total_s": 0.0}

    async def probe_logprobs(self, tokens: tuple[int, ...]) -> tuple[float, ...]:
        return (float(self.weight_version),)  # no weights: the version stands for them

    async def kv_stats(self) -> dict[str, float]:
        return {"transfers": 0, "bytes": 0.0, "failed": 0, "seconds": 0.0}  # the model moves no KV

    async def shutdown(self) -> None:
        for name in list(self._by_name):
            await self.abort(name)
        if self._task is not None:
            self._task.cancel()
            self._task = None
