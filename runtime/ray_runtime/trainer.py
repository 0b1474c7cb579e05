"""Trainer: a GRPO policy-gradient step in torch, and the weights it ships to rollout.

Advantages are group-relative: trajectories of one group answered the same question, so
A_i = (R_i - mean_group) / (std_group + eps). Rollout is asynchronous, so a trajectory may
have been generated (even partly) by older weights than the ones being trained: every
generated token carries the behaviour log-probability it was sampled with, and the loss
uses the clipped importance ratio exp(logp_now - logp_behaviour) (PPO-style), which is the
off-policy correction for stale trajectories. Trajectories older than the staleness bound
are dropped and counted.

Two real backends share this module's batch selection, per-sample loss and metrics, so
they compute the same update: `Trainer` (backend 'torch': the full model, Adam, one
process) and `runtime.ray_runtime.fsdp_trainer.FSDPTrainer` (backend 'fsdp': FSDP2
`fully_shard` over a process group of `trainer_world_size` ranks, gloo on CPU and NCCL on
CUDA, rank 0 gathering the full state dict for the weight blob). Both keep the interface
the controller uses: `weights()`, `train_step()`, `get_version()`. The FSDP path is tested
on CPU (two gloo ranks match the single-process update); a multi-GPU NCCL run has not
been done (no GPU here).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.ray_runtime.ray_nodes import OnANode


@dataclass(frozen=True)
class TrainSample:
    """One finished trajectory as the trainer needs it."""

    traj_id: str
    group: int
    tokens: tuple[int, ...]  # whole context: prompt, responses, observations
    action_mask: tuple[int, ...]  # 1 where the policy generated the token
    behaviour_logprobs: tuple[float, ...]  # one per action token, in order
    reward: float
    min_version: int  # oldest weight version that generated any of its tokens
    max_version: int = -1  # newest one (-1: the same as min_version)

    def generated_at(self, version: int) -> bool:
        """Every token came from weights `version`: its importance ratio must be 1."""
        return self.min_version == version and self.max_version in (-1, version)


@dataclass(frozen=True)
class Batch:
    """What trains in one step; every FSDP rank derives the same one, so they agree on the normaliser."""

    fresh: tuple[TrainSample, ...]
    advantages: tuple[float, ...]
    action_tokens: int  # the loss divides by this global count, whichever rank holds a sample
    version: int = -1  # the weights being trained (the rollout version the batch was selected at)


@dataclass(frozen=True)
class LossStats:
    """Sums over the samples one process trained; merged across ranks before becoming metrics."""

    loss: float = 0.0
    ratio_sum: float = 0.0
    ratio_count: int = 0
    max_abs_log_ratio: float = 0.0
    clipped: int = 0
    on_policy_ratio_sum: float = 0.0  # tokens of samples generated entirely at the trained weights
    on_policy_ratio_count: int = 0

    def merge(self, other: LossStats) -> LossStats:
        return LossStats(
            self.loss + other.loss,
            self.ratio_sum + other.ratio_sum,
            self.ratio_count + other.ratio_count,
            max(self.max_abs_log_ratio, other.max_abs_log_ratio),
            self.clipped + other.clipped,
            self.on_policy_ratio_sum + other.on_policy_ratio_sum,
            self.on_policy_ratio_count + other.on_policy_ratio_count,
        )

    def metrics(self) -> dict[str, float]:
        out = {
            "loss": self.loss,
            "ratio_mean": self.ratio_sum / self.ratio_count if self.ratio_count else 1.0,
            "ratio_max_abs_log": self.max_abs_log_ratio,
            "clipped_tokens": float(self.clipped),
            "on_policy_tokens": float(self.on_policy_ratio_count),
        }
        if self.on_policy_ratio_count:  # behaviour = trained weights: any gap from 1 is a sync or log-prob bug
            out["ratio_mean_on_policy"] = self.on_policy_ratio_sum / self.on_policy_ratio_count
        return out


def group_advantages(rewards: np.ndarray, groups: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """GRPO: standardise rewards within each group (a group with equal rewards gets zeros)."""
    adv = np.zeros_like(rewards, dtype=float)
    for g in np.unique(groups):
        idx = groups == g
        r = rewards[idx]
        adv[idx] = (r - r.mean()) / (r.std() + eps) if r.std() > 0 else 0.0
    return adv


def select_batch(samples: list[TrainSample], rollout_version: int, staleness: int, advantage_sign: float = 1.0) -> tuple[Batch, dict[str, float]]:
    """Drop trajectories past the staleness bound, compute advantages; also the batch's metrics.
    `advantage_sign` -1 is the learning tests' negative control (runtime.control flipped_advantage)."""
    fresh = tuple(s for s in samples if rollout_version - s.min_version <= staleness)
    rewards = np.array([s.reward for s in fresh], dtype=float)
    adv = advantage_sign * group_advantages(rewards, np.array([s.group for s in fresh]))
    batch = Batch(fresh, tuple(float(a) for a in adv), sum(sum(s.action_mask) for s in fresh), rollout_version)
    metrics = {
        "dropped_stale": float(len(samples) - len(fresh)),
        "samples": float(len(fresh)),
        "mean_reward": float(rewards.mean()) if fresh else 0.0,
        "max_staleness": float(max((rollout_version - s.min_version for s in samples), default=0)),
        "trained_tokens": float(sum(len(s.tokens) for s in fresh)),
    }
    return batch, metrics


def sample_loss(model: Any, sample: TrainSample, advantage: float, clip_eps: float, action_tokens: int, version: int = -1) -> tuple[Any, LossStats]:
    """Clipped-ratio GRPO loss of one trajectory, already divided by the batch's action tokens.

    Returns the loss tensor (the caller calls backward, so FSDP can choose when to sync) and
    its statistics.
    """
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([sample.tokens], device=device)
    mask = torch.tensor(sample.action_mask[1:], dtype=torch.bool, device=device)
    logits = model(input_ids=ids).logits[0, :-1]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(1, ids[0, 1:, None])[:, 0][mask]
    old = torch.tensor(sample.behaviour_logprobs[: int(mask.sum())], dtype=torch.float32, device=device)
    if old.numel() != logp.numel():
        logp = logp[: old.numel()]
    ratio = torch.exp(logp - old)
    unclipped = ratio * advantage
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantage
    loss = -torch.minimum(unclipped, clipped).sum() / max(action_tokens, 1)
    r = ratio.detach()
    on_policy = sample.generated_at(version)
    stats = LossStats(
        float(loss.detach()),
        float(r.sum()),
        int(r.numel()),
        float(r.log().abs().max()) if r.numel() else 0.0,
        int(((r - 1).abs() > clip_eps).sum()),
        float(r.sum()) if on_policy else 0.0,
        int(r.numel()) if on_policy else 0,
    )
    return loss, stats


def tensors_blob(tensors: dict[str, Any]) -> bytes:
    """safetensors bytes: the weight-sync format rollout workers load."""
    import safetensors.torch

    return safetensors.torch.save({k: v.detach().contiguous() for k, v in tensors.items()})


def state_blob(model: Any) -> bytes:
    return tensors_blob(model.state_dict())


class Trainer(OnANode):
    """Ray actor (or plain object). backend 'torch' trains for real; 'emulated' sleeps the training-time model."""

    def __init__(self, model_path: str | None, lr: float = 1e-3, clip_eps: float = 0.2, staleness: int = 1, seed: int = 0, threads: int = 1, backend: str = "torch", emulated_step_s: float = 1.0, time_scale: float = 1.0, advantage_sign: float = 1.0) -> None:
        self.backend = backend
        self.advantage_sign = advantage_sign
        self.version = 0
        self.staleness = staleness
        self.clip = clip_eps
        self.emulated_step_s, self.scale = emulated_step_s, time_scale
        self.model: Any = None
        self._probes: dict[int, tuple[float, ...]] = {}  # weights version -> probe log-probs
        if backend == "torch":
            import torch
            from transformers import AutoModelForCausalLM

            torch.manual_seed(seed)
            torch.set_num_threads(threads)
            if model_path is None:
                raise ValueError("the torch trainer needs a model path")
            self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
            self.model.train()
            self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)

    def weights(self) -> bytes:
        from runtime.ray_runtime.weight_sync import EMULATED_WEIGHTS

        return state_blob(self.model) if self.model is not None else EMULATED_WEIGHTS

    def train_step(self, samples: list[TrainSample], rollout_version: int) -> tuple[dict[str, float], bytes]:
        """One update on a rollout batch; returns (metrics, new weights as safetensors bytes)."""
        t0 = time.perf_counter()
        batch, metrics = select_batch(samples, rollout_version, self.staleness, self.advantage_sign)
        if self.model is not None:
            self.probe_logprobs(self.version)  # the weights about to change: engines may still hold them when asked
        if self.backend == "emulated":
            time.sleep(self.emulated_step_s / self.scale)
            self.version += 1
            metrics.update(version=float(self.version), train_s=time.perf_counter() - t0)
            return metrics, self.weights()
        self.opt.zero_grad()
        stats = LossStats()
        for s, a in zip(batch.fresh, batch.advantages):
            loss, part = sample_loss(self.model, s, a, self.clip, batch.action_tokens, batch.version)
            loss.backward()
            stats = stats.merge(part)
        if batch.fresh:
            self.opt.step()
        self.version += 1
        metrics.update(stats.metrics(), version=float(self.version), train_s=time.perf_counter() - t0, action_tokens=float(batch.action_tokens))
        return metrics, self.weights()

    def probe_logprobs(self, version: int) -> tuple[float, ...]:
        """What an engine holding weights `version` must answer (weight_sync.PROBE_TOKENS)."""
        if self.model is None:
            return (float(version),)
        if version not in self._probes:
            from runtime.ray_runtime.weight_sync import model_probe_logprobs

            if version != self.version:
                raise KeyError(f"no probe for weights version {version} (the trainer is at {self.version})")
            self._probes[version] = model_probe_logprobs(self.model)
        return self._probes[version]

    def get_version(self) -> int:
        return self.version
