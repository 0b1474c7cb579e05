"""Fit step-latency coefficients to measured step timings.

Non-negative least squares (every term is a physical cost, so no coefficient may be
negative) on relative error: each row is divided by its measured time, so the fit
minimises percentage error, which is what MAPE reports. Deterministic k-fold
cross-validation measures generalisation: every sample is predicted once by a fit that never
saw it; the shipped coefficients are fitted on all of them. Samples are checked line by line as they are read, and
data too thin to identify or judge a fit is refused (`check_identifiable`), so a "measured"
profile never carries a NaN or a trivially exact error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal

import numpy as np

from models.config import GPUSpec, LLMSpec
from models.step_latency import FEATURES, EngineProfile, KVHandoff, RequestOverhead, StepCoefficients, StepShape, step_features

SAMPLE_FIELDS = ("kind", "prefill_tokens", "prefill_requests", "prefill_prefix_tokens", "decode_seqs", "decode_context_tokens", "seconds")
KINDS = ("prefill", "decode", "handoff", "request")

# Stated ranges of a sample's numbers. Far beyond any engine step, yet small enough that the
# features (token counts squared for attention, divided by a step time) stay finite floats.
MAX_TOKENS = 1e10  # tokens in one step (prefill, cached prefix, summed decode context)
MAX_REQUESTS = 1e7  # requests or sequences in one step
SECONDS_RANGE = (1e-9, 1e5)  # one step: a nanosecond to about a day
MAX_REPEAT_SPREAD = 100.0  # relative deviation of the repeats (1 = 100%)
MAX_TP = 1024
MAX_SAMPLES_BYTES = 64 * 2**20  # a profiling grid writes kilobytes; more is not a samples file
# Whole numbers (a per-step average over identical steps is still whole); the summed decode
# context is averaged over decode steps whose context grows, so it may be fractional.
INTEGER_FIELDS = ("prefill_tokens", "prefill_requests", "prefill_prefix_tokens", "decode_seqs")
FIELD_MAX = {"prefill_tokens": MAX_TOKENS, "prefill_requests": MAX_REQUESTS, "prefill_prefix_tokens": MAX_TOKENS, "decode_seqs": MAX_REQUESTS, "decode_context_tokens": MAX_TOKENS}


@dataclass(frozen=True)
class StepSample:
    """One measured step (or a per-step average over several identical steps)."""

    # handoff: a decode engine admitting requests whose KV it loads (prefill_prefix_tokens: loaded);
    # request: a turn's time outside the engine with prefill_requests in flight on it (runtime clock)
    kind: Literal["prefill", "decode", "handoff", "request"]
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


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """JSON object hook: a repeated key is an error (plain json lets the last one win silently)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def brief_value(value: Any) -> Any:
    """The bad value as shown in an error line: short enough to stay one readable line."""
    text = repr(value)
    return value if len(text) <= 80 else text[:77] + "..."


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)  # JSON true is no number


def check_number(path: Path, field: str, v: Any, lo: float, hi: float, integer: bool = False) -> float:
    """`v` as a float if it is a finite JSON number in [lo, hi] (whole where `integer`), else ConfigError.

    Compares before converting: a JSON integer too large for a float must not overflow."""
    from models.config import ConfigError

    allowed = f"{'an integer' if integer else 'a finite number'} in [{lo:g}, {hi:g}]"
    if not _is_number(v) or (isinstance(v, float) and not math.isfinite(v)) or not lo <= v <= hi or (integer and v != int(v)):
        raise ConfigError(path, field, brief_value(v), allowed)
    return float(v)


def _read_text(path: Path) -> str:
    """The file's text, or ConfigError for what cannot be a samples file (a directory, a device
    or pipe that would block or never end, a huge or binary file)."""
    from models.config import ConfigError

    allowed = "a UTF-8 JSONL samples file written by `pearl profile`"
    if not path.exists():
        raise ConfigError(path, "<file>", str(path), "an existing samples JSONL written by `pearl profile`")
    if not path.is_file():
        raise ConfigError(path, "<file>", "a directory" if path.is_dir() else "not a regular file", allowed)
    try:
        if path.stat().st_size > MAX_SAMPLES_BYTES:
            raise ConfigError(path, "<file>", f"{path.stat().st_size} bytes", f"{allowed}, at most {MAX_SAMPLES_BYTES} bytes")
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(path, "<file>", f"binary data (not UTF-8 at byte {exc.start})", allowed) from None
    except OSError as exc:
        raise ConfigError(path, "<file>", exc.strerror or type(exc).__name__, allowed) from None
    if "\x00" in text:
        raise ConfigError(path, "<file>", f"binary data (NUL at byte {text.index(chr(0))})", allowed)
    return text


def _check_header(path: Path, where: str, header: Any) -> dict:
    """An object whose tp is a TP degree and that holds no NaN or infinite number anywhere (its
    engine facts are copied into the profile, whose JSON must stay strict). The fields only
    `pearl fit` reads are checked there (runtime/commands/fit.py)."""
    from models.config import ConfigError

    if not isinstance(header, dict):
        raise ConfigError(path, f"{where}.header", brief_value(header), "an object of run facts written by `pearl profile`")
    if "tp" in header:
        check_number(path, f"{where}.header.tp", header["tp"], 1, MAX_TP, integer=True)
    stack: list[tuple[str, Any]] = [(f"{where}.header", header)]
    while stack:  # iterative: a deeply nested header must not exhaust the recursion limit
        name, v = stack.pop()
        if isinstance(v, dict):
            stack.extend((f"{name}.{k}", x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((f"{name}[{i}]", x) for i, x in enumerate(v))
        elif isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(path, name, v, "finite numbers (JSON has no NaN or Infinity)")
    return header


def _check_sample(path: Path, where: str, obj: dict) -> StepSample:
    from models.config import ConfigError

    missing = [f for f in SAMPLE_FIELDS if f not in obj]
    if missing:
        raise ConfigError(path, f"{where}.{missing[0]}", "<missing>", f"sample fields {list(SAMPLE_FIELDS)}")
    unknown = [k for k in obj if k not in (*SAMPLE_FIELDS, "repeat_spread")]
    if unknown:
        raise ConfigError(path, f"{where}.{unknown[0]}", brief_value(obj[unknown[0]]), f"sample fields {list(SAMPLE_FIELDS)} and optional repeat_spread")
    kind, secs = obj["kind"], obj["seconds"]
    if kind not in KINDS or (_is_number(secs) and not secs > 0):  # NaN seconds fail `> 0` too
        raise ConfigError(path, where, {"kind": brief_value(kind), "seconds": secs}, "kind prefill|decode|handoff|request and seconds > 0")
    values = {f: check_number(path, f"{where}.{f}", obj[f], 0, FIELD_MAX[f], integer=f in INTEGER_FIELDS) for f in FIELD_MAX}
    seconds = check_number(path, f"{where}.seconds", secs, *SECONDS_RANGE)
    spread = obj.get("repeat_spread", 0.0)
    if not _is_number(spread) or not 0 <= spread <= MAX_REPEAT_SPREAD:  # NaN fails the comparison
        raise ConfigError(path, f"{where}.repeat_spread", brief_value(spread), f"a number >= 0 (optional; at most {MAX_REPEAT_SPREAD:g})")
    return StepSample(kind, **values, seconds=seconds, repeat_spread=float(spread))


def read_samples(path: str | Path) -> tuple[dict, list[StepSample]]:
    """JSONL: an optional first line {"header": {...}}, then one sample object per line.

    Everything is checked here, at the edge: a bad line is one ConfigError naming the file,
    the line and the field, so no NaN, string or absurd number reaches the fit."""
    from models.config import ConfigError

    path = Path(path)
    header: dict | None = None
    samples: list[StepSample] = []
    for lineno, line in enumerate(_read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        where = f"line {lineno}"
        try:
            obj = json.loads(line, object_pairs_hook=_no_duplicates)
        except _DuplicateKey as exc:
            raise ConfigError(path, f"{where}.{exc.key}", "a repeated key", "each key once per line") from None
        except (ValueError, RecursionError):  # JSONDecodeError, an integer of > 4300 digits, absurd nesting
            raise ConfigError(path, where, line[:60], "one JSON object per line") from None
        if not isinstance(obj, dict):
            raise ConfigError(path, where, brief_value(obj), "one JSON object per line: {\"header\": {...}} first, then samples")
        if "header" in obj:
            if samples or header is not None:
                raise ConfigError(path, f"{where}.header", "a header after other lines", "one header, on the first line")
            if len(obj) > 1:
                raise ConfigError(path, where, brief_value(sorted(obj)), "a header line holds only {\"header\": {...}}")
            header = _check_header(path, where, obj["header"])
            continue
        samples.append(_check_sample(path, where, obj))
    if not samples:
        raise ConfigError(path, "<samples>", 0, "at least one sample line")
    return header or {}, samples


def write_samples(path: str | Path, header: dict, samples: Iterable[StepSample]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fh.write(json.dumps({"header": header}) + "\n")
        for s in samples:
            fh.write(json.dumps({f: getattr(s, f) for f in (*SAMPLE_FIELDS, "repeat_spread")}) + "\n")


def _design(samples: list[StepSample], llm: LLMSpec, gpu: GPUSpec, tp: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.array([step_features(s.shape(), llm, gpu, tp) for s in samples]).reshape(-1, len(FEATURES))
    y = np.array([s.seconds for s in samples])
    return x, y


def _relative(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The system NNLS solves: rows divided by their measured time, columns by their largest entry."""
    a = x / y[:, None]
    # Column scaling keeps NNLS well conditioned when terms differ by orders of magnitude.
    scale = np.maximum(np.abs(a).max(axis=0), 1e-30)
    return a / scale, scale


def _nnls_relative(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative c minimising the relative error of x @ c against y."""
    from scipy.optimize import nnls  # here, not at the top: every `pearl` command imports this module's limits

    a, scale = _relative(x, y)
    sol, _ = nnls(a, np.ones_like(y), maxiter=2000)
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


def repeat_noise_pct(samples: list[StepSample]) -> float | None:
    """Mean repeat spread (%) of the samples: how far one measurement of a shape strays
    (None where the samples predate its recording)."""
    if not any(s.repeat_spread > 0 for s in samples):
        return None
    return float(np.mean([s.repeat_spread for s in samples]) * 100)


def _handoff_design(samples: list[StepSample]) -> tuple[np.ndarray, np.ndarray]:
    x = np.array([[1.0, s.prefill_requests, s.prefill_prefix_tokens] for s in samples]).reshape(-1, 3)
    return x, np.array([s.seconds for s in samples])


def fit_handoff(samples: list[StepSample]) -> KVHandoff:
    """NNLS on relative error: t = fixed + per_request * requests + per_token * loaded tokens."""
    return KVHandoff(*(float(v) for v in _nnls_relative(*_handoff_design(samples))))


REQUEST_COUNTS_NEEDED = 4


def _request_design(samples: list[StepSample]) -> tuple[np.ndarray, np.ndarray]:
    x = np.array([[1.0, s.prefill_requests] for s in samples]).reshape(-1, 2)
    return x, np.array([s.seconds for s in samples])


def fit_request_overhead(samples: list[StepSample]) -> RequestOverhead:
    """NNLS on relative error: t = fixed + per_request * requests in flight on the engine."""
    return RequestOverhead(*(float(v) for v in _nnls_relative(*_request_design(samples))))


def fold_of(n: int, k: int) -> np.ndarray:
    """Each of `n` samples' cross-validation fold (0..k-1; k >= n: one sample per fold).

    Folds are dealt round-robin over a fixed pseudo-random order (seed 0), not over the grid's
    own: a profiling grid lists its largest step at the same place in every block, so every
    k-th sample of the grid order held out every 2048-token step at once. That judged an
    extrapolation (the fit never saw a step that large, and under-predicted those by 15-25%)
    and left the largest steps out of the shipped profile."""
    fold = np.empty(n, dtype=int)
    fold[np.random.default_rng(0).permutation(n)] = np.arange(n) % k
    return fold


def cross_folds(samples: list[StepSample], k: int = 4) -> list[tuple[list[StepSample], list[StepSample]]]:
    """(train, held out) per fold, over samples of one kind: every sample is held out exactly once."""
    fold = fold_of(len(samples), k)
    return [([s for s, f in zip(samples, fold) if f != j], [s for s, f in zip(samples, fold) if f == j]) for j in range(min(k, len(samples)))]


# Singular values of the scaled training system below this fraction of the largest are
# directions the data does not move along. On the shipped grids they are either >= 1e-2 or
# <= 1e-15 (exactly collinear terms: a dense model's weight reads are constant, like `fixed`).
RANK_RTOL = 1e-10


def check_identifiable(kind: str, x: np.ndarray, y: np.ndarray, unseen: int, source: str | Path, holdout_every: int) -> None:
    """Refuse to call a fit measured when its data cannot judge it (ConfigError otherwise).

    The rule, per step kind: the samples hold more distinct shapes (distinct rows of the fit's
    design) than the rank of its scaled design matrix (the independent terms the shapes let
    vary), and cross-validation holds out at least one shape its fold's fit was not trained on
    (`unseen`). With no more distinct shapes than that rank the fit passes through every point:
    a 0% error that says nothing. With no unseen held-out shape the held-out error only
    repeats training points. Since the rank is at most the number of coefficients fitted,
    that many plus one distinct shapes always suffice (9 for a step kind, 4 for the handoff);
    fewer do where the shapes vary fewer terms (the 8-point `tiny` grid: rank 3-5).
    """
    from models.config import ConfigError

    rows = {r.tobytes() for r in x}
    if len(x):
        sv = np.linalg.svd(_relative(x, y)[0], compute_uv=False)
        rank = int(np.sum(sv > sv[0] * RANK_RTOL))
    else:
        rank = 0
    if len(rows) <= rank or unseen < 1:
        raise ConfigError(
            source,
            f"{kind} samples",
            f"{len(rows)} distinct shapes to fit, spanning {rank} independent terms; {unseen} held-out shapes their fold's fit was not trained on",
            f"more distinct {kind} shapes than the terms they span (here >= {rank + 1}; {x.shape[1] + 1} always suffice),"
            f" and >= 1 held-out shape its fold was not trained on ({holdout_every}-fold cross-validation: --holdout-every)",
        )


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
    source: str | Path = "<samples>",
) -> FitReport:
    """Fit prefill and decode coefficient sets on every sample; report their in-sample MAPE and
    the held-out MAPE of `holdout_every`-fold cross-validation (each sample predicted by the fit
    on the folds that do not hold it, `cross_folds`).

    Data that cannot identify a fit (`check_identifiable`) or that makes NNLS fail is a
    ConfigError naming `source`, never a "measured" profile with a 0% or NaN error."""
    from models.config import ConfigError

    tr_m: dict[str, float] = {}
    ho_m: dict[str, float] = {}
    n_tr: dict[str, int] = {}
    n_ho: dict[str, int] = {}
    noise: dict[str, float | None] = {}
    # A P/D profile also fits the decode engine's takeover of prefilled requests.
    # A runtime-clock profile also fits the requests' time outside the engine: a line in the
    # requests in flight, which needs 3 batch sizes to fit and one more to hold out (a grid of
    # fewer, e.g. `tiny`'s 1 and 16, leaves the term out and says so in the profile's fit).
    request_counts = len({s.prefill_requests for s in samples if s.kind == "request"})
    skipped: dict[str, str] = {}
    if 0 < request_counts < REQUEST_COUNTS_NEEDED:
        skipped["request"] = f"not fitted: {request_counts} request counts measured, {REQUEST_COUNTS_NEEDED} needed (3 to fit a line, 1 held out)"
    kinds = ("prefill", "decode", *(k for k in ("handoff", "request") if any(s.kind == k for s in samples) and k not in skipped))
    fitted: dict[str, Any] = {}
    for kind in kinds:
        group = [s for s in samples if s.kind == kind]
        design = {"handoff": _handoff_design, "request": _request_design}.get(kind, lambda g: _design(g, llm, gpu, tp))
        fit = {"handoff": fit_handoff, "request": fit_request_overhead}.get(kind, lambda g: fit_coefficients(g, llm, gpu, tp))
        folds = cross_folds(group, holdout_every)
        x, y = design(group)
        unseen = sum(len({r.tobytes() for r in design(ho)[0]} - {r.tobytes() for r in design(tr)[0]}) for tr, ho in folds)
        check_identifiable(kind, x, y, unseen, source, holdout_every)
        held: list[float] = []
        try:
            for tr, ho in folds:  # every sample predicted by a fit that never saw it
                x_ho, y_ho = design(ho)
                held.extend(np.abs(x_ho @ fit(tr).vector() - y_ho) / y_ho)
            fitted[kind] = fit(group)  # the shipped fit: every shape the grid measured, its largest steps included
        except RuntimeError as exc:  # NNLS out of iterations
            raise ConfigError(source, f"{kind} samples", str(exc), "samples a non-negative least-squares fit converges on") from None
        tr_m[kind], ho_m[kind] = _mape(x @ fitted[kind].vector(), y), float(np.mean(held) * 100)
        n_tr[kind], n_ho[kind] = len(group), len(held)
        noise[kind] = repeat_noise_pct(group)
        if not np.all(np.isfinite([*fitted[kind].vector(), tr_m[kind], ho_m[kind]])):  # backstop: validated input keeps these finite
            raise ConfigError(source, f"{kind} samples", "a fit with non-finite coefficients or errors", "samples whose fit is finite")
    handoff, overhead = fitted.get("handoff"), fitted.get("request")
    coeffs = {k: fitted[k] for k in ("prefill", "decode")}
    profile = EngineProfile(
        name=name,
        hardware=hardware,
        model=model,
        label="measured",
        prefill=coeffs["prefill"],
        decode=coeffs["decode"],
        machine=machine,
        notes=f"fitted by `pearl fit` on {len(samples)} samples (tp={tp})",
        fit={"train_mape_pct": tr_m, "holdout_mape_pct": ho_m, "repeat_noise_pct": noise, "n_train": n_tr, "n_holdout": n_ho, "folds": holdout_every, "tp": tp, **({"skipped": skipped} if skipped else {})},
        kv_handoff=handoff,
        request_overhead=overhead,
    )
    return FitReport(profile, tr_m, ho_m, n_tr, n_ho, noise)
