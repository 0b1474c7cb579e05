"""A P/D profile's measured KV handoff: fitted from 'handoff' samples, carried in the profile,
and charged by the predictor on the decode path in place of the link-bandwidth estimate."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from models.builder import build_models
from models.config import CONFIG_ROOT, ConfigError, load_experiment
from models.fit import StepSample, fit_profile
from models.step_latency import KVHandoff, load_profile
from test_fit_synthetic import GPU, LLM, TP, synthetic_samples

TRUE = KVHandoff(fixed_s=0.004, per_request_s=0.0009, per_token_s=2e-6)


def handoff_samples(seed: int = 0) -> list[StepSample]:
    rng = np.random.default_rng(seed)
    out = []
    for n, ctx in itertools.product([1, 2, 4, 8, 16, 32], [0, 128, 512, 1024]):
        t = float(TRUE.time(n, n * ctx)) * (1 + rng.normal(0, 0.01))
        out.append(StepSample("handoff", float(n * 16), float(n), float(n * ctx), 0.0, 0.0, t))
    return out


def test_handoff_terms_are_recovered_and_generalise() -> None:
    report = fit_profile(synthetic_samples() + handoff_samples(), LLM, GPU, TP, name="pd", hardware="H800", model="qwen3-30b-a3b")
    h = report.profile.kv_handoff
    assert h is not None
    for name in ("fixed_s", "per_request_s", "per_token_s"):
        assert getattr(h, name) == pytest.approx(getattr(TRUE, name), rel=0.1), name
    assert report.holdout_mape["handoff"] < 2.0 and report.n_holdout["handoff"] > 0


def test_profile_without_handoff_samples_has_none() -> None:
    assert fit_profile(synthetic_samples(), LLM, GPU, TP, name="x", hardware="H800", model="qwen3-30b-a3b").profile.kv_handoff is None


def test_handoff_round_trips_and_bad_values_are_one_clear_error(tmp_path: Path) -> None:
    prof = fit_profile(synthetic_samples() + handoff_samples(), LLM, GPU, TP, name="pd", hardware="H800", model="qwen3-30b-a3b").profile
    path = tmp_path / "pd.json"
    path.write_text(json.dumps(prof.to_json()))
    assert load_profile(path).kv_handoff == prof.kv_handoff
    data = prof.to_json()
    data["kv_handoff"]["per_token_s"] = -1.0
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        load_profile(path)
    assert info.value.field == "kv_handoff.per_token_s" and ">= 0" in info.value.allowed


def test_decode_path_charges_the_measured_handoff_instead_of_the_link() -> None:
    spec = load_experiment(CONFIG_ROOT / "experiments/cpu-tiny.yaml")
    base = load_profile(CONFIG_ROOT / "profiles/cpu-tiny-served-x2.json")
    without = build_models(spec, profile=base, pd_profile=base).predictor
    slow = replace(base, kv_handoff=KVHandoff(fixed_s=0.02, per_request_s=0.002, per_token_s=0.0))
    with_h = build_models(spec, profile=base, pd_profile=slow).predictor
    n = np.array([1])
    t0, t1 = float(without.decode_path_many(n)[0][0]), float(with_h.decode_path_many(n)[0][0])
    turns = with_h.shape.turns
    # each turn the critical trajectory waits at least for its own takeover (0.022 s) ...
    assert t1 - t0 >= turns * 0.022 * 0.99
    # ... and the colocated prediction does not see the P/D profile at all
    assert with_h.colocated(2).completion_s == pytest.approx(without.colocated(2).completion_s)
    # the link term is gone where the handoff was measured (prefill steps include the store)
    assert float(with_h._kv_send_s(np.array([1000.0]), with_h.prefill_engine)[0]) == 0.0
    assert float(without._kv_send_s(np.array([1000.0]), without.prefill_engine)[0]) > 0.0


def test_deployment_names_a_profile_per_mode(config_tree: Path) -> None:
    import yaml

    path = config_tree / "experiments/cpu-tiny.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["profile_by_engines"] = {2: {"colocated": "cpu-tiny-served-x2", "disaggregated": "cpu-tiny-served"}}
    path.write_text(yaml.safe_dump(doc))
    spec = load_experiment(path)
    assert spec.profile_name == "cpu-tiny-served-x2" and spec.pd_profile_name == "cpu-tiny-served"
    m = build_models(spec)
    assert m.predictor.colocated_engine.profile.name == "cpu-tiny-served-x2"
    assert m.predictor.prefill_engine.profile.name == m.predictor.decode_engine.profile.name == "cpu-tiny-served"
    doc["profile_by_engines"] = {2: {"colocated": "cpu-tiny-served-x2", "disaggregated": "no-such"}}
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    assert info.value.field == "profile_by_engines.2.disaggregated" and info.value.value == "no-such"


def test_engine_model_charges_the_takeover_on_decode_instances() -> None:
    """The simulator's and emulated engine's decode instance: arrivals admitted together cost one
    takeover step, h(k, loaded), before decoding goes on (what the predictor charges)."""
    import math

    from models.engine import Engine, EngineConfig, Request

    spec = load_experiment(CONFIG_ROOT / "experiments/cpu-tiny.yaml")
    base = load_profile(CONFIG_ROOT / "profiles/cpu-tiny-served-x2.json")
    h = KVHandoff(fixed_s=0.02, per_request_s=0.003, per_token_s=1e-5)

    def finish(profile) -> dict[int, float]:
        step = build_models(spec, profile=base, pd_profile=profile).predictor.decode_engine
        eng = Engine(EngineConfig(step, "decode", kv_capacity_tokens=math.inf))
        for rid in range(3):  # three trajectories' KV lands at once: 128 tokens each
            eng.submit(Request(rid, 128, 0, 8), 0.0)
        done: dict[int, float] = {}
        while not eng.idle():
            for o in eng.on_event(eng.next_event()):
                done[o.rid] = o.time
        return done

    plain, taken = finish(base), finish(replace(base, kv_handoff=h))
    assert set(plain) == set(taken) == {0, 1, 2}
    for rid in plain:
        assert taken[rid] - plain[rid] == pytest.approx(float(h.time(3, 3 * 128)), rel=1e-9)
