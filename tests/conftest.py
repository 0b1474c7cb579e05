"""Shared test helpers: the repo root, a private copy of configs/, and running the real `pearl` CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS = REPO_ROOT / "configs"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def pearl_executable() -> list[str]:
    """The installed console script beside this interpreter, else `python -m runtime.cli`."""
    script = Path(sys.executable).parent / "pearl"
    return [str(script)] if script.exists() else [sys.executable, "-m", "runtime.cli"]


def run_pearl(*args: str, cwd: Path = REPO_ROOT, timeout: float = 120.0) -> CliResult:
    """Run the real CLI in a subprocess (what a user types), capturing both streams."""
    proc = subprocess.run([*pearl_executable(), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def config_tree(tmp_path: Path) -> Path:
    """A writable copy of configs/ (tests break it on purpose); returns the copy's root."""
    dst = tmp_path / "configs"
    shutil.copytree(CONFIGS, dst)
    return dst


@pytest.fixture
def pearl() -> Callable[..., CliResult]:
    """`pearl(*args)` runs the real CLI in a subprocess and returns a CliResult."""
    return run_pearl
