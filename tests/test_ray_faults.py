"""Engines that die on a chosen request, on real Ray (emulated engines, runtime/ray_runtime/faults.py).

A crashed vLLM engine fails every request in flight on it; the controller restarts its slot.
If the same request goes back to a fresh engine and kills it again, a crash loop follows
(it once ran 17 minutes, 48 deaths, until pytest's timeout). These runs show the bounds:
  - a request in flight on two engine deaths of one kind is never sent to that kind again:
    its trajectory fails with a recorded reason and the run finishes its steps;
  - a slot that dies more than `runtime.max_restarts_per_slot` times stops the run with one
    clear error naming the slot and the cause, recorded in the metrics; restarts back off.
Each run has its own deadline well under pytest's timeout, so a regression fails, not hangs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from controller_runs import run_controller

from conftest import CONFIGS, run_pearl

pytestmark = [pytest.mark.ray]


def _config(tmp_path: Path, faults: list[dict], max_restarts: int, steps: int = 2) -> Path:
    """The two-slot CPU cluster and tiny workload, emulated engines that start in 1 s."""
    doc = yaml.safe_load((CONFIGS / "experiments" / "train-cpu-tiny.yaml").read_text())
    doc["name"] = "faults"
    doc["transition_costs"] = {"engine_start_s": 1.0, "role_switch_s": 1.5}
    doc["runtime"] = {"backend": "emulated", "steps": steps, "restart_backoff_s": 0.2, "max_restarts_per_slot": max_restarts,
                      "faults": faults, "metrics_path": str(tmp_path / "metrics.jsonl")}
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _records(run: dict, kind: str) -> list[dict]:
    return [r for r in run["records"] if r["record"] == kind]


def test_a_request_that_kills_two_engines_fails_its_trajectory_and_the_run_finishes(tmp_path):
    from models.config import load_experiment

    spec = load_experiment(_config(tmp_path, [{"request": "b0-5-t1-", "role": "any"}], max_restarts=3))
    t0 = time.monotonic()
    run = run_controller(spec, 2, tmp_path / "m.jsonl", lambda ctl: [], deadline_s=180)
    assert "error" not in run, run.get("error")
    s = run["summary"]
    assert s.steps == 2 and s.weight_version == 2
    # the poisoned request killed two engines (the first time with every request in flight on
    # it; then, retried alone as a suspect, alone), then was never sent to a third
    deaths = _records(run, "worker_died")
    assert len(deaths) == 2 and all("injected fault on request b0-5-t1-" in r["error"] for r in deaths), deaths
    assert [f["id"] for f in s.failed_trajectories] == ["b0-5"], s.failed_trajectories
    assert "2 colocated engines died" in s.failed_trajectories[0]["reason"]
    assert _records(run, "trajectory_failed")[0]["id"] == "b0-5"
    # everything else finished: 2 batches of 8, one trajectory given up
    assert len(run["trajectories"]) == 2 * 8 - 1 and s.lost_trajectories == 1
    # the dead slots came back after a backoff and served again
    assert sum(s.worker_failures.values()) == 2 and not _records(run, "run_failed")
    backoffs = _records(run, "restart_backoff")
    assert backoffs and all(b["seconds"] == pytest.approx(0.2 * 2 ** (b["failures"] - 1)) for b in backoffs), backoffs
    died = [r["t"] for r in _records(run, "worker_died")]
    assert any(r["t"] > max(died) for r in _records(run, "started"))
    assert time.monotonic() - t0 < 120


def test_a_slot_past_its_restart_bound_stops_the_run_with_one_clear_error(tmp_path):
    config = _config(tmp_path, [{"request": "-t", "role": "any"}], max_restarts=1, steps=3)  # every request kills its engine
    t0 = time.monotonic()
    res = run_pearl("train", "--config", str(config), "--json", timeout=240)
    took = time.monotonic() - t0
    assert res.returncode == 1, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr and res.stdout.strip() == ""
    errors = [line for line in res.stderr.splitlines() if line.startswith("pearl: error:")]
    assert len(errors) == 1, res.stderr[-2000:]
    line = errors[0]
    assert "run failed: worker w:" in line and "died 2 times" in line and "max_restarts_per_slot is 1" in line and "injected fault" in line, line
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    failed = [r for r in records if r["record"] == "run_failed"]
    assert len(failed) == 1 and failed[0]["reason"] in line
    deaths = [r for r in records if r["record"] == "worker_died"]
    assert 2 <= len(deaths) <= 4, deaths  # two slots: the run stops at the first slot's second death
    assert took < 120, took  # fails fast: the backoff (0.2 s, doubling) and the bound, not a timeout
