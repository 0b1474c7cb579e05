"""Trajectories drawn from the workload's distributions, deterministically per seed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.config import WorkloadSpec


@dataclass(frozen=True)
class TrajectoryPlan:
    """What one trajectory will do: per turn, new tokens to prefill, tokens to decode, then a tool wait."""

    new_tokens: tuple[int, ...]  # turn 0: the initial prompt
    response_tokens: tuple[int, ...]
    env_s: tuple[float, ...]  # environment time after each turn (after the last: the reward, e.g. the tests run)

    @property
    def turns(self) -> int:
        return len(self.new_tokens)

    def total_tokens(self) -> int:
        return int(sum(self.new_tokens) + sum(self.response_tokens))


class TrajectorySampler:
    """Samples trajectory plans; the context is capped at max_trajectory_tokens (turns past it are cut)."""

    def __init__(self, workload: WorkloadSpec, rng: np.random.Generator) -> None:
        self.w = workload
        self.rng = rng

    def sample(self, n: int) -> list[TrajectoryPlan]:
        w, rng = self.w, self.rng
        turns = np.maximum(np.rint(w.turns.sample(rng, n)), 1).astype(int)
        total = int(turns.sum())
        first = np.maximum(np.rint(w.initial_prompt_tokens.sample(rng, n)), 1).astype(int)
        new = np.maximum(np.rint(w.new_tokens_per_turn.sample(rng, total)), 1).astype(int)
        resp = np.maximum(np.rint(w.response_tokens_per_turn.sample(rng, total)), 1).astype(int)
        env = w.env_latency_s.sample(rng, total)
        cap = w.max_trajectory_tokens
        plans, at = [], 0
        for i in range(n):
            k = int(turns[i])
            nt = new[at : at + k].tolist()
            nt[0] = int(first[i])
            rt = resp[at : at + k].tolist()
            ev = env[at : at + k].tolist()
            at += k
            ctx, keep = 0, 0
            for j in range(k):
                if j > 0 and ctx + nt[j] + rt[j] > cap:
                    break
                ctx += nt[j] + rt[j]
                keep = j + 1
            plans.append(TrajectoryPlan(tuple(nt[:keep]), tuple(rt[:keep]), tuple(ev[:keep])))
        return plans
