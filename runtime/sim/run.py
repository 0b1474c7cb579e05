"""One entry point for the CLI and experiments: config + policy name + trace flags -> SimResult."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from models.builder import ExperimentModels, build_models, is_mixed
from models.config import ConfigError, ExperimentSpec
from planner.inputs import memory_model
from runtime.sim.held_mixed import TYPED_FORM, HeldTypedLayout, parse_typed, typed_layout_problem
from runtime.sim.layout import FIXED_FORM, FixedLayout, SimPolicy, fixed_layout_problem, parse_fixed
from runtime.sim.metrics import SimResult
from runtime.sim.simulator import Simulator

POLICIES = ("pearl", "pearl-no-borrow", "pearl-fixed-pd", "pearl-no-gate", "roll", "rlboost+", "rlboost+pd")


@dataclass(frozen=True)
class TraceFlags:
    path: str | None = None  # overrides the config's trace path
    offset_hours: float | None = None
    hours: float | None = None


def fixed_problem(name: str, spec: ExperimentSpec, fits_memory: Callable[[str, int], bool] | None = None) -> str | None:
    """What a `fixed:` policy name asks that this config's cluster cannot run, or the form it
    must take (None: it can run it). A mixed cluster takes a layout per GPU type
    (runtime/sim/held_mixed.py); one type at one degree per role takes instance counts."""
    if is_mixed(spec):
        typed = parse_typed(name)
        if typed is None:
            return f"on a mixed cluster (several GPU types or TP degrees), a layout per GPU type: {TYPED_FORM}"
        return typed_layout_problem(typed, spec.cluster, fits_memory)
    layout = parse_fixed(name)
    return FIXED_FORM if layout is None else fixed_layout_problem(layout, spec.cluster)


def fixed_form(spec: ExperimentSpec) -> str:
    """The `fixed:` form this config's cluster takes."""
    return TYPED_FORM if is_mixed(spec) else FIXED_FORM


def make_policy(name: str, models: ExperimentModels, source: str = "--policy") -> SimPolicy:
    """A planner policy by name, or a `fixed:` layout held throughout (replays, layout studies):
    instance counts `fixed:<mode>:<c>:<p>:<d>[:<borrow>]`, or per GPU type on a mixed cluster."""
    if name.startswith("fixed:"):
        problem = fixed_problem(name, models.spec, memory_model(models.spec).fits)
        if problem is not None:
            raise ConfigError(source, "policy", name, problem)
        typed = parse_typed(name)
        if typed is not None:
            return HeldTypedLayout(typed, name=name)
        tp = {"colocated": models.tp_colocated, "prefill": models.tp_prefill, "decode": models.tp_decode}
        return FixedLayout(parse_fixed(name), tp, name=name)  # type: ignore[arg-type]
    try:
        from planner import policies as _p

        known = tuple(getattr(_p, "POLICIES", POLICIES))
    except ImportError:
        known = POLICIES
    if name not in known:
        raise ConfigError(source, "policy", name, f"one of {list(known)} or {fixed_form(models.spec)}")
    from runtime.sim.planner_adapter import PlannerPolicy

    return PlannerPolicy(name, models)


def run_hours(spec: ExperimentSpec, flags: TraceFlags = TraceFlags()) -> float:
    """Simulated hours: `--hours`, else the config's window: `trace.hours`, or with `elastic_traces`
    (and no `--trace`) the longest per-type `hours`, as `pearl plan` spans it (each type keeps its
    own window; a shorter one holds its last count); else 2."""
    if flags.hours:
        return flags.hours
    if spec.elastic_traces and flags.path is None:
        return max((t.hours for t in spec.elastic_traces.values() if t.hours), default=2.0)
    return spec.trace.hours if spec.trace and spec.trace.hours else 2.0


def load_availability(spec: ExperimentSpec, flags: TraceFlags, hours: float):
    """The elastic pool's availability over the run (None: no trace, the pool stays full); with
    `elastic_traces`, one availability per elastic GPU type (a dict), each on that type's GPUs
    over its own window, as `pearl plan` loads them (`--hours` sets them all; a type without
    `hours` runs `hours`, as one `trace` does)."""
    if spec.elastic_traces and flags.path is None:
        from runtime.offline_plan import load_typed_windows

        return load_typed_windows(spec, flags.offset_hours, flags.hours, fallback_hours=hours)
    trace = spec.trace
    if trace is None and flags.path is None:
        return None
    from pathlib import Path

    from models.config import TraceSpec
    from runtime.traces import load_trace  # the trace readers (planner helper's module)

    if trace is None:
        trace = TraceSpec(path=str(Path(flags.path).resolve()))  # type: ignore[arg-type]
    update: dict = {}
    if flags.path is not None:
        update["path"] = str(Path(flags.path).resolve())
        update["format"] = "auto"  # another file: detect its format; the GPU mapping stays the config's
    if flags.offset_hours is not None:
        update["offset_hours"] = flags.offset_hours
    update["hours"] = hours
    if update:
        trace = trace.model_copy(update=update)
    pool = spec.cluster.gpus_in_pool("elastic")
    return load_trace(trace, pool)


def simulate(
    spec: ExperimentSpec,
    policy: str | None = None,
    flags: TraceFlags = TraceFlags(),
    hours: float | None = None,
    seed: int | None = None,
    progress: Callable[[float], None] | None = None,
    models: ExperimentModels | None = None,
    sample_s: float = 60.0,
    cohort: int = 1,
) -> SimResult:
    hours = hours or run_hours(spec, flags)
    models = models or build_models(spec)
    pol = make_policy(policy or spec.policy.name, models)
    avail = load_availability(spec, flags, hours)
    t0 = time.perf_counter()
    result = Simulator(models, pol, avail, hours=hours, seed=seed, progress=progress, sample_s=sample_s, cohort=cohort).run()
    result.wall_s = time.perf_counter() - t0
    return result
