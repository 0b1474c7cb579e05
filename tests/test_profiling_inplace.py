"""Deployment profiles measured in place (runtime/profiling_inplace.py, experiments/calibrate_deployment.py):
the speed from calibration batches, the component terms from the runtime's request records, the
shipped profiles' provenance, and the validation's in-run judgement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from models.builder import build_models
from models.config import CONFIG_ROOT, load_experiment
from models.step_latency import load_profile
from runtime.profiling_inplace import InPlaceTerms, base_of, deployed_profile, deployment_speed, inplace_terms, with_decode_of

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "configs/experiments/train-cpu-tiny.yaml"


@pytest.fixture(scope="module")
def base():
    return load_profile(CONFIG_ROOT / "profiles/cpu-tiny-runtime-x2.json")


@pytest.fixture(scope="module")
def engine(base):
    return build_models(load_experiment(CONFIG), profile=base).predictor.colocated_engine


def _call(engine, worker: str, start: float, tokens: int, slower: float, outside_s: float, in_flight: int, ctx: int = 128) -> dict:
    """A colocated call alone on its engine (concurrency 1) whose decode steps take `slower` x the profile's."""
    step = slower * float(engine.decode_time(1.0, ctx + tokens / 2))
    first = start + 0.01
    last = first + step * (tokens - 1)
    return {"record": "request", "worker": worker, "phase": "full", "prompt_tokens": ctx, "in_flight": in_flight,
            "engine_times": [start, start + 0.002, first, last, tokens], "sent": start - outside_s / 2, "back": last + outside_s / 2}


def test_in_place_terms_read_the_decode_ratio_and_fit_the_overhead_on_calls_in_flight(engine):
    # calls one after another on two engines, decode 1.3x the profile's, outside 20 ms + 3 ms per call in flight
    calls = [_call(engine, f"w{i % 2}", 10.0 * i, 17, 1.3, 0.020 + 0.003 * n, n) for i, n in enumerate([1, 2, 4, 6, 8, 3, 5, 7])]
    terms = inplace_terms(calls + [{"record": "rollout_step", "t": 1.0}], engine)
    assert terms.calls == 8 and terms.decode_calls == 8
    assert terms.decode_ratio == pytest.approx(1.3, rel=1e-6) and terms.decode_ratio_iqr == pytest.approx((1.3, 1.3), rel=1e-6)
    assert terms.request_overhead.fixed_s == pytest.approx(0.020, abs=1e-6) and terms.request_overhead.per_request_s == pytest.approx(0.003, abs=1e-7)
    # a P/D call is not a colocated one, and no colocated call at all is one clear error
    with pytest.raises(ValueError, match="no colocated engine calls"):
        inplace_terms([{**c, "phase": "decode"} for c in calls], engine)


def test_deployment_speed_is_the_median_ratio_of_measured_to_predicted():
    assert deployment_speed([1.2, 2.6, 3.3], [1.0, 2.0, 3.0]) == pytest.approx(1.2)
    assert deployment_speed([0.9, 1.1, 1.5, 1.6], [1.0, 1.0, 1.0, 1.0]) == pytest.approx(1.3)
    for measured, predicted in (([], []), ([1.0], [1.0, 2.0]), ([1.0], [0.0])):
        with pytest.raises(ValueError):
            deployment_speed(measured, predicted)


def test_a_deployed_profile_is_its_base_scaled_and_says_so(base, tmp_path):
    terms = InPlaceTerms(1.4, base.request_overhead, 10, 9, 41.0, (1.1, 1.6))
    p = deployed_profile(base, 1.25, terms, "deployed-test", "a test")
    assert p.name == "deployed-test" and p.label == base.label and p.hardware == base.hardware
    assert np.allclose(p.decode.vector(), 1.25 * base.decode.vector()) and np.allclose(p.prefill.vector(), 1.25 * base.prefill.vector())
    assert p.request_overhead.fixed_s == pytest.approx(1.25 * base.request_overhead.fixed_s)
    assert p.fit["in_place"]["speed"] == 1.25 and p.fit["in_place"]["base_profile"] == base.name and p.fit["in_place"]["components"]["decode_step_ratio"] == 1.4
    # written and read back, it leads back to its base: a second calibration scales the base, not this one
    (tmp_path / f"{base.name}.json").write_text(json.dumps(base.to_json()))
    (tmp_path / "deployed-test.json").write_text(json.dumps(p.to_json()))
    again = load_profile(tmp_path / "deployed-test.json")
    assert again == p
    assert base_of(again, tmp_path) == base and base_of(base, tmp_path) is base


def test_a_pd_base_takes_another_profiles_decode_terms_and_a_recalibration_keeps_them(base, tmp_path):
    pd = load_profile(CONFIG_ROOT / "profiles/cpu-tiny-runtime-pd.json")
    both = with_decode_of(pd, base)
    assert np.array_equal(both.decode.vector(), base.decode.vector()) and np.array_equal(both.prefill.vector(), pd.prefill.vector())
    assert both.kv_handoff == pd.kv_handoff and both.request_overhead == pd.request_overhead
    p = deployed_profile(both, 0.9, None, "deployed-pd-test", "a test")
    assert p.fit["in_place"]["decode_profile"] == base.name and "decode_profile" not in p.fit and f"with the decode terms of {base.name}" in p.notes
    assert np.allclose(p.decode.vector(), 0.9 * base.decode.vector()) and np.allclose(p.prefill.vector(), 0.9 * pd.prefill.vector())
    for q in (pd, base):
        (tmp_path / f"{q.name}.json").write_text(json.dumps(q.to_json()))
    (tmp_path / "deployed-pd-test.json").write_text(json.dumps(p.to_json()))
    again = load_profile(tmp_path / "deployed-pd-test.json")
    assert base_of(again, tmp_path) == both  # what the next calibration scales: the same composition
    assert base_of(again, tmp_path, compose=False) == pd
    other = load_profile(CONFIG_ROOT / "profiles/cpu-small.json")
    with pytest.raises(ValueError, match="cannot serve"):
        with_decode_of(pd, other)


@pytest.mark.parametrize("name", ["cpu-tiny-deployed-x2", "cpu-tiny-deployed-pd"])
def test_the_shipped_deployment_profiles_are_their_measured_base_times_their_recorded_speed(name):
    p = load_profile(CONFIG_ROOT / f"profiles/{name}.json")
    rec = p.fit["in_place"]
    b = load_profile(CONFIG_ROOT / f"profiles/{rec['base_profile']}.json")
    d = load_profile(CONFIG_ROOT / f"profiles/{rec['decode_profile']}.json") if "decode_profile" in rec else b  # the P/D one's decode: one engine alone
    assert rec["speed"] > 0 and "calibrate_deployment.py" in rec["provenance"]
    assert np.allclose(p.decode.vector(), rec["speed"] * d.decode.vector(), rtol=1e-3)
    assert np.allclose(p.prefill.vector(), rec["speed"] * b.prefill.vector(), rtol=1e-3)


def test_the_validation_judges_in_run_at_the_speed_its_calibration_batches_measured():
    sys.path.insert(0, str(ROOT / "experiments"))
    import validate_predictor as vp

    spec = load_experiment(CONFIG)
    bases = (base_of(load_profile(CONFIG_ROOT / "profiles/cpu-tiny-deployed-x2.json"), CONFIG_ROOT / "profiles"), None)
    cal = [(12, 0.5), (24, 0.2)]
    rows = [{"mode": "colocated", "ratio": "2C", "rollout_s": f * vp.predict(spec, "2C", b, e, (bases[0], bases[0], {}))} for (b, e) in cal for f in (1.1, 1.3)]
    pts = [{"batch": 4, "env_s": spec.workload.env_latency_s.expected() * 0.1, "layout": "2C", "measured_s": 1.0}]
    out = vp.judge_in_run(spec, "colocated", cal, 2, rows, pts, (bases[0], bases[0], {}))
    assert out["base_profile"] == "cpu-tiny-runtime-x2" and out["calibration_ratios"] == pytest.approx([1.1, 1.3, 1.1, 1.3], rel=1e-3)
    # beside each ratio, the speed at which the base profile predicts what the batch measured; its
    # tool waits do not scale, so that speed is further from 1 than the ratio
    for (b, e), (speed, row) in zip([c for c in cal for _ in (1, 2)], zip(out["calibration_speeds"], rows)):
        assert vp.predict(spec, "2C", b, e, (bases[0], bases[0], {}), speed) == pytest.approx(row["rollout_s"], rel=2e-3)
    assert all(s > r for s, r in zip(out["calibration_speeds"], out["calibration_ratios"]))
    assert out["speed"] == pytest.approx(1.2, rel=1e-3)
    assert pts[0]["in_run_predicted_s"] == pytest.approx(vp.predict(spec, "2C", 4, 0.1, (bases[0], bases[0], {}), out["speed"]), rel=1e-3)
    assert out["mean_abs_error_pct"] == pytest.approx(abs(pts[0]["in_run_error_pct"]), abs=0.01)
    # a calibration batch that ran another mode's layout is one clear error, not a speed
    with pytest.raises(SystemExit, match="validate_predictor: colocated: the runtime ran disaggregated 1P1D at calibration B=12"):
        vp.judge_in_run(spec, "colocated", cal, 2, [{**rows[0], "mode": "disaggregated", "ratio": "1P1D"}] + rows[1:], pts, (bases[0], bases[0], {}))


def test_the_validation_judges_a_one_engine_layout_in_run_on_the_one_engine_base():
    """A 1C batch on a two-slot node is predicted from the profile measured with one engine on
    the node (`profile_by_engines`), in-run too: its speed is that base's, not the full node's."""
    sys.path.insert(0, str(ROOT / "experiments"))
    import validate_predictor as vp

    spec = load_experiment(CONFIG)
    assert spec.colocated_by_engines, "train-cpu-tiny.yaml names a one-engine profile"
    x2, x1 = (base_of(load_profile(CONFIG_ROOT / f"profiles/{n}.json"), CONFIG_ROOT / "profiles") for n in ("cpu-tiny-deployed-x2", "cpu-tiny-deployed-x1"))
    assert (x2.name, x1.name) == ("cpu-tiny-runtime-x2", "cpu-tiny-runtime-x1")
    bases = (x2, x2, {1: x1})
    cal = [(12, 0.5), (24, 0.2)]
    one_alone = (x1, x1, {})
    rows = [{"mode": "colocated", "ratio": "1C", "rollout_s": 1.2 * vp.predict(spec, "1C", b, e, one_alone)} for (b, e) in cal for _ in (1, 2)]
    pts = [{"batch": 4, "env_s": spec.workload.env_latency_s.expected() * 0.1, "layout": "1C", "measured_s": 1.0}]
    out = vp.judge_in_run(spec, "colocated", cal, 2, rows, pts, bases)
    assert out["base_profile"] == "cpu-tiny-runtime-x1" and out["calibration_ratios"] == pytest.approx([1.2] * 4, rel=1e-3)
    assert pts[0]["in_run_predicted_s"] == pytest.approx(vp.predict(spec, "1C", 4, 0.1, one_alone, out["speed"]), rel=1e-3)
    # the engine-speed diagnosis reads each batch against the engine of its own layout
    assert [vp.engine_mode(spec, "colocated")(r).profile.name for r in ("1C", "2C", "")] == ["cpu-tiny-deployed-x1", "cpu-tiny-deployed-x2", "cpu-tiny-deployed-x2"]


def test_the_validation_refuses_to_calibrate_on_a_point_it_judges():
    proc = subprocess.run([sys.executable, "experiments/validate_predictor.py", "--batches", "4,8", "--env-scales", "1.0",
                           "--calibration-batches", "8", "--calibration-env-scales", "1.0"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "a calibration point is also a validated one: [(8, 1.0)]" in proc.stderr
    for script in ("validate_predictor.py", "calibrate_deployment.py"):  # no point at all is one clear error too, not an IndexError
        proc = subprocess.run([sys.executable, f"experiments/{script}", "--batches", ""], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr and "error:" in proc.stderr, proc.stderr


def test_the_calibration_refuses_a_number_of_runs_it_cannot_take():
    for runs in ("0", "21"):
        proc = subprocess.run([sys.executable, "experiments/calibrate_deployment.py", "--runs", runs], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr and "--runs 1-20" in proc.stderr and f", {runs}, " in proc.stderr, proc.stderr


@pytest.mark.parametrize(("value", "says"), [("../x", "a profile name of letters"), ("nosuch", "an existing profile JSON"), ("cpu-small", "cannot serve cpu-tiny-runtime-pd")])
def test_the_calibration_refuses_decode_terms_it_cannot_use(value, says):
    proc = subprocess.run([sys.executable, "experiments/calibrate_deployment.py", "--pd-decode-profile", value], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("calibrate_deployment: error:")]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and len(lines) == 1 and says in lines[0], proc.stderr


def test_a_calibration_run_on_a_contended_host_is_measured_again_and_then_refused(monkeypatch):
    sys.path.insert(0, str(ROOT / "experiments"))
    import calibrate_deployment as cd

    steals = iter([5.0, 0.3])
    monkeypatch.setattr(cd, "calibrate", lambda *a: ([{"run": a[-1], "steal_pct": (s := next(steals))}], [], s))
    batches, _, rejected = cd.quiet_run(None, "colocated", [(12, 0.5)], 2, (None, None, {}), 0, 1.0, 3)
    assert batches == [{"run": 0, "steal_pct": 0.3}] and rejected == [5.0]
    monkeypatch.setattr(cd, "calibrate", lambda *a: ([], [], None))  # no /proc/stat: nothing to judge the host by, the run counts
    assert cd.quiet_run(None, "colocated", [(12, 0.5)], 2, (None, None, {}), 1, 1.0, 3)[2] == []
    steals = iter([2.5, 3.0, 4.5])
    monkeypatch.setattr(cd, "calibrate", lambda *a: ([], [], next(steals)))
    with pytest.raises(SystemExit, match=r"disaggregated run 2: the hypervisor took 2.50%, 3.00%, 4.50% of the CPU time in 3 runs \(--max-steal-pct 1\)"):
        cd.quiet_run(None, "disaggregated", [(12, 0.5)], 2, (None, None, {}), 2, 1.0, 3)
    proc = subprocess.run([sys.executable, "experiments/calibrate_deployment.py", "--max-steal-pct", "101"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "--max-steal-pct 0-100" in proc.stderr, proc.stderr
