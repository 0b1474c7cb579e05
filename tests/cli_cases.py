"""Running bad input through the real CLI in-process, as the bad-input suites do.

One place for what every such case checks: the command answers within a bound (a hang fails,
it does not stall the suite), and a refusal is exit 2 with exactly one well-formed
`pearl: error:` line on stderr, nothing on stdout, no traceback and no usage box.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from typer.testing import CliRunner

from runtime.cli import app

LINE = re.compile(r"^pearl: error: (?P<place>.+?): field '(?P<field>[^']+)': got (?P<value>.+); allowed: (?P<allowed>.+)$")


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    stdout: str
    stderr: str
    exception: BaseException | None
    seconds: float


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in this (main) thread after `seconds`: a hang becomes a failure.

    pytest-timeout (`make test` runs it) may own SIGALRM too: its handler and the rest of its
    timer are put back afterwards."""

    def _expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"no answer within {seconds} s")

    old_handler = signal.signal(signal.SIGALRM, _expire)
    started = time.monotonic()
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:
            signal.setitimer(signal.ITIMER_REAL, max(old_delay - (time.monotonic() - started), 1e-3), old_interval)


def invoke(args: list[str], seconds: float) -> Outcome:
    """`pearl <args>` in-process, within `seconds`."""
    t0 = time.perf_counter()
    with deadline(seconds):
        res = CliRunner().invoke(app, args)
    return Outcome(res.exit_code, res.stdout, res.stderr, res.exception, time.perf_counter() - t0)


def one_error(out: Outcome) -> re.Match[str]:
    """Exit 2, nothing on stdout, exactly one well-formed `pearl: error:` line, no traceback or box."""
    assert not isinstance(out.exception, Exception), f"uncaught {out.exception!r}"  # SystemExit is no Exception
    assert out.exit_code == 2, (out.exit_code, out.stdout[-500:], out.stderr[-1500:])
    assert "Traceback" not in out.stdout + out.stderr and "Usage:" not in out.stderr and "╭" not in out.stderr
    assert out.stdout == ""
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, out.stderr
    m = LINE.match(lines[0])
    assert m, lines[0]
    return m


def strict_loads(text: str) -> Any:
    """json.loads that refuses NaN and Infinity, as standard parsers do."""

    def refuse(token: str) -> Any:
        raise ValueError(f"non-standard JSON constant {token}")

    return json.loads(text, parse_constant=refuse)
