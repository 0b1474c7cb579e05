"""A deployment profile from the runtime's own batches: what `pearl profile` cannot see.

Every profiler measures engines under a load it makes itself; the runtime then runs them
beside its agent loop, the environment actor and the rollout actors' own output processing,
on the same cores. Measured on this 2-core machine (experiments/engine_timings.py, colocated,
batches 4 and 16 at 0.03 s tools, 2026-12-02): inside real batches the decode steps took
9.4-10.3 ms where the runtime-clock profile said 6.6 at the same concurrency, and a call spent
41-43 ms outside its engine where the profile said 12. The profile was right about what it
measured; the deployment is another machine load, and its batches ran 9-35% longer than the
profile predicted.

The deployment profile is the runtime tracker's speed refit (runtime/ray_runtime/telemetry.py:
every term of the profile scaled by one speed) done ahead of time on calibration batches:
`deployment_speed` is the median of their measured / predicted (why not the tracker's solved
speed: its docstring), and `deployed_profile` scales the base profile by it. One number,
because the component terms measured in place do not compose into the predictor's structure
on their own: taken at face value (decode x1.45-1.6, 41-66 ms outside) they over-predicted the same batches by 8-30%; the
in-place decode steps include the other trajectories' prefills, which the predictor already
charges as prefill time. They are still measured (`inplace_terms`) and written beside the
speed, to say where the time goes. The calibration batches must be other batches than a
validation judges (experiments/calibrate_deployment.py: other batch sizes and tool waits).

Colocated calls only ("full" phase) for the component terms: a P/D turn's two calls share one
overhead term and its prefill engine idles between turns.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from models.step_latency import EngineProfile, RequestOverhead, StepLatencyModel, load_profile


@dataclass(frozen=True)
class InPlaceTerms:
    """What the calibration batches measured, and from how many calls."""

    decode_ratio: float  # measured decode step / the profile's, median over calls (a diagnosis; not the profile's speed)
    request_overhead: RequestOverhead
    calls: int
    decode_calls: int
    outside_ms_median: float
    decode_ratio_iqr: tuple[float, float]  # the ratio's 25th and 75th percentiles: how much one number hides


def concurrency(first: np.ndarray, last: np.ndarray, samples: int = 8) -> np.ndarray:
    """Per request: how many of the engine's requests (itself included) were decoding, averaged
    over `samples` instants of its own decode."""
    out = np.empty(first.size)
    for i, (f, l) in enumerate(zip(first, last)):
        at = np.linspace(f, l, samples)[:, None]
        out[i] = float(((first[None, :] <= at) & (last[None, :] >= at)).sum(axis=1).mean())
    return out


def colocated_calls(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("record") == "request" and r.get("phase") == "full" and r.get("engine_times")]


def inplace_terms(records: list[dict[str, Any]], engine: StepLatencyModel) -> InPlaceTerms:
    """The decode step ratio and the overhead outside the engine, measured in place from colocated calls."""
    from scipy.optimize import nnls

    calls = colocated_calls(records)
    if not calls:
        raise ValueError("no colocated engine calls with engine timestamps in the records (runtime.request_log on, policy colocated)")
    ratios = []
    for worker in sorted({r["worker"] for r in calls}):
        rs = [r for r in calls if r["worker"] == worker]
        t = np.array([r["engine_times"] for r in rs], dtype=float)  # queued, scheduled, first, last, generated
        dec = t[:, 4] > 1
        if not dec.any():
            continue
        first, last, n = t[dec, 2], t[dec, 3], t[dec, 4]
        ctx = np.array([r["prompt_tokens"] for r in rs], dtype=float)[dec]
        step = (last - first) / (n - 1)
        predicted = np.array([float(engine.decode_time(c, x + k / 2)) for c, x, k in zip(concurrency(first, last), ctx, n)])
        ratios.extend((step / predicted).tolist())
    if not ratios:
        raise ValueError("no colocated call decoded more than one token: the decode speed cannot be measured")
    t = np.array([r["engine_times"] for r in calls], dtype=float)
    outside = (t[:, 0] - np.array([r["sent"] for r in calls])) + (np.array([r["back"] for r in calls]) - t[:, 3])
    in_flight = np.array([r["in_flight"] for r in calls], dtype=float)
    (fixed, per_request), _ = nnls(np.stack([np.ones_like(in_flight), in_flight], axis=1), outside)
    r = np.array(ratios)
    return InPlaceTerms(float(np.median(r)), RequestOverhead(float(fixed), float(per_request)), len(calls), len(ratios),
                        float(np.median(outside)) * 1000.0, (float(np.percentile(r, 25)), float(np.percentile(r, 75))))


def base_of(profile: EngineProfile, profiles_dir: Path, compose: bool = True) -> EngineProfile:
    """The profile `pearl profile` measured: `profile` itself, or the one an in-place profile
    scaled (read from `profiles_dir`), so that a second calibration replaces the first; with the
    decode terms it took from another measured profile (`with_decode_of`) unless `compose` is off."""
    rec = profile.fit.get("in_place", {})
    name = rec.get("base_profile", profile.name)
    base = profile if name == profile.name else load_profile(profiles_dir / f"{name}.json")
    decode = rec.get("decode_profile")
    return with_decode_of(base, load_profile(profiles_dir / f"{decode}.json")) if compose and decode else base


def with_decode_of(base: EngineProfile, decode: EngineProfile) -> EngineProfile:
    """`base` (a P/D profile) with `decode`'s decode-step terms: a deployed pair's decode engine
    runs as one engine alone on its core, not as `pearl profile --pd` times it.

    Why: the P/D profile times each engine while the other serves back to back (load `pd-busy`),
    an upper bound of the load. In the runtime's batches the prefill engine idles most of the
    time (the tool waits and the decode steps are most of a batch), and its decode engine's steps
    ran 20-40% faster than that profile's (validate_predictor's `engine_decode_error_pct`, runs 45-47,
    2026-12-04). Chosen on calibration batches alone (B = 12 / 24, tools 0.15 / 0.06 s, 24
    batches, 2026-12-04): on the one-engine profile's decode terms the measured / predicted
    ratio is x1.035 (IQR 1.014-1.059), and within 3.2% of every batch once scaled; on the P/D
    profile's own, x0.837 (IQR 0.800-0.868) and 4.0%, the short tool waits over-predicted."""
    if (decode.model, decode.hardware) != (base.model, base.hardware):
        raise ValueError(f"decode terms from {decode.name} ({decode.model} on {decode.hardware}) cannot serve {base.name} ({base.model} on {base.hardware})")
    return replace(base, decode=decode.decode, fit={**base.fit, "decode_profile": decode.name})


def deployment_speed(measured_s: list[float], predicted_s: list[float]) -> float:
    """The median over calibration batches of measured / predicted completion (base profile),
    robust to one odd batch.

    Not the median of the speeds solved on the predictor per batch (`models.speed.solve_speed`,
    the runtime tracker's refit), which was tried: in six validation runs on 2026-12-03, each
    judged at the speed of the calibration before it, the solved speed predicted the colocated
    batches worse in 4 (mean |error| 9.1% against 7.7%) and the P/D ones alike (10.5% / 10.4%);
    on 2026-12-02's pair, colocated better (4.2% / 5.4%), P/D worse (6.2% / 5.0%). One
    calibration's solved speeds spread x0.96-1.59, so nothing there favours the change. The
    solved speeds are written beside the ratios (`calibration_batches`), a diagnosis."""
    if not measured_s or len(measured_s) != len(predicted_s) or min(predicted_s) <= 0 or min(measured_s) <= 0:
        raise ValueError("deployment speed needs one positive measured and predicted completion per calibration batch")
    return float(np.median(np.asarray(measured_s, dtype=float) / np.asarray(predicted_s, dtype=float)))


def deployed_profile(base: EngineProfile, speed: float, terms: InPlaceTerms | None, name: str, provenance: str) -> EngineProfile:
    """`base` as the deployment runs it: every term `speed` times slower (`EngineProfile.scaled`,
    as the runtime tracker applies its refit), with what was measured recorded in `fit`."""
    scaled = base.scaled(speed)
    fit = dict(base.fit)
    decode = fit.pop("decode_profile", None)
    measured = f"{base.name} (measured by `pearl profile`)" if decode is None else f"{base.name} with the decode terms of {decode} (both measured by `pearl profile`)"
    notes = f"{measured} x{speed:.3f}, the deployment's speed measured on calibration batches of the runtime: {provenance}"
    in_place: dict = {"speed": round(speed, 4), "base_profile": base.name, "provenance": provenance}
    if decode is not None:
        in_place["decode_profile"] = decode
    if terms is not None:
        in_place["components"] = {"decode_step_ratio": round(terms.decode_ratio, 4), "decode_step_ratio_iqr": [round(x, 4) for x in terms.decode_ratio_iqr], "calls": terms.calls,
                                  "decode_calls": terms.decode_calls, "outside_ms_median": round(terms.outside_ms_median, 2), "request_overhead": terms.request_overhead.to_json()}
    return replace(scaled, name=name, notes=notes, fit={**fit, "in_place": in_place})
