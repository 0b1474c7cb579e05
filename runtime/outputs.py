"""Output paths (`--out`, `--plot`, `--cache`) checked before a command does its work.

Why: the commands write their results at the end, so a path under a regular file, an
unwritable folder or a plot extension matplotlib cannot write used to cost the whole
computation and end in a traceback. Each check fails with one ConfigError naming the command
and the flag. The checks create the missing folders (the command would anyway) and leave no
file behind.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from models.config import ConfigError


def _folder(folder: Path, place: str, flag: str, given: Path) -> None:
    """`folder` exists as a folder afterwards, or ConfigError."""
    up = folder
    while not up.exists() and up != up.parent:
        up = up.parent
    if up.exists() and not up.is_dir():
        raise ConfigError(place, flag, str(given), f"a path whose folders are folders ({up} is a file)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(place, flag, str(given), f"a path in a folder that can be created ({folder}: {exc.strerror})") from None


def check_file(path: Path, place: str, flag: str) -> None:
    """`path` can be written as a file: not a folder, its folder exists or can be made, and
    writable (tried, not guessed from permission bits: root ignores those, a read-only mount does not)."""
    if path.is_dir():
        raise ConfigError(place, flag, str(path), "a file path (this is a folder)")
    _folder(path.parent, place, flag, path)
    try:
        if path.exists():
            if not (path.is_file() or path.is_char_device()):
                raise ConfigError(place, flag, str(path), "a regular file path")
            with path.open("r+b"):  # opens for writing without changing it
                pass
        else:
            with path.open("xb"):
                pass
            path.unlink()
    except OSError as exc:
        raise ConfigError(place, flag, str(path), f"a writable file path ({exc.strerror})") from None


def check_folder(path: Path, place: str, flag: str) -> None:
    """`path` is (or can be made) a folder that files can be created in."""
    if path.exists() and not path.is_dir():
        raise ConfigError(place, flag, str(path), "a folder path (this is a file)")
    _folder(path, place, flag, path)
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".pearl-write-check-"):
            pass
    except OSError as exc:
        raise ConfigError(place, flag, str(path), f"a writable folder ({exc.strerror})") from None


def plot_formats() -> list[str]:
    """File extensions matplotlib can write here (pgf only with a TeX engine to run)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backend_bases import FigureCanvasBase

    kinds = set(FigureCanvasBase.get_supported_filetypes())
    if not shutil.which(str(matplotlib.rcParams.get("pgf.texsystem", "xelatex"))):
        kinds.discard("pgf")
    return sorted(kinds)


def check_plot(path: Path, place: str, flag: str) -> None:
    """A plot path with an extension matplotlib writes (without one it would silently add
    `.png` and the reported path would not exist), and writable."""
    kinds = plot_formats()
    ext = path.suffix.lower().lstrip(".")
    if ext not in kinds:
        raise ConfigError(place, flag, str(path), f"a file name ending in one of {', '.join('.' + k for k in kinds)}")
    check_file(path, place, flag)

