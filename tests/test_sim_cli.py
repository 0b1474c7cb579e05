"""`pearl simulate` / `pearl compare`: the --json contract, the plot, and one-line errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from runtime.cli import app

ROOT = Path(__file__).resolve().parent.parent
CFG = str(ROOT / "configs/experiments/default.yaml")
KEYS = {"steps_per_h", "trajectories_per_h", "tokens_per_s", "rollout_share", "switches", "lost_trajectories", "late_returns", "train_delay_s"}


def test_compare_json_contract_and_plot(tmp_path):
    png = tmp_path / "cmp.png"
    res = CliRunner().invoke(app, ["compare", "--config", CFG, "--policies", "pearl,roll", "--hours", "0.4", "--plot", str(png), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(out["policies"]) == {"pearl", "roll"}
    for name, row in out["policies"].items():
        assert KEYS <= set(row), name
        assert row["lost_trajectories"] == 0 and row["late_returns"] == 0
        assert row["tokens_per_s"] > 0
    assert png.exists() and png.stat().st_size > 10_000


def test_compare_table_keeps_every_number_when_piped(pearl):
    """Off a terminal (a pipe, a log, CI) rich assumed 80 columns and cut the table's numbers to '15,…'."""
    table = pearl("compare", "--config", CFG, "--policies", "pearl,roll,rlboost+", "--hours", "0.2")
    assert table.returncode == 0, table.stderr[-2000:]
    assert "…" not in table.stdout, table.stdout
    res = CliRunner().invoke(app, ["compare", "--config", CFG, "--policies", "pearl,roll,rlboost+", "--hours", "0.2", "--json"])
    rows = json.loads(res.stdout.strip().splitlines()[-1])["policies"]
    for name, row in rows.items():
        line = next(x for x in table.stdout.splitlines() if x.startswith(f"│ {name} "))
        assert f"{row['tokens_per_s']:,.0f}" in line, (name, line)


def test_simulate_json_uses_trace_flags():
    res = CliRunner().invoke(app, ["simulate", "--config", CFG, "--policy", "fixed:colocated:8:0:0", "--trace-offset-hours", "2", "--hours", "0.3", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["policy"] == "fixed:colocated:8:0:0" and out["hours"] == 0.3


def test_bad_inputs_exit_2_with_one_line():
    cases = [
        ["simulate", "--config", CFG, "--policy", "nope", "--hours", "0.1"],
        ["simulate", "--config", CFG, "--trace", "/nonexistent/trace.csv", "--hours", "0.1"],
        ["simulate", "--config", CFG, "--trace-offset-hours", "100", "--hours", "0.1"],
        ["compare", "--config", CFG, "--policies", ",", "--hours", "0.1"],
    ]
    for argv in cases:
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 2, (argv, res.output)
        assert "Traceback" not in res.output
        assert "error" in res.output.lower()
