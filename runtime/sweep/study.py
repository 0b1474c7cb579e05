"""A whole sweep from an experiment and `--set` lists to records, aggregates and output files.

Shared by `pearl sweep` and experiments/sensitivity.py so both compute the same thing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.config import ConfigError, ExperimentSpec, repo_relative
from runtime.sim.run import TraceFlags, run_hours
from runtime.sweep.keys import Number
from runtime.sweep.points import MODES, sweep_points
from runtime.sweep.report import BAND, aggregate, mark_front, markdown_table, plot_sweep
from runtime.sweep.runner import PLAN_METRICS, SIM_METRICS, SweepRun, make_tasks, run_sweep

LABELS = {"tokens_per_s": "tokens/s", "steps_per_h": "steps/h", "trajectories_per_h": "traj/h", "rollout_share": "rollout share",
          "switches": "switches", "reconfigurations": "reconfigurations", "lends": "lends", "starts": "starts", "stops": "stops",
          "lost_trajectories": "lost", "late_returns": "late returns", "predicted_trajectories_per_h": "predicted traj/h",
          "predicted_rollout_s": "predicted rollout s", "role_changes": "role changes", "solve_ms_p50": "solve ms p50",
          "elastic_gpus_serving": "elastic GPUs serving", "lent_gpus_serving": "lent GPUs serving", "gated": "gated",
          "policy_failures": "failed decisions"}
SIM_TABLE = ("tokens_per_s", "steps_per_h", "trajectories_per_h", "rollout_share", "switches", "reconfigurations", "lends",
             "elastic_gpus_serving", "gated", "lost_trajectories", "late_returns")
PLAN_TABLE = ("predicted_trajectories_per_h", "predicted_rollout_s", "switches", "reconfigurations", "role_changes", "joins", "leaves",
              "solve_ms_p50")


@dataclass
class SweepResult:
    spec: ExperimentSpec
    keys: list[str]
    mode: str
    policy: str
    flags: TraceFlags
    hours: float
    seeds: list[int]
    planner_only: bool
    run: SweepRun
    pareto_cost: str
    aggregated: list[dict[str, Any]] = field(default_factory=list)
    front: list[int] = field(default_factory=list)

    @property
    def gain(self) -> str:
        return "predicted_trajectories_per_h" if self.planner_only else "tokens_per_s"

    @property
    def table_metrics(self) -> tuple[str, ...]:
        """The table's columns; `failed decisions` only when some run's policy failed one (else it is noise)."""
        if self.planner_only:
            return PLAN_TABLE
        failed = any(r.get("policy_failures") for r in self.run.records)
        return SIM_TABLE + ("policy_failures",) if failed else SIM_TABLE

    def to_json(self) -> dict[str, Any]:
        return {
            "config": repo_relative(self.spec.source), "experiment": self.spec.name, "model": self.spec.model_name, "mode": self.mode,
            "policy": self.policy, "kind": "planner" if self.planner_only else "simulator", "hours": self.hours, "seeds": self.seeds,
            "trace": {"path": repo_relative(trace) if (trace := self.flags.path or (self.spec.trace.path if self.spec.trace else None)) else None,
                      "offset_hours": self.flags.offset_hours},
            "keys": self.keys, "band": BAND, "pareto": {"gain": self.gain, "cost": self.pareto_cost, "points": self.front},
            "computed": self.run.computed, "cached": self.run.cached, "wall_s": round(self.run.wall_s, 2),
            "records": self.run.records, "aggregated": self.aggregated,
        }

    def markdown(self) -> str:
        return markdown_table(self.aggregated, self.keys, self.table_metrics, LABELS)

    def title(self) -> str:
        what = "planner over the trace" if self.planner_only else f"{self.hours:g} simulated h"
        return f"{self.spec.name} ({self.spec.model_name}), {self.policy}, {what}"


def run_study(spec: ExperimentSpec, sets: dict[str, list[Number]], mode: str = "grid", policy: str | None = None,
              flags: TraceFlags = TraceFlags(), hours: float | None = None, seeds: int = 1, jobs: int = 2, planner_only: bool = False,
              cache_dir: Path = Path("runs/sweep-cache"), pareto_cost: str = "switches", show_progress: bool = True) -> SweepResult:
    if mode not in MODES:
        raise ConfigError("--mode", "mode", mode, f"one of {list(MODES)}")
    if seeds < 1:
        raise ConfigError("--seeds", "seeds", seeds, "an integer >= 1")
    metrics = PLAN_METRICS if planner_only else SIM_METRICS
    if pareto_cost not in metrics:
        raise ConfigError("--pareto-x", "pareto_x", pareto_cost, f"one of {list(metrics)}")
    if flags.offset_hours is not None and "trace.offset_hours" in sets:
        raise ConfigError("--set", "trace.offset_hours", sets["trace.offset_hours"], "either --trace-offset-hours or a trace.offset_hours sweep, not both")
    name = policy or spec.policy.name
    _check_policy(spec, name, planner_only)
    h = hours or run_hours(spec, flags)
    seed_list = [spec.seed + i for i in range(seeds)]
    spec, flags = fold_trace_flag(spec, flags)
    if spec.trace is not None:  # a missing or too short trace fails here, not once per point
        from runtime.sim.run import load_availability

        load_availability(spec, flags, h)
    points = sweep_points(sets, mode)  # type: ignore[arg-type]
    tasks = make_tasks(spec, points, seed_list, name, flags, h, planner_only)
    keys = list(sets)
    run = run_sweep(tasks, keys, cache_dir, jobs=jobs, show_progress=show_progress)
    res = SweepResult(spec, keys, mode, name, flags, h, seed_list, planner_only, run, pareto_cost)
    res.aggregated = aggregate(run.records, list(metrics) + ["wall_s"])
    res.front = mark_front(res.aggregated, pareto_cost, res.gain)
    return res


def fold_trace_flag(spec: ExperimentSpec, flags: TraceFlags) -> tuple[ExperimentSpec, TraceFlags]:
    """Move `--trace FILE` into the experiment's trace section, format auto-detected and the config's
    GPU mapping kept (what runtime.sim.run.load_availability does with the flag), so the file is
    part of the config hash and `--planner-only` reads the same trace.
    """
    if flags.path is None:
        return spec, flags
    from dataclasses import replace

    from models.config import TraceSpec

    path = str(Path(flags.path).resolve())
    trace = spec.trace.model_copy(update={"path": path, "format": "auto"}) if spec.trace else TraceSpec(path=path)
    return ExperimentSpec.model_validate({**spec.model_dump(), "trace": trace.model_dump()}), replace(flags, path=None)


def _check_policy(spec: ExperimentSpec, name: str, planner_only: bool) -> None:
    """Fail before any point runs on an unknown policy name (workers would fail once per point)."""
    from planner.policies import POLICIES

    if planner_only or not name.startswith("fixed:"):
        if name not in POLICIES:
            from runtime.sim.run import fixed_form

            extra = "" if planner_only else f" or {fixed_form(spec)}"
            raise ConfigError("--policy", "policy", name, f"one of {sorted(POLICIES)}{extra}")
        return
    from models.builder import build_models
    from runtime.sim.run import make_policy

    make_policy(name, build_models(spec))


def write_outputs(res: SweepResult, out_dir: Path, plot: Path | None = None, stem: str = "sweep") -> dict[str, Path]:
    """`<stem>.json`, `<stem>.md` and the PNG (at `plot`, else `<stem>.png`) under out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{stem}.json", "md": out_dir / f"{stem}.md", "png": plot or out_dir / f"{stem}.png"}
    rows = ["predicted_trajectories_per_h", "switches"] if res.planner_only else ["tokens_per_s", "switches", "reconfigurations"]
    plot_sweep(res.aggregated, res.keys, paths["png"], res.title(), res.gain, rows, res.pareto_cost, LABELS)
    doc = res.to_json()
    doc["outputs"] = {k: str(v) for k, v in paths.items()}
    paths["json"].write_text(json.dumps(doc, indent=1))
    seeds = f"{len(res.seeds)} seeds ({BAND})" if len(res.seeds) > 1 else "1 seed"
    head = (f"# Sweep: {res.title()}\n\nConfig `{res.spec.source}`, {res.mode} over {', '.join(f'`{k}`' for k in res.keys)}, "
            f"{seeds}. `*` marks the key a one-way point varies; Pareto: {LABELS.get(res.gain, res.gain)} vs "
            f"{LABELS.get(res.pareto_cost, res.pareto_cost)}.\n\n![sweep]({paths['png'].name if paths['png'].parent == out_dir else paths['png']})\n\n")
    paths["md"].write_text(head + res.markdown())
    return paths
