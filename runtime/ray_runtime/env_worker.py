"""Environment worker: a multi-turn tool-use task with a verifiable reward.

The task ("calculator"): compute `a op b op c`. Each turn the policy answers; if its answer
contains a tool call `calc(x op y)` the environment evaluates it and returns the result,
otherwise it returns the tool's usage. Tool calls take real time, drawn from the workload's
environment-latency distribution (asyncio sleeps, so one actor serves many trajectories at
once). After the last turn the reward is checked against the true value, taking the last
integer of the final response as the answer: 1.0 if exact, else 0.5 x (digits shared with
the true answer, as multisets, over the longer of the two) + 0.1 if the policy issued a
well-formed tool call.
The graded part keeps group-relative advantages informative for a policy that is not yet
any good (the tiny random model), and it is still a deterministic function of the text.

The environment speaks token ids (it owns the tokenizer) so the controller only moves ids
around and every turn's context is the previous context plus new ids: the prefix cache of
the engine that served the previous turn covers everything but the new tokens.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.ray_runtime.ray_nodes import OnANode

CALL = re.compile(r"calc\(\s*(-?\d+)\s*([-+*])\s*(-?\d+)\s*\)")
NUMBER = re.compile(r"-?\d+")
OPS = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}


@dataclass
class _Episode:
    answer: int
    turns: int
    turn: int = 0
    tool_calls: int = 0
    env_s: float = 0.0


def score(answer: int, final_text: str, tool_calls: int) -> float:
    """The verifiable reward (see module docstring): the answer is the last integer of the final turn."""
    numbers = [int(n) for n in NUMBER.findall(final_text)]
    bonus = 0.1 if tool_calls else 0.0
    if not numbers:
        return bonus
    given = numbers[-1]
    if given == answer:
        return 1.0
    want, have = Counter(str(abs(answer))), Counter(str(abs(given)))
    overlap = sum(min(c, have[d]) for d, c in want.items()) / max(sum(want.values()), sum(have.values()))
    return 0.5 * overlap + bonus


def evaluate_call(text: str) -> int | None:
    m = CALL.search(text)
    if m is None:
        return None
    return OPS[m.group(2)](int(m.group(1)), int(m.group(3)))


class EnvWorker(OnANode):
    """Async Ray actor holding many episodes. `text=False` emulates the task with synthetic ids."""

    def __init__(self, tokenizer_path: str | None, turns: Any, env_latency_s: Any, prompt_tokens: Any = None, obs_tokens: Any = None, time_scale: float = 1.0, seed: int = 0, vocab: int = 1024) -> None:
        self.tok = None
        if tokenizer_path is not None:
            from transformers import AutoTokenizer

            self.tok = AutoTokenizer.from_pretrained(tokenizer_path)
        self.turns, self.latency = turns, env_latency_s
        self.prompt_tokens, self.obs_tokens = prompt_tokens, obs_tokens
        self.scale = time_scale
        self.rng = np.random.default_rng(seed)
        self.vocab = vocab
        self.episodes: dict[str, _Episode] = {}

    def _ids(self, role: str, content: str, generation_prompt: bool = True) -> list[int]:
        assert self.tok is not None
        text = self.tok.apply_chat_template([{"role": role, "content": content}], tokenize=False, add_generation_prompt=generation_prompt)
        return list(self.tok.encode(text, add_special_tokens=False))

    def _synthetic(self, dist: Any) -> list[int]:
        n = max(1, int(round(dist.sample(self.rng))))
        return [int(x) for x in self.rng.integers(4, self.vocab, n)]

    async def reset(self, traj_id: str, task_seed: int) -> list[int]:
        """Start an episode; trajectories of one GRPO group share `task_seed` (same question)."""
        rng = np.random.default_rng(task_seed)
        a, b, c = (int(x) for x in rng.integers(2, 60, 3))
        op1, op2 = (str(o) for o in rng.choice(list(OPS), 2))
        answer = OPS[op2](OPS[op1](a, b), c)
        turns = max(1, int(round(self.turns.sample(rng))))
        self.episodes[traj_id] = _Episode(answer=answer, turns=turns)
        if self.tok is None:
            return self._synthetic(self.prompt_tokens)
        question = f"question: what is ({a} {op1} {b}) {op2} {c} ? you have {turns} turns. tool: calc(x + y) computes one operation. end with: answer <number>"
        return self._ids("user", question)

    async def step(self, traj_id: str, response_ids: list[int]) -> tuple[list[int], bool, float]:
        """Run the tool on the policy's turn; returns (observation ids, done, reward)."""
        ep = self.episodes[traj_id]
        ep.turn += 1
        text = self.tok.decode(response_ids) if self.tok is not None else ""
        if self.tok is None:
            ep.tool_calls += int(sum(response_ids) % 3 == 0)
        # every turn waits on the environment, the last one too: its reward is the check
        # (a SWE task's tests run), as the simulator and the predictor count it
        delay = float(self.latency.sample(self.rng))
        await asyncio.sleep(delay / self.scale)
        ep.env_s += delay
        if ep.turn >= ep.turns:
            reward = score(ep.answer, text, ep.tool_calls) if self.tok is not None else float(np.mean([t % 2 for t in response_ids] or [0.0]))
            del self.episodes[traj_id]
            return [], True, reward
        if self.tok is None:
            return self._synthetic(self.obs_tokens), False, 0.0
        value = evaluate_call(text)
        if value is not None:
            ep.tool_calls += 1
            obs = f"tool result: {value}"
        else:
            obs = "tool error: no call found. usage: calc(12 * 7)"
        close = list(self.tok.encode("<|im_end|>\n", add_special_tokens=False))
        return close + self._ids("tool", obs), False, 0.0

    async def set_workload(self, turns: Any, env_latency_s: Any, prompt_tokens: Any, obs_tokens: Any) -> None:
        """A load change: episodes reset from now on draw from these distributions."""
        self.turns, self.latency = turns, env_latency_s
        self.prompt_tokens, self.obs_tokens = prompt_tokens, obs_tokens

    async def forget(self, traj_id: str) -> None:
        self.episodes.pop(traj_id, None)

    async def live(self) -> int:
        return len(self.episodes)
