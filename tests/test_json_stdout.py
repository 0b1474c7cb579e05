"""`--json` means exactly one strict JSON object on stdout, for the CLI and the experiments.

Pipelines read it with `json.load`, so stdout must hold nothing else (solver banners written
by C code to fd 1, tables, progress bars, log lines) and no bare NaN/Infinity, which
Python's json writes and accepts but JSON does not have.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from conftest import REPO_ROOT, CliResult
from runtime.jsonout import dumps

DEFAULT = str(REPO_ROOT / "configs/experiments/default.yaml")
TINY_SAMPLES = REPO_ROOT / "configs/profiles/samples/cpu-tiny.jsonl"


def _reject_constant(token: str) -> None:
    raise ValueError(f"non-standard JSON constant {token} on stdout")


def strict_object(res: CliResult) -> dict[str, Any]:
    """stdout as exactly one JSON object without NaN/Infinity (anything else fails the parse)."""
    assert res.returncode == 0, res.stderr[-3000:]
    obj = json.loads(res.stdout, parse_constant=_reject_constant)
    assert isinstance(obj, dict), res.stdout[:300]
    return obj


def run_python(*args: str, timeout: float = 120.0) -> CliResult:
    """An experiment script (or `-c` code) in a subprocess from the repo root, both streams captured."""
    proc = subprocess.run([sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


# `{tmp}` is the test's tmp_path. plan runs highspy, whose constructor used to print a banner.
CLI_CASES = {
    "predict": ["predict", "--config", DEFAULT, "--json"],
    "plan-highspy": ["plan", "--config", DEFAULT, "--hours", "0.5", "--backend", "highspy", "--out", "{tmp}/plan.json", "--json"],
    "simulate": ["simulate", "--config", DEFAULT, "--hours", "0.5", "--json"],
    "compare": ["compare", "--config", DEFAULT, "--hours", "0.5", "--json"],
    "fit": ["fit", "--samples", str(TINY_SAMPLES), "--out", "{tmp}/profile.json", "--json"],
    "sweep": ["sweep", "--config", DEFAULT, "--set", "costs.transition_weight=0,1", "--hours", "0.1", "--jobs", "1",
              "--cache", "{tmp}/cache", "--out", "{tmp}/sweep", "--json"],
}

EXPERIMENT_CASES = {
    "bench_planner": ["experiments/bench_planner.py", "--gpus", "16", "--events", "2", "--backends", "highspy,pulp", "--out", "{tmp}/bench.json", "--json"],
    "bench_sim": ["experiments/bench_sim.py", "--hours", "0.05", "--check-hours", "0", "--out", "{tmp}/bench_sim.json", "--json"],
    "sim_fidelity": ["experiments/sim_fidelity.py", "--out", "{tmp}/sim_fidelity.json", "--json"],
}


@pytest.mark.parametrize("argv", list(CLI_CASES.values()), ids=list(CLI_CASES))
def test_cli_json_is_one_strict_object(pearl: Callable[..., CliResult], tmp_path: Path, argv: list[str]) -> None:
    strict_object(pearl(*(a.format(tmp=tmp_path) for a in argv)))


@pytest.mark.parametrize("argv", list(EXPERIMENT_CASES.values()), ids=list(EXPERIMENT_CASES))
def test_experiment_json_is_one_strict_object(tmp_path: Path, argv: list[str]) -> None:
    out = strict_object(run_python(*(a.format(tmp=tmp_path) for a in argv)))
    if argv[0].endswith("bench_planner.py"):
        assert set(out) == {"meta", "rows"} and [r["backend"] for r in out["rows"]] == ["highspy", "pulp"]


def test_every_solver_backend_is_silent_at_the_source() -> None:
    """As a library (no CLI, no fd redirection) no backend writes to stdout: each is configured
    silent where it is called, not only hidden by the `--json` backstop."""
    code = (
        "import sys; sys.path.insert(0, 'experiments')\n"
        "from bench_planner import bench\n"
        "from models.builder import build_models\n"
        "from models.config import load_experiment\n"
        "from planner.backends import BACKENDS\n"
        f"bench(build_models(load_experiment({DEFAULT!r})), [16], list(BACKENDS), 2, 0)\n"
    )
    res = run_python("-c", code)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout == "", res.stdout[:500]


def test_too_few_samples_are_refused_not_fitted_with_a_nan_error(pearl: Callable[..., CliResult], tmp_path: Path) -> None:
    """Two samples per kind cannot identify a fit nor leave one to judge it by: exit 2, one line,
    nothing on stdout (never a "measured" profile with a NaN held-out error printed as null)."""
    samples = tmp_path / "few.jsonl"
    samples.write_text("\n".join(TINY_SAMPLES.read_text().splitlines()[:5]) + "\n")  # header, 2 prefill, 2 decode
    res = pearl("fit", "--samples", str(samples), "--out", str(tmp_path / "p.json"), "--json")
    assert res.returncode == 2 and res.stdout == "" and "field 'prefill samples'" in res.stderr, res.stderr
    assert not (tmp_path / "p.json").exists()


def test_dumps_turns_non_finite_numbers_into_null() -> None:
    doc = {"nan": math.nan, "np": np.float64("nan"), "inf": [math.inf, -math.inf, 1.5], "tuple": (2, "x")}
    assert dumps(doc) == '{"nan": null, "np": null, "inf": [null, null, 1.5], "tuple": [2, "x"]}'
