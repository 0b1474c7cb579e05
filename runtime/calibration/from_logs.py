"""Fit a workload to per-trajectory logs: `pearl calibrate --logs`.

    result = fit_workload([Path("runs/x.trajectories.jsonl")], base=spec.workload)
    Path("configs/workloads/mine.yaml").write_text(workload_yaml(result, source="pearl calibrate --logs ..."))

Input: JSONL files of `TrajectoryRecord`s (runtime/calibration/trajectory_log.py), as
`pearl train` writes them or as users write from their own agent runs. Output: a
`FitResult` holding a validated `WorkloadSpec` plus observed-vs-fitted statistics per field,
and `workload_yaml` renders it as a `configs/workloads/*.yaml` file that `models.config`
loads back. Bad input raises `ConfigError` naming the file, the line and the field.

How each distribution is fitted, and why:
- Lognormal by moments: its mean and cv are the data's. The data are clipped to the observed
  [min, max] and the fitted distribution is clipped there too, which lowers its mean and cv;
  so the lognormal's parameters are solved for such that the *clipped* mean and cv equal
  the observed ones (sampling the fitted spec reproduces the logs, not a shrunken copy).
- `constant` when the observed cv is below CONSTANT_CV (e.g. a fixed tool latency).
- Turns: trajectories cut at the token budget ran fewer turns than they would have (right-
  censored). Counting them as finished biases turns low, and the planner applies the budget
  again on top (models/predictor.batch_shape). When some are truncated, the turns lognormal is
  the censored maximum-likelihood fit on log(turns); its max is left unset if the longest
  trajectories were the truncated ones (their length is unknown). min is at least 1. If
  fewer than two trajectories finished, turns are fitted as observed (a lower bound; noted).
- Per-turn tokens and latencies pool all turns of all trajectories (the spec draws them
  i.i.d. per turn). env_latency_s has one entry per turn, the last included, as the
  simulator waits after every turn.
- max_trajectory_tokens: `base`'s, else the largest token_budget the logs record, else the
  largest context observed. trajectories_per_batch, group_size and prefix_cache_hit: `base`'s
  (per-trajectory logs do not show them), else read from the records' batch/group ids where
  present, else defaults; FitResult.assumed lists which fields did not come from the logs.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import ndtr

from models.config import ConfigError, Distribution, WorkloadSpec, _validate
from runtime.calibration.trajectory_log import TrajectoryRecord, read_records
from runtime.calibration.workload_file import render_workload

CONSTANT_CV = 0.01  # below this the data are one value (measurement noise aside)
SIG_DIGITS = 4  # fitted numbers are rounded so the rendered YAML is the fitted spec exactly
DEFAULT_BATCH = 64  # only without a base and without batch ids in the logs


@dataclass(frozen=True)
class Stats:
    mean: float
    p50: float
    p90: float
    max: float

    def to_json(self) -> dict[str, float]:
        return {k: _sig(v, 6) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class FieldFit:
    """One distribution: what the logs show and what the fitted spec gives (clipping included)."""

    name: str
    samples: int
    observed: Stats
    fitted: Stats
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "samples": self.samples, "observed": self.observed.to_json(), "fitted": self.fitted.to_json()}
        return {**out, "note": self.note} if self.note else out


@dataclass(frozen=True)
class FitResult:
    workload: WorkloadSpec
    sources: tuple[str, ...]
    trajectories: int
    turns: int  # turns read, over all trajectories
    truncated: int  # trajectories that ended at the token budget
    fields: tuple[FieldFit, ...]
    assumed: tuple[str, ...]  # workload fields not taken from the logs (from base or defaults)

    def field(self, name: str) -> FieldFit:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {"sources": list(self.sources), "trajectories": self.trajectories, "turns": self.turns, "truncated": self.truncated,
                "assumed": list(self.assumed), "fields": [f.to_json() for f in self.fields], "workload": self.workload.model_dump(exclude_none=True)}


# ----------------------------------------------------------------------------- reading
def read_logs(paths: list[Path]) -> list[TrajectoryRecord]:
    """All records of all files; an empty file is an error (it would fit nothing)."""
    if not paths:
        raise ConfigError("--logs", "--logs", [], "at least one JSONL file of trajectory records")
    out: list[TrajectoryRecord] = []
    for path in paths:
        got = [r for _, r in read_records(path)]
        if not got:
            raise ConfigError(path, "<file>", "no records", "one JSON trajectory record per line (the file is empty)")
        out.extend(got)
    return out


# ----------------------------------------------------------------------------- fitting
def fit_workload(paths: list[Path], base: WorkloadSpec | None = None) -> FitResult:
    """Fit every distribution of a WorkloadSpec to the trajectories in `paths` (see module docstring)."""
    paths = [Path(p) for p in paths]
    recs = read_logs(paths)
    where = str(paths[0]) if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} more)"
    turns = np.array([r.turns for r in recs], dtype=float)
    cut = np.array([r.truncated for r in recs])
    pooled = {
        "initial_prompt_tokens": np.array([r.initial_prompt_tokens for r in recs], dtype=float),
        "new_tokens_per_turn": np.array([x for r in recs for x in r.new_tokens], dtype=float),
        "response_tokens_per_turn": np.array([x for r in recs for x in r.response_tokens], dtype=float),
        "env_latency_s": np.array([x for r in recs for x in r.env_latency_s], dtype=float),
    }
    turns_dist, note = _fit_turns(turns, cut)
    dists: dict[str, Distribution] = {"turns": turns_dist}
    fits = [_field_fit("turns", turns, turns_dist, note)]
    for name, x in pooled.items():
        if not x.size:  # e.g. every trajectory had one turn: no observations between turns
            dists[name] = Distribution(kind="constant", mean=0.0)
            fits.append(_field_fit(name, x, dists[name], "no samples in the logs: constant 0"))
            continue
        dists[name] = _fit_clipped_lognormal(x)
        fits.append(_field_fit(name, x, dists[name]))
    sizes, assumed = _batch_fields(recs, base)
    budget = _budget(recs, base, assumed)
    workload = _validate(WorkloadSpec, {**sizes, **dists, "max_trajectory_tokens": budget}, Path(where), "fitted workload.")  # a fitted value the spec refuses: one clear error
    return FitResult(workload, tuple(str(p) for p in paths), len(recs), int(turns.sum()), int(cut.sum()), tuple(fits), tuple(assumed))


def _batch_fields(recs: list[TrajectoryRecord], base: WorkloadSpec | None) -> tuple[dict[str, Any], list[str]]:
    """trajectories_per_batch, group_size, prefix_cache_hit: from base, else batch/group ids, else defaults."""
    if base is not None:
        return ({"trajectories_per_batch": base.trajectories_per_batch, "group_size": base.group_size, "prefix_cache_hit": base.prefix_cache_hit},
                ["trajectories_per_batch", "group_size", "prefix_cache_hit"])
    assumed = ["prefix_cache_hit"]
    batches = Counter(r.batch for r in recs if r.batch is not None)
    if len(batches) and sum(batches.values()) == len(recs):
        size = max(batches.values())
        groups = Counter((r.batch, r.group) for r in recs if r.group is not None)
        group = max(groups.values()) if groups and sum(groups.values()) == len(recs) else 1
        if size % group:
            group = 1
            assumed.append("group_size")
    else:
        size, group = DEFAULT_BATCH, 1
        assumed += ["trajectories_per_batch", "group_size"]
    return {"trajectories_per_batch": size, "group_size": group, "prefix_cache_hit": 1.0}, assumed


def _budget(recs: list[TrajectoryRecord], base: WorkloadSpec | None, assumed: list[str]) -> int:
    if base is not None:
        assumed.append("max_trajectory_tokens")
        return base.max_trajectory_tokens
    logged = [r.token_budget for r in recs if r.token_budget]
    return max(logged) if logged else max(1, max(r.context_tokens for r in recs))


def _fit_turns(turns: np.ndarray, cut: np.ndarray) -> tuple[Distribution, str]:
    """The turns distribution and a note on how truncated trajectories were treated."""
    n_cut = int(cut.sum())
    if not n_cut:
        return _fit_clipped_lognormal(turns), ""  # records have turns >= 1, so min >= 1 already
    if int((~cut).sum()) < 2:  # (nearly) all cut: the likelihood has no finite maximum
        return _fit_clipped_lognormal(turns), f"{n_cut} of {turns.size} truncated at the token budget: turns are a lower bound"
    mu, sigma = _censored_lognormal(turns, cut)
    mean, cv = math.exp(mu + sigma**2 / 2), math.sqrt(math.expm1(sigma**2))
    top_cut = turns[cut].max() >= turns[~cut].max()  # the longest were cut: how long they would run is unknown
    d = Distribution(kind="lognormal", mean=_sig(mean), cv=_sig(cv), min=max(1.0, float(turns.min())), max=None if top_cut else float(turns.max()))
    return d, f"{n_cut} truncated at the token budget: fitted as censored"


def _censored_lognormal(x: np.ndarray, cut: np.ndarray, iters: int = 500) -> tuple[float, float]:
    """(mu, sigma) of log X by EM, where `cut` values are lower bounds (X > x + 0.5: counts are rounded)."""
    y = np.log(np.where(cut, x + 0.5, x))
    mu, sigma = float(y.mean()), max(float(y.std()), 1e-3)
    for _ in range(iters):
        a = (y[cut] - mu) / sigma
        tail = np.maximum(ndtr(-a), 1e-300)
        lam = np.exp(-a * a / 2) / math.sqrt(2 * math.pi) / tail  # inverse Mills ratio
        e1 = y.copy()
        e2 = y * y
        e1[cut] = mu + sigma * lam
        e2[cut] = (sigma**2) * (1 + a * lam - lam**2) + e1[cut] ** 2
        new_mu = float(e1.mean())
        new_sigma = math.sqrt(max(float(e2.mean()) - new_mu**2, 1e-12))
        done = abs(new_mu - mu) < 1e-9 and abs(new_sigma - sigma) < 1e-9
        mu, sigma = new_mu, new_sigma
        if done:
            break
    return mu, sigma


def _fit_clipped_lognormal(x: np.ndarray) -> Distribution:
    """Lognormal clipped to the observed range whose clipped mean and cv are the data's."""
    m, c = float(x.mean()), float(x.std() / x.mean()) if x.mean() > 0 else 0.0
    lo, hi = float(x.min()), float(x.max())
    if c < CONSTANT_CV or hi <= lo:
        return Distribution(kind="constant", mean=_sig(m))
    mean, cv = m, c
    for _ in range(200):
        got_m, got_c = _clipped_moments(mean, cv, lo, hi)
        if abs(got_m / m - 1) < 1e-6 and abs(got_c / c - 1) < 1e-6:
            break
        mean *= m / got_m
        cv = min(cv * c / max(got_c, 1e-12), 50.0)  # a clipped lognormal's cv saturates: stop where it does
    return Distribution(kind="lognormal", mean=_sig(mean), cv=_sig(cv), min=_sig(lo), max=_sig(hi))


def _clipped_moments(mean: float, cv: float, lo: float, hi: float) -> tuple[float, float]:
    """Mean and cv of a lognormal(mean, cv) clipped to [lo, hi], in closed form."""
    s2 = math.log1p(cv * cv)
    s, mu = math.sqrt(s2), math.log(mean) - s2 / 2
    a = (math.log(lo) - mu) / s if lo > 0 else -math.inf
    b = (math.log(hi) - mu) / s

    def moment(k: int) -> float:
        inside = math.exp(k * mu + k * k * s2 / 2) * (ndtr(b - k * s) - ndtr(a - k * s))
        return float(lo**k * ndtr(a) + inside + hi**k * ndtr(-b))

    m1, m2 = moment(1), moment(2)
    return m1, math.sqrt(max(m2 - m1 * m1, 0.0)) / m1


def _field_fit(name: str, x: np.ndarray, d: Distribution, note: str = "") -> FieldFit:
    obs = Stats(float(x.mean()), float(np.percentile(x, 50)), float(np.percentile(x, 90)), float(x.max())) if x.size else Stats(0.0, 0.0, 0.0, 0.0)
    hi = d.max if d.max is not None else d.quantile(1.0)
    return FieldFit(name, int(x.size), obs, Stats(_clipped_mean(d), d.quantile(0.5), d.quantile(0.9), hi), note)


def _clipped_mean(d: Distribution) -> float:
    if d.kind == "lognormal" and d.cv > 0 and d.max is not None:
        return _clipped_moments(d.mean, d.cv, d.min or 0.0, d.max)[0]
    return d.expected()


def _sig(v: float, digits: int = SIG_DIGITS) -> float:
    return float(f"{v:.{digits}g}")


# ----------------------------------------------------------------------------- rendering
def workload_yaml(result: FitResult, source: str) -> str:
    """A `configs/workloads/*.yaml` file: a header saying where it came from, then the spec."""
    w = result.workload
    lines = [
        f"# Fitted from per-trajectory logs ({source}) on {date.today().isoformat()}.",
        f"# Logs: {', '.join(result.sources)}",
        f"# {result.trajectories} trajectories, {result.turns} turns, {result.truncated} truncated at the token budget.",
    ]
    if result.assumed:
        lines.append(f"# Not in the logs (from the base workload or defaults): {', '.join(result.assumed)}.")
    lines.append("# Observed vs fitted (mean / p50 / p90 / max):")
    for f in result.fields:
        o, p = f.observed, f.fitted
        lines.append(f"#   {f.name}: {o.mean:.4g} / {o.p50:.4g} / {o.p90:.4g} / {o.max:.4g}  vs  {p.mean:.4g} / {p.p50:.4g} / {p.p90:.4g} / {p.max:.4g}"
                     + (f"  ({f.note})" if f.note else ""))
    return render_workload(lines, w)
