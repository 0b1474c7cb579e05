"""`pearl` command line. Each subcommand lives in runtime/commands/<name>.py and registers on `app`.

Bad input prints one line on stderr, `pearl: error: <file or command>: field '<field>': got
<value>; allowed: <...>`, exits 2 and never shows a traceback: a ConfigError from a command
(via `user_errors`) and a flag the CLI framework itself refuses (a bad number, a missing value,
an unknown option or command) alike. `--json` output goes to stdout; logs and progress to stderr.
"""

from __future__ import annotations

import functools
import importlib
import re
import sys
from typing import Any, Callable, NoReturn, Sequence

import typer
from typer._click import exceptions as click_errors  # typer vendors click; its errors live here
from typer.core import TyperGroup

COMMAND_MODULES = ["predict", "profile", "fit", "calibrate", "simulate", "compare", "plan", "train", "sweep"]


def _flag_name(param: Any) -> str:
    """`--config` for an option declared `--config/-c`; the metavar for an argument."""
    opts = [o for o in getattr(param, "opts", []) if o.startswith("--")] or list(getattr(param, "opts", []))
    return max(opts, key=len) if opts else str(getattr(param, "human_readable_name", "<argument>"))


def _options_of(ctx: Any) -> list[str]:
    cmd = getattr(ctx, "command", None)
    names = [_flag_name(p) for p in getattr(cmd, "params", []) if getattr(p, "param_type_name", "") == "option"]
    return names + ["--help"]


def usage_line(exc: click_errors.ClickException, command: str | None = None) -> str:
    """One `<place>: field '<flag>': got <value>; allowed: <...>` line for an error the CLI
    framework raised; `command`: the subcommand being parsed (the parser leaves some errors without it)."""
    from models.config import ConfigError
    from runtime.flags import FlagValueError

    ctx = getattr(exc, "ctx", None)
    place = ctx.command_path if ctx is not None else "pearl"
    if command and place == "pearl":
        place = f"pearl {command}"
    if isinstance(exc, FlagValueError):
        return str(ConfigError(place, _flag_name(exc.param), exc.value, exc.allowed))
    if isinstance(exc, click_errors.MissingParameter):
        help_text = getattr(exc.param, "help", None)
        return str(ConfigError(place, _flag_name(exc.param), "<missing>", "required" + (f": {help_text}" if help_text else "")))
    if isinstance(exc, click_errors.BadParameter):
        return str(ConfigError(place, _flag_name(exc.param), "<invalid>", exc.message))
    if isinstance(exc, click_errors.NoSuchOption):
        return str(ConfigError(place, "<option>", exc.option_name, f"one of {', '.join(_options_of(ctx))}"))
    if isinstance(exc, click_errors.BadOptionUsage) and "requires" in exc.message:
        return str(ConfigError(place, exc.option_name, "<missing>", f"a value after {exc.option_name} (see {place} --help)"))
    if isinstance(exc, click_errors.BadOptionUsage) and "does not take a value" in exc.message:
        return str(ConfigError(place, exc.option_name, "<a value>", f"no value: {exc.option_name} is a switch"))
    extra = re.fullmatch(r"Got unexpected extra arguments?(?:\(s\))? \((.*)\)", exc.message)
    if extra:
        return str(ConfigError(place, "<arguments>", extra[1], f"none: every value follows its option (see {place} --help)"))
    return f"{place}: {exc.format_message()} (see {place} --help)"


class _Refused(click_errors.UsageError):
    """A usage error whose message is already the one line (e.g. an unknown command)."""


class PearlGroup(TyperGroup):
    """Runs every entry path (the `pearl` script, `python -m runtime.cli`, `main()`, typer's
    CliRunner) through one error handler, so a framework error looks like any other bad input
    instead of click's usage text and boxed panel."""

    invoked: str | None = None  # the subcommand being parsed, for errors the parser raises without it

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and not args[0].startswith("-") and self.get_command(ctx, args[0]) is None:
            from models.config import ConfigError

            raise _Refused(str(ConfigError("pearl", "<command>", args[0], f"one of {', '.join(self.list_commands(ctx))}")), ctx)
        name, cmd, rest = super().resolve_command(ctx, args)
        self.invoked = name
        return name, cmd, rest

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name or "pearl", complete_var, standalone_mode=False, **extra)
        from models.config import ConfigError

        self.invoked = None
        try:
            rv = super().main(args, prog_name or "pearl", complete_var, standalone_mode=False, **extra)
        except click_errors.NoArgsIsHelpError as exc:  # bare `pearl` / `pearl <group>`: the help text
            exc.show()
            sys.exit(2)
        except click_errors.UsageError as exc:
            _fail(exc.message if isinstance(exc, _Refused) else usage_line(exc, self.invoked), 2)
        except click_errors.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except ConfigError as exc:  # raised outside a command body (e.g. while parsing a flag)
            _fail(str(exc), 2)
        except typer.Abort:
            _fail("aborted", 1)
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)


def _fail(line: str, code: int) -> NoReturn:
    print(f"pearl: error: {line}", file=sys.stderr)
    sys.exit(code)


app = typer.Typer(cls=PearlGroup, name="pearl", add_completion=False, no_args_is_help=True, help="PEARL: adaptive prefill-decode execution with elasticity for agentic RL.")


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


if __name__ != "__main__":  # under `python -m runtime.cli` the importable module registers them (below)
    for _name in COMMAND_MODULES:
        importlib.import_module(f"runtime.commands.{_name}")


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    # `python -m runtime.cli`: the commands registered on the importable module's `app`, not on
    # this `__main__` copy of it
    from runtime.cli import main as _main

    _main()
