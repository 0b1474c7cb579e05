"""Run a real `Controller` to completion with side tasks beside it (real-engine test modules)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Callable, Coroutine


class RunDeadline(AssertionError):
    """A real-engine run passed its own deadline: the message says what it was waiting for."""


def run_controller(config: str | Any, steps: int, metrics: Path, side: Callable[[Any], list[Coroutine[Any, Any, None]]], deadline_s: float) -> dict:
    """Load `config` (a path or an ExperimentSpec), run `steps` training steps with `side(ctl)`
    tasks beside them, shut down, and return summary (or the run's error), worker versions,
    trajectories and the metrics records. Past `deadline_s` (well under pytest's timeout) the
    run is cancelled and RunDeadline names what it was waiting for."""
    from models.config import load_experiment
    from runtime.ray_runtime.controller import Controller

    spec = load_experiment(config) if isinstance(config, (str, Path)) else config
    ctl = Controller(spec, metrics_path=str(metrics), log=lambda m: print(m, flush=True))
    out: dict = {}

    async def main() -> None:
        tasks = [asyncio.ensure_future(c) for c in side(ctl)]
        try:
            out["summary"] = await asyncio.wait_for(ctl.run(steps), timeout=deadline_s)
            out["versions"] = await ctl.worker_versions()
            out["trajectories"] = list(ctl.trajectories)
        except asyncio.TimeoutError:
            waiting = json.dumps(ctl.progress(), default=str)
            print(f"run past its {deadline_s:.0f} s deadline, waiting for: {waiting}", flush=True)
            raise RunDeadline(f"{config}: run past its {deadline_s:.0f} s deadline; waiting for: {waiting}") from None
        except Exception as exc:  # the run's own error (RunFailed, ...) is what some tests assert
            out["error"] = exc
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.wait_for(ctl.shutdown(), timeout=120)

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
