"""Walk an availability trace and decide at every change: the loop behind `pearl plan` and `pearl sweep --planner-only`.

The trainer is modelled as always training (offline there is no step timeline, so no
training GPUs are lent); the simulator adds the training/rollout cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from models.config import ConfigError, ExperimentSpec, TraceSpec


@dataclass(frozen=True)
class PlannedEvent:
    t_s: float
    event: str  # "initial" | "availability"
    elastic_gpus: int  # all elastic GPUs available from t_s on
    step: object  # planner.policies step: .decision and .plan
    gpu_type: str | None = None  # with `elastic_traces`: the type whose availability changed (None: the first event, or one trace for all)


@dataclass(frozen=True)
class OfflinePlan:
    events: tuple[PlannedEvent, ...]
    duration_s: float
    source: str
    mean_elastic_gpus: float
    trace: TraceSpec | Mapping[str, TraceSpec]  # one trace, or `elastic_traces`: one per elastic GPU type

    def mean_predicted_completion_s(self) -> float:
        """Time-weighted mean of the predicted batch completion over the window."""
        ts = np.array([e.t_s for e in self.events] + [self.duration_s])
        w = np.diff(ts)
        comp = np.array([e.step.decision.predicted_completion_s for e in self.events])  # type: ignore[attr-defined]
        return float(np.sum(w * comp) / max(w.sum(), 1e-9))


def trace_spec_for(spec: ExperimentSpec, trace: str | Path | None) -> TraceSpec:
    """The config's trace, or `trace` (format auto-detected unless it is the config's own file)."""
    tspec = spec.trace
    if trace is not None:
        path = str(Path(trace).resolve())
        same = tspec is not None and Path(tspec.path).resolve() == Path(path)
        tspec = (tspec or TraceSpec(path=path)).model_copy(update={"path": path, "format": tspec.format if same and tspec else "auto"})
    if tspec is None:
        raise ConfigError(spec.source, "trace", None, "a trace section in the config, or --trace FILE")
    return tspec


def load_window(spec: ExperimentSpec, tspec: TraceSpec, offset_hours: float | None = None, hours: float | None = None):
    """The trace window mapped to the experiment's elastic pool (ConfigError on a bad trace)."""
    from runtime.traces import load_trace

    pool = spec.cluster.gpus_in_pool("elastic")
    return load_trace(tspec, pool_gpus=pool or None, offset_hours=offset_hours, hours=hours)


def load_typed_windows(spec: ExperimentSpec, offset_hours: float | None = None, hours: float | None = None,
                       fallback_hours: float | None = None) -> dict:
    """`elastic_traces`: each elastic GPU type's window, mapped to that type's GPUs (flags override
    every trace's window; `fallback_hours` spans a trace without `hours`, else its whole file)."""
    from runtime.traces import load_trace

    flagged = {name for name, v in (("hours", hours), ("offset_hours", offset_hours)) if v is not None}
    out = {}
    for typ, tspec in spec.elastic_traces.items():
        span = hours  # a flag sets every type's window
        if span is None and not tspec.hours:
            span = fallback_hours  # else the type's own `hours`
        try:
            out[typ] = load_trace(tspec, pool_gpus=spec.cluster.gpus_in_pool("elastic", typ), offset_hours=offset_hours, hours=span)
        except ConfigError as exc:
            raise _per_type_error(spec, typ, exc, flagged) from None
    return out


def _per_type_error(spec: ExperimentSpec, typ: str, exc: ConfigError, flagged: set[str]) -> ConfigError:
    """The trace readers name `trace.<field>`; a per-type setting is the experiment's
    `elastic_traces.<type>.<field>` (the trace file, if any, is where its limit comes from).
    A window a flag set stays `trace.<field>`, for `runtime.flags.window_flags` to blame the flag."""
    field = exc.field.removeprefix("trace.")
    if field == exc.field or field in flagged:
        return exc
    allowed = exc.allowed if field == "path" else f"{exc.allowed} in {exc.file}"
    return ConfigError(spec.source, f"elastic_traces.{typ}.{field}", exc.value, allowed)


def typed_changes(avail: Mapping[str, object]) -> list[tuple[float, str | None, int]]:
    """Every type's changes merged in time order: (t, type, that type's GPUs)."""
    return sorted((float(t), typ, int(g)) for typ, tr in avail.items() for t, g in tr.changes())  # type: ignore[attr-defined]


def plan_over_trace(
    spec: ExperimentSpec,
    policy: str,
    backend: str,
    tspec: TraceSpec | Mapping[str, TraceSpec],
    avail: object,
    on_event: Callable[[int, int], None] | None = None,
) -> OfflinePlan:
    """Decide at each elastic-GPU change of the window (from `load_window`, or `load_typed_windows`:
    one availability per elastic GPU type, each moving only that type's GPUs) and apply each plan
    to the state."""
    from models.builder import build_models
    from planner.inputs import planning_inputs
    from planner.policies import PlanningError, get_policy
    from planner.state import TrainerPhase, state_from_cluster_spec
    from planner.transition import apply_plan

    pool = spec.cluster.gpus_in_pool("elastic")
    models = build_models(spec)
    inputs = planning_inputs(models, sum(g.count * g.gpus_per_node for g in spec.cluster.nodes))
    pol = get_policy(policy, backend)
    state = state_from_cluster_spec(spec.cluster, TrainerPhase("training", 0.0))
    typed = isinstance(avail, Mapping)
    # (t, type or None, GPUs): one trace drives the whole elastic pool, or each type its own GPUs
    changes = typed_changes(avail) if typed else [(float(t), None, int(g)) for t, g in avail.changes()]  # type: ignore[union-attr]
    # one decision per instant, whatever changed then (changes are in time order)
    instants = [(t, [(typ, g) for _, typ, g in group]) for t, group in groupby(changes, key=lambda c: c[0])]
    events: list[PlannedEvent] = []
    for i, (t, now) in enumerate(instants):
        for typ, g in now:
            state = state.with_availability("elastic", min(g, pool)) if typ is None else state.with_availability("elastic", g, gpu_type=typ)
        kind = "initial" if i == 0 else "availability"
        elastic = sum(1 for x in state.gpus if x.pool == "elastic" and x.available) if typed else now[-1][1]
        try:
            step = pol.decide(state, inputs, t, kind)
        except PlanningError as exc:
            raise ConfigError(spec.source, "cluster", f"{elastic} elastic GPUs at t={t:.0f}s", f"a feasible rollout configuration ({exc})") from None
        state = apply_plan(state, step.plan)
        changed = "+".join(sorted(typ for typ, _ in now if typ is not None)) or None
        events.append(PlannedEvent(float(t), kind, elastic, step, None if i == 0 else changed))
        if on_event is not None:
            on_event(i + 1, len(instants))
    if typed:
        traces = avail.values()  # type: ignore[union-attr]
        return OfflinePlan(tuple(events), max(float(tr.duration_s) for tr in traces), "; ".join(f"{typ}: {tr.source}" for typ, tr in avail.items()),  # type: ignore[union-attr]
                           float(sum(tr.mean_gpus() for tr in traces)), tspec)
    return OfflinePlan(tuple(events), float(avail.duration_s), avail.source, float(avail.mean_gpus()), tspec)  # type: ignore[union-attr]
