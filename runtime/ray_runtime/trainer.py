"""Trainer: a GRPO policy-gradient step in torch, and the weights it ships to rollout.

Advantages are group-relative: trajectories of one group answered the same question, so
A_i = (R_i - mean_group) / (std_group + eps). Rollout is asynchronous, so a trajectory may
have been generated (even partly) by older weights than the ones being trained: every
generated token carries the behaviour log-probability it was sampled with, and the loss
uses the clipped importance ratio exp(logp_now - logp_behaviour) (PPO-style), which is the
off-policy correction for stale trajectories. Trajectories older than the staleness bound
are dropped and counted.

CPU: the tiny model, full parameters, Adam, one process. Not implemented yet: the GPU
path, which would keep this interface, wrap the model with FSDP2
(`torch.distributed.fsdp.fully_shard`) across the training pool and gather a full state
dict on rank 0 for the weight blob.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np


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


def group_advantages(rewards: np.ndarray, groups: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """GRPO: standardise rewards within each group (a group with equal rewards gets zeros)."""
    adv = np.zeros_like(rewards, dtype=float)
    for g in np.unique(groups):
        idx = groups == g
        r = rewards[idx]
        adv[idx] = (r - r.mean()) / (r.std() + eps) if r.std() > 0 else 0.0
    return adv


def state_blob(model: Any) -> bytes:
    import safetensors.torch

    return safetensors.torch.save({k: v.detach().contiguous() for k, v in model.state_dict().items()})


class Trainer:
    """Ray actor (or plain object). backend 'torch' trains for real; 'emulated' sleeps the training-time model."""

    def __init__(self, model_path: str | None, lr: float = 1e-3, clip_eps: float = 0.2, staleness: int = 1, seed: int = 0, threads: int = 1, backend: str = "torch", emulated_step_s: float = 1.0, time_scale: float = 1.0) -> None:
        self.backend = backend
        self.version = 0
        self.staleness = staleness
        self.clip = clip_eps
        self.emulated_step_s, self.scale = emulated_step_s, time_scale
        self.model: Any = None
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
        return state_blob(self.model) if self.model is not None else b"emulated"

    def train_step(self, samples: list[TrainSample], rollout_version: int) -> tuple[dict[str, float], bytes]:
        """One update on a rollout batch; returns (metrics, new weights as safetensors bytes)."""
        t0 = time.perf_counter()
        fresh = [s for s in samples if rollout_version - s.min_version <= self.staleness]
        dropped = len(samples) - len(fresh)
        rewards = np.array([s.reward for s in fresh], dtype=float)
        metrics: dict[str, float] = {"dropped_stale": float(dropped), "samples": float(len(fresh)), "mean_reward": float(rewards.mean()) if len(fresh) else 0.0}
        metrics["max_staleness"] = float(max((rollout_version - s.min_version for s in samples), default=0))
        trained_tokens = sum(len(s.tokens) for s in fresh)
        metrics["trained_tokens"] = float(trained_tokens)
        if self.backend == "emulated":
            time.sleep(self.emulated_step_s / self.scale)
            self.version += 1
            metrics.update(version=float(self.version), train_s=time.perf_counter() - t0)
            return metrics, self.weights()
        import torch

        adv = group_advantages(rewards, np.array([s.group for s in fresh]))
        self.opt.zero_grad()
        n_tokens = sum(sum(s.action_mask) for s in fresh)
        total_loss, ratios, clipped = 0.0, [], 0
        for s, a in zip(fresh, adv):
            ids = torch.tensor([s.tokens])
            mask = torch.tensor(s.action_mask[1:], dtype=torch.bool)
            logits = self.model(input_ids=ids).logits[0, :-1]
            logp = torch.log_softmax(logits.float(), dim=-1).gather(1, ids[0, 1:, None])[:, 0][mask]
            old = torch.tensor(s.behaviour_logprobs[: int(mask.sum())], dtype=torch.float32)
            if old.numel() != logp.numel():
                logp = logp[: old.numel()]
            ratio = torch.exp(logp - old)
            unclipped = ratio * float(a)
            clip = torch.clamp(ratio, 1 - self.clip, 1 + self.clip) * float(a)
            loss = -torch.minimum(unclipped, clip).sum() / max(n_tokens, 1)
            loss.backward()
            total_loss += float(loss.detach())
            ratios.append(ratio.detach())
            clipped += int(((ratio - 1).abs() > self.clip).sum())
        if fresh:
            self.opt.step()
        self.version += 1
        allr = torch.cat(ratios) if ratios else torch.ones(1)
        metrics.update(
            loss=total_loss,
            version=float(self.version),
            train_s=time.perf_counter() - t0,
            ratio_mean=float(allr.mean()),
            ratio_max_abs_log=float(allr.log().abs().max()),
            clipped_tokens=float(clipped),
            action_tokens=float(n_tokens),
        )
        return metrics, self.weights()

    def get_version(self) -> int:
        return self.version
