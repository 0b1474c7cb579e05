"""Step times of a SERVED vLLM engine: AsyncLLM with its engine core in its own process.

This is how rollout workers run engines, and their steps are slower than the in-process
steps `runtime.profiling.EngineProfiler` times (the engine core's busy loop, IPC and output
serialization, the client's output handler sharing the machine): ~1.9x for the tiny
model's decode step on this 2-core machine (experiments/step_cadence.py). A profile fitted
on served samples is what predictions of real rollouts need.

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
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from runtime.profiling import EngineSettings, GridPoint, _Run


@dataclass
class ServedProfiler:
    """Owns one AsyncLLM (engine core in its own process) and measures its steps."""

    settings: EngineSettings
    engine_start_s: float = field(default=0.0, init=False)
    _engine: Any = field(default=None, init=False, repr=False)
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop, init=False, repr=False)
    _rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0), init=False, repr=False)
    _ids: Iterator[int] = field(default_factory=lambda: iter(range(1 << 62)), init=False, repr=False)

    def start(self) -> None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(self.settings.kv_cache_gib)
        if self.settings.cpu_threads_bind != "auto":
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = self.settings.cpu_threads_bind
        t0 = time.perf_counter()
        self._engine = self._loop.run_until_complete(self._make())
        self.engine_start_s = time.perf_counter() - t0
        self._vocab = int(self._engine.model_config.get_vocab_size())

    async def _make(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(**self.settings.engine_kwargs()))

    def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
        pending = asyncio.all_tasks(self._loop)  # the engine's output handler
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    def _tokens(self, n: int) -> list[int]:
        return self._rng.integers(16, self._vocab, size=n).tolist()

    async def _one(self, prompt: list[int], max_tokens: int) -> Any:
        from vllm import SamplingParams, TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)
        last = None
        async for out in self._engine.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id=f"s{next(self._ids)}"):
            last = out
        return last

    async def _batch(self, prompts: list[list[int]], max_tokens: int) -> list[Any]:
        """Submit every prompt while the scheduler is paused, then release them together."""
        await self._engine.pause_generation(mode="keep", clear_cache=False)
        tasks = [asyncio.ensure_future(self._one(p, max_tokens)) for p in prompts]
        await asyncio.sleep(0.05 + 0.002 * len(prompts))  # every request reaches the paused core
        await self._engine.resume_generation()
        return list(await asyncio.gather(*tasks))

    def warm_up(self) -> None:
        for n in (1, 4):
            self._loop.run_until_complete(self._batch([self._tokens(64) for _ in range(n)], 4))

    def run_point(self, point: GridPoint, decode_steps: int) -> _Run:
        n, l, c = point.batch, point.prompt_tokens, point.context_tokens
        prefixes = [self._tokens(c) for _ in range(n)]
        if c:
            self._loop.run_until_complete(self._batch(prefixes, 1))
        outs = self._loop.run_until_complete(self._batch([pre + self._tokens(l) for pre in prefixes], 1 + decode_steps))
        stats = [o.metrics for o in outs]
        if any(m is None or not m.first_token_ts for m in stats):
            raise RuntimeError("the served engine returned no per-request timestamps (log_stats off?)")
        prefill = statistics.median(m.first_token_ts - m.scheduled_ts for m in stats)
        firsts = [m.first_token_ts for m in stats]
        if max(firsts) - min(firsts) > 0.1 * prefill + 1e-3:
            raise RuntimeError(f"prefill of {n} x {l} tokens did not run as one engine step (first tokens {max(firsts) - min(firsts):.4f} s apart)")
        cached = sum(int(o.num_cached_tokens or 0) for o in outs)
        expected = n * (c // self.settings.block_size) * self.settings.block_size
        if cached != expected:
            raise RuntimeError(f"prefix cache hit {cached} tokens, expected {expected} (n={n}, context={c})")
        decode = [(m.last_token_ts - m.first_token_ts) / (m.num_generation_tokens - 1) for m in stats if m.num_generation_tokens > 1]
        if len(decode) != n:
            raise RuntimeError(f"expected {decode_steps} decode steps for each of {n} requests")
        return _Run(prefill, [statistics.median(decode)], cached, n * (l + c) - cached)
