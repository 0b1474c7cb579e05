"""The runtime tracker's speed refit: the first measured step replaces the profile's guess
with the speed at which the predictor gives that step's time for its layout, later steps move
it by an EMA; predictions then follow the deployment it measured."""

from __future__ import annotations

from dataclasses import replace

import pytest

from models.config import CONFIG_ROOT, load_experiment, profile_path
from models.step_latency import load_profile
from runtime.ray_runtime.telemetry import RuntimeTracker, StepTelemetry


def _tracker() -> RuntimeTracker:
    spec = load_experiment(CONFIG_ROOT / "experiments/train-cpu-tiny.yaml")
    return RuntimeTracker(spec, load_profile(profile_path(spec)))


def _step(tracker: RuntimeTracker, predicted_s: float, measured_s: float, step: int = 0) -> StepTelemetry:
    w = tracker.spec.workload  # the workload as configured: only the engine speed is off
    return StepTelemetry(step, w.trajectories_per_batch, w.turns.expected(), w.initial_prompt_tokens.expected(), w.new_tokens_per_turn.expected(),
                         w.response_tokens_per_turn.expected(), w.env_latency_s.expected(), 0, measured_s, predicted_s, "colocated", "2C", step)


def _with_ratio(step: StepTelemetry, ratio: str) -> StepTelemetry:
    return replace(step, ratio=ratio, mode="disaggregated" if "P" in ratio else "colocated")


def _colocated_s(tracker: RuntimeTracker) -> float:
    return tracker.models().predictor.colocated(2).completion_s


def test_first_measured_step_replaces_the_profile_speed() -> None:
    t = _tracker()
    before = _colocated_s(t)
    t.observe(_step(t, predicted_s=before, measured_s=before * 1.8))
    # the layout is now predicted at what it measured; the tool waits, which no engine speed
    # scales, make the engines' own slowdown larger than the batch's
    assert _colocated_s(t) == pytest.approx(before * 1.8, rel=2e-3)
    assert t.speed > 1.8 * 1.1


def test_later_steps_move_the_speed_by_an_ema_of_the_exact_speeds() -> None:
    t = _tracker()
    p0 = _colocated_s(t)
    t.observe(_step(t, p0, p0 * 2.0, 0))
    slow = t.speed
    p1 = _colocated_s(t)
    t.observe(_step(t, p1, p1, 1))  # step 1 predicted exactly: the speed was right
    assert t.speed == pytest.approx(slow, rel=1e-3)
    t.observe(_step(t, p1, p0, 2))  # as fast as the profile now: exact speed 1.0, EMA halfway
    assert t.speed == pytest.approx((slow + 1.0) / 2, rel=1e-2)


def test_a_layout_that_cannot_be_predicted_again_takes_the_ratio() -> None:
    """A mixed cluster (its layouts mix kinds the one predictor does not hold), a label that
    names no layout, or a re-prediction that misses the step's own (the models moved in
    between): the speed in use x measured / predicted."""
    spec = load_experiment(CONFIG_ROOT / "experiments/train-mixed-emulated.yaml")
    t = RuntimeTracker(spec, load_profile(profile_path(spec)))
    p0 = t.models().predictor.colocated(2).completion_s
    t.observe(_step(t, p0, p0 * 1.8))
    assert t.speed == pytest.approx(1.8)
    t = _tracker()
    p0 = _colocated_s(t)
    t.observe(replace(_step(t, p0, p0 * 1.8), ratio="H20 2C@TP4"))
    assert t.speed == pytest.approx(1.8)
    t = _tracker()
    t.observe(_step(t, p0 * 1.5, p0 * 1.8))
    assert t.speed == pytest.approx(1.2)


def test_a_pd_step_is_solved_on_the_pd_layout() -> None:
    t = _tracker()
    before = t.models().predictor.disaggregated(1, 1).completion_s
    t.observe(_with_ratio(_step(t, before, before * 0.7), "1P1D"))
    assert t.models().predictor.disaggregated(1, 1).completion_s == pytest.approx(before * 0.7, rel=2e-3)
    assert t.speed < 0.7


def test_prediction_record_reports_error_and_basis() -> None:
    """The summary row of a step (that it is out of sample is checked on a run: test_ray_emulated)."""
    t = _tracker()
    rec = _step(t, 2.0, 2.5, step=3).prediction()
    assert rec == {"step": 3, "predicted_s": 2.0, "measured_s": 2.5, "error_pct": -20.0, "fitted_on_steps": 3, "disrupted": None}


def test_a_disrupted_step_leaves_the_engine_speed_alone() -> None:
    """A batch that waited out an engine restart is not the engines' speed (the scenario's
    killed worker once made the planner predict 22 s for a 2 s batch); its token counts still
    refit the workload."""
    from runtime.ray_runtime.telemetry import disruption

    t = _tracker()
    p0 = _colocated_s(t)
    t.observe(_step(t, p0, p0 * 2.0, 0))
    speed = t.speed
    why = disruption(32, True)
    assert "32 resumed turns" in why and "waited" in why and disruption(0, False) == ""
    stalled = replace(_step(t, _colocated_s(t), 40.0, 1), disrupted=why, mean_turns=5.0)
    turns_before = t.spec.workload.turns.expected()
    t.observe(stalled)
    assert t.speed == speed
    assert t.spec.workload.turns.expected() != pytest.approx(turns_before)
    assert stalled.prediction()["disrupted"] == why


def _mixed_tracker() -> RuntimeTracker:
    spec = load_experiment(CONFIG_ROOT / "experiments/train-mixed-emulated.yaml")
    return RuntimeTracker(spec, load_profile(profile_path(spec)))


def _decode_step_s(tracker: RuntimeTracker, typ: str) -> float:
    return float(tracker.models().engines()[("colocated", typ, 4)].decode_time(32, 2000))


def test_per_type_speeds_follow_each_types_requests_relative_to_the_batch():
    """A mixed cluster's types are profiled apart (H20 and A100 datasheet-derived): a batch whose
    H20 requests took twice what their model says, and the H800's as predicted, makes the H20
    twice as slow as the H800 relative to before; the pooled level stays the batch fit's."""
    t = _mixed_tracker()
    before = _decode_step_s(t, "H20") / _decode_step_s(t, "H800")
    home = float(t.models().predictor.colocated_engine.decode_time(32, 2000))  # H800: the rollout type's own predictor
    t.refit_type_speeds((("H20", 40, 200.0, 100.0), ("H800", 160, 400.0, 400.0)))
    assert t.type_speeds["H20"] / t.type_speeds["H800"] == pytest.approx(2.0)
    assert _decode_step_s(t, "H20") / _decode_step_s(t, "H800") == pytest.approx(2.0 * before)
    assert float(t.models().predictor.colocated_engine.decode_time(32, 2000)) == pytest.approx(home * t.type_speeds["H800"])
    # the predicted-seconds-weighted mean of the first speeds is 1: the level is not moved
    assert (100 * t.type_speeds["H20"] + 400 * t.type_speeds["H800"]) / 500 == pytest.approx(1.0)
    # a later batch that ran as the refitted models said leaves them; one whose H20 requests
    # took half their prediction moves each type halfway to its exact speed (EMA, alpha 0.5)
    first = dict(t.type_speeds)
    t.refit_type_speeds((("H20", 40, 100.0, 100.0), ("H800", 160, 400.0, 400.0)))
    assert t.type_speeds == pytest.approx(first)
    t.refit_type_speeds((("H20", 40, 50.0, 100.0), ("H800", 160, 400.0, 400.0)))
    pooled = 450.0 / 500.0
    assert t.type_speeds["H20"] == pytest.approx(first["H20"] * (0.5 + 0.5 * 0.5 / pooled))
    assert t.type_speeds["H800"] == pytest.approx(first["H800"] * (0.5 + 0.5 / pooled))


def test_a_batch_of_one_type_or_few_requests_leaves_type_speeds_alone():
    t = _mixed_tracker()
    t.refit_type_speeds((("H800", 200, 800.0, 400.0),))  # one type: only the batch fit can say
    t.refit_type_speeds((("H20", 5, 50.0, 10.0), ("H800", 200, 400.0, 400.0)))  # 5 requests say too little
    assert t.type_speeds == {}
    # through observe: a disrupted step says nothing either
    p0 = t.models().predictor.colocated(2).completion_s
    rows = (("H20", 40, 200.0, 100.0), ("H800", 160, 400.0, 400.0))
    t.observe(replace(_step(t, p0, p0), type_seconds=rows, disrupted="2 resumed turns"))
    assert t.type_speeds == {}
    t.observe(replace(_step(t, p0, p0), type_seconds=rows))
    assert t.type_speeds["H20"] / t.type_speeds["H800"] == pytest.approx(2.0)


def test_refit_types_false_keeps_one_speed_for_all_types():
    t = _mixed_tracker()
    t.spec = t.spec.model_copy(update={"runtime": t.spec.runtime.model_copy(update={"refit_types": False})})
    p0 = t.models().predictor.colocated(2).completion_s
    t.observe(replace(_step(t, p0, p0 * 1.5), type_seconds=(("H20", 40, 200.0, 100.0), ("H800", 160, 400.0, 400.0))))
    assert t.type_speeds == {} and t.speed == pytest.approx(1.5)
