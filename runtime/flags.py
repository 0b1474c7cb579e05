"""Command-line flag values: a finite, stated range for every numeric flag, and one error line.

Why parsers instead of `typer.Option(min=, max=)`: typer's messages lose the value the user
typed, accept `inf`/`nan` for floats unless a bound catches them, and some flags had no upper
bound at all (`pearl predict --gpus 100000000` allocated 24 GB). A `FlagValueError` carries
the typed value and the allowed range; `runtime.cli` prints it as the one line
`pearl: error: pearl <command>: field '--flag': got <value>; allowed: <range>`, exit 2.
The upper bounds are the config's (models/config.py), so a flag can ask for no more than a
config file may.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator

import typer

from models.config import MAX_BATCH, MAX_GPUS, MAX_HOURS, MAX_SEED, MAX_STEPS, ConfigError, ExperimentSpec

MAX_SEEDS = 1_000  # seeds per sweep point: each is a full simulation
MAX_JOBS = 256  # parallel sweep processes


class FlagValueError(typer.BadParameter):
    """A flag value outside its range; click attaches the flag (`.param`) and context on the way out."""

    def __init__(self, value: Any, allowed: str) -> None:
        super().__init__(f"got {value!r}; allowed: {allowed}")
        self.value, self.allowed = value, allowed


def _int_in(lo: int, hi: int) -> Callable[[Any], int]:
    allowed = f"an integer from {lo} to {hi}"

    def parse(text: Any) -> int:
        if isinstance(text, bool):
            raise FlagValueError(text, allowed)
        try:
            v = text if isinstance(text, int) else int(str(text).strip())
        except ValueError:
            raise FlagValueError(text, allowed) from None
        if not lo <= v <= hi:
            raise FlagValueError(text, allowed)
        return v

    return parse


def _float_in(lo: float, hi: float, open_lo: bool) -> Callable[[Any], float]:
    allowed = f"a finite number {'>' if open_lo else '>='} {lo:g} and <= {hi:g}"

    def parse(text: Any) -> float:
        try:
            v = float(text)
        except (TypeError, ValueError):
            raise FlagValueError(text, allowed) from None
        if not (math.isfinite(v) and (v > lo if open_lo else v >= lo) and v <= hi):
            raise FlagValueError(text, allowed)
        return v

    return parse


def int_option(default: int | None, *decls: str, lo: int, hi: int, help: str) -> Any:
    """A typer option for an integer in [lo, hi] (the range is shown in --help)."""
    return typer.Option(default, *decls, parser=_int_in(lo, hi), metavar="INTEGER", help=f"{help} [{lo}..{hi}]")


def float_option(default: float | None, *decls: str, lo: float, hi: float, help: str, open_lo: bool = False) -> Any:
    """A typer option for a finite float in [lo, hi] (or (lo, hi] with open_lo)."""
    span = f"{'(' if open_lo else '['}{lo:g}..{hi:g}]"
    return typer.Option(default, *decls, parser=_float_in(lo, hi, open_lo), metavar="FLOAT", help=f"{help} {span}")


# The flags several commands share, each with its range.
def gpus_option(help: str) -> Any:
    return int_option(None, "--gpus", lo=1, hi=MAX_GPUS, help=help)


def batch_option(help: str) -> Any:
    return int_option(None, "--batch", lo=1, hi=MAX_BATCH, help=help)


def hours_option(help: str) -> Any:
    return float_option(None, "--hours", lo=0.0, hi=MAX_HOURS, open_lo=True, help=help)


def offset_option(help: str) -> Any:
    return float_option(None, "--trace-offset-hours", lo=0.0, hi=MAX_HOURS, help=help)


def seed_option(help: str) -> Any:
    return int_option(None, "--seed", lo=0, hi=MAX_SEED, help=help)


def steps_option(help: str) -> Any:
    return int_option(None, "--steps", lo=1, hi=MAX_STEPS, help=help)


def split_policies(text: str) -> list[str]:
    """`--policies` names, comma-separated; a typed fixed layout keeps its own commas
    (`pearl,fixed:H800=8P@TP1,H20=3D@TP4`: a piece with '=' continues the `fixed:` before it,
    since no policy name holds one)."""
    out: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if "=" in piece and out and out[-1].startswith("fixed:") and "=" in out[-1]:
            out[-1] += "," + piece
        elif piece:
            out.append(piece)
    return out


def check_policies(names: list[str], spec: ExperimentSpec, flag: str | None, command: str, fixed: bool = True) -> None:
    """Refuse an unknown policy name before any work, blaming where the name came from: the
    flag (e.g. --policies) or, when none was given, the config's `policy.name` (the simulator's
    own check says `--policy` whatever the source). `fixed`: `fixed:...` layouts are allowed,
    when the cluster can run them."""
    from planner.inputs import memory_model
    from planner.policies import POLICIES
    from runtime.sim.run import fixed_form, fixed_problem

    where = (f"pearl {command}", flag) if flag else (spec.source, "policy.name")
    for name in names:
        if fixed and name.startswith("fixed:"):
            problem = fixed_problem(name, spec, memory_model(spec).fits)
            if problem is not None:
                raise ConfigError(where[0], where[1], name, problem)
        elif name not in POLICIES:
            raise ConfigError(where[0], where[1], name, f"one of {sorted(POLICIES)}" + (f" or {fixed_form(spec)}" if fixed else ""))


@contextlib.contextmanager
def window_flags(command: str, hours: float | None, offset_hours: float | None) -> Iterator[None]:
    """Blame `--hours` / `--trace-offset-hours` when the trace window they set does not fit the
    trace: the readers only see the merged trace settings and would name `trace.hours`, a field
    the user never wrote."""
    try:
        yield
    except ConfigError as exc:
        flag, value = {"trace.hours": ("--hours", hours), "trace.offset_hours": ("--trace-offset-hours", offset_hours)}.get(exc.field, (None, None))
        if flag is None or value is None:
            raise
        raise ConfigError(f"pearl {command}", flag, value, f"{exc.allowed} in {exc.file}") from None
