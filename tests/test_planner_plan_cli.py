"""`pearl plan` on the bundled config and a real trace; bad traces exit 2 with one line."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import REPO_ROOT


def test_plan_on_a_real_trace(pearl, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    # HiGHS prints a banner from C++ to fd 1: stdout must still hold exactly one JSON object
    res = pearl("plan", "--config", str(REPO_ROOT / "configs/experiments/default.yaml"), "--trace-offset-hours", "1", "--hours", "1", "--out", str(out), "--json", "--backend", "highspy")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert set(summary) == {"decisions", "solve_ms_p50", "solve_ms_p95", "optimal_fraction", "role_changes", "predicted_rollout_s", "feasible", "reason"}
    assert summary["feasible"] is True and summary["reason"] is None
    doc = json.loads(out.read_text())
    assert summary["decisions"] == len(doc["decisions"]) == doc["trace"]["events"] >= 2
    assert summary["optimal_fraction"] == 1.0 and summary["predicted_rollout_s"] > 0
    first = doc["decisions"][0]
    assert first["event"] == "initial" and first["plan"]["joins"] > 0
    for rec in doc["decisions"]:
        d = rec["decision"]
        assert d["proof"]["status"] == "optimal" and d["proof"]["solve_ms"] > 0
        gpus = sum(n for roles in d["per_node"].values() for n in roles.values()) * 2  # TP2 everywhere
        assert gpus <= 4 + rec["elastic_gpus"]  # no borrowing offline: reserved + available elastic only
        kinds = {a["kind"] for a in rec["plan"]["actions"]}
        assert kinds <= {"start", "load_weights", "drain", "switch_role", "stop", "lend", "return"}


def test_plan_bad_traces_exit_2_with_one_line(pearl, tmp_path: Path) -> None:
    cfg = str(REPO_ROOT / "configs/experiments/default.yaml")
    res = pearl("plan", "--config", cfg, "--trace", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "p.json"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "an existing trace file" in res.stderr
    res = pearl("plan", "--config", cfg, "--hours", "50", "--out", str(tmp_path / "p.json"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "trace spans" in res.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,count\n2021-07-26T18:42:00Z,-3\n")
    res = pearl("plan", "--config", cfg, "--trace", str(bad), "--out", str(tmp_path / "p.json"))
    assert res.returncode == 2 and "line 2" in res.stderr and "Traceback" not in res.stderr
    res = pearl("plan", "--config", cfg, "--policy", "nope", "--out", str(tmp_path / "p.json"))
    assert res.returncode == 2 and "pearl-no-borrow" in res.stderr


def test_plan_drives_each_elastic_type_by_its_own_trace(pearl, tmp_path: Path) -> None:
    """`elastic_traces` (mixed-elastic.yaml: H20 and A100 spot pools, one SkyPilot trace each):
    one decision per instant any type's availability changes, each type's GPUs following its own
    trace; the plan names the type that changed and counts every type's available GPUs."""
    from models.config import load_experiment
    from runtime.offline_plan import load_typed_windows

    cfg = REPO_ROOT / "configs/experiments/mixed-elastic.yaml"
    out = tmp_path / "plan.json"
    res = pearl("plan", "--config", str(cfg), "--hours", "1", "--out", str(out), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    spec = load_experiment(cfg)
    windows = load_typed_windows(spec, hours=1.0)
    assert set(windows) == {"H20", "A100"} and "H20: " in doc["trace"]["path"] and "A100: " in doc["trace"]["path"]
    instants = sorted({t for tr in windows.values() for t, _ in tr.changes()})
    assert [r["t_s"] for r in doc["decisions"]] == instants and len(instants) >= 3
    for rec in doc["decisions"]:
        t = rec["t_s"]
        assert rec["elastic_gpus"] == sum(tr.at(t) for tr in windows.values())
        changed = {typ for typ, tr in windows.items() if t in dict(tr.changes()) and t > 0}
        assert rec["gpu_type"] == ("+".join(sorted(changed)) if rec["event"] == "availability" else None)
        assert rec["decision"]["proof"]["status"] in ("optimal", "feasible")
