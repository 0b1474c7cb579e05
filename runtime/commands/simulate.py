"""`pearl simulate`: one policy through the discrete-event simulator."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from runtime.cli import app, user_errors
from runtime.flags import hours_option, offset_option, seed_option, window_flags

if TYPE_CHECKING:
    from runtime.sim.metrics import SimResult


def trace_progress(hours: float, label: str):
    """A rich progress bar on stderr over simulated time; returns (context manager, callback)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed:.1f}/{task.total:.1f} h"), TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    task = prog.add_task(label, total=hours)

    def update(t: float) -> None:
        prog.update(task, completed=t / 3600.0)

    return prog, update


def warn_failures(results: dict[str, SimResult]) -> bool:
    """One stderr line per policy that failed decisions (stdout may be JSON); True if one failed them all.

    A policy that cannot decide keeps its layout, so without this a run with no layout at all
    would only show 0 tokens/s.
    """
    from runtime.sim.metrics import failure_warning

    for name, r in results.items():
        if r.policy_failures:
            print(failure_warning(f"policy {name}", r.policy_failures, r.decisions, r.starts, r.failure), file=sys.stderr)
    return any(r.failed_all for r in results.values())


def failed_cell(r: SimResult) -> str:
    """`failed/decisions` for a table, marked when nothing ran."""
    return f"{r.policy_failures}/{r.decisions}" + (" (all)" if r.failed_all else "")


@app.command()
@user_errors
def simulate(
    config: Path = typer.Option(..., "--config", "-c", help="experiment YAML"),
    policy: Optional[str] = typer.Option(None, "--policy", "-p", help="pearl | pearl-no-borrow | pearl-fixed-pd | pearl-no-gate | roll | rlboost+ | rlboost+pd | fixed:<mode>:<c>:<p>:<d>[:<borrow>] | on a mixed cluster fixed:<type>=<n><C|P|D>@TP<d>[+...],..."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="availability trace for the elastic pool (overrides the config's)"),
    trace_offset_hours: Optional[float] = offset_option("start this many hours into the trace"),
    hours: Optional[float] = hours_option("simulated hours (default: the config's trace hours, else 2)"),
    seed: Optional[int] = seed_option("random seed (default: the config's)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Simulate asynchronous agentic RL under one policy and report throughput, switches and safety counters."""
    from models.config import load_experiment
    from runtime.flags import check_policies
    from runtime.jsonout import print_json, stdout_to_stderr
    from runtime.sim.run import TraceFlags, run_hours
    from runtime.sim.run import simulate as run_sim

    spec = load_experiment(config)
    check_policies([spec.policy.name if policy is None else policy], spec, "--policy" if policy is not None else None, "simulate")  # `--policy ""` is refused, not read as absent
    flags = TraceFlags(str(trace) if trace else None, trace_offset_hours, hours)
    h = run_hours(spec, flags)
    prog, update = trace_progress(h, f"simulating {policy or spec.policy.name}")
    with stdout_to_stderr(as_json), prog, window_flags("simulate", hours, trace_offset_hours):
        r = run_sim(spec, policy, flags, hours=h, seed=seed, progress=update)
    if as_json:
        print_json({**r.to_json(), "feasible": r.policy_failures == 0})  # a layout at every decision; else `failure` says why
    else:
        print_table(r, f"{spec.name}: {r.policy}, {h:g} simulated h (seed {r.seed}, {r.wall_s:.1f} s wall, {r.events} events)")
    if warn_failures({r.policy: r}):
        raise typer.Exit(1)


def print_table(r: SimResult, title: str) -> None:
    """The metric/value table on stdout; failed decisions and the first reason get rows when there are any."""
    from rich.table import Table

    from runtime.tables import table_console
    s = r.summary()
    t = Table(title=title)
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k in ("tokens_per_s", "steps_per_h", "trajectories_per_h", "rollout_share", "mean_batch_s", "mean_step_interval_s",
              "switches", "starts", "stops", "lends", "preempted_instances", "resumed_requests", "lost_trajectories", "late_returns"):
        t.add_row(k, str(s[k]))
    if r.policy_failures:
        t.add_row("failed decisions", failed_cell(r))
        t.add_row("first failure", str(r.failure))
    u = r.utilization()
    for k, v in u.get("mean_gpus", {}).items():
        t.add_row(f"mean GPUs {k}", str(v))
    for k, v in u.get("busy_fraction", {}).items():
        t.add_row(f"busy fraction {k}", str(v))
    table_console().print(t)
