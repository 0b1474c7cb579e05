"""The deployment's terms: requests' time outside the engine, and trajectories in lockstep.

A runtime-clock profile (`pearl profile --clock runtime`) measures how long a request spends
between the driver and its engine core; `pearl fit` turns those samples into a
`request_overhead` the predictor and the simulator charge on every turn. A workload with no
spread keeps its trajectories in lockstep, so they decode together (Little's law would mix them).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from models.builder import build_models
from models.config import CONFIG_ROOT, ConfigError, load_experiment
from models.fit import StepSample, fit_profile, read_samples
from models.step_latency import RequestOverhead, load_profile

ROOT = Path(__file__).resolve().parent.parent


def _request_sample(n: int, seconds: float) -> StepSample:
    return StepSample("request", 0.0, float(n), 0.0, 0.0, 0.0, seconds, 0.01)


def _spec(batch: int, env_cv: float = 0.0):
    spec = load_experiment(ROOT / "configs/experiments/cpu-tiny.yaml")
    w = spec.workload.model_copy(update={"trajectories_per_batch": batch})
    if env_cv:
        w = w.model_copy(update={"env_latency_s": w.env_latency_s.model_copy(update={"kind": "lognormal", "cv": env_cv})})
    return spec.model_copy(update={"workload": w})


def test_fit_turns_request_samples_into_a_linear_overhead() -> None:
    """Shipped runtime-clock samples plus exact request samples: the fit recovers the line."""
    _, samples = read_samples(CONFIG_ROOT / "profiles/samples/cpu-tiny-runtime-x2.jsonl")
    steps = [s for s in samples if s.kind in ("prefill", "decode")]
    exact = [_request_sample(n, 0.010 + 0.003 * n) for n in (1, 2, 3, 4, 6, 8, 16, 32)]
    from models.config import load_hardware, load_llms

    report = fit_profile(steps + exact, load_llms().models["tiny"], load_hardware().gpus["cpu"], 1, name="t", hardware="cpu", model="tiny", machine="m")
    r = report.profile.request_overhead
    assert r is not None and r.fixed_s == pytest.approx(0.010, rel=1e-3) and r.per_request_s == pytest.approx(0.003, rel=1e-3)
    assert report.holdout_mape["request"] < 0.1
    assert RequestOverhead(**report.profile.to_json()["request_overhead"]) == r


def test_too_few_request_counts_leave_the_term_out_and_say_why() -> None:
    """The `tiny` grid measures 2 batch sizes: no line can be fitted and held out, so the profile
    has no request_overhead and its fit says why (the step kinds are fitted as ever)."""
    from models.config import load_hardware, load_llms

    _, samples = read_samples(CONFIG_ROOT / "profiles/samples/cpu-tiny-runtime-x2.jsonl")
    steps = [s for s in samples if s.kind in ("prefill", "decode")]
    two = [_request_sample(n, 0.01 * n) for n in (1, 16)]
    report = fit_profile(steps + two, load_llms().models["tiny"], load_hardware().gpus["cpu"], 1, name="t", hardware="cpu", model="tiny")
    assert report.profile.request_overhead is None and "request" not in report.holdout_mape
    assert "2 request counts measured" in report.profile.fit["skipped"]["request"]


def test_shipped_runtime_profiles_carry_their_measured_overhead() -> None:
    for name in ("cpu-tiny-runtime-x2", "cpu-tiny-runtime-pd"):
        p = load_profile(CONFIG_ROOT / f"profiles/{name}.json")
        assert p.request_overhead is not None and p.request_overhead.fixed_s + p.request_overhead.per_request_s > 0
        assert p.fit["engine"]["clock"] == "runtime"


def test_a_bad_request_overhead_is_one_clear_error(tmp_path: Path) -> None:
    doc = json.loads((CONFIG_ROOT / "profiles/cpu-tiny-runtime-x2.json").read_text())
    doc["request_overhead"] = {"fixed_s": -1.0, "per_request_s": 0.0}
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as err:
        load_profile(bad)
    assert err.value.field == "request_overhead.fixed_s"


def test_every_turn_pays_the_overhead_at_its_engine_load() -> None:
    """With the engines far from busy the overhead adds sum_k overhead(m_k) to a colocated
    batch, m_k the trajectories per instance at turn k (a little less: the others' prefills
    interrupt a smaller share of a longer turn)."""
    spec = _spec(batch=4)
    p = build_models(spec).predictor
    r = p.colocated_engine.profile.request_overhead
    assert r is not None
    without = dataclasses.replace(p, colocated_engine=dataclasses.replace(p.colocated_engine, profile=dataclasses.replace(p.colocated_engine.profile, request_overhead=None)), _cache={})
    m = np.maximum(p.shape.active / 2.0, 1.0)
    added, charged = p.colocated(2).completion_s - without.colocated(2).completion_s, float(r.time(m).sum())
    assert 0.98 * charged <= added <= charged


def test_a_constant_workload_decodes_in_lockstep_and_a_spread_one_mixes() -> None:
    """No spread: every trajectory of an instance decodes in every step (c = m), whatever the
    tool wait. A spread tool wait spreads later turns' arrivals: concurrency falls toward Little's law."""
    lockstep = build_models(_spec(batch=16)).predictor
    assert lockstep.colocated(2).mean_concurrency == pytest.approx(8.0)
    spread = build_models(_spec(batch=16, env_cv=1.0)).predictor
    assert spread.colocated(2).mean_concurrency < 8.0 - 1e-6
    # turn 0 starts together in both
    *_, c = spread._colocated_turns(np.array([2]))
    assert c[0, 0] == pytest.approx(8.0) and c[0, -1] < 8.0


def test_the_simulator_charges_what_the_predictor_charges() -> None:
    """A constant 3-turn workload whose requests each spend 2 s outside the engine: the simulated
    batch, like the predicted one, grows by 3 x 2 s (the simulator's engines and the predictor
    read the same profile term)."""
    from runtime.sim.run import TraceFlags, simulate

    spec = _spec(batch=8)
    base = build_models(spec)
    slow = dataclasses.replace(base.predictor.colocated_engine.profile, request_overhead=RequestOverhead(2.0, 0.0))
    plain = dataclasses.replace(slow, request_overhead=None)
    sims = {}
    for name, prof in (("slow", slow), ("plain", plain)):
        models = build_models(spec, profile=prof, pd_profile=prof)
        sims[name] = simulate(spec, "roll", TraceFlags(), hours=0.05, models=models).mean_batch_s
        assert models.predictor.shape.turns == 3
    predicted = build_models(spec, profile=slow, pd_profile=slow).predictor.colocated(2).completion_s - build_models(spec, profile=plain, pd_profile=plain).predictor.colocated(2).completion_s
    assert predicted == pytest.approx(6.0, rel=0.01)
    assert sims["slow"] - sims["plain"] == pytest.approx(6.0, abs=0.3)
