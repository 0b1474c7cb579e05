"""The batch's last finisher when tool waits vary: the latest of its trajectories, not the mean one.

The turn-indexed predictor (models/predictor.py) follows the trajectory with the most turns at
the mean tool wait. With waits that vary (lognormal, cv 1, in the shipped workloads) the batch
ends with whichever trajectory drew the longest waits over its turns, often one with a few
turns fewer: 17-25% after the prediction on the mixed-cluster workload (README, "The tool
waits' tail", where experiments/wait_tail.py measures both). Two effects, computed here per
candidate row:

  latest finish   trajectory i with n_i turns finishes at D(n_i) + W_i: D the turn-indexed
                  engine part of its first n_i turns, W_i the sum of its n_i waits
                  (lognormal with the sum's mean and variance, Fenton-Wilkinson, as
                  `predictor._turn_counts` approximates a sum of token sizes). The batch ends at
                  E[max_i], from P(max <= x) = prod_n F_n(x - D(n))^(c_n) over the c_n
                  trajectories with n turns, on a grid;
  lighter load    the trajectory that finishes last is behind the turn-indexed schedule, by
                  its waits' excess over the mean, and so meets fewer trajectories still running
                  at each of its turns (`active_behind`). Alone, the first effect over-predicts
                  large batches by 4.5-6.9% (prototype against experiments/predictor_vs_sim.py).

Only tool waits spread here; response lengths keep their mean (their spread is in the
arrival window of the predictor's fixed point)."""

from __future__ import annotations

import math

import numpy as np

GRID = 64  # within 0.1 s of 256 points and of a 2,000-draw Monte Carlo (batches of 64-1,024, calibrated workload)
TAIL_Z = 5.3  # P(Z > 5.3) ~ 6e-8
SPAN_SD = (1.0, 12.0)  # the grid, in standard deviations of the longest trajectory's waits: below / above the mean finish


def waits_spread(turns: int, env_mean_s: float, env_var_s2: float) -> bool:
    """Whether the waits vary enough to matter: their spread over the longest trajectory at least
    a millisecond and a millionth of its mean waits (quadrature leaves ~1e-190 s^2 on a constant)."""
    spread = math.sqrt(max(turns * env_var_s2, 0.0))
    return turns > 0 and env_mean_s > 0.0 and spread >= max(1e-3, 1e-6 * turns * env_mean_s)


def latest_finish(turn_s: np.ndarray, active: np.ndarray, env_mean_s: float, env_var_s2: float) -> tuple[np.ndarray, np.ndarray]:
    """Per row of turn_s (rows: candidates, columns: turns, each with the mean wait inside):
    the expected latest finish (s, never below the turn-indexed sum) and the last finisher's
    wait excess per turn (s: how far behind the schedule it falls each turn).

    `active[k]` holds the trajectories with more than k turns (BatchShape.active)."""
    from scipy.special import log_ndtr  # here: every pearl command imports the predictor

    t = np.atleast_2d(np.asarray(turn_s, dtype=float))
    plain = t.sum(axis=1)
    finite = np.isfinite(plain)
    if not waits_spread(t.shape[1], env_mean_s, env_var_s2) or not finite.any():
        return plain, np.zeros_like(plain)
    t = np.where(finite[:, None], t, 0.0)
    # rows whose turns match (instance counts past the batch's size all run one trajectory each) are priced once
    t, rows = np.unique(t, axis=0, return_inverse=True)
    rows = rows.reshape(-1)
    exact = active - np.concatenate([active[1:], [0.0]])  # trajectories with exactly k + 1 turns
    ns = np.flatnonzero(exact > 0.5) + 1
    engine = np.cumsum(t - env_mean_s, axis=1)[:, ns - 1]  # (rows, counts)
    mean_w, var_w = ns * env_mean_s, ns * env_var_s2
    s2 = np.log1p(var_w / mean_w**2)
    mu, sd = np.log(mean_w) - s2 / 2.0, np.sqrt(s2)
    base = engine + mean_w
    spread = np.sqrt(t.shape[1] * env_var_s2)
    lo = base.max(axis=1) - SPAN_SD[0] * spread
    # counts that finish before the grid starts even at a 1-in-10^7 wait sum cannot be last (F_n = 1 there)
    late = (engine + np.exp(mu + TAIL_Z * sd) > lo[:, None]).any(axis=0)
    ns, engine, base, mu, sd = ns[late], engine[:, late], base[:, late], mu[late], sd[late]
    count = exact[ns - 1]
    width = (SPAN_SD[0] + SPAN_SD[1]) * spread
    x = lo[:, None] + width * np.linspace(0.0, 1.0, GRID)[None, :]
    y = x[:, :, None] - engine[:, None, :]  # each count's wait that finishes by x
    above = y > 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (np.log(np.where(above, y, 1.0)) - mu) / sd
        log_f = np.where(above, log_ndtr(z), -np.inf)  # log P(W_n <= y)
        log_cdf = (count * log_f).sum(axis=2)  # log P(max <= x)
        # the density of the max coming from a trajectory with n turns: c_n f_n(y) F(x) / F_n(y)
        pdf_n = np.where(above, np.exp(-0.5 * z * z) / (np.sqrt(2.0 * np.pi) * sd * np.where(above, y, 1.0)), 0.0)
        wins = np.nan_to_num(count * pdf_n * np.exp(log_cdf[:, :, None] - log_f))
    dx = width / (GRID - 1)
    latest = lo + _trapezoid(1.0 - np.exp(log_cdf), dx)
    p = _trapezoid(wins, dx)
    p = p / np.maximum(p.sum(axis=1, keepdims=True), 1e-300)
    excess = np.maximum(latest - (p * base).sum(axis=1), 0.0) / np.maximum((p * ns).sum(axis=1), 1.0)
    latest, excess = latest[rows], excess[rows]
    latest = np.where(finite, np.maximum(latest, plain), plain)
    return latest, np.where(finite, excess, 0.0)


def _trapezoid(y: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """The trapezoid rule along axis 1 with per-row spacing (np.trapezoid is numpy >= 2 only)."""
    d = dx.reshape(dx.shape + (1,) * (y.ndim - 2))
    return d * (y.sum(axis=1) - 0.5 * (y[:, 0] + y[:, -1]))


def active_behind(schedule_s: np.ndarray, turn_s: np.ndarray, active: np.ndarray, excess_s: np.ndarray) -> np.ndarray:
    """(rows, turns) trajectories still running when the last finisher starts each turn.

    It starts turn k at its own turn times' sum plus k excesses; the batch, on the turn-indexed
    schedule (`schedule_s`: per row, when each turn starts), has by then left the turns that
    start before that moment, so the last finisher meets the trajectories of the latest of them."""
    t = np.atleast_2d(turn_s)
    k = np.arange(t.shape[1])
    start = np.cumsum(t, axis=1) - t + excess_s[:, None] * k[None, :]
    j = (np.atleast_2d(schedule_s)[:, None, :] <= start[:, :, None]).sum(axis=2) - 1
    return active[np.clip(j, 0, t.shape[1] - 1)]
