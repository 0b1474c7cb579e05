"""The FSDP2 trainer (two gloo ranks on CPU) computes the single-process Trainer's update, step by step."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import yaml

from models.config import ConfigError, load_experiment
from runtime.ray_runtime.fsdp_trainer import FSDPTrainer, validate_world_size
from runtime.ray_runtime.trainer import TrainSample, Trainer

TINY = Path(__file__).resolve().parent.parent / "artifacts" / "models" / "tiny"
LR = 1e-3
ATOL = 1e-5  # first step: the two differ only in the order fp32 gradients are summed
# Later steps start from weights that already differ by ~1e-6, and Adam scales any element whose
# gradient is near its eps (1e-8) up to ~lr, so a handful of elements may differ by a fraction
# of one step (measured: 4 of 754,816 weights above 1e-6, the largest 2.7e-5 with lr 1e-3).
# Bound that fraction of a step, and bound how many weights may differ at all; a real error
# (wrong normaliser, mean instead of sum) moves thousands of weights by up to lr.
LATER_ATOL = 0.1 * LR
OFF_SHARE = 1e-4  # of all weights, those allowed to differ by more than 1e-6


def make_batch(model: Any, rng: np.random.Generator, n: int, group_of: int, version: int) -> list[TrainSample]:
    """Trajectories of random vocab tokens; behaviour log-probs = the model's own, perturbed, so ratios vary and some clip."""
    import torch

    vocab = model.config.vocab_size
    out = []
    for i in range(n):
        length, prompt = int(rng.integers(20, 48)), int(rng.integers(6, 16))
        ids = [int(x) for x in rng.integers(4, vocab, length)]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
            lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0][prompt - 1 :]
        noisy = lp.numpy() + rng.normal(0.0, 0.3, lp.numel())
        mask = [0] * prompt + [1] * (length - prompt)
        out.append(TrainSample(f"v{version}-{i}", i // group_of, tuple(ids), tuple(mask), tuple(float(x) for x in noisy), float(rng.random()), version))
    return out


@dataclass(frozen=True)
class StepPair:
    """One step of both trainers on the same batch."""

    name: str
    single: dict[str, float]
    sharded: dict[str, float]
    single_weights: dict[str, Any]
    sharded_weights: dict[str, Any]


@dataclass(frozen=True)
class Run:
    initial_single: dict[str, Any]
    initial_sharded: dict[str, Any]
    steps: tuple[StepPair, ...]
    versions: tuple[int, ...]


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    """Three steps: 5 fresh + 1 stale (ranks train 3 / 2 samples: rank 1 runs a padding pass), 3 fresh (2 / 1), all stale (no update)."""
    import safetensors.torch

    single = Trainer(str(TINY), lr=LR, staleness=1, seed=0)
    sharded = FSDPTrainer(str(TINY), lr=LR, staleness=1, seed=0, world_size=2)
    try:
        rng = np.random.default_rng(7)
        batches = {
            "uneven": (make_batch(single.model, rng, 5, 3, 0) + make_batch(single.model, rng, 1, 1, -4), 0),
            "padded": (make_batch(single.model, rng, 3, 2, 1), 1),
            "all stale": (make_batch(single.model, rng, 2, 2, 0), 5),
        }
        initial = (safetensors.torch.load(single.weights()), safetensors.torch.load(sharded.weights()))
        steps, versions = [], []
        for name, (samples, rollout_version) in batches.items():
            m1, w1 = single.train_step(samples, rollout_version)
            m2, w2 = sharded.train_step(samples, rollout_version)
            steps.append(StepPair(name, m1, m2, safetensors.torch.load(w1), safetensors.torch.load(w2)))
            versions.append(sharded.get_version())
        yield Run(initial[0], initial[1], tuple(steps), tuple(versions))
    finally:
        sharded.close()


def max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_initial_weights_are_the_gathered_full_model(run: Run) -> None:
    assert max_diff(run.initial_single, run.initial_sharded) == 0.0
    assert all(run.initial_sharded[k].shape == run.initial_single[k].shape for k in run.initial_single)


def share_off(a: dict[str, Any], b: dict[str, Any], tol: float = 1e-6) -> float:
    """Share of all weights on which a and b differ by more than tol."""
    off = sum(int(((a[k] - b[k]).abs() > tol).sum()) for k in a)
    return off / sum(a[k].numel() for k in a)


def test_two_gloo_ranks_compute_the_single_process_update(run: Run) -> None:
    first, second, _ = run.steps
    assert max_diff(first.single_weights, first.sharded_weights) <= ATOL
    assert max_diff(second.single_weights, second.sharded_weights) <= LATER_ATOL
    for step in (first, second):
        assert share_off(step.single_weights, step.sharded_weights) <= OFF_SHARE, step.name
    # the weights really moved (Adam's first step moves a touched weight by ~lr), so the match is not vacuous
    assert max_diff(first.sharded_weights, run.initial_sharded) > 100 * ATOL
    assert max_diff(second.sharded_weights, first.sharded_weights) > 100 * ATOL
    for step in (first, second):
        s, f = step.single, step.sharded
        for key in ("samples", "dropped_stale", "mean_reward", "max_staleness", "trained_tokens", "action_tokens", "clipped_tokens"):
            assert f[key] == s[key], (step.name, key)
        for key in ("loss", "ratio_mean", "ratio_max_abs_log"):
            assert f[key] == pytest.approx(s[key], rel=1e-5, abs=1e-7), (step.name, key)
        assert f["world_size"] == 2.0
    assert first.sharded["dropped_stale"] == 1.0 and first.sharded["samples"] == 5.0
    assert first.sharded["clipped_tokens"] > 0 and abs(first.sharded["ratio_mean"] - 1.0) > 1e-3  # off-policy path exercised


def test_all_stale_batch_keeps_weights_and_advances_version(run: Run) -> None:
    stale = run.steps[2]
    assert stale.sharded["samples"] == 0.0 and stale.sharded["dropped_stale"] == 2.0
    assert max_diff(stale.sharded_weights, run.steps[1].sharded_weights) == 0.0
    assert max_diff(stale.single_weights, stale.sharded_weights) <= LATER_ATOL


def test_version_advances_on_every_step(run: Run) -> None:
    assert run.versions == (1, 2, 3)
    assert [step.sharded["version"] for step in run.steps] == [1.0, 2.0, 3.0]
    assert [step.single["version"] for step in run.steps] == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_bad_world_size_is_one_clear_error(bad: Any) -> None:
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        FSDPTrainer(str(TINY), world_size=bad)


def test_world_size_beyond_the_cuda_devices_is_refused() -> None:
    with pytest.raises(ValueError, match="exceeds the 2 visible CUDA devices"):
        validate_world_size(4, cuda_devices=2)
    assert validate_world_size(4, cuda_devices=0) == 4  # CPU: gloo ranks are processes, not devices


def test_a_failing_rank_raises_instead_of_hanging(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"fsdp trainer rank \d failed"):
        FSDPTrainer(str(tmp_path), world_size=2)  # a directory with no model in it


def _experiment(config_tree: Path, runtime: dict[str, Any]) -> Path:
    path = config_tree / "experiments" / "train-cpu-tiny.yaml"
    data = yaml.safe_load(path.read_text())
    data["runtime"].update(runtime)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("runtime", "value", "allowed"),
    [
        ({"trainer_backend": "torch", "trainer_world_size": 2}, "2", "1 unless trainer_backend is fsdp"),
        ({"trainer_world_size": 2}, "2", "1 unless trainer_backend is fsdp"),
        ({"trainer_backend": "fsdp", "trainer_world_size": 0}, "0", "greater than 0"),
    ],
)
def test_bad_world_size_in_config_names_the_field(config_tree: Path, runtime: dict[str, Any], value: str, allowed: str) -> None:
    path = _experiment(config_tree, runtime)
    with pytest.raises(ConfigError) as err:
        load_experiment(path)
    assert err.value.field == "runtime.trainer_world_size" and str(err.value.value) == value and allowed in err.value.allowed
    assert str(path) in str(err.value)


def test_fsdp_config_loads(config_tree: Path) -> None:
    spec = load_experiment(_experiment(config_tree, {"trainer_backend": "fsdp", "trainer_world_size": 2}))
    assert spec.runtime.trainer_backend == "fsdp" and spec.runtime.trainer_world_size == 2
