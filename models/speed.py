"""The engine speed at which a prediction meets a measurement.

A profile is scaled by one speed (`EngineProfile.scaled`) when a deployment runs its engines
slower or faster than they were profiled. The runtime tracker refits it after every step and
needs the speed that makes the predictor give what the step measured; the deployment
calibration writes the same per batch beside its ratios (a diagnosis: why its own speed stays
the ratio is in `runtime.profiling_inplace.deployment_speed`). The batch's measured /
predicted is not that speed: a batch's time also holds its tool waits, which no engine speed
scales, so that ratio corrects only part of an error (a one-engine step predicted at 1.98 s and measured at 1.49 s, scaled by
the ratio, was predicted again at 1.72 s). The predicted completion rises with the speed, so
a secant from a known prediction finds it in a few predictions. Written once here so that
the tracker and the calibration's diagnosis cannot solve it two ways.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

SPEED_RANGE = (1e-3, 1e6)


def solve_speed(predict_at: Callable[[float], float | None], measured_s: float, speed: float, predicted_s: float,
                rel_tol: float = 1e-3, max_predictions: int = 8) -> float:
    """The speed at which `predict_at(speed)` gives `measured_s`, starting from `speed`, whose
    prediction is `predicted_s`. The first guess is the ratio, speed x measured / predicted;
    each secant step stays within 4x of the last. Where a prediction is not available (None)
    or stops moving, the last guess is the answer."""
    s0, p0 = speed, predicted_s
    s1 = float(np.clip(speed * measured_s / predicted_s, *SPEED_RANGE))
    for _ in range(max_predictions):
        p1 = predict_at(s1)
        if p1 is None or abs(p1 - measured_s) <= rel_tol * measured_s or p1 == p0:
            break
        step = s1 + (measured_s - p1) * (s1 - s0) / (p1 - p0)
        s0, p0, s1 = s1, p1, float(np.clip(step, max(s1 / 4, SPEED_RANGE[0]), min(s1 * 4, SPEED_RANGE[1])))
    return s1
