"""Run a real `Controller` to completion with side tasks beside it (real-engine test modules)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Callable, Coroutine


def run_controller(config: str, steps: int, metrics: Path, side: Callable[[Any], list[Coroutine[Any, Any, None]]]) -> dict:
    """Load `config`, run `steps` training steps with `side(ctl)` tasks running beside them,
    shut down, and return summary, worker versions, trajectories and the metrics records."""
    from models.config import load_experiment
    from runtime.ray_runtime.controller import Controller

    ctl = Controller(load_experiment(config), metrics_path=str(metrics), log=lambda m: print(m, flush=True))
    out: dict = {}

    async def main() -> None:
        tasks = [asyncio.ensure_future(c) for c in side(ctl)]
        try:
            out["summary"] = await ctl.run(steps)
            out["versions"] = await ctl.worker_versions()
            out["trajectories"] = list(ctl.trajectories)
        finally:
            for t in tasks:
                t.cancel()
            await ctl.shutdown()

    asyncio.run(main())
    out["records"] = [json.loads(line) for line in metrics.read_text().splitlines()]
    return out


async def probe_until(ctl: Any, probes: list[dict], proven: Callable[[dict], bool]) -> None:
    """While a prefill and a decode engine both serve, probe the KV handoff until one probe
    proves it (a probe can race a role change); every probe that generated is kept."""
    while True:
        roles = {r.role for r in ctl.rec.values() if r.status == "active"}
        if {"prefill", "decode"} <= roles:
            probe = await ctl.probe_kv_handoff()
            if probe.get("decode_generated"):
                probes.append(probe)
                if proven(probe):
                    return
        await asyncio.sleep(0.2)
