"""The console that prints a command's table.

Why: rich sizes a table to the terminal, and where the stream is not one (a pipe, `| tee`, a
log file, CI) it assumes 80 columns; `pearl compare`'s eleven columns then came out as
"15,…" and "pea…", every number cut. Off a terminal the table gets the width it needs, whatever
`COLUMNS` says (pytest's children, for one, inherit COLUMNS=80).
"""

from __future__ import annotations

import sys

from rich.console import Console

OFF_TERMINAL_WIDTH = 250  # wider than any table the commands print; rich never pads a table to it


def table_console(stderr: bool = False) -> Console:
    """A Console on stdout (or stderr) that cuts no table short off a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else OFF_TERMINAL_WIDTH)
