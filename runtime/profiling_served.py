"""Step times of a SERVED vLLM engine: AsyncLLM with its engine core in its own process.

This is how rollout workers run engines, and their steps are slower than the in-process
steps `runtime.profiling.EngineProfiler` times (the engine core's busy loop, IPC and output
serialization, the client's output handler sharing the machine): ~1.9x for the tiny
model's decode step on this 2-core machine (experiments/step_cadence.py). A profile fitted
on served samples is what predictions of real rollouts need.

With `engines` > 1 it starts that many engines at once, engine i pinned to the i-th part of
`cpu_threads_bind` ("0|1": vLLM's per-rank separator), and runs every point on all of them at
the same moment: each step is measured while the other engines run the same step (load
"mirror"), as co-located rollout engines run in a deployment. Samples pool the requests of
every engine. A profile fitted on them predicts that deployment, not a lone engine.

With `pd` (two engines) the pair runs as a disaggregated deployment does, through the same KV
connector configuration as the runtime's P/D workers (`runtime.ray_runtime.vllm_args`,
ExampleConnector on a temporary folder): engine 0 (kv_producer) prefills each point's prompts
with max_tokens=1 and stores their KV; engine 1 (kv_consumer) is then given the same prompts,
loads that KV and decodes. Prefill samples are engine 0's steps (their KV store included),
decode samples engine 1's, and "handoff" samples engine 1's first step (scheduled -> first
token: the load plus the tokens beyond the last full block), checked to have loaded KV. While
one engine of the pair is measured the other serves its own role on the point's shape back to
back (load "pd-busy"), as a deployed pair serves other trajectories' turns meanwhile.

Engines are built and requests sent as the runtime's rollout workers do (`runtime.ray_runtime.
vllm_args`: engine arguments, worker extension, stat logger; sampled tokens with their
log-probabilities, streamed one by one), only with a fixed length (ignore_eos): these cost
~1.5x the greedy, unstreamed requests of a bare engine on this machine, and a rollout pays them.

Same grid and same samples as the in-process profiler; only the measurement differs:
  - the n requests of a point are submitted while the scheduler is paused
    (`pause_generation(mode="keep", clear_cache=False)`, which keeps the warmed prefixes)
    and released together, so their prefills share one engine step;
  - the prefill step is first_token_ts - scheduled_ts of the engine core's own per-request
    timestamps (median over the n requests), checked to be one step: every request's first
    token must come within a tenth of that time of the others';
  - the decode step is (last_token_ts - first_token_ts) / (generated - 1) per request.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from runtime.profiling import EngineSettings, GridPoint, _Run

RUNTIME_TEMPERATURE = 1.0  # models.config.RuntimeSpec.temperature's default: how rollouts sample


@dataclass(frozen=True)
class Timed:
    """One request's engine timestamps (`engines.engine_times`: queued, scheduled, first token,
    last token, generated) and the prompt tokens it found cached."""

    times: tuple[float, float, float, float, int] | None
    cached: int
    overhead_s: float = float("nan")  # runtime clock: the request's way to its engine and back, beyond the engine's own time


@dataclass
class ServedProfiler:
    """Owns `settings.engines` AsyncLLMs (engine cores in their own processes) and measures their steps."""

    settings: EngineSettings
    engine_start_s: float = field(default=0.0, init=False)
    _engines: list[Any] = field(default_factory=list, init=False, repr=False)
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop, init=False, repr=False)
    _rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0), init=False, repr=False)
    _ids: Iterator[int] = field(default_factory=lambda: iter(range(1 << 62)), init=False, repr=False)
    _store: str = field(default="", init=False, repr=False)  # P/D: the connector's shared folder

    def start(self) -> None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(self.settings.kv_cache_gib)
        if self.settings.pd:
            self._store = tempfile.mkdtemp(prefix="pearl-profile-kv-")
        t0 = time.perf_counter()
        for i, bind in enumerate(self.settings.engine_bindings()):
            if bind != "auto":  # read when the engine core process starts
                os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
            role = ("prefill", "decode")[i] if self.settings.pd else "colocated"
            self._engines.append(self._loop.run_until_complete(self._make(role)))
        self.engine_start_s = time.perf_counter() - t0
        self._vocab = int(self._engines[0].model_config.get_vocab_size())

    async def _make(self, role: str) -> Any:
        """An engine built as the runtime builds its workers' (`vllm_args.engine_args`: worker
        extension, KV connector, scheduling, stat logger), with the profile's own settings on top."""
        import dataclasses

        from vllm.v1.engine.async_llm import AsyncLLM

        from runtime.ray_runtime import vllm_args

        s = self.settings
        deployed = vllm_args.EngineSettings(model=s.model_dir, dtype=s.dtype, max_model_len=s.max_model_len, block_size=s.block_size, enforce_eager=s.enforce_eager, kv_store=self._store, seed=s.seed, cpu_kv_cache_mib=s.kv_cache_gib << 10)
        args = vllm_args.engine_args(deployed, role)  # type: ignore[arg-type]
        args = dataclasses.replace(args, load_format=s.load_format, tensor_parallel_size=s.tp, distributed_executor_backend=vllm_args.executor_backend(s.tp),
                                   max_num_batched_tokens=vllm_args.scheduling_args(deployed, role).get("max_num_batched_tokens", s.max_num_batched_tokens))  # type: ignore[arg-type]
        with vllm_args.engine_core_env():
            return AsyncLLM.from_engine_args(args, stat_loggers=[vllm_args.kv_transfer_logger({"transfers": 0, "bytes": 0.0, "failed": 0, "seconds": 0.0})])

    def close(self) -> None:
        from runtime.ray_runtime import vllm_args

        for engine in self._engines:
            engine.shutdown(timeout=vllm_args.ENGINE_EXIT_GRACE_S)
        self._engines = []
        if self._store:
            shutil.rmtree(self._store, ignore_errors=True)
        pending = asyncio.all_tasks(self._loop)  # the engine's output handler
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    def _tokens(self, n: int) -> list[int]:
        return self._rng.integers(16, self._vocab, size=n).tolist()

    async def _one(self, i: int, prompt: list[int], max_tokens: int) -> Timed:
        """One request as the runtime sends it (`vllm_args.sampling_params`: sampled, with
        log-probabilities, streamed), at a fixed length; its engine's timestamps and cache hits."""
        from vllm import TokensPrompt

        from runtime.ray_runtime.engines import engine_times
        from runtime.ray_runtime.vllm_args import sampling_params

        rid = next(self._ids)
        params = sampling_params(max_tokens, RUNTIME_TEMPERATURE, rid, "full", "ExampleConnector", ignore_eos=True)
        last, cached = None, 0
        async for out in self._engines[i].generate(TokensPrompt(prompt_token_ids=prompt), params, request_id=f"s{rid}"):
            last, cached = out, out.num_cached_tokens or cached
        return Timed(engine_times(last.metrics if last is not None else None), int(cached or 0))

    async def _hold(self) -> None:
        """Pause every engine's scheduler, keeping its warmed prefixes."""
        for engine in self._engines:
            await engine.pause_generation(mode="keep", clear_cache=False)

    async def _release(self) -> None:
        await asyncio.gather(*(engine.resume_generation() for engine in self._engines))

    async def _batch(self, prompts: list[list[list[int]]], max_tokens: int) -> list[list[Timed]]:
        """Submit engine i's prompts[i] while every scheduler is paused, then release them together."""
        await self._hold()
        tasks = [[asyncio.ensure_future(self._one(i, p, max_tokens)) for p in ps] for i, ps in enumerate(prompts)]
        await self._arrived([len(ps) for ps in prompts])
        await asyncio.sleep(0.05 + 0.002 * sum(map(len, prompts)))  # every request reaches its paused core
        await self._release()
        return [list(await asyncio.gather(*ts)) for ts in tasks]

    async def _while_busy(self, measured: Any, engine: int, prompts: Any, max_tokens: int) -> Any:
        """Await `measured` while `engine` serves `prompts()` back to back at `max_tokens`.

        Measured on this 2-core machine, a P/D pair's decode step with its prefill engine idle
        took 3.8 ms at one sequence; inside `pearl train`'s P/D batches the decode engine's steps
        ran ~18% slower than that profile said (5.6 ms against 4.8 ms at ~10 sequences): the
        other engine, its actor and the driver take CPU from it there. So each engine of the pair
        is measured under the other's load: the prefill engine prefilling, the decode engine
        decoding (prompts without handed-over KV: it prefills them itself, then decodes)."""
        done = asyncio.Event()

        async def load() -> None:
            while not done.is_set():
                await asyncio.gather(*(self._one(engine, p, max_tokens) for p in prompts()))

        busy = asyncio.ensure_future(load())
        try:
            return await measured
        finally:
            done.set()
            await busy

    async def _arrived(self, counts: list[int]) -> None:
        """Wait until engine i holds counts[i] of the point's requests (in-process clients: at once)."""

    def _each(self, make: Any) -> list[list[list[int]]]:
        return [make() for _ in range(self.settings.engines)]

    def warm_up(self) -> None:
        for n in (1, 4):
            self._loop.run_until_complete(self._batch(self._each(lambda: [self._tokens(64) for _ in range(n)]), 4))

    def run_point(self, point: GridPoint, decode_steps: int) -> _Run:
        if self.settings.pd:
            return self._run_pd_point(point, decode_steps)
        n, l, c = point.batch, point.prompt_tokens, point.context_tokens
        prefixes = self._each(lambda: [self._tokens(c) for _ in range(n)])
        if c:
            self._loop.run_until_complete(self._batch(prefixes, 1))
        per_engine = self._loop.run_until_complete(self._batch([[pre + self._tokens(l) for pre in ps] for ps in prefixes], 1 + decode_steps))
        prefill_s, decode_s = zip(*(self._timings(outs, point, decode_steps) for outs in per_engine))
        cached = self._cached_tokens(point)
        overhead = statistics.median(o.overhead_s for outs in per_engine for o in outs)
        return _Run(statistics.median(prefill_s), [statistics.median(decode_s)], cached, n * (l + c) - cached, overhead_s=overhead)

    def _cached_tokens(self, point: GridPoint) -> int:
        """The warmed prefixes' full blocks: what the engine's prefix cache must hit."""
        block = self.settings.block_size
        return point.batch * (point.context_tokens // block) * block

    def _run_pd_point(self, point: GridPoint, decode_steps: int) -> _Run:
        """Prefill on engine 0 (stores KV), then load + decode on engine 1, as a P/D turn runs;
        each measured while the other engine of the pair is busy with its own role on the same
        shape (`_while_busy`): a deployed pair serves different trajectories' turns at once."""
        n, l, c = point.batch, point.prompt_tokens, point.context_tokens
        block = self.settings.block_size
        prefixes = [self._tokens(c) for _ in range(n)]
        others = [self._tokens(c) for _ in range(n)]  # the decode engine's own load: contexts it holds, not the handed-over ones
        if c:
            self._loop.run_until_complete(self._batch([prefixes, others], 1))

        def fresh(of: list[list[int]]) -> Any:
            return lambda: [pre + self._tokens(l) for pre in of]

        prompts = fresh(prefixes)()
        [produced, _] = self._loop.run_until_complete(self._while_busy(self._batch([prompts, []], 1), 1, fresh(others), 1 + decode_steps))
        prefill_s, _ = self._timings(produced, point, 0)
        [_, consumed] = self._loop.run_until_complete(self._while_busy(self._batch([[], prompts], 1 + decode_steps), 0, fresh(prefixes), 1))
        handoff_s, decode_s = self._timings(consumed, point, decode_steps, check_cache=False)
        loaded = sum(o.cached for o in consumed)
        if loaded < n * ((c + l - 1) // block) * block:  # it computes at least the last token itself
            raise RuntimeError(f"the decode engine loaded {loaded} KV tokens for {n} prompts of {c + l} (expected their full blocks): no handoff")
        cached = self._cached_tokens(point)
        overhead = statistics.median(o.overhead_s for o in produced) + statistics.median(o.overhead_s for o in consumed)  # a P/D turn calls both
        return _Run(prefill_s, [decode_s], cached, n * (l + c) - cached, handoff_s, loaded, overhead)

    def _timings(self, outs: list[Any], point: GridPoint, decode_steps: int, check_cache: bool = True) -> tuple[float, float]:
        """One engine's first step (prefill) and median decode step from its requests' timestamps,
        checked (with check_cache, that the warmed prefixes were prefix-cache hits)."""
        n, l, c = point.batch, point.prompt_tokens, point.context_tokens
        stats = [o.times for o in outs]
        if any(m is None for m in stats):
            raise RuntimeError("the served engine returned no per-request timestamps (log_stats off?)")
        prefill = statistics.median(first - scheduled for _, scheduled, first, _, _ in stats)  # type: ignore[misc]
        firsts = [first for _, _, first, _, _ in stats]  # type: ignore[misc]
        if max(firsts) - min(firsts) > 0.1 * prefill + 1e-3:
            raise RuntimeError(f"prefill of {n} x {l} tokens did not run as one engine step (first tokens {max(firsts) - min(firsts):.4f} s apart)")
        expected = self._cached_tokens(point)
        hit = sum(o.cached for o in outs)
        if check_cache and hit != expected:
            raise RuntimeError(f"prefix cache hit {hit} tokens, expected {expected} (n={n}, context={c})")
        if not decode_steps:
            return prefill, float("nan")
        decode = [(last - first) / (generated - 1) for _, _, first, last, generated in stats if generated > 1]  # type: ignore[misc]
        if len(decode) != n:
            raise RuntimeError(f"expected {decode_steps} decode steps for each of {n} requests")
        return prefill, statistics.median(decode)
