"""GPU slots as Ray custom resources, their fixed bindings, and elastic availability over time.

Every GPU of the cluster spec is a stable slot with the planner's GPU id, one Ray custom
resource (`pearl_gpu_<n>`, amount 1) and a fixed binding: the CPU cores its vLLM engine is
pinned to on this machine (`VLLM_CPU_OMP_THREADS_BIND`) or the device index on a GPU node.
Roles and membership change; bindings never do. Locally all slots are declared when Ray
starts; on a real cluster the nodes declare their slots (`ray start --resources`) and an
elastic node's slots come and go with it.

Elastic availability follows either inline events from the config or a real trace
(`runtime/traces.py`), with time compressed by `trace.time_scale` (trace seconds per run
second) and the run's own `runtime.time_scale` (virtual seconds per wall second).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from planner.state import ClusterState


@dataclass(frozen=True)
class Slot:
    gpu: str  # planner GPU id, stable
    index: int
    pool: str
    resource: str
    binding: str


@dataclass(frozen=True)
class AvailabilityChange:
    at_s: float  # wall seconds after the first rollout batch starts (or batch `after_step`)
    available: int  # elastic GPUs that exist from then on (of `gpu_type` only, if given)
    after_step: int | None = None
    gpu_type: str | None = None  # `elastic_traces`: the one elastic GPU type this change moves


def resource_name(index: int) -> str:
    return f"pearl_gpu_{index}"


def make_slots(state: ClusterState, bindings: list[str] | None = None, cores: int | None = None, device: str = "cpu") -> tuple[Slot, ...]:
    """One slot per GPU; binding from config, else the slot's core (index mod core count) on
    CPU, or the GPU's device index on its node with CUDA."""
    cores = cores or os.cpu_count() or 1
    out = []
    on_node: dict[str, int] = {}
    for i, g in enumerate(state.gpus):
        local = on_node.get(g.node, 0)
        on_node[g.node] = local + 1
        default = str(local) if device == "cuda" else str(i % cores)
        bind = bindings[i % len(bindings)] if bindings else default
        out.append(Slot(g.id, i, g.pool, resource_name(i), bind))
    return tuple(out)


NIXL_BASE_PORT = 5600
NIXL_PORT_STRIDE = 16  # vLLM adds the engine's TP / DP rank to the side-channel base port


def slot_env(slot: Slot, device: str) -> dict[str, str]:
    """Environment of the process that owns a slot's engine: its fixed binding and its own
    NIXL side-channel port (engines of one node must not share it).

    With CUDA, Ray would set CUDA_VISIBLE_DEVICES='' for an actor that asks for no `GPU`
    resource (slots are custom resources), so the binding is set here and Ray told not to
    override it. On CPU the binding pins the engine's threads to its cores.
    """
    env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(NIXL_BASE_PORT + NIXL_PORT_STRIDE * slot.index)}
    if device == "cuda":
        env.update(CUDA_VISIBLE_DEVICES=slot.binding, RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES="1")
    else:
        env["VLLM_CPU_OMP_THREADS_BIND"] = slot.binding
    return env


def group_env(group: tuple[Slot, ...], device: str) -> dict[str, str]:
    """Environment of the process that owns a TP group's engine (the lead slot first): the lead's
    (`slot_env`), bound to every slot of the group: CUDA devices '0,1', CPU ranks '0|1' (vLLM's
    per-rank binding of its CPU workers)."""
    env = slot_env(group[0], device)
    if len(group) > 1:
        key = "CUDA_VISIBLE_DEVICES" if device == "cuda" else "VLLM_CPU_OMP_THREADS_BIND"
        env[key] = ("," if device == "cuda" else "|").join(s.binding for s in group)
    return env


def resolve_device(device: str) -> str:
    """'auto' means CUDA when this process sees a GPU; a driver without GPUs must say 'cuda'."""
    if device != "auto":
        return device
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def ray_resources(slots: tuple[Slot, ...]) -> dict[str, float]:
    return {s.resource: 1.0 for s in slots}


def elastic_schedule(spec: Any, elastic_gpus: int) -> tuple[AvailabilityChange, ...]:
    """Availability changes of the elastic pool, in wall seconds after the first rollout batch starts.

    Inline `runtime.elastic_events` (the loader refuses them beside a trace); otherwise
    `elastic_traces` (one trace per elastic GPU type, each change moving that type's GPUs only)
    or the experiment's trace (if any) through runtime.traces with its time compression;
    otherwise the pool is always fully available.
    """
    rt = spec.runtime
    if rt.elastic_events:
        return tuple(AvailabilityChange(e.at_s, min(e.available, elastic_gpus), e.after_step) for e in rt.elastic_events)
    if spec.elastic_traces and elastic_gpus:  # each elastic GPU type follows its own trace
        from runtime.offline_plan import load_typed_windows, typed_changes

        return tuple(AvailabilityChange(t / rt.time_scale, g, gpu_type=typ) for t, typ, g in typed_changes(load_typed_windows(spec)))
    if spec.trace is None or elastic_gpus == 0:
        return (AvailabilityChange(0.0, elastic_gpus),)
    from runtime.traces import load_trace  # the real trace readers (Bamboo, SkyPilot)

    trace = load_trace(spec.trace, elastic_gpus)
    # trace times are already compressed by trace.time_scale into the run's (virtual) seconds;
    # the runtime's clock runs rt.time_scale virtual seconds per wall second
    return tuple(AvailabilityChange(t / rt.time_scale, int(min(g, elastic_gpus))) for t, g in trace.changes())
