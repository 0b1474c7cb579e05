"""`pearl predict --json` prints the issue's contract; `best` agrees with the numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import pytest

from models.builder import build_models, rollout_gpu_count
from models.config import load_experiment

CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "experiments"


def check_contract(out: dict[str, Any]) -> None:
    assert set(out) >= {"colocated", "disaggregated", "best"}
    col, dis = out["colocated"], out["disaggregated"]
    assert set(col) >= {"completion_s", "instances"}
    assert set(dis) >= {"completion_s", "prefill", "decode"}
    for v in (col["completion_s"], dis["completion_s"]):
        assert isinstance(v, (int, float)) and v > 0 and math.isfinite(v)
    for v in (col["instances"], dis["prefill"], dis["decode"]):
        assert isinstance(v, int) and v >= 1
    assert out["best"] in ("colocated", "disaggregated")
    faster = "colocated" if col["completion_s"] <= dis["completion_s"] else "disaggregated"
    assert out["best"] == faster


def test_predict_json_default_contract(pearl: Callable[..., Any]) -> None:
    res = pearl("predict", "--config", str(CONFIGS / "default.yaml"), "--json")
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1  # exactly one JSON object on stdout
    out = json.loads(lines[0])
    check_contract(out)
    # Instances follow the config: 4 reserved + 12 elastic H800 GPUs as TP2 workers.
    spec = load_experiment(CONFIGS / "default.yaml")
    gpus = rollout_gpu_count(spec)
    assert out["colocated"]["instances"] == gpus // 2 == 8
    assert out["disaggregated"]["prefill"] + out["disaggregated"]["decode"] == gpus // 2


def test_predict_json_matches_the_predictor(pearl: Callable[..., Any]) -> None:
    cfg = CONFIGS / "pd-crossover.yaml"
    res = pearl("predict", "--config", str(cfg), "--json", "--batch", "32")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    check_contract(out)
    m = build_models(load_experiment(cfg), batch=32)
    col = m.predictor.colocated(8)
    dis = m.predictor.best_disaggregated(8)
    assert out["colocated"]["completion_s"] == pytest.approx(col.completion_s, rel=1e-3)
    assert out["disaggregated"]["completion_s"] == pytest.approx(dis.completion_s, rel=1e-3)
    assert (out["disaggregated"]["prefill"], out["disaggregated"]["decode"]) == (dis.prefill, dis.decode)


def test_predict_gpus_flag_changes_instances(pearl: Callable[..., Any]) -> None:
    res = pearl("predict", "--config", str(CONFIGS / "pd-crossover.yaml"), "--json", "--gpus", "8")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    check_contract(out)
    assert out["colocated"]["instances"] == 4
    assert out["disaggregated"]["prefill"] + out["disaggregated"]["decode"] == 4


def test_predict_table_without_json(pearl: Callable[..., Any]) -> None:
    res = pearl("predict", "--config", str(CONFIGS / "pd-crossover.yaml"))
    assert res.returncode == 0, res.stderr
    assert "colocated" in res.stdout and "disaggregated" in res.stdout and "best:" in res.stdout


def test_predict_rejects_bad_flag_value(pearl: Callable[..., Any]) -> None:
    res = pearl("predict", "--config", str(CONFIGS / "pd-crossover.yaml"), "--json", "--gpus", "0")
    assert res.returncode == 2 and "Traceback" not in res.stderr and res.stdout == ""
