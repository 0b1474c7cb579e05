"""experiments/sim_fidelity.py replays the real-engine validation's own points in the simulator.

It once read a measurement format that experiments/validate_predictor.py no longer writes, found
no points and compared the simulator with the predictor on a grid instead, while its table still
named the measurement file: these tests hold it to the points the file has.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO_ROOT

MEASURED = REPO_ROOT / "results/validate_predictor.json"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "experiments/sim_fidelity.py", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


def test_every_measured_point_is_replayed_and_the_simulator_meets_its_target(tmp_path: Path) -> None:
    out = tmp_path / "fidelity.json"
    res = _run("--measured", str(MEASURED), "--out", str(out), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(out.read_text())
    data = json.loads(MEASURED.read_text())
    points = [(p["layout"], p["batch"], p["env_s"], p["measured_s"]) for m in data["modes"].values() for p in m["points"]]
    assert [(r["layout"], r["batch"], r["env_s"], r["measured_s"]) for r in got["rows"]] == points
    assert got["config"] == Path(data["experiment"]).name
    # the replay runs on the profiles the validation predicted with: the predictor gives its predictions
    # again (a profile changed since: run experiments/validate_predictor.py, then this script)
    assert all(abs(r["predicted_s"] - r["validation_predicted_s"]) <= 0.0006 for r in got["rows"]), got["rows"]
    # the simulator against the real engines' batches
    assert got["mape_sim_vs_measured_pct"] <= got["target_pct"], got["rows"]


def test_a_file_that_is_not_a_validation_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "old.json"
    bad.write_text(json.dumps({"rows": [{"mode": "colocated", "batch": 4}]}))
    res = _run("--measured", str(bad), "--out", str(tmp_path / "out.json"))
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "'modes'" in lines[0], res.stderr
    assert not (tmp_path / "out.json").exists()


def test_a_validation_naming_a_missing_experiment_is_one_clear_error(tmp_path: Path) -> None:
    data = json.loads(MEASURED.read_text())
    data["experiment"] = "configs/experiments/no-such-experiment.yaml"
    bad = tmp_path / "validation.json"
    bad.write_text(json.dumps(data))
    res = _run("--measured", str(bad), "--out", str(tmp_path / "out.json"))
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0 and len(lines) == 1 and "no-such-experiment.yaml" in lines[0], res.stderr
