"""`pearl sweep`: how config keys (cost weights, margins, thresholds, staleness) move throughput and switching."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from runtime.cli import app, user_errors
from runtime.flags import MAX_JOBS, MAX_SEEDS, hours_option, int_option, offset_option, window_flags

if TYPE_CHECKING:
    from runtime.sweep.study import SweepResult


@app.command()
@user_errors
def sweep(
    config: Path = typer.Option(..., "--config", "-c", help="experiment YAML"),
    sets: List[str] = typer.Option([], "--set", help="key=v1,v2,... over a numeric config key (repeat for more keys), e.g. costs.transition_weight=0,1,4"),
    mode: str = typer.Option("grid", "--mode", help="grid: every combination | oneway: one key at a time, the others at the config's values"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="availability trace for the elastic pool (overrides the config's)"),
    trace_offset_hours: Optional[float] = offset_option("start this many hours into the trace"),
    hours: Optional[float] = hours_option("simulated hours per point (default: the config's trace hours, else 2)"),
    policy: Optional[str] = typer.Option(None, "--policy", "-p", help="policy for every point (default: the config's)"),
    seeds: int = int_option(1, "--seeds", lo=1, hi=MAX_SEEDS, help="seeds per point: the config's seed, +1, ..."),
    jobs: int = int_option(2, "--jobs", "-j", lo=1, hi=MAX_JOBS, help="parallel processes"),
    planner_only: bool = typer.Option(False, "--planner-only", help="run the `pearl plan` loop over the trace instead of the simulator"),
    pareto_x: str = typer.Option("switches", "--pareto-x", help="cost axis of the Pareto front (switches, reconfigurations, lends, ...)"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="PNG path (default: <out>/sweep.png)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="output folder for sweep.json / sweep.md / sweep.png (default: runs/sweep/<experiment>)"),
    cache: Path = typer.Option(Path("runs/sweep-cache"), "--cache", help="per-point result cache; a rerun resumes from it"),
    as_json: bool = typer.Option(False, "--json", help="print the JSON document on stdout"),
) -> None:
    """Sweep config keys through the simulator; write JSON, a markdown table and plots (cached, parallel, resumable)."""
    from models.config import ConfigError, load_experiment
    from runtime.flags import check_policies
    from runtime.jsonout import print_json, stdout_to_stderr
    from runtime.outputs import check_file, check_folder, check_plot
    from runtime.sim.run import TraceFlags
    from runtime.sweep.keys import parse_sets
    from runtime.sweep.points import MODES
    from runtime.sweep.runner import PLAN_METRICS, SIM_METRICS
    from runtime.sweep.study import run_study, write_outputs

    # every flag and output path is checked here, before a study that can run for hours
    spec = load_experiment(config)
    parsed = parse_sets(sets, spec)
    if mode not in MODES:
        raise ConfigError("pearl sweep", "--mode", mode, f"one of {list(MODES)}")
    metrics = PLAN_METRICS if planner_only else SIM_METRICS
    if pareto_x not in metrics:
        raise ConfigError("pearl sweep", "--pareto-x", pareto_x, f"one of {list(metrics)}")
    check_policies([spec.policy.name if policy is None else policy], spec, "--policy" if policy is not None else None, "sweep", fixed=not planner_only)  # `--policy ""` is refused
    out_dir = out or Path("runs/sweep") / spec.name
    check_folder(out_dir, "pearl sweep", "--out")
    for name in ("sweep.json", "sweep.md") + (() if plot else ("sweep.png",)):
        check_file(out_dir / name, "pearl sweep", "--out")
    if plot is not None:
        check_plot(plot, "pearl sweep", "--plot")
    check_folder(cache, "pearl sweep", "--cache")
    flags = TraceFlags(str(trace) if trace else None, trace_offset_hours, hours)
    try:
        with stdout_to_stderr(as_json), window_flags("sweep", hours, trace_offset_hours):  # worker processes inherit fd 1
            res = run_study(spec, parsed, mode, policy, flags, hours, seeds, jobs, planner_only, cache, pareto_x)
    except KeyboardInterrupt:
        print(f"pearl: sweep interrupted; finished points are cached in {cache}, rerun the same command to resume", file=sys.stderr)
        raise typer.Exit(130) from None
    paths = write_outputs(res, out_dir, plot)
    if as_json:
        print_json(res.to_json())
    else:
        print_table(res, paths)
    if warn_failures(res.run.records):
        raise typer.Exit(1)


def warn_failures(records: list[dict]) -> bool:
    """One stderr line per run whose policy failed decisions; True if one never got a layout running."""
    from runtime.sweep.report import any_failed_all, failure_lines

    for line in failure_lines(records):
        print(line, file=sys.stderr)
    return any_failed_all(records)


def print_table(res: SweepResult, paths: dict[str, Path]) -> None:
    """The aggregated points on stdout (mean ± std over seeds), output paths on stderr."""
    from rich.console import Console
    from rich.table import Table

    from runtime.sweep.report import fmt
    from runtime.sweep.study import LABELS
    from runtime.tables import table_console

    t = Table(title=f"{res.title()}: {len(res.run.records)} runs ({res.run.computed} computed, {res.run.cached} cached), {res.run.wall_s:.1f} s")
    for k in res.keys:
        t.add_column(k.split(".")[-1], justify="right")
    metrics = res.table_metrics
    for m in metrics:
        t.add_column(LABELS.get(m, m), justify="right")
    t.add_column("Pareto")
    several = len(res.seeds) > 1
    for a in res.aggregated:
        cells = [f"{a['values'][k]:g}" + ("*" if a.get("varied") == k else "") for k in res.keys]
        for m in metrics:
            s = a.get(m)
            cells.append("-" if s is None else fmt(s["mean"]) + (f" ±{fmt(s['std'])}" if several else ""))
        t.add_row(*cells, "yes" if a.get("pareto") else "")
    table_console().print(t)
    Console(stderr=True).print(f"wrote {paths['json']}, {paths['md']}, {paths['png']}" + (" (± = 1 std across seeds)" if several else ""))
