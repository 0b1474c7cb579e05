"""The learning tests' parts that need no engine: the flipped-advantage control, the per-step
rows of `pearl train --json`, and the reward plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runtime.ray_runtime.trainer import TrainSample, select_batch
from runtime.ray_runtime.trainer_loop import step_detail


def _sample(i: int, group: int, reward: float) -> TrainSample:
    return TrainSample(f"t{i}", group, (1, 2, 3, 4), (0, 0, 1, 1), (0.0, 0.0, -1.0, -1.0), reward, 0, 0)


def test_flipped_advantage_is_the_exact_negative() -> None:
    samples = [_sample(i, i // 2, float(i % 2)) for i in range(6)]
    plain, _ = select_batch(samples, 0, 1)
    flipped, _ = select_batch(samples, 0, 1, advantage_sign=-1.0)
    assert np.any(np.abs(plain.advantages) > 0.5)
    assert np.allclose(flipped.advantages, -np.asarray(plain.advantages))


def test_step_detail_keeps_what_a_user_plots() -> None:
    row = {"step": 3, "weight_version": 4, "mean_reward": 0.61234567, "train_loss": 0.05, "train_ratio_mean": 1.01, "rollout_s": 2.5,
           "tok_per_s": 400.0, "mode": "disaggregated", "ratio": "1P1D", "kinds": "H800 1P@TP1 1D@TP1", "gen_tokens": 3000, "pred_error": 0.1}
    d = step_detail(row)
    assert d == {"step": 3, "weight_version": 4, "mean_reward": 0.612346, "loss": 0.05, "importance_ratio": 1.01, "rollout_s": 2.5,
                 "tok_per_s": 400.0, "mode": "disaggregated", "ratio": "1P1D", "kinds": "H800 1P@TP1 1D@TP1"}
    # an emulated trainer reports no loss: the row says so instead of failing
    assert step_detail({**row, "train_loss": None})["loss"] is None


def test_reward_plot_is_written(tmp_path: Path) -> None:
    from runtime.learning_plot import plot_steps

    steps = [{"step": i, "mean_reward": 0.5 + 0.03 * i, "tok_per_s": 300.0 + i, "mode": "colocated" if i < 3 else "disaggregated"} for i in range(6)]
    out = tmp_path / "learn.png"
    plot_steps(steps, out, "test")
    assert out.stat().st_size > 10_000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_flag_with_a_bad_extension_is_one_clear_error() -> None:
    from conftest import run_pearl

    proc = run_pearl("train", "--config", "configs/experiments/train-cpu-learn.yaml", "--backend", "emulated", "--plot", "curve.xyz")
    assert proc.returncode == 2 and "--plot" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().count("\n") == 0


def test_an_unknown_control_is_refused_with_the_field_named(tmp_path: Path) -> None:
    from models.config import ConfigError, load_experiment

    text = Path("configs/experiments/train-cpu-learn.yaml").read_text().replace("  task: synthetic", "  task: synthetic\n  control: sabotage")
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_experiment(cfg)
    assert "runtime.control" in str(e.value) and "frozen_engines" in str(e.value), str(e.value)
    assert load_experiment("configs/experiments/train-cpu-learn.yaml").runtime.control == "none"


def test_a_worker_lost_while_the_trainer_scores_the_probe_is_skipped_not_fatal() -> None:
    """The weights check awaits the trainer's probe first; a node loss meanwhile drops a worker's
    actor (a fresh clone's multinode run died of `None.probe_logprobs`). The lost worker is
    left for its next start's check; the others are still compared."""
    import asyncio
    from types import SimpleNamespace

    from runtime.ray_runtime.trainer_loop import TrainerLoop

    probe = [-1.0, -2.0]

    class Remote:
        def __init__(self, fn):
            self.remote = fn

    class Engine:
        def __init__(self) -> None:
            async def answer(slot, tokens):
                return probe
            self.probe_logprobs = Remote(answer)

    lost = SimpleNamespace(actor=Engine(), slot_no=0, worker_id="w:lost")
    kept = SimpleNamespace(actor=Engine(), slot_no=0, worker_id="w:kept")

    async def trainer_probe(version):
        lost.actor = None  # the node leaves while the trainer works
        return probe

    written = []
    loop = TrainerLoop()
    loop.trainer = SimpleNamespace(probe_logprobs=Remote(trainer_probe))
    loop.metrics = SimpleNamespace(write=lambda record, **kw: written.append((record, kw)))
    loop.weights_verified = loop.weights_mismatched = 0
    loop.log = print
    asyncio.run(loop._verify_weights([lost, kept], 3, "push"))
    [(record, check)] = written
    assert record == "weights_check" and check["engines"] == 2 and check["compared"] == 1 and check["mismatched"] == []
    assert loop.weights_verified == 1 and loop.weights_mismatched == 0
