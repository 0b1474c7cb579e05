"""`pearl` command line. Each subcommand lives in runtime/commands/<name>.py and registers on `app`.

Bad input (ConfigError) prints one line naming file, field and what is allowed, exits 2,
and never shows a traceback. `--json` output goes to stdout; logs and progress to stderr.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Callable

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="PEARL: adaptive prefill-decode execution with elasticity for agentic RL.")

COMMAND_MODULES = ["predict", "profile", "fit", "calibrate", "simulate", "compare", "plan", "train", "sweep"]


@app.callback()
def _root() -> None:
    """PEARL: adaptive prefill-decode execution with elasticity for agentic RL."""


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn bad-input exceptions into one clear line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from models.config import ConfigError

        try:
            return fn(*args, **kwargs)
        except ConfigError as exc:
            print(f"pearl: error: {exc}", file=sys.stderr)
            raise typer.Exit(2) from None

    return wrapper


for _name in COMMAND_MODULES:
    importlib.import_module(f"runtime.commands.{_name}")


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
