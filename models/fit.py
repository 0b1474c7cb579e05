"""Fit step-latency coefficients to measured step timings.

Non-negative least squares (every term is a physical cost, so no coefficient may be
negative) on relative error: each row is divided by its measured time, so the fit
minimises percentage error, which is what MAPE reports. A deterministic held-out part
of the grid measures generalisation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal

import numpy as np
from scipy.optimize import nnls

from models.config import GPUSpec, LLMSpec
from models.step_latency import FEATURES, EngineProfile, KVHandoff, StepCoefficients, StepShape, step_features

SAMPLE_FIELDS = ("kind", "prefill_tokens", "prefill_requests", "prefill_prefix_tokens", "decode_seqs", "decode_context_tokens", "seconds")


@dataclass(frozen=True)
class StepSample:
    """One measured step (or a per-step average over several identical steps)."""

    kind: Literal["prefill", "decode", "handoff"]  # handoff: a decode engine admitting requests whose KV it loads (prefill_prefix_tokens: loaded)
    prefill_tokens: float
    prefill_requests: float
    prefill_prefix_tokens: float
    decode_seqs: float
    decode_context_tokens: float
    seconds: float
    # Median relative deviation of the repeats from `seconds` (0: one repeat, or not recorded):
    # the measurement's own noise, below which no fit can be judged.
    repeat_spread: float = 0.0

    def shape(self) -> StepShape:
        return StepShape(self.prefill_tokens, self.prefill_requests, self.prefill_prefix_tokens, self.decode_seqs, self.decode_context_tokens)


def read_samples(path: str | Path) -> tuple[dict, list[StepSample]]:
    """JSONL: first line a header object {"header": {...}}, then one sample object per line."""
    from models.config import ConfigError

    path = Path(path)
    if not path.exists():
        raise ConfigError(path, "<file>", str(path), "an existing samples JSONL written by `pearl profile`")
    header: dict = {}
    samples: list[StepSample] = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise ConfigError(path, f"line {lineno}", line[:60], "one JSON object per line") from None
        if "header" in obj:
            header = obj["header"]
            continue
        missing = [f for f in SAMPLE_FIELDS if f not in obj]
        if missing:
            raise ConfigError(path, f"line {lineno}.{missing[0]}", "<missing>", f"sample fields {list(SAMPLE_FIELDS)}")
        if obj["kind"] not in ("prefill", "decode", "handoff") or not obj["seconds"] > 0:
            raise ConfigError(path, f"line {lineno}", {k: obj[k] for k in ("kind", "seconds")}, "kind prefill|decode|handoff and seconds > 0")
        spread = obj.get("repeat_spread", 0.0)
        if isinstance(spread, bool) or not isinstance(spread, (int, float)) or spread < 0:
            raise ConfigError(path, f"line {lineno}.repeat_spread", spread, "a number >= 0 (optional)")
        samples.append(StepSample(**{f: obj[f] for f in SAMPLE_FIELDS}, repeat_spread=float(spread)))
    if not samples:
        raise ConfigError(path, "<samples>", 0, "at least one sample line")
    return header, samples


def write_samples(path: str | Path, header: dict, samples: Iterable[StepSample]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fh.write(json.dumps({"header": header}) + "\n")
        for s in samples:
            fh.write(json.dumps({f: getattr(s, f) for f in (*SAMPLE_FIELDS, "repeat_spread")}) + "\n")


def _design(samples: list[StepSample], llm: LLMSpec, gpu: GPUSpec, tp: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.array([step_features(s.shape(), llm, gpu, tp) for s in samples])
    y = np.array([s.seconds for s in samples])
    return x, y


def _nnls_relative(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative c minimising the relative error of x @ c against y."""
    a = x / y[:, None]
    # Column scaling keeps NNLS well conditioned when terms differ by orders of magnitude.
    scale = np.maximum(np.abs(a).max(axis=0), 1e-30)
    sol, _ = nnls(a / scale, np.ones_like(y), maxiter=2000)
    return sol / scale


def _mape(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - y) / y) * 100) if len(y) else float("nan")


def fit_coefficients(samples: list[StepSample], llm: LLMSpec, gpu: GPUSpec, tp: int, features: tuple[str, ...] = FEATURES) -> StepCoefficients:
    """NNLS on relative error over the chosen features (others fixed at 0)."""
    x, y = _design(samples, llm, gpu, tp)
    idx = [FEATURES.index(f) for f in features]
    coef = np.zeros(len(FEATURES))
    coef[idx] = _nnls_relative(x[:, idx], y)
    return StepCoefficients.from_vector(coef)


def mape(samples: list[StepSample], coeffs: StepCoefficients, llm: LLMSpec, gpu: GPUSpec, tp: int) -> float:
    if not samples:
        return float("nan")
    x, y = _design(samples, llm, gpu, tp)
    return _mape(x @ coeffs.vector(), y)


def repeat_noise_pct(samples: list[StepSample]) -> float | None:
    """Mean repeat spread (%) of the samples: how far one measurement of a shape strays
    (None where the samples predate its recording)."""
    if not any(s.repeat_spread > 0 for s in samples):
        return None
    return float(np.mean([s.repeat_spread for s in samples]) * 100)


def fit_handoff(samples: list[StepSample]) -> KVHandoff:
    """NNLS on relative error: t = fixed + per_request * requests + per_token * loaded tokens."""
    x = np.array([[1.0, s.prefill_requests, s.prefill_prefix_tokens] for s in samples])
    return KVHandoff(*(float(v) for v in _nnls_relative(x, np.array([s.seconds for s in samples]))))


def handoff_mape(samples: list[StepSample], h: KVHandoff) -> float:
    pred = np.array([float(h.time(s.prefill_requests, s.prefill_prefix_tokens)) for s in samples])
    return _mape(pred, np.array([s.seconds for s in samples]))


def split_holdout(samples: list[StepSample], every: int = 4) -> tuple[list[StepSample], list[StepSample]]:
    """Deterministic split: every `every`-th sample (per kind) is held out."""
    train: list[StepSample] = []
    test: list[StepSample] = []
    for kind in ("prefill", "decode", "handoff"):
        group = [s for s in samples if s.kind == kind]
        for i, s in enumerate(group):
            (test if every and i % every == every - 1 else train).append(s)
    return train, test


@dataclass(frozen=True)
class FitReport:
    profile: EngineProfile
    train_mape: dict[str, float]
    holdout_mape: dict[str, float]
    n_train: dict[str, int]
    n_holdout: dict[str, int]
    repeat_noise: dict[str, float | None]


def fit_profile(
    samples: list[StepSample],
    llm: LLMSpec,
    gpu: GPUSpec,
    tp: int,
    name: str,
    hardware: str,
    model: str,
    machine: str = "",
    holdout_every: int = 4,
) -> FitReport:
    """Fit prefill and decode coefficient sets and report MAPE on train and held-out samples."""
    train, test = split_holdout(samples, holdout_every)
    coeffs: dict[str, StepCoefficients] = {}
    tr_m: dict[str, float] = {}
    ho_m: dict[str, float] = {}
    n_tr: dict[str, int] = {}
    n_ho: dict[str, int] = {}
    noise: dict[str, float | None] = {}
    for kind in ("prefill", "decode"):
        tr = [s for s in train if s.kind == kind]
        ho = [s for s in test if s.kind == kind]
        if not tr:
            raise ValueError(f"no {kind} samples to fit")
        c = fit_coefficients(tr, llm, gpu, tp)
        coeffs[kind] = c
        tr_m[kind] = mape(tr, c, llm, gpu, tp)
        ho_m[kind] = mape(ho, c, llm, gpu, tp)
        n_tr[kind], n_ho[kind] = len(tr), len(ho)
        noise[kind] = repeat_noise_pct(tr + ho)
    handoff = None
    tr = [s for s in train if s.kind == "handoff"]
    if tr:  # a P/D profile: the decode engine's takeover of prefilled requests
        ho = [s for s in test if s.kind == "handoff"]
        handoff = fit_handoff(tr)
        tr_m["handoff"], ho_m["handoff"] = handoff_mape(tr, handoff), handoff_mape(ho, handoff)
        n_tr["handoff"], n_ho["handoff"] = len(tr), len(ho)
        noise["handoff"] = repeat_noise_pct(tr + ho)
    profile = EngineProfile(
        name=name,
        hardware=hardware,
        model=model,
        label="measured",
        prefill=coeffs["prefill"],
        decode=coeffs["decode"],
        machine=machine,
        notes=f"fitted by `pearl fit` on {len(samples)} samples (tp={tp})",
        fit={"train_mape_pct": tr_m, "holdout_mape_pct": ho_m, "repeat_noise_pct": noise, "n_train": n_tr, "n_holdout": n_ho, "tp": tp},
        kv_handoff=handoff,
    )
    return FitReport(profile, tr_m, ho_m, n_tr, n_ho, noise)
