"""Per-trajectory log records: the one schema `pearl train` writes and calibration reads.

One JSON object per finished trajectory, one per line (`*.trajectories.jsonl`). The fields
are what a `WorkloadSpec` is made of, per turn, so a user can write the same file from
their own agent runs and calibrate to them:

  turns                  int    policy turns (engine calls) the trajectory ran
  initial_prompt_tokens  int    the first prompt (prefilled at turn 1)
  new_tokens             [int]  observation tokens prefilled before turns 2..turns (turns - 1)
  response_tokens        [int]  tokens generated at each turn (turns)
  env_latency_s          [float] environment/tool time after each turn (turns; the last is
                                 the final step, e.g. the reward's tests; 0 if it takes none)
  truncated              bool   it ended at the token budget, not because the task was done
                                 (its true turn count is larger: a right-censored observation)
  token_budget           int?   the context limit the run enforced (optional)
  id, batch, group       optional: where it came from (batch/group let the batch size and
                                 GRPO group size be read back)

The schema is this dataclass and nothing else: the writer serialises with `to_json`, the
reader validates with `from_json`, so the two cannot drift apart.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from models.config import ConfigError


class RecordFieldError(ValueError):
    """A record's field is missing or malformed; the reader adds the file and line."""

    def __init__(self, field: str, value: Any, allowed: str) -> None:
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"field '{field}': got {value!r}; allowed: {allowed}")


@dataclass(frozen=True)
class TrajectoryRecord:
    """One finished trajectory as the workload model sees it (see the module docstring)."""

    turns: int
    initial_prompt_tokens: int
    new_tokens: tuple[int, ...]
    response_tokens: tuple[int, ...]
    env_latency_s: tuple[float, ...]
    truncated: bool = False
    token_budget: int | None = None
    id: str | None = None
    batch: int | None = None
    group: int | None = None

    def __post_init__(self) -> None:
        _check(self)

    @property
    def context_tokens(self) -> int:
        """Tokens in the context when it ended (prompt, observations and responses)."""
        return self.initial_prompt_tokens + sum(self.new_tokens) + sum(self.response_tokens)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "turns": self.turns, "initial_prompt_tokens": self.initial_prompt_tokens,
            "new_tokens": list(self.new_tokens), "response_tokens": list(self.response_tokens),
            "env_latency_s": [round(x, 6) for x in self.env_latency_s], "truncated": self.truncated,
        }
        for key in ("token_budget", "id", "batch", "group"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_json(cls, data: Any) -> "TrajectoryRecord":
        """Validate one decoded JSON object; RecordFieldError names the first bad field."""
        if not isinstance(data, Mapping):
            raise RecordFieldError("<record>", type(data).__name__, "a JSON object with the trajectory's fields")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise RecordFieldError(unknown[0], data[unknown[0]], f"one of {sorted(known)}")
        return cls(
            turns=_int(data, "turns", required=True),
            initial_prompt_tokens=_int(data, "initial_prompt_tokens", required=True),
            new_tokens=_ints(data, "new_tokens"),
            response_tokens=_ints(data, "response_tokens"),
            env_latency_s=_floats(data, "env_latency_s"),
            truncated=_bool(data, "truncated"),
            token_budget=_int(data, "token_budget"),
            id=_str(data, "id"),
            batch=_int(data, "batch"),
            group=_int(data, "group"),
        )


def _check(r: TrajectoryRecord) -> None:
    """Per-turn lengths agree with `turns` (a writer bug or a hand-made file shows up here)."""
    if r.turns < 1:
        raise RecordFieldError("turns", r.turns, "an integer >= 1")
    for key, want in (("new_tokens", r.turns - 1), ("response_tokens", r.turns), ("env_latency_s", r.turns)):
        got = len(getattr(r, key))
        if got != want:
            raise RecordFieldError(key, f"{got} entries", f"{want} entries ({'turns - 1' if key == 'new_tokens' else 'one per turn'}; turns is {r.turns})")


def _get(data: Mapping[str, Any], key: str, required: bool) -> Any:
    if key not in data:
        if required:
            raise RecordFieldError(key, "<missing>", "a value (this field is required)")
        return None
    return data[key]


def _int(data: Mapping[str, Any], key: str, required: bool = False) -> int | None:
    v = _get(data, key, required)
    if v is None and not required:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise RecordFieldError(key, v, "a non-negative integer")
    return v


def _ints(data: Mapping[str, Any], key: str) -> tuple[int, ...]:
    v = _get(data, key, True)
    if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v):
        raise RecordFieldError(key, v, "a list of non-negative integers, one per turn")
    return tuple(v)


def _floats(data: Mapping[str, Any], key: str) -> tuple[float, ...]:
    v = _get(data, key, True)
    if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 for x in v):
        raise RecordFieldError(key, v, "a list of non-negative seconds, one per turn")
    return tuple(float(x) for x in v)


def _bool(data: Mapping[str, Any], key: str) -> bool:
    v = _get(data, key, True)
    if not isinstance(v, bool):
        raise RecordFieldError(key, v, "true or false")
    return v


def _str(data: Mapping[str, Any], key: str) -> str | None:
    v = _get(data, key, False)
    if v is not None and not isinstance(v, str):
        raise RecordFieldError(key, v, "a string")
    return v


def read_records(path: str | Path) -> Iterator[tuple[int, TrajectoryRecord]]:
    """(line number, record) for each non-blank line; ConfigError names file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(path, "<file>", str(path), "an existing JSONL file of trajectory records")
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(path, f"line {n}", line.strip()[:80], f"one JSON object per line ({exc.msg})") from None
            try:
                yield n, TrajectoryRecord.from_json(data)
            except RecordFieldError as exc:
                raise ConfigError(path, f"line {n}: {exc.field}", exc.value, exc.allowed) from None


class TrajectoryLogWriter:
    """Appends records to a JSONL file, flushed per line (the run may stop at any point)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[str] = self.path.open("w")  # one file per run, like the metrics

    def write(self, record: TrajectoryRecord) -> None:
        self._f.write(json.dumps(record.to_json()) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def log_path_for(metrics_path: str | Path) -> Path:
    """Where a run's trajectory log goes: beside its metrics, `runs/x.jsonl` -> `runs/x.trajectories.jsonl`."""
    p = Path(metrics_path)
    return p.with_name(f"{p.stem}.trajectories.jsonl")
