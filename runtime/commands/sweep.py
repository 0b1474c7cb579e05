"""`pearl sweep`: how config keys (cost weights, margins, thresholds, staleness) move throughput and switching."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from runtime.cli import app, user_errors

if TYPE_CHECKING:
    from runtime.sweep.study import SweepResult


@app.command()
@user_errors
def sweep(
    config: Path = typer.Option(..., "--config", "-c", help="experiment YAML"),
    sets: List[str] = typer.Option([], "--set", help="key=v1,v2,... over a numeric config key (repeat for more keys), e.g. costs.transition_weight=0,1,4"),
    mode: str = typer.Option("grid", "--mode", help="grid: every combination | oneway: one key at a time, the others at the config's values"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="availability trace for the elastic pool (overrides the config's)"),
    trace_offset_hours: Optional[float] = typer.Option(None, "--trace-offset-hours", min=0.0, help="start this many hours into the trace"),
    hours: Optional[float] = typer.Option(None, "--hours", min=0.01, help="simulated hours per point (default: the config's trace hours, else 2)"),
    policy: Optional[str] = typer.Option(None, "--policy", "-p", help="policy for every point (default: the config's)"),
    seeds: int = typer.Option(1, "--seeds", min=1, help="seeds per point: the config's seed, +1, ..."),
    jobs: int = typer.Option(2, "--jobs", "-j", min=1, help="parallel processes"),
    planner_only: bool = typer.Option(False, "--planner-only", help="run the `pearl plan` loop over the trace instead of the simulator"),
    pareto_x: str = typer.Option("switches", "--pareto-x", help="cost axis of the Pareto front (switches, reconfigurations, lends, ...)"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="PNG path (default: <out>/sweep.png)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="output folder for sweep.json / sweep.md / sweep.png (default: runs/sweep/<experiment>)"),
    cache: Path = typer.Option(Path("runs/sweep-cache"), "--cache", help="per-point result cache; a rerun resumes from it"),
    as_json: bool = typer.Option(False, "--json", help="print the JSON document on stdout"),
) -> None:
    """Sweep config keys through the simulator; write JSON, a markdown table and plots (cached, parallel, resumable)."""
    from models.config import load_experiment
    from runtime.jsonout import print_json, stdout_to_stderr
    from runtime.sim.run import TraceFlags
    from runtime.sweep.keys import parse_sets
    from runtime.sweep.study import run_study, write_outputs

    spec = load_experiment(config)
    parsed = parse_sets(sets, spec)
    flags = TraceFlags(str(trace) if trace else None, trace_offset_hours, hours)
    try:
        with stdout_to_stderr(as_json):  # worker processes inherit fd 1
            res = run_study(spec, parsed, mode, policy, flags, hours, seeds, jobs, planner_only, cache, pareto_x)
    except KeyboardInterrupt:
        print(f"pearl: sweep interrupted; finished points are cached in {cache}, rerun the same command to resume", file=sys.stderr)
        raise typer.Exit(130) from None
    paths = write_outputs(res, out or Path("runs/sweep") / spec.name, plot)
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
    Console().print(t)
    Console(stderr=True).print(f"wrote {paths['json']}, {paths['md']}, {paths['png']}" + (" (± = 1 std across seeds)" if several else ""))
