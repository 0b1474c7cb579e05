"""`pearl calibrate --targets` recovers known parameters and reports residuals; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from models.config import load_experiment
from runtime.calibration.targets import Target, TargetsFile, apply, load_targets, predicted

ROOT = Path(__file__).resolve().parent.parent
TRUE = {"turns.mean": 18.0, "env_latency_s.mean": 6.0, "response_tokens_per_turn.mean": 420.0}


def _targets_file(tmp_path: Path) -> Path:
    """Targets computed by the predictor at TRUE parameters: a fit must find them again."""
    spec = apply(load_experiment(ROOT / "configs/experiments/paper-8b-motivation.yaml"), {"trajectories_per_batch": 256, **TRUE})
    metrics = {
        "rollout_16": {"metric": "rollout_s", "setting": {"rollout_gpus": 16}},
        "rollout_32": {"metric": "rollout_s", "setting": {"rollout_gpus": 32}},
        "ideal": {"metric": "mean_trajectory_s"},
        "decode_rate": {"metric": "decode_tok_s_per_gpu", "setting": {"rollout_gpus": 16}},
        "prefill_time": {"metric": "prefill_time_share_pct", "setting": {"rollout_gpus": 16}},
    }
    targets = {n: {**m, "value": round(predicted(spec, Target(value=1.0, **m)), 6)} for n, m in metrics.items()}
    doc = {
        "name": "synthetic",
        "source": "the predictor at known parameters",
        "experiment": "paper-8b-motivation",
        "parameters": {"turns.mean": {"low": 5, "high": 50}, "env_latency_s.mean": {"low": 1, "high": 30}, "response_tokens_per_turn.mean": {"low": 100, "high": 2000}},
        "candidates": [{"name": "b256", "fixed": {"trajectories_per_batch": 256}}, {"name": "b32", "fixed": {"trajectories_per_batch": 32}}],
        "targets": targets,
        "held_out": ["nothing: a test"],
    }
    path = tmp_path / "targets.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_calibrate_recovers_known_parameters(pearl, tmp_path: Path) -> None:
    targets = _targets_file(tmp_path)
    out = tmp_path / "fitted.yaml"
    res = pearl("calibrate", "--targets", str(targets), "--out", str(out), "--no-simulate", "--json", timeout=600)
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    assert set(rep) >= {"targets", "parameters", "workload"} and rep["workload"] == str(out)
    assert rep["candidate"] == "b256" and rep["candidates"]["b32"]["rms_pct"] > rep["candidates"]["b256"]["rms_pct"]
    for name, row in rep["targets"].items():
        assert set(row) >= {"target", "model", "residual_pct"} and abs(row["residual_pct"]) < 1.0, (name, row)
    for k, v in TRUE.items():
        assert abs(rep["parameters"][k] / v - 1) < 0.05, (k, rep["parameters"][k], v)
    # the workload file loads as a workload and says where it came from
    text = out.read_text()
    assert "pearl calibrate" in text and "targets.yaml" in text and "Held out" in text
    w = yaml.safe_load(text)
    assert w["trajectories_per_batch"] == 256 and abs(w["turns"]["mean"] / TRUE["turns.mean"] - 1) < 0.05


def test_calibrate_needs_exactly_one_source(pearl, tmp_path: Path) -> None:
    res = pearl("calibrate", "--out", str(tmp_path / "x.yaml"))
    assert res.returncode == 2 and "exactly one of them" in res.stderr and "Traceback" not in res.stderr


def test_a_bad_targets_file_names_the_field(pearl, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    doc = yaml.safe_load(_targets_file(tmp_path).read_text())
    doc["parameters"]["turns.median"] = {"low": 1, "high": 2}
    bad.write_text(yaml.safe_dump(doc))
    res = pearl("calibrate", "--targets", str(bad), "--out", str(tmp_path / "x.yaml"))
    assert res.returncode == 2 and "parameters.turns.median" in res.stderr and "Traceback" not in res.stderr
    doc["parameters"].pop("turns.median")
    doc["targets"]["rollout_16"]["setting"] = {}
    bad.write_text(yaml.safe_dump(doc))
    res = pearl("calibrate", "--targets", str(bad), "--out", str(tmp_path / "x.yaml"))
    assert res.returncode == 2 and "rollout_gpus" in res.stderr and "Traceback" not in res.stderr


def test_the_paper_calibration_set_holds_no_held_out_result() -> None:
    """The paper's targets are the motivation and engine statistics only (the issue's split)."""
    tf: TargetsFile = load_targets(ROOT / "configs/calibration/paper-8b.yaml")
    metrics = {t.metric for t in tf.targets.values()}
    assert metrics <= {"training_step_s", "rollout_over_training", "rollout_cut_pct", "rollout_share_pct", "mean_trajectory_s",
                       "prefill_token_share_pct", "prefill_time_share_pct", "decode_tok_s_per_gpu"}
    assert {t.value for t in tf.targets.values()} == {163.8, 5.7, 4.5, 10.3, 8.9, 81.8, 216.3, 96.68, 26.48, 400.0}


def test_a_targets_file_naming_a_missing_workload_is_one_clear_error(pearl, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    doc = yaml.safe_load(_targets_file(tmp_path).read_text())
    doc["workload"] = "swe-agentik"
    bad.write_text(yaml.safe_dump(doc))
    res = pearl("calibrate", "--targets", str(bad), "--out", str(tmp_path / "x.yaml"))
    assert res.returncode == 2 and "field 'workload'" in res.stderr and "swe-agentic" in res.stderr and "Traceback" not in res.stderr
