"""experiments/bench_planner.py's `--batch-per-gpu`: the batch grows with the cluster, so that a
large cluster is timed under the load per GPU of a small one, not with GPUs to spare."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.bench_planner import bench, with_batch_per_gpu
from models.builder import build_models
from models.config import load_experiment

ROOT = Path(__file__).resolve().parent.parent
MIXED = "configs/experiments/mixed-elastic.yaml"  # 1,024 trajectories per batch in groups of 16


def test_the_batch_is_per_gpu_times_the_cluster_in_whole_groups() -> None:
    spec = load_experiment(MIXED)
    assert spec.workload.trajectories_per_batch == 1024 and spec.workload.group_size == 16
    batch = lambda n, per_gpu: with_batch_per_gpu(spec, n, per_gpu).workload.trajectories_per_batch  # noqa: E731
    assert batch(256, 4) == 1024 and batch(4096, 4) == 16384  # 256 GPUs at 4 per GPU: the config's own batch
    assert batch(256, 4.01) == 1040  # 1,026.6 rounds up to whole groups of 16
    assert batch(16, 0.001) == 16  # never below one group
    assert with_batch_per_gpu(spec, 4096, 4).workload.turns == spec.workload.turns  # only the batch changes


def test_each_size_is_planned_for_its_own_batch() -> None:
    models = build_models(load_experiment(MIXED))
    rows = bench(models, [16, 32], ["cbc"], 2, 0, mixed=True, batch_per_gpu=4)
    assert [r["batch"] for r in rows] == [64, 128]
    assert all(r["optimal_fraction"] == 1.0 for r in rows)
    [plain] = bench(models, [32], ["cbc"], 2, 0, mixed=True)
    assert plain["batch"] == 1024  # without the flag, the config's batch at every size


@pytest.mark.parametrize("script", ["bench_planner", "mixed_search_stats"])
def test_each_script_refuses_a_batch_the_config_refuses_in_its_own_name_before_any_work(script: str, tmp_path) -> None:
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, f"experiments/{script}.py", "--gpus", "16,4096", "--batch-per-gpu", "1000", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (f"{script}: error: --batch-per-gpu 1000 at 4096 GPUs gives 4096000 trajectories per batch; "
                                   "trajectories_per_batch: an integer greater than 0 and less than or equal to 1000000")
    assert not out.exists()  # refused before the 16-GPU size ran


def test_search_stats_time_the_native_solver_inside_each_decision(tmp_path) -> None:
    """mixed_search_stats' `native_solve_ms`: the part of a decision spent in CP-SAT's native
    solve, timed per decision around the planner's own solver calls (run apart: the script
    patches the planner's modules for its run)."""
    out = tmp_path / "stats.json"
    proc = subprocess.run([sys.executable, "experiments/mixed_search_stats.py", "--gpus", "16,64", "--events", "4", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["rows"]
    for r in rows:
        assert 0.0 <= r["native_solve_ms_p50"] <= r["native_solve_ms_p95"] <= r["decision_ms_p95"]
        assert (r["native_solve_ms_p95"] > 0.0) == (r["programs_total"] > 0)
    assert rows[1]["programs_total"] > 0  # 64 GPUs: programs were solved, and timed
