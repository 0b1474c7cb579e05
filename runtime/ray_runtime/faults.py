"""Fault injection for tests: an engine that dies on a chosen request, as a crashed vLLM
engine does (the request that killed it and every other request in flight on it fail with
the engine's error, and so does every later call). It lets a test drive the controller's
restart bound, backoff and poisoned-request handling on real Ray without a real crash.

Configured by `runtime.faults` (models.config.FaultSpec); never active unless listed there.
"""

from __future__ import annotations

from typing import Any

from runtime.ray_runtime.engines import Engine, GenRequest, GenResult


class InjectedEngineDeath(RuntimeError):
    """What a faulty engine raises: its message names the request that killed it."""


class FaultyEngine:
    """Wraps an engine; the first request matching a fault (id substring, role) kills it."""

    def __init__(self, engine: Engine, faults: tuple[tuple[str, str], ...]) -> None:
        self._engine = engine
        self._faults = faults
        self._inflight: set[str] = set()
        self.dead: str | None = None

    def __getattr__(self, name: str) -> Any:  # role, weight_version, busy_s, ... of the wrapped engine
        return getattr(self._engine, name)

    def _check(self) -> None:
        if self.dead is not None:
            raise InjectedEngineDeath(f"engine dead: {self.dead}")

    def _matches(self, req: GenRequest) -> bool:
        return any(sub in req.request_id and role in ("any", self._engine.role) for sub, role in self._faults)

    async def start(self) -> dict[str, Any]:
        return await self._engine.start()

    async def generate(self, req: GenRequest) -> GenResult:
        self._check()
        if self._matches(req):
            self.dead = f"injected fault on request {req.request_id} ({self._engine.role})"
            for rid in list(self._inflight):  # everything in flight dies with the engine
                await self._engine.abort(rid)
            self._check()
        self._inflight.add(req.request_id)
        try:
            res = await self._engine.generate(req)
        finally:
            self._inflight.discard(req.request_id)
        self._check()
        return res

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    async def load_weights(self, blob: bytes, version: int) -> dict[str, float]:
        self._check()
        return await self._engine.load_weights(blob, version)

    async def probe_logprobs(self, tokens: tuple[int, ...]) -> tuple[float, ...]:
        self._check()
        return await self._engine.probe_logprobs(tokens)

    async def kv_stats(self) -> dict[str, float]:
        return await self._engine.kv_stats()

    async def shutdown(self) -> None:
        await self._engine.shutdown()
