"""Argument types and config loading shared by the experiment scripts: a bad flag or config is
one line naming it and what is allowed, never a traceback (as the `pearl` CLI does)."""

from __future__ import annotations

import argparse
from pathlib import Path

from models.config import ConfigError, ExperimentSpec, load_experiment


def int_list(lowest: int, most: int | None = None):
    """An argparse type: comma-separated whole numbers >= lowest, at most `most` of them (a bad
    one is argparse's one-line error)."""
    def parse(text: str) -> list[int]:
        try:
            out = [int(x) for x in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"got {text!r}; allowed: comma-separated whole numbers") from None
        if not out or min(out) < lowest or (most is not None and len(out) > most):
            raise argparse.ArgumentTypeError(f"got {text!r}; allowed: {'one whole number' if most == 1 else 'whole numbers'} >= {lowest}")
        return out
    return parse


def one_int(lowest: int):
    """An argparse type: one whole number >= lowest."""
    return lambda text: int_list(lowest, most=1)(text)[0]


def positive_floats(text: str) -> list[float]:
    """An argparse type: comma-separated numbers > 0."""
    try:
        out = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: comma-separated numbers > 0") from None
    if not out or not all(0 < x < float("inf") for x in out):
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: comma-separated numbers > 0")
    return out


def one_positive(text: str) -> float:
    """An argparse type: one number > 0."""
    try:
        [out] = positive_floats(text)
    except (argparse.ArgumentTypeError, ValueError):
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: one number > 0") from None
    return out


def load_spec(path: str | Path, prog: str) -> ExperimentSpec:
    """The experiment config at `path`, or exit with its one-line error."""
    try:
        return load_experiment(path)
    except ConfigError as e:
        raise SystemExit(f"{prog}: error: {e}") from None
