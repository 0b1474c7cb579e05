"""Scripted scenarios for tests and experiments: elastic GPUs coming and going on a schedule,
and load or policy changes at given steps (`runtime.elastic_events`, `runtime.load_changes`,
or a real availability trace). Scaffolding around a run, not part of the controller: it
only changes what the controller reads (availability, workload, policy) and asks it to
decide.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from runtime.ray_runtime.resources import AvailabilityChange


def apply_load_change(ctl: Any, b: int) -> bool:
    """Apply the configured changes for batch `b`; True if the workload changed."""
    changed = False
    for ch in ctl.rt.load_changes:
        if ch.at_step == b and ch.policy:
            from planner.policies import get_policy

            ctl.policy = get_policy(ch.policy)
            ctl.metrics.write("policy_change", step=b, policy=ch.policy)
            ctl.log(f"policy change at step {b}: {ch.policy}")
        if ch.at_step == b and ch.workload:
            w = ctl.spec.workload.model_validate({**ctl.spec.workload.model_dump(), **ch.workload})
            ctl.spec = ctl.spec.model_copy(update={"workload": w})
            ctl.tracker.spec = ctl.tracker.spec.model_copy(update={"workload": w})
            ctl.batch_size = w.trajectories_per_batch
            ctl.env.set_workload.remote(w.turns, w.env_latency_s, w.initial_prompt_tokens, w.new_tokens_per_turn)
            ctl.response_tokens = int(round(w.response_tokens_per_turn.expected()))
            ctl.metrics.write("load_change", step=b, workload=ch.workload)
            ctl.log(f"load change at step {b}: {ch.workload}")
            changed = True
    return changed


async def elastic_loop(ctl: Any, schedule: tuple[AvailabilityChange, ...]) -> None:
    """Follow the availability schedule: a shrink stops the workers on vanished GPUs at once
    (their requests resume elsewhere), then the policy decides.

    Times count from the start of the first rollout batch (or of batch `after_step`), when the
    initial layout serves, as the simulator's warm start does: the engines' first start takes
    whatever the machine needs, and it must not use up the trace."""
    table = ctl.table
    for ch in schedule:
        step = 0 if ch.after_step is None else ch.after_step
        while step not in ctl.batch_started:
            await asyncio.sleep(0.05)
        origin = ctl.batch_started[step]
        delay = ch.at_s - (time.monotonic() - origin)
        if delay > 0:
            await asyncio.sleep(delay)
        before = table.elastic_now()
        if not table.set_elastic(ch.available, ch.gpu_type):
            continue
        ctl.metrics.write("availability", elastic=ch.available, gpu_type=ch.gpu_type, at_s=round(time.monotonic() - ctl.t0, 3))
        ctl.log(f"elastic GPUs{f' ({ch.gpu_type})' if ch.gpu_type else ''}: {before} -> {table.elastic_now()}")
        await ctl.preempt(table.gone_elastic())
        await ctl.decide("availability")
