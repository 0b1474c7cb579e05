"""Run sweep points: the simulator (or the planner over the trace) per point, cached on disk.

A point's cache key is a SHA-256 over the re-validated experiment (minus its name and file
path), the policy, seed, trace flags, hours, the kind of run and a digest of the model,
planner and simulator sources, so an interrupted sweep resumes where it stopped and a code
change never serves stale numbers. Points run in a process pool (one simulation per
process; the simulator is single-threaded Python) with a rich progress bar on stderr.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from models.config import ConfigError, ExperimentSpec
from runtime.sim.run import TraceFlags
from runtime.sweep.keys import Number, apply_overrides, current_values
from runtime.sweep.points import Point

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
CODE_DIRS = ("models", "planner", "runtime/sim")
CODE_FILES = ("runtime/offline_plan.py", "runtime/traces.py", "runtime/sweep/runner.py", "runtime/executor.py", "runtime/router.py",
              "runtime/timeline.py", "runtime/loans.py", "runtime/naming.py", "runtime/gc_pause.py")
# What `pearl compare --json` reports per policy, plus the churn counters a sensitivity study needs.
SUMMARY_KEYS = ("steps_per_h", "trajectories_per_h", "tokens_per_s", "rollout_share", "switches", "lost_trajectories", "late_returns",
               "role_switches", "mode_switches", "starts", "stops", "lends", "preempted_instances", "decisions", "policy_failures")
SIM_METRICS = (*SUMMARY_KEYS, "reconfigurations", "elastic_gpus_serving", "lent_gpus_serving", "gate_mode_switches", "gate_ratio_changes",
               "gate_scale_changes", "gated")
ERROR = "__config_error__"
PLAN_METRICS = ("decisions", "switches", "role_changes", "mode_switches", "joins", "leaves", "reconfigurations", "predicted_rollout_s",
                "predicted_trajectories_per_h", "solve_ms_p50", "solve_ms_p95", "optimal_fraction")


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """SHA-256 over the sources a point's numbers depend on."""
    h = hashlib.sha256()
    paths = [p for d in CODE_DIRS for p in sorted((REPO_ROOT / d).rglob("*.py"))] + [REPO_ROOT / f for f in CODE_FILES]
    for p in paths:
        if p.exists():
            h.update(str(p.relative_to(REPO_ROOT)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Task:
    """One (point, seed) run, with its already re-validated experiment."""

    index: int
    point: Point
    seed: int
    spec: ExperimentSpec
    policy: str
    flags: TraceFlags
    hours: float
    planner_only: bool = False

    def config_hash(self) -> str:
        body = self.spec.model_dump(mode="json", exclude={"name", "source"})
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]

    def cache_key(self) -> str:
        ident = {"config": self.config_hash(), "policy": self.policy, "seed": self.seed, "trace": asdict(self.flags),
                 "hours": self.hours, "kind": "plan" if self.planner_only else "sim", "code": code_digest()}
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]


def make_tasks(spec: ExperimentSpec, points: list[Point], seeds: list[int], policy: str, flags: TraceFlags, hours: float,
               planner_only: bool = False) -> list[Task]:
    """Validate every point before anything runs (a bad value fails the sweep up front)."""
    tasks = []
    for i, p in enumerate(points):
        s = apply_overrides(spec, p.overrides())
        for seed in seeds:
            tasks.append(Task(i, p, seed, s, policy, flags, hours, planner_only))
    return tasks


# ----------------------------------------------------------------------------- one point
def simulate_metrics(spec: ExperimentSpec, policy: str, flags: TraceFlags, hours: float, seed: int) -> dict[str, Any]:
    from runtime.sim import run as sim_run

    r = sim_run.simulate(spec, policy, flags, hours=hours, seed=seed)
    s = r.summary()
    # every engine-level action the policy caused: starts (lends included), stops, role changes
    reconf = s["starts"] + s["stops"] + s["role_switches"]
    # mean GPUs serving rollout per pool (transitioning ones excluded): where the capacity came from
    gpus = r.utilization().get("mean_gpus", {})
    serving = {pool: round(sum(v for k, v in gpus.items() if k.startswith(pool + ":") and k.split(":")[1] in ("colocated", "prefill", "decode")), 3)
               for pool in ("elastic", "training")}
    return {**{k: s[k] for k in SUMMARY_KEYS}, "reconfigurations": reconf, "elastic_gpus_serving": serving["elastic"],
            "lent_gpus_serving": serving["training"], **gate_counts(r.decision_log), "failure": r.failure, "wall_s": round(r.wall_s, 3)}


GATE_KINDS = {"mode switch": "gate_mode_switches", "ratio change": "gate_ratio_changes", "scale change": "gate_scale_changes"}


def gate_counts(decision_log: list) -> dict[str, int]:
    """How often the policy's hysteresis gate saw each kind of change, and how often it held one back.

    Read from the decision reasons planner.policies.PearlPolicy writes ("<kind>: gain ..." when
    applied, "gated <kind>: ..." when held back): the margins only act on mode switches
    (mode_switch_margin) and ratio changes (ratio_change_margin).
    """
    out = dict.fromkeys(GATE_KINDS.values(), 0)
    out["gated"] = 0
    for entry in decision_log:
        reason = str(entry[3].get("reason", "")) if len(entry) > 3 and isinstance(entry[3], dict) else ""
        held = reason.startswith("gated ")
        kind = reason.removeprefix("gated ").split(":")[0]
        if kind in GATE_KINDS:
            out[GATE_KINDS[kind]] += 1
            out["gated"] += held
    return out


def plan_metrics(spec: ExperimentSpec, policy: str, flags: TraceFlags, hours: float, seed: int) -> dict[str, Any]:
    """The `pearl plan` loop (runtime/offline_plan.py) over the trace window, summarised for a sweep point."""
    import numpy as np

    from runtime.offline_plan import load_window, plan_over_trace, trace_spec_for

    del seed  # planning is deterministic
    t0 = time.perf_counter()
    tspec = trace_spec_for(spec, flags.path)
    result = plan_over_trace(spec, policy, spec.solver.backend, tspec, load_window(spec, tspec, flags.offset_hours, hours))
    solve_ms: list[float] = []
    counts = {"role_changes": 0, "mode_switches": 0, "joins": 0, "leaves": 0, "optimal": 0}
    mode: str | None = None
    for ev in result.events:
        d, p = ev.step.decision, ev.step.plan
        if mode is not None and d.mode != mode:  # a gated decision reports the kept (current) mode
            counts["mode_switches"] += 1
        mode = d.mode
        solve_ms.append(d.proof.solve_ms)
        counts["optimal"] += d.proof.status in ("optimal", "evaluated")
        counts["role_changes"] += p.role_changes
        counts["joins"] += p.joins
        counts["leaves"] += p.leaves
    mean_s = result.mean_predicted_completion_s()
    n = len(result.events)
    return {
        "decisions": n, "switches": counts["role_changes"] + counts["mode_switches"], "role_changes": counts["role_changes"],
        "mode_switches": counts["mode_switches"], "joins": counts["joins"], "leaves": counts["leaves"],
        "reconfigurations": counts["joins"] + counts["leaves"] + counts["role_changes"],
        "predicted_rollout_s": round(mean_s, 3),
        "predicted_trajectories_per_h": round(3600.0 * spec.workload.trajectories_per_batch / mean_s, 2) if mean_s > 0 else 0.0,
        "solve_ms_p50": round(float(np.percentile(solve_ms, 50)), 3), "solve_ms_p95": round(float(np.percentile(solve_ms, 95)), 3),
        "optimal_fraction": round(counts["optimal"] / max(n, 1), 4), "wall_s": round(time.perf_counter() - t0, 3),
    }


def run_task(task: Task) -> dict[str, Any]:
    """Metrics of one task; a ConfigError comes back as data (its 4-argument form does not unpickle)."""
    fn = plan_metrics if task.planner_only else simulate_metrics
    try:
        return fn(task.spec, task.policy, task.flags, task.hours, task.seed)
    except ConfigError as exc:
        return {ERROR: [exc.file, exc.field, exc.value if isinstance(exc.value, (int, float, str)) else str(exc.value), exc.allowed]}


def _raise_if_error(metrics: dict[str, Any]) -> dict[str, Any]:
    if ERROR in metrics:
        raise ConfigError(*metrics[ERROR])
    return metrics


# ----------------------------------------------------------------------------- cache
def _cache_path(cache_dir: Path, task: Task) -> Path:
    return cache_dir / f"{task.cache_key()}.json"


def read_cached(cache_dir: Path, task: Task) -> dict[str, Any] | None:
    p = _cache_path(cache_dir, task)
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())["metrics"]
    except (ValueError, KeyError):
        return None  # a torn or foreign file: recompute


def write_cached(cache_dir: Path, task: Task, metrics: dict[str, Any]) -> None:
    cache_dir.mkdir(parents=True, exist_ok=True)
    p = _cache_path(cache_dir, task)
    tmp = p.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"config_hash": task.config_hash(), "seed": task.seed, "policy": task.policy, "metrics": metrics}))
    os.replace(tmp, p)  # atomic: an interrupt never leaves half a record


# ----------------------------------------------------------------------------- the sweep
def _ignore_sigint() -> None:
    """Workers leave Ctrl-C to the parent, which stops them and keeps the finished points."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _preload() -> None:
    """Import everything a point runs before the pool forks, so every worker runs the code the
    cache key's digest describes even while the sources change on disk."""
    import models.builder  # noqa: F401
    import planner.policies  # noqa: F401
    import runtime.offline_plan  # noqa: F401
    import runtime.sim.planner_adapter  # noqa: F401
    import runtime.traces  # noqa: F401

    code_digest()


@dataclass
class SweepRun:
    records: list[dict[str, Any]] = field(default_factory=list)
    computed: int = 0
    cached: int = 0
    wall_s: float = 0.0


def record(task: Task, keys: list[str], metrics: dict[str, Any], cached: bool) -> dict[str, Any]:
    """One JSON record: the swept keys' values as the run saw them, seed, policy, hash, metrics."""
    values: dict[str, Number] = current_values(task.spec, keys)
    return {"point": task.index, "values": values, "varied": task.point.varied, "seed": task.seed, "policy": task.policy,
            "config_hash": task.config_hash(), "cached": cached, **metrics}


def run_sweep(tasks: list[Task], keys: list[str], cache_dir: Path, jobs: int = 2, show_progress: bool = True) -> SweepRun:
    """Run what the cache lacks (in `jobs` processes; in this process when jobs == 1) and collect every record.

    Tasks with the same cache key (a one-way sweep meets the config's own values once per key)
    run once. `computed` counts simulations run now, `cached` the records served without one.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    t0 = time.perf_counter()
    out = SweepRun()
    key_of = [t.cache_key() for t in tasks]
    found: dict[str, dict[str, Any]] = {}
    todo: dict[str, int] = {}  # cache key -> the first task that needs it
    for i, (t, k) in enumerate(zip(tasks, key_of)):
        if k in found or k in todo:
            continue
        m = read_cached(cache_dir, t)
        if m is None:
            todo[k] = i
        else:
            found[k] = m
    fresh: set[str] = set()
    progress = Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("runs ({task.fields[cached]} cached)"),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True), transient=True, disable=not show_progress)

    def finish(k: str, m: dict[str, Any]) -> None:
        _raise_if_error(m)
        write_cached(cache_dir, tasks[todo[k]], m)
        found[k] = m
        fresh.add(k)
        progress.advance(bar)

    with progress:
        bar = progress.add_task("sweep", total=len(todo) + len(found), completed=len(found), cached=len(found))
        if jobs <= 1 or len(todo) <= 1:
            for k, i in todo.items():
                finish(k, run_task(tasks[i]))
        else:
            _preload()
            with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), initializer=_ignore_sigint) as pool:
                pending: dict[Future, str] = {pool.submit(run_task, tasks[i]): k for k, i in todo.items()}
                try:
                    while pending:
                        ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                        for f in ready:
                            finish(pending.pop(f), f.result())
                except BaseException:
                    # Ctrl-C (or an error): drop what has not finished; what has is already cached
                    pool.shutdown(wait=False, cancel_futures=True)
                    for proc in list((getattr(pool, "_processes", None) or {}).values()):
                        proc.terminate()
                    raise
    ran = {todo[k] for k in fresh}
    out.records = [record(t, keys, found[k], cached=i not in ran) for i, (t, k) in enumerate(zip(tasks, key_of))]
    out.computed = len(fresh)
    out.cached = len(tasks) - out.computed
    out.wall_s = time.perf_counter() - t0
    return out
