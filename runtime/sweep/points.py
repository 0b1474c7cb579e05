"""The points of a sweep: a full grid, or one key at a time around the config's own values."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

from runtime.sweep.keys import Number

Mode = Literal["grid", "oneway"]
MODES: tuple[str, ...] = ("grid", "oneway")


@dataclass(frozen=True)
class Point:
    """Overrides of one point; `varied` names the key a one-way point moves (None on a grid)."""

    values: tuple[tuple[str, Number], ...]
    varied: str | None = None

    def overrides(self) -> dict[str, Number]:
        return dict(self.values)


def sweep_points(sets: dict[str, list[Number]], mode: Mode) -> list[Point]:
    """Grid: the cartesian product of all lists. Oneway: each key's list with the others left at the config's values."""
    keys = list(sets)
    if mode == "grid":
        return [Point(tuple(zip(keys, combo))) for combo in itertools.product(*(sets[k] for k in keys))]
    return [Point(((k, v),), varied=k) for k in keys for v in sets[k]]
