"""The fit recovers known coefficients from synthetic samples of the step model; sample files round-trip."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from models.config import ConfigError, load_hardware, load_llms
from models.fit import StepSample, cross_folds, fit_profile, read_samples, write_samples
from models.step_latency import FEATURES, StepCoefficients, StepLatencyModel, StepShape, step_features

LLM = load_llms().models["qwen3-30b-a3b"]  # MoE: weight reads vary with tokens, so 'weights' is identifiable
GPU = load_hardware().gpus["H800"]
ROOT = Path(__file__).resolve().parent.parent
TP = 1  # no TP traffic: the comm column is zero and compute is identifiable
TRUE = {
    "prefill": StepCoefficients(fixed=0.004, requests=0.0002, compute=1.8, attn=1.5, weights=1.2, kv=1.0, comm=0.0),
    "decode": StepCoefficients(fixed=0.007, compute=2.5, attn=0.0, weights=1.4, kv=1.3, comm=0.0),
}
NOISE = 0.01


def _time(shape: StepShape, kind: str) -> float:
    return float(step_features(shape, LLM, GPU, TP) @ TRUE[kind].vector())


def synthetic_samples(seed: int = 0) -> list[StepSample]:
    """A profiling-like grid timed by the step model with TRUE coefficients, times (1 + 1% noise)."""
    rng = np.random.default_rng(seed)
    out: list[StepSample] = []
    for p, r, prefix in itertools.product([8, 32, 128, 512, 2048, 8192], [1, 4, 16], [0, 4096, 32768]):
        if r > p:
            continue
        shape = StepShape(p, r, prefix * r, 0, 0)
        out.append(StepSample("prefill", p, r, prefix * r, 0, 0, _time(shape, "prefill") * (1 + rng.normal(0, NOISE))))
    for d, ctx in itertools.product([1, 2, 4, 8, 16, 32, 64, 128, 256], [128, 1024, 4096, 16384, 32768]):
        shape = StepShape(0, 0, 0, d, d * ctx)
        out.append(StepSample("decode", 0, 0, 0, d, d * ctx, _time(shape, "decode") * (1 + rng.normal(0, NOISE))))
    return out


@pytest.fixture(scope="module")
def report():
    return fit_profile(synthetic_samples(), LLM, GPU, TP, name="synthetic", hardware="H800", model="qwen3-30b-a3b")


def test_prefill_coefficients_recovered(report) -> None:
    got = report.profile.prefill
    for name in ("fixed", "compute", "attn", "weights", "kv"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE["prefill"], name), rel=0.06), name
    # Per-request cost is a few percent of these steps' time: recovered less tightly.
    assert got.requests == pytest.approx(TRUE["prefill"].requests, rel=0.10)


def test_decode_coefficients_recovered(report) -> None:
    got = report.profile.decode
    for name in ("fixed", "weights"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE["decode"], name), rel=0.10), name

    def identified(shape: StepShape, base: StepShape, names: tuple[str, ...]) -> tuple[float, float]:
        """The fitted and true time of what `names` add between two shapes: where terms scale alike, only their sum is identifiable."""
        f = step_features(shape, LLM, GPU, TP) - step_features(base, LLM, GPU, TP)
        idx = [FEATURES.index(n) for n in names]
        return f[idx] @ got.vector()[idx], f[idx] @ TRUE["decode"].vector()[idx]

    # A decode step samples one token per sequence: matmul FLOPs and the per-request term both scale with sequences.
    fitted, true = identified(StepShape(0, 0, 0, 64, 0), StepShape(0, 0, 0, 1, 0), ("requests", "compute"))
    assert fitted == pytest.approx(true, rel=0.10)
    # Attention FLOPs and KV reads both scale with context tokens.
    fitted, true = identified(StepShape(0, 0, 0, 1, 10_000), StepShape(0, 0, 0, 1, 0), ("attn", "kv"))
    assert fitted == pytest.approx(true, rel=0.03)


def test_fit_is_non_negative_and_generalises(report) -> None:
    for kind in ("prefill", "decode"):
        assert np.all(report.profile.coefficients(kind).vector() >= 0)
        assert report.holdout_mape[kind] < 2.0  # noise is 1%: the model class is exact
        n = sum(s.kind == kind for s in synthetic_samples())
        assert report.n_train[kind] == report.n_holdout[kind] == n  # fitted on all; each held out once
    assert report.profile.label == "measured"
    # Off-grid shapes, noise-free truth: the fitted engine predicts them within a few percent.
    fitted = StepLatencyModel(LLM, GPU, TP, report.profile)
    truth = StepLatencyModel(LLM, GPU, TP, report.profile.__class__("t", "H800", "m", "derived", TRUE["prefill"], TRUE["decode"]))
    seqs, ctx = np.array([3.0, 24.0, 96.0]), np.array([700.0, 6000.0, 20000.0])
    assert np.allclose(fitted.decode_time(seqs, ctx), truth.decode_time(seqs, ctx), rtol=0.03)
    assert np.allclose(fitted.prefill_time(np.array([100.0, 3000.0]), 2.0, 5000.0), truth.prefill_time(np.array([100.0, 3000.0]), 2.0, 5000.0), rtol=0.03)


def test_cross_folds_hold_each_sample_out_once_and_deterministically() -> None:
    samples = synthetic_samples()
    folds = cross_folds(samples, 4)
    assert folds == cross_folds(samples, 4) and len(folds) == 4
    held = [s for _, ho in folds for s in ho]
    assert sorted(map(id, held)) == sorted(map(id, samples))  # every sample once
    for tr, ho in folds:
        assert ho and len(tr) + len(ho) == len(samples) and not set(map(id, tr)) & set(map(id, ho))
    assert [len(ho) for _, ho in cross_folds(samples[:5], 1000)] == [1] * 5  # k >= n: leave one out


def test_folds_do_not_follow_the_grids_order() -> None:
    """A profiling grid lists its largest step at the same place in every block: with every
    k-th sample of the grid's order held out, one fold held every 2048-token step of the
    shipped runtime profile's samples, and its fit never saw a step that large."""
    _, rows = read_samples(ROOT / "configs/profiles/samples/cpu-tiny-runtime-x2.jsonl")
    prefill = [s for s in rows if s.kind == "prefill"]
    largest = [i for i, s in enumerate(prefill) if s.prefill_tokens == 2048]
    assert len(largest) == 6 and {i % 4 for i in largest} == {3}  # the grid's order: all in one fold
    folds = cross_folds(prefill, 4)
    per_fold = [sum(s.prefill_tokens == 2048 for s in ho) for _, ho in folds]
    assert max(per_fold) < len(largest) and sum(per_fold) == len(largest), per_fold


def test_samples_round_trip(tmp_path: Path) -> None:
    samples = synthetic_samples()
    header = {"model": "qwen3-30b-a3b", "hardware": "H800", "tp": TP, "engine": "synthetic"}
    path = tmp_path / "sub" / "samples.jsonl"
    write_samples(path, header, samples)
    got_header, got = read_samples(path)
    assert got_header == header and got == samples
    assert json.loads(path.read_text().splitlines()[0]) == {"header": header}


BAD_FILES = {
    "not json": ("{\"header\": {}}\nnot json at all\n", "line 2", "one JSON object per line"),
    "missing field": ('{"kind": "decode", "prefill_tokens": 0}\n', "line 1.prefill_requests", "sample fields"),
    "bad kind": ('{"kind": "train", "prefill_tokens": 0, "prefill_requests": 0, "prefill_prefix_tokens": 0, "decode_seqs": 1, "decode_context_tokens": 1, "seconds": 0.1}\n', "line 1", "kind prefill|decode"),
    "non-positive time": ('{"kind": "decode", "prefill_tokens": 0, "prefill_requests": 0, "prefill_prefix_tokens": 0, "decode_seqs": 1, "decode_context_tokens": 1, "seconds": 0}\n', "line 1", "seconds > 0"),
    "header only": ('{"header": {"model": "tiny"}}\n', "<samples>", "at least one sample"),
    "bad repeat spread": ('{"kind": "decode", "prefill_tokens": 0, "prefill_requests": 0, "prefill_prefix_tokens": 0, "decode_seqs": 1, "decode_context_tokens": 1, "seconds": 0.1, "repeat_spread": "x"}\n', "line 1.repeat_spread", "a number >= 0"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_sample_file_errors(tmp_path: Path, case: str) -> None:
    text, field, allowed = BAD_FILES[case]
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_samples(path)
    assert info.value.field == field and allowed in info.value.allowed and "bad.jsonl" in str(info.value)


def test_missing_sample_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        read_samples(tmp_path / "absent.jsonl")
    assert info.value.field == "<file>" and "pearl profile" in info.value.allowed
