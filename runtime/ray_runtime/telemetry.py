"""Runtime tracker: per-step telemetry, refitting the predictor, metrics to JSONL.

After every rollout step the tracker records what the batch really did (turns, new input
tokens per turn, generated tokens per turn, environment time, transition costs measured
while applying plans) and refits the predictor for the next decision:
  - workload parameters: the means of turns, initial prompt, new tokens per turn,
    response tokens per turn and tool latency become the measured ones (adjacent steps
    are similar; no stationarity assumed: the latest step wins, smoothed by an EMA);
  - engine speed: the profile's coefficients are scaled by the speed that would have
    predicted the step exactly, solved on the predictor for the step's layout (`exact_speed`):
    the first measured step replaces the profile's guess, later ones enter an EMA, so a
    profile measured on another machine or setting converges to this deployment; a disrupted
    step (turns resumed after an engine death, requests waiting through a transition) leaves
    the speed alone;
  - per-type speeds (a mixed cluster): each GPU type's engines' busy time against what their
    step models predict for the requests they served (`TypeTimes`), relative to the batch's
    pooled ratio, moves that type's speed (`refit_type_speeds`): a type whose profile is off
    (a datasheet-derived one) is found, which one batch time cannot say;
  - transition costs: EMAs of measured engine start and role-switch seconds.
Each step's measured-vs-predicted error is written to the metrics.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from models.builder import ExperimentModels, build_models, is_mixed
from models.config import Distribution, ExperimentSpec, layout_counts
from models.speed import SPEED_RANGE, solve_speed
from models.step_latency import EngineProfile, StepLatencyModel


@dataclass(frozen=True)
class StepTelemetry:
    step: int
    trajectories: int
    mean_turns: float
    mean_initial_tokens: float
    mean_new_tokens: float
    mean_response_tokens: float
    mean_env_s: float
    generated_tokens: int
    rollout_s: float
    predicted_s: float
    mode: str
    ratio: str
    fitted_on_steps: int = 0  # measured steps behind the prediction: all earlier than this one
    disrupted: str = ""  # why the batch did not run at its layout's speed (resumed turns, no worker of a role); "" if it did
    kinds: str = ""  # the layout by GPU type, role and TP degree when the batch ended ('H20 3C@TP4; H800 1C@TP4')
    type_seconds: tuple[tuple[str, int, float, float], ...] = ()  # per GPU type: requests, its engines' measured and predicted busy seconds (`TypeTimes`)

    @property
    def error(self) -> float:
        """Relative error of the prediction made for this step's configuration."""
        return (self.predicted_s - self.rollout_s) / self.rollout_s if self.rollout_s > 0 else 0.0

    def prediction(self) -> dict[str, Any]:
        """The step's prediction against its measurement, for the run summary."""
        ok = np.isfinite(self.predicted_s) and self.rollout_s > 0
        return {"step": self.step, "predicted_s": round(self.predicted_s, 3) if ok else None, "measured_s": round(self.rollout_s, 3),
                "error_pct": round(self.error * 100, 2) if ok else None, "fitted_on_steps": self.fitted_on_steps, "disrupted": self.disrupted or None}


def disruption(resumed_turns: int, starved: bool) -> str:
    """Why a batch's time says nothing about its layout's speed: turns resumed after an engine
    stopped or died under them, or requests that waited while no worker served their role (a
    transition). The predictor prices neither (transitions are the planner's cost term)."""
    why = [f"{resumed_turns} resumed turns"] * bool(resumed_turns) + ["requests waited for a worker of their role"] * starved
    return "; ".join(why)


MIN_TYPE_REQUESTS = 16  # a type's counted requests (colocated, decode or prefill-only) in a batch before its engine seconds say anything


def request_engine_s(engine: StepLatencyModel, phase: str, prompt: np.ndarray | float, cached: np.ndarray | float, generated: np.ndarray | float,
                     concurrency: np.ndarray | float) -> np.ndarray:
    """The engine time requests cost by their step model (arrays: one per request): a colocated
    request's prefill of its uncached prompt, and each request's share of one decode step per
    token among the `concurrency` sequences it met (a step serves them all); a prefill-only
    request (`phase` "prefill") its share of the prefill backlog of `concurrency` such requests,
    as the engine runs it in steps (`StepLatencyModel.prefill_work`: the per-step terms shared).
    Summed over an engine's requests this is the engine's busy time the model predicts: prefill
    and decode weigh as they do on that type, whatever order the requests came in."""
    b = np.maximum(np.asarray(concurrency, dtype=float), 1.0)
    if phase == "prefill":
        cached = np.asarray(cached, dtype=float)
        new = np.maximum(np.asarray(prompt, dtype=float) - cached, 1.0)
        return engine.prefill_work(b * new, b, b * cached) / b
    n = np.asarray(generated, dtype=float)
    out = n * engine.decode_time(b, np.asarray(prompt, dtype=float) + n / 2) / b
    if phase == "full":
        cached = np.asarray(cached, dtype=float)
        out = out + engine.prefill_time(np.maximum(np.asarray(prompt, dtype=float) - cached, 1.0), 1.0, cached)
    return out


@dataclass
class TypeTimes:
    """One batch per GPU type: its engines' busy time as measured (virtual seconds with a request
    in flight, `SlotRuntime.busy_s`) and as the planner's step models predict it from the
    requests they served (`request_engine_s`, priced once per batch): colocated and decode
    requests, and prefill-only ones, so that a P/D layout whose types split the roles (prefill
    on H800, decode on H20) still compares its types.

    Why: a mixed cluster's types are profiled apart (some datasheet-derived); one batch time
    cannot tell which type is off, but every request names its engine's type. The tracker
    compares the types' measured / predicted (`RuntimeTracker.refit_type_speeds`). Per engine,
    not per request: a request's own latency also holds the other requests' prefills, which
    weigh more on a type with less compute."""

    engines: dict[tuple[str, str, int], StepLatencyModel]  # the models in use, by (role, GPU type, TP)
    kind_of: Callable[[Any], tuple[str, int]]  # a slot's (GPU type, TP degree)
    scale: float  # virtual seconds per wall second
    requests: dict[tuple[str, str, int], list[tuple[int, int, int, float]]] = field(default_factory=dict)  # per engine kind: (prompt, cached, generated, concurrency)
    served: dict[int, Any] = field(default_factory=dict)  # slots that served a counted request this batch
    busy_at: dict[int, float] = field(default_factory=dict)  # per slot: busy_s when the batch began

    def reset(self, slots: Iterable[Any]) -> None:
        self.requests, self.served = {}, {}
        self.busy_at = {id(s): s.busy_s for s in slots}

    def add(self, slot: Any, phase: str, prompt: int, cached: int, generated: int, concurrency: float) -> None:
        """One finished request on `slot` (generating ones of fewer than 8 tokens say too little: skipped)."""
        if phase not in ("full", "decode", "prefill") or (phase != "prefill" and generated < 8):
            return
        key = ({"full": "colocated"}.get(phase, phase), *self.kind_of(slot))
        if key not in self.engines:
            return
        self.requests.setdefault(key, []).append((prompt, cached, generated, concurrency))
        self.served[id(slot)] = slot

    def rows(self) -> tuple[tuple[str, int, float, float], ...]:
        """Per type: requests, measured and predicted busy seconds of the engines that served them."""
        busy: dict[str, float] = {}
        for key, slot in self.served.items():
            typ = self.kind_of(slot)[0]
            busy[typ] = busy.get(typ, 0.0) + (slot.busy_s - self.busy_at.get(key, 0.0)) * self.scale
        predicted: dict[str, list[float]] = {}
        for (role, typ, tp), reqs in self.requests.items():
            prompt, cached, generated, concurrency = np.array(reqs, dtype=float).T
            row = predicted.setdefault(typ, [0, 0.0])
            row[0] += len(reqs)
            row[1] += float(request_engine_s(self.engines[(role, typ, tp)], {"colocated": "full"}.get(role, role), prompt, cached, generated, concurrency).sum())
        return tuple((typ, int(n), round(busy.get(typ, 0.0), 4), round(p, 4)) for typ, (n, p) in sorted(predicted.items()))


def _with_mean(d: Distribution, mean: float) -> Distribution:
    if not np.isfinite(mean) or mean <= 0:
        return d
    if d.kind == "uniform":
        assert d.min is not None and d.max is not None
        shift = mean - (d.min + d.max) / 2
        lo = max(d.min + shift, 0.0)
        return d.model_copy(update={"min": lo, "max": max(d.max + shift, lo)})
    upd: dict[str, Any] = {"mean": mean}
    if d.min is not None and mean < d.min:
        upd["min"] = mean
    if d.max is not None and mean > d.max:
        upd["max"] = mean
    return d.model_copy(update=upd)




@dataclass
class RuntimeTracker:
    """Refits the experiment's models from measured steps (see module docstring)."""

    spec: ExperimentSpec
    base_profile: EngineProfile
    base_pd_profile: EngineProfile | None = None  # P/D instances' own profile, where the deployment names one
    base_fewer_engines: dict[int, EngineProfile] | None = None  # colocated, fewer engines on a node (`profile_by_engines`; None: read them)
    env_scale: float = 1.0  # tool sleeps run at 1/time_scale: the predictor sees wall seconds
    alpha: float = 0.5
    speed: float = 1.0
    speed_measured: bool = False
    type_speeds: dict[str, float] = field(default_factory=dict)  # a mixed cluster's per-type speeds, relative (`refit_type_speeds`)
    history: list[StepTelemetry] = field(default_factory=list)
    transition_s: dict[str, float] = field(default_factory=dict)

    def models(self, speed: float | None = None, type_speeds: dict[str, float] | None = None) -> ExperimentModels:
        """The refitted models, at the measured speeds unless `speed` / `type_speeds` say others."""
        return build_models(self.spec, profile=self.base_profile, env_scale=self.env_scale, pd_profile=self.base_pd_profile,
                            speed=self.speed if speed is None else speed, fewer_engines=self.base_fewer_engines,
                            type_speeds=self.type_speeds if type_speeds is None else type_speeds)

    def refit_type_speeds(self, seconds: tuple[tuple[str, int, float, float], ...]) -> None:
        """Move each GPU type's speed by its engines' measured / predicted busy seconds over the
        batch's pooled measured / predicted (`TypeTimes` rows): relative, so the level stays the
        batch-time fit's (`speed`) and what every type's prediction leaves out alike cancels.
        The first measurement of a type replaces its 1.0, later ones enter the EMA; a type with
        fewer than MIN_TYPE_REQUESTS requests, or a batch of one type, says nothing."""
        rows = [(typ, m, p) for typ, n, m, p in seconds if n >= MIN_TYPE_REQUESTS and m > 0 and p > 0]
        if len(rows) < 2:
            return
        pooled = sum(m for _, m, _ in rows) / sum(p for _, _, p in rows)
        for typ, m, p in rows:
            old = self.type_speeds.get(typ)
            exact = float(np.clip((1.0 if old is None else old) * m / p / pooled, *SPEED_RANGE))
            self.type_speeds[typ] = exact if old is None else (1 - self.alpha) * old + self.alpha * exact

    def record_transition(self, kind: str, seconds: float) -> None:
        old = self.transition_s.get(kind)
        self.transition_s[kind] = seconds if old is None else (1 - self.alpha) * old + self.alpha * seconds

    def exact_speed(self, t: StepTelemetry) -> float:
        """The engine speed at which the predictor gives the step's measured time for its layout
        (`models.speed.solve_speed`, from the speed in use). The ratio, speed x measured /
        predicted, stays the answer where the layout cannot be predicted again here (a mixed
        cluster, an unknown label) or the prediction again misses the one made for the step by
        over 2% (the models moved in between)."""
        ratio = float(np.clip(self.speed * t.rollout_s / t.predicted_s, *SPEED_RANGE))
        if is_mixed(self.spec):  # its layouts are per-kind mixes, planned from the variants' tables
            return ratio
        p0 = self._layout_s(t.ratio, self.speed)
        if p0 is None or abs(p0 - t.predicted_s) > 0.02 * t.predicted_s:
            return ratio
        return solve_speed(lambda s: self._layout_s(t.ratio, s), t.rollout_s, self.speed, p0)

    def _layout_s(self, ratio: str, speed: float) -> float | None:
        """A fresh batch's predicted completion for a layout label ('2C', '1P1D') at `speed`; None where it has none."""
        counts = layout_counts(ratio)
        if counts is None:
            return None
        predictor = self.models(speed).predictor
        p = predictor.colocated(counts[0]) if counts[0] else predictor.disaggregated(counts[1], counts[2])
        return p.completion_s if math.isfinite(p.completion_s) else None

    def observe(self, t: StepTelemetry) -> ExperimentSpec:
        """Record a step and refit; returns the refitted spec (workload + measured transition costs)."""
        self.history.append(t)
        # a disrupted batch (a death, a transition) is not the engines' speed: learning from it
        # once made the planner predict a 2 s batch at 22 s after one killed worker
        if not t.disrupted and t.predicted_s > 0 and t.rollout_s > 0 and np.isfinite(t.predicted_s):
            exact = self.exact_speed(t)
            self.speed = exact if not self.speed_measured else (1 - self.alpha) * self.speed + self.alpha * exact
            self.speed_measured = True
            if self.spec.runtime.refit_types:
                self.refit_type_speeds(t.type_seconds)
        w = self.spec.workload
        a = self.alpha

        def ema(d: Distribution, x: float) -> Distribution:
            return _with_mean(d, (1 - a) * d.expected() + a * x)

        workload = w.model_copy(
            update={
                "turns": ema(w.turns, t.mean_turns),
                "initial_prompt_tokens": ema(w.initial_prompt_tokens, t.mean_initial_tokens),
                "new_tokens_per_turn": ema(w.new_tokens_per_turn, t.mean_new_tokens),
                "response_tokens_per_turn": ema(w.response_tokens_per_turn, t.mean_response_tokens),
                "env_latency_s": ema(w.env_latency_s, t.mean_env_s),
            }
        )
        tc = self.spec.transition_costs.model_copy(
            update={k: v for k, v in (("engine_start_s", self.transition_s.get("start")), ("role_switch_s", self.transition_s.get("switch_role"))) if v is not None}
        )
        self.spec = self.spec.model_copy(update={"workload": workload, "transition_costs": tc})
        return self.spec


class MetricsWriter:
    """Appends one JSON object per event to a JSONL file (streamed: flushed per line)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("w")
        self._t0 = time.time()

    def write(self, record: str, /, **data: Any) -> None:
        rec = {"t": round(time.time() - self._t0, 4), "record": record, **data}
        self._f.write(json.dumps(rec, default=_jsonable) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _jsonable(x: Any) -> Any:
    if hasattr(x, "__dataclass_fields__"):
        return asdict(x)
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return str(x)
