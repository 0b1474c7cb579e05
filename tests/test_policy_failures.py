"""A policy that fails decisions is reported loudly, never as a silent 0 tokens/s.

`pearl compare`, `pearl simulate` and `pearl sweep` put failed decisions in their table and
one warning per failing policy on stderr (stdout may be JSON), and exit 1 when a policy
never got a layout running. The invariant: no policy reports 0 tokens/s without an error.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO_ROOT, CliResult, pearl_executable, run_pearl
from models import architecture as arch
from models.builder import build_models
from models.config import load_experiment
from planner.inputs import PlanningInputs
from planner.state import ClusterState
from runtime.commands.simulate import warn_failures
from runtime.sim.layout import FixedLayout, Layout, PolicyStep
from runtime.sim.planner_adapter import NO_PLAN
from runtime.sim.run import POLICIES, TraceFlags, load_availability
from runtime.sim.simulator import Simulator

DEFAULT = REPO_ROOT / "configs/experiments/default.yaml"
# Qwen3-0.6B in bf16 (1.11 GiB of weights) on the `cpu` machine class (1 GiB per slot, TP 1
# only): no rollout layout exists, so every policy fails every decision.
TOO_BIG = "name: too-big\nmodel: qwen3-0.6b\nworkload: cpu-tiny\ncluster: cpu-2\nprofile: cpu-qwen3-0.6b\nseed: 0\n"
WIDE = {"COLUMNS": "250"}  # rich wraps tables to the terminal; keep each row on one line


@pytest.fixture
def too_big(tmp_path: Path) -> Path:
    path = tmp_path / "too-big.yaml"
    path.write_text(TOO_BIG)
    spec = load_experiment(path)
    gpu = spec.hardware.gpus[spec.cluster.nodes[0].gpu]
    assert arch.weight_bytes(spec.model) > gpu.memory_gib * 2**30  # the premise: the weights do not fit one slot
    return path


def pearl_wide(*args: str) -> CliResult:
    """The real CLI with a wide terminal, so table cells are not truncated."""
    proc = subprocess.run([*pearl_executable(), *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **WIDE})
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def warnings(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("pearl: warning:")]


def assert_no_traceback(res: CliResult) -> None:
    assert "Traceback" not in res.stdout + res.stderr, res.stderr[-2000:]


def test_compare_json_reports_every_failed_decision_and_exits_1(too_big: Path) -> None:
    res = run_pearl("compare", "--config", str(too_big), "--policies", "pearl,roll", "--hours", "0.1", "--json")
    assert res.returncode == 1, res.stderr[-2000:]
    assert_no_traceback(res)
    out = json.loads(res.stdout)  # stdout stays one JSON object; the warnings are on stderr
    lines = warnings(res.stderr)
    assert len(lines) == 2
    for name, row in out["policies"].items():
        assert row["tokens_per_s"] == 0
        assert row["decisions"] >= 1 and row["policy_failures"] == row["decisions"]
        assert row["failure"]
        line = next(ln for ln in lines if f"policy {name} " in ln)
        assert f"failed {row['decisions']} of {row['decisions']} decisions" in line and row["failure"] in line


def test_compare_table_shows_failed_decisions(too_big: Path) -> None:
    res = pearl_wide("compare", "--config", str(too_big), "--policies", "pearl,roll", "--hours", "0.1")
    assert res.returncode == 1, res.stderr[-2000:]
    assert_no_traceback(res)
    assert "failed decisions" in res.stdout
    rows = [ln for ln in res.stdout.splitlines() if ln.startswith("│ pearl ") or ln.startswith("│ roll ")]
    assert len(rows) == 2 and all("1/1 (all)" in r for r in rows), res.stdout
    assert len(warnings(res.stderr)) == 2


def test_simulate_table_and_exit_code(too_big: Path) -> None:
    res = pearl_wide("simulate", "--config", str(too_big), "--policy", "roll", "--hours", "0.1")
    assert res.returncode == 1, res.stderr[-2000:]
    assert_no_traceback(res)
    assert "failed decisions" in res.stdout and "1/1 (all)" in res.stdout and "first failure" in res.stdout
    [line] = warnings(res.stderr)
    assert "policy roll failed 1 of 1 decisions, no engine ever ran; first failure: " in line


def test_simulate_json_carries_the_first_failure(too_big: Path) -> None:
    res = run_pearl("simulate", "--config", str(too_big), "--hours", "0.1", "--json")
    assert res.returncode == 1
    out = json.loads(res.stdout)
    assert out["policy_failures"] == out["decisions"] >= 1 and out["failure"] and out["starts"] == 0
    assert out["failure"] in warnings(res.stderr)[0]


def test_sweep_warns_per_run_and_exits_1(too_big: Path, tmp_path: Path) -> None:
    res = pearl_wide("sweep", "--config", str(too_big), "--set", "costs.transition_weight=0,1", "--hours", "0.1", "--jobs", "1",
                     "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "sweep"))
    assert res.returncode == 1, res.stderr[-2000:]
    assert_no_traceback(res)
    assert "failed decisions" in res.stdout
    lines = warnings(res.stderr)
    assert len(lines) == 2 and all("policy pearl at transition_weight=" in ln and "failed 1 of 1 decisions" in ln for ln in lines)
    doc = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert all(r["policy_failures"] == 1 and r["failure"] for r in doc["records"])


@pytest.mark.parametrize("config", ["default", "too-big"])
def test_no_policy_reports_zero_throughput_without_an_error(config: str, too_big: Path) -> None:
    """Every policy, one short window: throughput > 0, or failed decisions with a reason."""
    path = DEFAULT if config == "default" else too_big
    res = run_pearl("compare", "--config", str(path), "--policies", ",".join(POLICIES), "--hours", "0.25", "--json")
    assert_no_traceback(res)
    out = json.loads(res.stdout)
    assert set(out["policies"]) == set(POLICIES)
    silent = {n: r for n, r in out["policies"].items() if not (r["tokens_per_s"] > 0 or (r["policy_failures"] > 0 and r["failure"]))}
    assert not silent, silent
    all_failed = any(r["policy_failures"] == r["decisions"] for r in out["policies"].values())
    assert res.returncode == (1 if all_failed else 0), res.stderr[-2000:]
    if config == "default":
        assert res.returncode == 0 and all(r["tokens_per_s"] > 0 for r in out["policies"].values())


class FlakyPolicy:
    """Fails its first `fail` decisions (as a planner that cannot decide does), then holds a fixed layout."""

    name = "flaky"
    predicted_s = math.nan

    def __init__(self, fixed: FixedLayout, fail: int) -> None:
        self.fixed, self.fail, self.calls = fixed, fail, 0

    def decide(self, state: ClusterState, inputs: PlanningInputs, now: float, event: str) -> PolicyStep:
        self.calls += 1
        if self.calls <= self.fail:
            return PolicyStep(NO_PLAN, "colocated", math.nan, {"error": f"failure #{self.calls}"})
        return self.fixed.decide(state, inputs, now, event)


def test_simulator_keeps_the_first_reason_and_a_recovered_policy_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    spec = load_experiment(DEFAULT)
    models = build_models(spec)
    tp = {"colocated": models.tp_colocated, "prefill": models.tp_prefill, "decode": models.tp_decode}
    policy = FlakyPolicy(FixedLayout(Layout("colocated", 2), tp), fail=2)
    r = Simulator(models, policy, load_availability(spec, TraceFlags(), 0.25), hours=0.25).run()
    assert r.policy_failures == 2 and r.decisions > 2 and r.failure == "failure #1"
    assert r.to_json()["failure"] == "failure #1"
    assert r.starts > 0 and r.tokens_per_s > 0 and not r.failed_all
    assert warn_failures({"flaky": r}) is False  # warned, but it ran: no exit 1
    err = capsys.readouterr().err
    assert f"policy flaky failed 2 of {r.decisions} decisions; first failure: failure #1" in err
    assert "no engine ever ran" not in err


def test_a_run_that_never_started_an_engine_counts_as_failed_all() -> None:
    """Failures that leave no engine (later decisions kept the empty layout) are no result either."""
    from runtime.sim.metrics import failed_every_decision

    assert failed_every_decision(3, 3, starts=0)
    assert failed_every_decision(1, 5, starts=0)
    assert not failed_every_decision(1, 5, starts=4)
    assert not failed_every_decision(0, 5, starts=0)
