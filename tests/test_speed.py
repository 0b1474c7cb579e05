"""`models.speed.solve_speed`: the engine speed at which a prediction meets a measurement, which the
runtime tracker refits with and the deployment calibration reports per batch."""

from __future__ import annotations

import pytest

from models.builder import build_models
from models.config import load_experiment
from models.speed import solve_speed


def test_the_speed_scales_the_engine_part_of_a_batch_and_not_its_tool_waits():
    # 1 s of tool waits and 0.5 s of engine time at speed 1: 1.75 s measured is speed 1.5,
    # where the ratio (1.75 / 1.5 = 1.17) would still predict 1.58 s
    predict = lambda s: 1.0 + 0.5 * s  # noqa: E731
    assert solve_speed(predict, 1.75, 1.0, predict(1.0)) == pytest.approx(1.5, rel=1e-3)
    assert solve_speed(predict, 1.2, 1.0, predict(1.0)) == pytest.approx(0.4, rel=1e-3)
    # from another speed in use, the same answer
    assert solve_speed(predict, 1.75, 3.0, predict(3.0)) == pytest.approx(1.5, rel=1e-3)


def test_a_prediction_that_is_not_there_leaves_the_ratio():
    assert solve_speed(lambda s: None, 3.0, 1.0, 2.0) == pytest.approx(1.5)


def test_a_step_steeper_than_4x_is_taken_in_bounded_steps():
    # 10 s of tool waits and 1 s of engine time measured at 30 s: speed 20, reached in steps of at most 4x
    predict = lambda s: 10.0 + s  # noqa: E731
    assert solve_speed(predict, 30.0, 1.0, predict(1.0)) == pytest.approx(20.0, rel=1e-3)
    assert solve_speed(predict, 30.0, 1.0, predict(1.0), max_predictions=1) == pytest.approx(4 * 30.0 / 11.0, rel=1e-6)


def test_the_solved_speed_reproduces_a_real_predictors_measurement():
    spec = load_experiment("configs/experiments/train-cpu-tiny.yaml")

    def completion(speed: float) -> float:
        return build_models(spec, speed=speed).predictor.colocated(1).completion_s

    measured = 1.3 * completion(1.0)
    speed = solve_speed(completion, measured, 1.0, completion(1.0))
    assert completion(speed) == pytest.approx(measured, rel=1e-3) and speed > 1.3
