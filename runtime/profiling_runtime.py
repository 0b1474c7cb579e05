"""Step times of engines inside the runtime itself: `pearl profile --clock runtime`.

The served profiler (runtime/profiling_served.py) runs AsyncLLM engines in its own process;
the runtime runs each engine inside a RolloutWorker Ray actor, with its client, the Ray
core worker and raylet, and the driver beside it. On a machine whose cores the engines fill,
those processes take their CPU from the engines: measured on this 2-core machine, a decode
step at 8 sequences took ~8.6 ms served and ~10.9 ms through the actors (the same requests,
timed by the same engine-core timestamps). A profile of what is deployed has to be measured
here.

This profiler is the served one with the engines swapped for the runtime's: Ray starts as
`pearl train` starts it locally (one custom resource per slot), each engine is a
`RolloutWorker` actor started on its slot with the slot's binding (`resources.slot_env`),
and every request is a `GenRequest` sent from this process through Ray, as the rollout
driver sends turns (P/D pairs: the prefill request's KV parameters travel to the decode
request). Points are released together by pausing each engine's scheduler in the actor
(`RolloutWorker.hold` / `release`); timings are the engine core's own per-request
timestamps (`GenResult.engine_times`), so the grid, samples and checks are the served
profiler's.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from runtime.profiling_served import RUNTIME_TEMPERATURE, ServedProfiler, Timed


@dataclass
class RuntimeProfiler(ServedProfiler):
    """`settings.engines` RolloutWorker actors (one slot each) measured through Ray."""

    _actors: list[Any] = field(default_factory=list, init=False, repr=False)
    _roles: list[str] = field(default_factory=list, init=False, repr=False)
    _kv: dict[tuple[int, ...], Any] = field(default_factory=dict, init=False, repr=False)  # P/D: prompt -> the prefill's KV parameters

    def start(self) -> None:
        import ray

        from runtime.ray_runtime.resources import Slot, resource_name, slot_env
        from runtime.ray_runtime.rollout_worker import RolloutWorker
        from runtime.ray_runtime.vllm_args import EngineSettings

        s = self.settings
        self._store = tempfile.mkdtemp(prefix="pearl-profile-kv-")
        slots = [Slot(f"profile-{i}", i, "rollout", resource_name(i), bind if bind != "auto" else str(i % (os.cpu_count() or 1))) for i, bind in enumerate(s.engine_bindings())]
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": str(s.kv_cache_gib), "TOKENIZERS_PARALLELISM": "false", "RAY_AUTH_MODE": "disabled",
               "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"), "PYTHONPATH": repo}
        ray.init(address="local", num_cpus=os.cpu_count() or 1, resources={slot.resource: 1.0 for slot in slots}, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": env}, object_store_memory=256 * 2**20)
        # the runtime's engine settings (bootstrap._engine_settings), the profile's own on top
        deployed = EngineSettings(os.path.abspath(s.model_dir), s.dtype, s.max_model_len, s.block_size, s.enforce_eager, kv_store=self._store, seed=s.seed, cpu_kv_cache_mib=s.kv_cache_gib << 10)
        self._roles = [("prefill", "decode")[i] if s.pd else "colocated" for i in range(len(slots))]
        t0 = time.perf_counter()
        self._actors = [ray.remote(RolloutWorker).options(num_cpus=0, resources={slot.resource: 1.0}, runtime_env={"env_vars": slot_env(slot, "cpu")}, max_concurrency=1000)
                        .remote("vllm", deployed, None, ()) for slot in slots]
        infos = ray.get([a.start_slot.remote(0, role) for a, role in zip(self._actors, self._roles)])
        failed = [str(i.get("error")) for i in infos if not i.get("ok")]
        if failed:
            raise RuntimeError(f"a runtime engine failed to start: {failed[0]}")
        self.engine_start_s = time.perf_counter() - t0
        from transformers import AutoConfig

        self._vocab = int(AutoConfig.from_pretrained(s.model_dir).vocab_size)

    def close(self) -> None:
        import ray

        try:
            ray.get([a.shutdown.remote() for a in self._actors], timeout=60)
        except Exception:  # a dead actor has nothing left to shut down
            pass
        self._actors = []
        ray.shutdown()
        shutil.rmtree(self._store, ignore_errors=True)
        self._loop.close()

    async def _one(self, i: int, prompt: list[int], max_tokens: int) -> Timed:
        """A turn's request as the rollout driver sends it; a P/D decode carries its prefill's KV parameters."""
        from runtime.ray_runtime.engines import GenRequest

        rid = next(self._ids)
        role = self._roles[i]
        key = tuple(prompt)
        phase = "full" if role == "colocated" else role
        req = GenRequest(f"p{rid}", key, max_tokens, phase, RUNTIME_TEMPERATURE, rid, self._kv.pop(key, None) if role == "decode" else None, ignore_eos=True)  # type: ignore[arg-type]
        sent = time.monotonic()
        res = await self._actors[i].generate.remote(0, req)
        back = time.monotonic()
        if role == "prefill":
            self._kv[key] = res.kv_params
        times = res.engine_times
        # the request's way here and back (one machine: the engine's stats and this process
        # read the same monotonic clock): the driver -> actor -> engine core hops before it is
        # queued, and the last token's way back
        overhead = (times[0] - sent) + (back - times[3]) if times is not None else float("nan")
        return Timed(times, int(res.cached_tokens), overhead)

    async def _arrived(self, counts: list[int]) -> None:
        """A request crosses Ray before it reaches its engine: wait until every actor holds all
        of its point's requests (at most 30 s)."""
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            held = await asyncio.gather(*(a.in_flight.remote(0) for a in self._actors))
            if all(h >= n for h, n in zip(held, counts)):
                return
            await asyncio.sleep(0.01)

    async def _hold(self) -> None:
        await asyncio.gather(*(a.hold.remote(0) for a in self._actors))

    async def _release(self) -> None:
        await asyncio.gather(*(a.release.remote(0) for a in self._actors))
