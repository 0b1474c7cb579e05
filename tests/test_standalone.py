"""The project stands alone: a user's clone has no reference shelf beside it, so nothing in
the tree may point outside it, and every trace a shipped config names is shipped too."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from models.config import load_experiment
from runtime.traces import load_trace

from conftest import CONFIGS, REPO_ROOT, run_pearl

# Built from parts so that this file does not match itself (nor the issue's own grep for it).
SHELF = "shared"
OUTSIDE = ("../" + SHELF, "/" + SHELF + "/data", SHELF + "/" + "data/", SHELF + "/" + "reference")
TEXT_SUFFIXES = {".py", ".yaml", ".yml", ".md", ".json", ".toml", ".txt", ".cfg", ".sh", ""}


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
        return [REPO_ROOT / line for line in out.splitlines() if line]
    except (OSError, subprocess.CalledProcessError):  # an exported tree without .git
        skip = {".venv", ".git", "artifacts", "runs", "__pycache__"}
        return [p for p in REPO_ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(REPO_ROOT).parts)]


def test_nothing_in_the_tree_points_outside_the_project() -> None:
    offenders = []
    for path in _tracked_files():
        if path.suffix not in TEXT_SUFFIXES or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for needle in OUTSIDE:
            if needle in text:
                offenders.append(f"{path.relative_to(REPO_ROOT)}: {needle}")
    assert not offenders, "paths outside the project:\n" + "\n".join(offenders)


def _configs_with_traces() -> list[Path]:
    return sorted(p for p in (CONFIGS / "experiments").glob("*.yaml") if re.search(r"^trace:", p.read_text(), re.M))


@pytest.mark.parametrize("config", _configs_with_traces(), ids=lambda p: p.stem)
def test_every_config_trace_is_shipped_inside_the_repository(config: Path) -> None:
    spec = load_experiment(config)
    assert spec.trace is not None
    path = Path(spec.trace.path)
    assert path.is_file() and path.resolve().is_relative_to(REPO_ROOT / "data" / "traces"), path
    assert len(load_trace(spec.trace, pool_gpus=spec.cluster.gpus_in_pool("elastic") or None).gpus) >= 1


def test_shipped_trace_folders_carry_source_and_licence() -> None:
    bamboo, sky = REPO_ROOT / "data/traces/bamboo", REPO_ROOT / "data/traces/skypilot"
    assert "MIT" in (bamboo / "LICENSE").read_text()
    assert "uclasystem/bamboo" in (bamboo / "README.md").read_text()
    sky_readme = (sky / "README.md").read_text()
    assert "skypilot-org/spot-traces" in sky_readme and "NSDI 24" in sky_readme


def test_a_users_own_trace_given_relative_to_the_working_directory_is_read(tmp_path: Path) -> None:
    """Users bring their own traces: a config's relative trace.path that is not under the
    project resolves against the directory pearl runs in."""
    (tmp_path / "mine.json").write_text('{"metadata": {"gap_seconds": 300}, "data": [0, 2, 4, 2, 0, 4]}')
    config = tmp_path / "exp.yaml"
    base = (CONFIGS / "experiments" / "default.yaml").read_text()
    lines = base.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("trace:"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith(" ")), len(lines))
    lines[start:end] = ["trace:", "  path: mine.json", "  scale_to_pool: true"]
    config.write_text("\n".join(lines) + "\n")
    # an experiment file outside configs/experiments/ names the project's bundled specs
    res = run_pearl("plan", "--config", str(config), "--hours", "0.4", "--out", str(tmp_path / "plan.json"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["trace"]["path"] == str(tmp_path / "mine.json")
    assert plan["trace"]["mean_elastic_gpus"] > 0
