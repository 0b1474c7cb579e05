"""experiments/engine_timings.py's reading of `request` records: decode steps, concurrency and
time outside the engine from the engine's own timestamps, against the profile's terms."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "experiments"))
import engine_timings as et  # noqa: E402

from models.builder import build_models  # noqa: E402
from models.config import load_experiment  # noqa: E402


def _request(worker: str, phase: str, start: float, steps: int, step_s: float, in_flight: int = 1, actor_s: float | None = None) -> dict:
    first = start + 0.01
    last = first + step_s * (steps - 1)
    rec = {"record": "request", "worker": worker, "phase": phase, "engine_times": [start, start + 0.002, first, last, steps],
           "sent": start - 0.004, "back": last + 0.006, "prompt_tokens": 128, "in_flight": in_flight}
    return rec if actor_s is None else {**rec, "actor_s": actor_s}


@pytest.fixture(scope="module")
def engine():
    return build_models(load_experiment("configs/experiments/train-cpu-tiny.yaml")).predictor.colocated_engine


def test_concurrency_counts_the_requests_decoding_at_once():
    first = np.array([0.0, 0.0, 0.5])
    last = np.array([1.0, 1.0, 1.5])
    c = et.concurrency(first, last, samples=5)
    # sampled at 0, 1/4, 1/2, 3/4, 1 of each decode (ends included): the first two see 2, 2, 3, 3, 3;
    # the third 3, 3, 3, 1, 1
    assert c[0] == pytest.approx(2.6) and c[1] == pytest.approx(2.6)
    assert c[2] == pytest.approx(2.2)


def test_summarize_reads_steps_and_outside_time_and_prices_the_profile_at_the_concurrency_seen(engine):
    recs = [_request("a", "full", 0.0, 11, 0.02, in_flight=4) for _ in range(4)] + [_request("b", "full", 5.0, 11, 0.005)]
    rows = {r["worker"]: r for r in et.summarize(recs, engine)}
    a, b = rows["a"], rows["b"]
    assert a["requests"] == 4 and a["decode_step_ms"] == pytest.approx(20.0) and a["concurrency"] == pytest.approx(4.0)
    assert b["decode_step_ms"] == pytest.approx(5.0) and b["concurrency"] == pytest.approx(1.0)
    assert a["first_step_ms"] == pytest.approx(8.0) and a["outside_ms"] == pytest.approx(10.0)
    # the profile's step grows with the sequences decoding together; the error is the profile's against the measurement
    assert a["decode_profile_ms"] > b["decode_profile_ms"]
    assert a["decode_error_pct"] == pytest.approx((a["decode_profile_ms"] - 20.0) / 20.0 * 100, abs=0.1)
    assert a["outside_profile_ms"] == pytest.approx(float(engine.profile.outside_engine_s(4.0)) * 1000, abs=0.01)


def test_a_pd_profiles_outside_time_is_judged_per_turn_not_per_call(engine):
    recs = [_request("p", "prefill", 0.0, 1, 0.0), _request("d", "decode", 1.0, 9, 0.01)]
    rows = et.summarize(recs, engine, per_turn=True)
    assert all(r["outside_profile_ms"] is None for r in rows)
    assert "decode_step_ms" not in next(r for r in rows if r["phase"] == "prefill")  # one token: no decode step


def test_outside_time_splits_into_the_actors_part_and_the_driver_and_ray_part(engine):
    # engine 10 + 9 x 10 ms = 100 ms from queued to last token; the actor saw 103 ms around it,
    # so 3 of the call's 10 ms outside the engine were inside the actor, 7 between driver and actor
    rows = et.summarize([_request("a", "full", 0.0, 10, 0.01, actor_s=0.103) for _ in range(3)], engine)
    assert rows[0]["outside_ms"] == pytest.approx(10.0)
    assert rows[0]["outside_in_actor_ms"] == pytest.approx(3.0) and rows[0]["outside_driver_ray_ms"] == pytest.approx(7.0)
    # records without the actor's time (older logs) leave the split out rather than guess it
    old = et.summarize([_request("a", "full", 0.0, 10, 0.01)], engine)[0]
    assert old["outside_in_actor_ms"] is None and old["outside_driver_ray_ms"] is None


def test_validate_predictor_reads_each_batchs_engine_speed_from_its_own_requests(engine):
    import validate_predictor as vp

    slow = [{**_request("a", "full", 0.0, 11, 0.02, in_flight=2), "t": 0.5} for _ in range(2)]
    fast = [{**_request("a", "full", 5.0, 11, 0.003, in_flight=2), "t": 1.5} for _ in range(2)]
    ends = [{"record": "rollout_step", "step": 0, "t": 1.0}, {"record": "rollout_step", "step": 1, "t": 2.0}]
    errors = vp.batch_decode_errors(slow + fast + ends, lambda ratio: engine)
    # each batch is judged on its own calls only: 20 ms steps make the profile optimistic, 3 ms ones pessimistic
    assert set(errors) == {0, 1} and errors[0] < 0 < errors[1]
    assert errors[0] == pytest.approx(et.summarize(slow, engine)[0]["decode_error_pct"], abs=0.05)
    assert errors[1] == pytest.approx(et.summarize(fast, engine)[0]["decode_error_pct"], abs=0.05)
