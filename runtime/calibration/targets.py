"""Fit a workload's unknown parameters to measured aggregate statistics: `pearl calibrate --targets`.

A targets file (configs/calibration/*.yaml) lists measured statistics, each with the setting
it was measured in (an experiment, a rollout GPU count), the workload parameters that are
unknown with the range each may take, and candidate mechanisms: discrete alternatives
(e.g. "the batch counts 64 trajectories" vs "64 prompts x 16"; "prefix hits follow memory
pressure" vs "a constant hit share") that the data must choose between. For each candidate
the free parameters are fitted with the predictor (fast, deterministic) by least squares on
log(model / target); the candidate with the smallest error wins. The winner is then
corrected against the simulator (the runtime's ground truth) by output space mapping: the
predictor is refitted to target x (predictor / simulator) at the current point until the
simulator's residuals stop improving. Only the targets in the file are ever used to fit;
the residual of every target is reported for both models.

Why least squares on logs: targets are ratios and times of different scales; a 10% miss
weighs the same on each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Callable, Literal

import numpy as np
from pydantic import Field, model_validator

from models.config import CONFIG_ROOT, ConfigError, ExperimentSpec, Frozen, PositiveFloat, _read_yaml, _validate, load_experiment

Metric = Literal[
    "training_step_s",  # one optimizer step on the experiment's training pool
    "rollout_s",  # rollout-batch completion on `rollout_gpus` GPUs, colocated (data-parallel scaling)
    "rollout_over_training",  # rollout_s / training_step_s
    "rollout_share_pct",  # rollout_s / (rollout_s + training_step_s), synchronous steps
    "rollout_cut_pct",  # (rollout_s(from) - rollout_s(to)) / rollout_s(of) x 100
    "mean_trajectory_s",  # a trajectory alone on an instance (the idealized unlimited scale-out)
    "prefill_token_share_pct",  # colocated engines: prefilled / processed tokens
    "prefill_time_share_pct",  # colocated engines: prefill / busy time
    "decode_tok_s_per_gpu",  # colocated engines: decode rate between prefills, per GPU
]
SIMULATED: frozenset[str] = frozenset({"training_step_s", "rollout_s", "rollout_over_training", "rollout_share_pct", "rollout_cut_pct"})

PARAMETERS: tuple[str, ...] = (
    "trajectories_per_batch", "prefix_cache_hit", "max_trajectory_tokens",
    "turns.mean", "turns.cv", "initial_prompt_tokens.mean", "new_tokens_per_turn.mean", "new_tokens_per_turn.cv",
    "response_tokens_per_turn.mean", "response_tokens_per_turn.cv", "env_latency_s.mean", "env_latency_s.cv",
    "training.mfu",
)
INTEGER = frozenset({"trajectories_per_batch", "max_trajectory_tokens"})


class Setting(Frozen):
    experiment: str | None = None  # configs/experiments/<name>.yaml; default: the file's `experiment`
    rollout_gpus: int | None = Field(None, gt=0)
    from_gpus: int | None = Field(None, gt=0)
    to_gpus: int | None = Field(None, gt=0)
    of_gpus: int | None = Field(None, gt=0)


class Target(Frozen):
    metric: Metric
    value: PositiveFloat
    setting: Setting = Setting()
    weight: PositiveFloat = 1.0
    source: str = ""

    @model_validator(mode="after")
    def _setting_complete(self) -> "Target":
        s = self.setting
        if self.metric == "rollout_cut_pct" and None in (s.from_gpus, s.to_gpus):
            raise ValueError("rollout_cut_pct needs setting.from_gpus and setting.to_gpus")
        if self.metric in ("rollout_s", "rollout_over_training", "rollout_share_pct", "prefill_token_share_pct", "prefill_time_share_pct", "decode_tok_s_per_gpu") and s.rollout_gpus is None:
            raise ValueError(f"{self.metric} needs setting.rollout_gpus")
        return self


class Range(Frozen):
    low: PositiveFloat
    high: PositiveFloat

    @model_validator(mode="after")
    def _ordered(self) -> "Range":
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be < high ({self.high})")
        return self


class Candidate(Frozen):
    name: str
    description: str = ""
    fixed: dict[str, float] = Field(default_factory=dict)  # parameter -> value
    free: dict[str, Range] = Field(default_factory=dict)  # parameters free in this candidate only


class TargetsFile(Frozen):
    name: str
    source: str
    experiment: str
    workload: str | None = None  # base workload (default: the experiment's)
    parameters: dict[str, Range]
    candidates: Annotated[list[Candidate], Field(min_length=1)]
    targets: Annotated[dict[str, Target], Field(min_length=1)]
    held_out: list[str] = Field(default_factory=list)  # documentation: results never used to fit


def load_targets(path: Path) -> TargetsFile:
    spec = _validate(TargetsFile, _read_yaml(path), path)
    names = list(spec.parameters) + [k for c in spec.candidates for k in (*c.fixed, *c.free)]
    for k in names:
        if k not in PARAMETERS:
            raise ConfigError(path, f"parameters.{k}", k, f"one of {list(PARAMETERS)}")
    for name in {spec.experiment, *(t.setting.experiment for t in spec.targets.values() if t.setting.experiment)}:
        if not (CONFIG_ROOT / "experiments" / f"{name}.yaml").exists():
            raise ConfigError(path, "experiment", name, f"one of {sorted(p.stem for p in (CONFIG_ROOT / 'experiments').glob('*.yaml'))}")
        if spec.workload is not None and not (CONFIG_ROOT / "workloads" / f"{spec.workload}.yaml").exists():
            raise ConfigError(path, "workload", spec.workload, f"one of {sorted(p.stem for p in (CONFIG_ROOT / 'workloads').glob('*.yaml'))}")
        base_spec(name, spec.workload)  # a broken experiment or workload file is an error here, not a failed fit point
    return spec


# ----------------------------------------------------------------------------- applying parameters
def apply(spec: ExperimentSpec, values: dict[str, float]) -> ExperimentSpec:
    """The experiment with workload (and training) parameters set; validated like a config file."""
    w = spec.workload.model_dump()
    training = spec.training.model_dump()
    for key, v in values.items():
        if key == "training.mfu":
            training["mfu"] = float(v)
        elif "." in key:
            dist, attr = key.split(".")
            w[dist] = {**w[dist], attr: float(v)}
        else:
            w[key] = int(round(v)) if key in INTEGER else float(v)
    b = w["trajectories_per_batch"]
    if b % w["group_size"]:
        w["group_size"] = math.gcd(b, w["group_size"])
    # a point the spec refuses (e.g. a token budget below its first turn) is one clear error
    workload = _validate(type(spec.workload), w, Path(spec.source), "workload.")
    return spec.model_copy(update={"workload": workload, "training": _validate(type(spec.training), training, Path(spec.source), "training.")})


@lru_cache(maxsize=16)
def base_spec(experiment: str, workload: str | None) -> ExperimentSpec:
    """A target's setting before fitting: the experiment, on the targets file's base workload
    if it names one (read once: the fit evaluates thousands of points)."""
    spec = load_experiment(CONFIG_ROOT / "experiments" / f"{experiment}.yaml")
    if workload is None:
        return spec
    path = CONFIG_ROOT / "workloads" / f"{workload}.yaml"
    return spec.model_copy(update={"workload": _validate(type(spec.workload), _read_yaml(path), path)})


# ----------------------------------------------------------------------------- evaluating
def predicted(spec: ExperimentSpec, t: Target, models=None) -> float:
    """The predictor's value of one target metric."""
    from models.builder import build_models
    from runtime.timeline import train_step_s

    m = models or build_models(spec)
    p, tp = m.predictor, m.tp_colocated
    train = train_step_s(spec, p.shape.trajectory_tokens())  # the tokens the trainer gets (runtime.timeline.expected_batch_tokens)
    roll = lambda gpus: p.colocated(max(gpus // tp, 1)).completion_s  # noqa: E731
    return _metric(t, roll, train, lambda: p.mean_trajectory_s(), lambda g: p.colocated_engine_use(max(g // tp, 1)), tp)


def _metric(t: Target, roll: Callable[[int], float], train: float, mean_traj: Callable[[], float], use: Callable[[int], object], tp: int) -> float:
    s = t.setting
    if t.metric == "training_step_s":
        return train
    if t.metric == "rollout_s":
        return roll(s.rollout_gpus)  # type: ignore[arg-type]
    if t.metric == "rollout_over_training":
        return roll(s.rollout_gpus) / train  # type: ignore[arg-type]
    if t.metric == "rollout_share_pct":
        r = roll(s.rollout_gpus)  # type: ignore[arg-type]
        return 100.0 * r / (r + train)
    if t.metric == "rollout_cut_pct":
        a, b = roll(s.from_gpus), roll(s.to_gpus)  # type: ignore[arg-type]
        return max(100.0 * (a - b) / roll(s.of_gpus or s.from_gpus), 1e-3)  # type: ignore[arg-type]
    if t.metric == "mean_trajectory_s":
        return mean_traj()
    u = use(s.rollout_gpus)  # type: ignore[arg-type]
    if t.metric == "prefill_token_share_pct":
        return 100.0 * u.prefill_token_share  # type: ignore[attr-defined]
    if t.metric == "prefill_time_share_pct":
        return 100.0 * u.prefill_time_share  # type: ignore[attr-defined]
    return u.decode_tok_s / tp  # type: ignore[attr-defined]


def simulated(spec: ExperimentSpec, t: Target, batches: int = 2, cache: dict | None = None) -> float:
    """The simulator's value of a rollout/training metric: fixed colocated layouts, the mean of `batches` batches."""
    from models.builder import build_models
    from runtime.sim.run import simulate

    cache = {} if cache is None else cache
    m = build_models(spec)
    tp = m.tp_colocated

    def run(gpus: int):
        key = (id(spec), gpus)
        if key not in cache:
            guess = m.predictor.colocated(max(gpus // tp, 1)).completion_s
            hours = max(batches * 1.6 * guess / 3600.0, 0.05)
            r = simulate(spec, f"fixed:colocated:{max(gpus // tp, 1)}:0:0", hours=hours, models=m)
            cache[key] = r
        return cache[key]

    def roll(gpus: int) -> float:
        r = run(gpus)
        done = r.batch_times_s[:batches]
        return float(np.mean(done)) if done else math.inf

    gpus = t.setting.rollout_gpus or t.setting.from_gpus or 16
    r0 = run(gpus)
    train = float(np.mean(r0.train_times_s)) if r0.train_times_s else math.inf
    return _metric(t, roll, train, lambda: math.nan, lambda g: None, tp)


# ----------------------------------------------------------------------------- fitting
@dataclass(frozen=True)
class CandidateFit:
    name: str
    values: dict[str, float]  # every fitted or fixed parameter
    predicted: dict[str, float]  # target name -> predictor value
    rms_pct: float  # root mean square of the log residuals, in percent


@dataclass(frozen=True)
class Calibration:
    file: TargetsFile
    chosen: CandidateFit
    candidates: tuple[CandidateFit, ...]
    simulated: dict[str, float] = field(default_factory=dict)  # target name -> simulator value (final point)
    rounds: int = 0  # space-mapping rounds against the simulator

    def residual_pct(self, name: str, value: float) -> float:
        return (value / self.file.targets[name].value - 1.0) * 100.0


def _spec_for(tf: TargetsFile, t: Target, values: dict[str, float]) -> ExperimentSpec:
    return apply(base_spec(t.setting.experiment or tf.experiment, tf.workload), values)


def _rms_pct(got: dict[str, float], targets: dict[str, float], names) -> float:
    """Root mean square of log(model / target) over `names`, in percent."""
    return float(np.sqrt(np.mean([math.log(got[n] / targets[n]) ** 2 for n in names]))) * 100.0


def _predict_all(tf: TargetsFile, values: dict[str, float]) -> dict[str, float]:
    from models.builder import build_models

    built: dict[str | None, tuple] = {}
    out = {}
    for name, t in tf.targets.items():
        key = t.setting.experiment
        if key not in built:
            spec = _spec_for(tf, t, values)
            built[key] = (spec, build_models(spec))
        out[name] = predicted(*built[key][:1], t, models=built[key][1])
    return out


def _fit_candidate(tf: TargetsFile, cand: Candidate, goal: dict[str, float], start: dict[str, float] | None = None, starts: int = 4) -> CandidateFit:
    from scipy.optimize import least_squares
    from scipy.stats import qmc

    free = {**tf.parameters, **cand.free}
    free = {k: r for k, r in free.items() if k not in cand.fixed}
    keys = list(free)
    lo = np.log([free[k].low for k in keys])
    hi = np.log([free[k].high for k in keys])
    w = np.sqrt([tf.targets[n].weight for n in goal])

    def values_at(x: np.ndarray) -> dict[str, float]:
        return {**cand.fixed, **{k: float(math.exp(v)) for k, v in zip(keys, x)}}

    def residuals(x: np.ndarray) -> np.ndarray:
        try:
            got = _predict_all(tf, values_at(x))
        except (ValueError, ConfigError):
            return np.full(len(goal), 10.0)
        r = np.array([math.log(max(got[n], 1e-9) / goal[n]) if math.isfinite(got[n]) else 10.0 for n in goal])
        return w * r

    inits = [np.log([start[k] for k in keys])] if start and all(k in start for k in keys) else []
    if not inits or starts > 1:
        unit = qmc.Halton(d=len(keys), seed=0).random(starts)
        inits += [lo + u * (hi - lo) for u in unit]
    best = None
    for x0 in inits:
        x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
        res = least_squares(residuals, x0, bounds=(lo, hi), diff_step=1e-3, x_scale=1.0, max_nfev=200)
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    vals = values_at(best.x)
    got = _predict_all(tf, vals)
    return CandidateFit(cand.name, vals, got, _rms_pct(got, {n: t.value for n, t in tf.targets.items()}, tf.targets))


def calibrate(tf: TargetsFile, simulate: bool = True, rounds: int = 3, progress: Callable[[str], None] | None = None) -> Calibration:
    """Fit every candidate with the predictor, choose the best, then correct it against the simulator."""
    say = progress or (lambda _msg: None)
    goal = {n: t.value for n, t in tf.targets.items()}
    fits = []
    for cand in tf.candidates:
        say(f"candidate {cand.name}")
        fits.append(_fit_candidate(tf, cand, goal))
    chosen = min(fits, key=lambda f: f.rms_pct)
    if not simulate:
        return Calibration(tf, chosen, tuple(fits))
    cand = next(c for c in tf.candidates if c.name == chosen.name)
    sim_names = [n for n, t in tf.targets.items() if t.metric in SIMULATED]
    best_fit, best_sim, best_err, done = chosen, _simulate_all(tf, chosen.values, sim_names), math.inf, 0
    current, sim = chosen, best_sim
    for k in range(rounds + 1):
        err = _rms_pct(sim, goal, sim_names) if sim_names else 0.0
        if err < best_err:
            best_fit, best_sim, best_err, done = current, sim, err, k
        if k == rounds or not sim_names:
            break
        say(f"simulator round {k + 1}: rms {err:.1f}%")
        # output space mapping: ask the predictor for what makes the simulator hit the target
        corrected = dict(goal)
        for n in sim_names:
            corrected[n] = goal[n] * current.predicted[n] / sim[n]
        current = _fit_candidate(tf, cand, corrected, start=current.values, starts=1)  # its rms is against the true targets
        sim = _simulate_all(tf, current.values, sim_names)
    return Calibration(tf, best_fit, tuple(fits), best_sim, done)


def _simulate_all(tf: TargetsFile, values: dict[str, float], names: list[str]) -> dict[str, float]:
    cache: dict = {}
    specs: dict[str | None, ExperimentSpec] = {}
    out = {}
    for n in names:
        t = tf.targets[n]
        key = t.setting.experiment
        if key not in specs:
            specs[key] = _spec_for(tf, t, values)
        out[n] = simulated(specs[key], t, cache=cache)
    return out


# ----------------------------------------------------------------------------- output
def report(cal: Calibration, workload_path: str) -> dict:
    """The `--json` object: per target its value, the model's and the residual; the parameters."""
    targets = {}
    for n, t in cal.file.targets.items():
        pred = cal.chosen.predicted[n]
        row = {"target": t.value, "model": round(pred, 4), "residual_pct": round(cal.residual_pct(n, pred), 2), "metric": t.metric, "evaluated_by": "predictor"}
        if n in cal.simulated:
            sim = cal.simulated[n]
            row.update(model=round(sim, 4), residual_pct=round(cal.residual_pct(n, sim), 2), evaluated_by="simulator", predictor=round(pred, 4),
                       predictor_residual_pct=round(cal.residual_pct(n, pred), 2))
        targets[n] = row
    return {
        "targets": targets,
        "parameters": {k: round(v, 4) for k, v in cal.chosen.values.items()},
        "workload": workload_path,
        "candidate": cal.chosen.name,
        "candidates": {c.name: {"rms_pct": round(c.rms_pct, 2), "parameters": {k: round(v, 4) for k, v in c.values.items()}} for c in cal.candidates},
        "simulator_rounds": cal.rounds,
        "held_out": list(cal.file.held_out),
    }


def workload_yaml(cal: Calibration, targets_path: str, command: str) -> str:
    """A configs/workloads file with the fitted values and a header saying where they came from."""
    import datetime

    from runtime.calibration.workload_file import render_workload

    tf = cal.file
    spec = apply(base_spec(tf.experiment, tf.workload), {k: round(v, 4) for k, v in cal.chosen.values.items()})
    rep = report(cal, "")
    lines = [
        f"# Calibrated by `{command}` on {datetime.date.today().isoformat()}",
        f"# from {targets_path} ({cal.file.source}).",
        f"# Candidate mechanism chosen by fit to the calibration targets: {cal.chosen.name} "
        + "(rms error per candidate: " + ", ".join(f"{c.name} {c.rms_pct:.1f}%" for c in cal.candidates) + ").",
        "# Residuals (model vs target; simulator where it can measure the target, else predictor):",
    ]
    for n, r in rep["targets"].items():
        lines.append(f"#   {n}: target {r['target']:g}, model {r['model']:.4g} ({r['evaluated_by']}), {r['residual_pct']:+.1f}%")
    extra = {k: v for k, v in cal.chosen.values.items() if k.startswith("training.")}
    if extra:
        lines.append("# Fitted outside the workload (set them in the experiment): " + ", ".join(f"{k} = {v:.4g}" for k, v in extra.items()))
    if cal.file.held_out:
        lines.append("# Held out, never used to fit: " + "; ".join(cal.file.held_out))
    return render_workload(lines, spec.workload)
