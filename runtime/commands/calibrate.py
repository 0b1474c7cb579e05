"""`pearl calibrate`: a workload file fitted to measured statistics or to per-trajectory logs."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

from runtime.cli import app, user_errors


@app.command()
@user_errors
def calibrate(
    targets: Optional[Path] = typer.Option(None, "--targets", "-t", help="aggregate targets YAML (configs/calibration/*.yaml)"),
    logs: Optional[list[Path]] = typer.Option(None, "--logs", help="per-trajectory JSONL log (repeatable), e.g. runs/<name>.trajectories.jsonl"),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="with --logs: experiment whose workload supplies what logs do not show (batch, group, cache hit, token budget)"),
    out: Path = typer.Option(..., "--out", "-o", help="workload YAML to write (e.g. configs/workloads/mine.yaml)"),
    simulate: bool = typer.Option(True, "--simulate/--no-simulate", help="with --targets: correct the fit against the simulator and report its residuals"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Fit a workload: to aggregate targets (--targets) or to per-trajectory logs (--logs)."""
    from models.config import ConfigError
    from runtime.jsonout import print_json
    from runtime.outputs import check_file

    if (targets is None) == (not logs):
        raise ConfigError("pearl calibrate", "--targets / --logs", "both" if targets else "neither", "exactly one of them")
    command = "pearl calibrate " + shlex.join(sys.argv[2:]) if len(sys.argv) > 2 else "pearl calibrate"
    check_file(out, "pearl calibrate", "--out")
    if logs:
        from runtime.calibration.from_logs import fit_workload, workload_yaml

        base = None
        if config is not None:
            from models.config import load_experiment

            base = load_experiment(config).workload
        fit = fit_workload(list(logs), base=base)
        out.write_text(workload_yaml(fit, source=command))
        if as_json:
            print_json({**fit.to_json(), "workload": str(out)})
        else:
            _print_log_fit(fit, out)
        return
    from rich.console import Console

    from runtime.calibration.targets import calibrate as run_calibration, load_targets, report, workload_yaml as targets_yaml

    assert targets is not None
    tf = load_targets(targets)
    err = Console(stderr=True)
    with err.status("calibrating") as status:
        cal = run_calibration(tf, simulate=simulate, progress=lambda msg: status.update(f"calibrating: {msg}"))
    out.write_text(targets_yaml(cal, str(targets), command))
    rep = report(cal, str(out))
    if as_json:
        print_json(rep)
        return
    _print_targets(rep)


def _print_targets(rep: dict) -> None:
    from rich.table import Table

    from runtime.tables import table_console
    t = Table(title=f"calibration: candidate {rep['candidate']} -> {rep['workload']}")
    for c in ("target", "measured", "model", "residual", "by", "predictor"):
        t.add_column(c)
    for name, r in rep["targets"].items():
        t.add_row(name, f"{r['target']:g}", f"{r['model']:.4g}", f"{r['residual_pct']:+.1f}%", r["evaluated_by"], f"{r.get('predictor', r['model']):.4g}")
    con = table_console()
    con.print(t)
    con.print("candidates (rms error of the predictor fit): " + ", ".join(f"{k} {v['rms_pct']:.1f}%" for k, v in rep["candidates"].items()))
    con.print("parameters: " + ", ".join(f"{k} = {v:g}" for k, v in rep["parameters"].items()))


def _print_log_fit(fit, out: Path) -> None:
    from rich.table import Table

    from runtime.tables import table_console
    t = Table(title=f"{fit.trajectories} trajectories, {fit.turns} turns -> {out}")
    for c in ("field", "samples", "observed mean", "fitted mean", "observed p90", "fitted p90", "note"):
        t.add_column(c)
    for f in fit.fields:
        t.add_row(f.name, str(f.samples), f"{f.observed.mean:.4g}", f"{f.fitted.mean:.4g}", f"{f.observed.p90:.4g}", f"{f.fitted.p90:.4g}", f.note)
    con = table_console()
    con.print(t)
    if fit.assumed:
        con.print("not in the logs (from the base workload or defaults): " + ", ".join(fit.assumed))
