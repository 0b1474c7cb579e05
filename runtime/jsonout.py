"""`--json` output: exactly one strict JSON object on stdout.

Consumers pipe `--json` into `json.load`, so two things must never reach stdout: bare
NaN/Infinity (Python's json writes them, JSON has no such literals) and anything a library
prints. Solvers are configured silent where they are called (planner/backends.py);
`stdout_to_stderr` is the backstop for output that cannot be silenced there: C code writing
to fd 1 directly, child processes, Ray forwarding worker output, vLLM's stdout logger.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from typing import Any, Iterator


def finite(obj: Any) -> Any:
    """A copy of `obj` with every non-finite float (NaN, +-inf) replaced by None (JSON null)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """Strict JSON text: non-finite numbers become null instead of the invalid NaN/Infinity."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


def print_json(obj: dict[str, Any]) -> None:
    """The one `--json` object, on one line of stdout."""
    print(dumps(obj), flush=True)


@contextlib.contextmanager
def stdout_to_stderr(enabled: bool = True) -> Iterator[None]:
    """Point fd 1 at stderr while the body runs: C libraries and child processes write to
    fd 1 directly, past any `sys.stdout` redirection. No-op when not `enabled`."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
