"""Real spot-instance traces -> elastic GPU availability over time.

Formats (auto-detected from the file; `TraceSpec.format` may force one):
  skypilot       JSON {"metadata": {"gap_seconds": G}, "data": [n0, n1, ...]}: n_i instances at i*G s
  bamboo-count   CSV `timestamp,count` (ISO UTC, irregular): instances in service from that time
  bamboo-minute  CSV `time,count` ("YYYY-mm-dd HH:MM:SS", float counts, every minute)
  bamboo-delta   CSV of instance changes: `,timestamp,dt,count` (additions, +),
                 `timestamp,number` (terminations, -), `,dt,count` (found preemptions, -);
                 count = initial_instances +/- running sum (never below 0). Rows are sorted
                 by time (the Bamboo terminate file has a few rows out of order).
  bamboo-events  CSV rows `ms,add|remove,nodeN`: count = nodes added minus removed so far

Mapping to GPUs (models.config.TraceSpec; the mapping is config, never code):
  window      [offset_hours, offset_hours + hours) of trace time (the whole trace if hours unset);
              the count in force at the window start is the first sample
  instances   round(count * sample_fraction)
  GPUs        instances * gpus_per_instance; with scale_to_pool the window's peak is rescaled to
              the elastic pool (max_gpus if set, else the pool size) in whole instances;
              finally clipped to max_gpus
  time        (trace time - window start) / time_scale
A trace that is missing, a folder, binary, malformed, empty or shorter than the window, or
holds a non-finite or out-of-range count or time (bounds: MAX_COUNT, MAX_SPAN_S, MAX_GAP_S),
raises ConfigError naming the file and the line (JSON: the field) and the allowed range.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from models.config import MAX_GPUS, MAX_HOURS, ConfigError, TraceSpec

FORMATS = ("skypilot", "bamboo-count", "bamboo-minute", "bamboo-delta", "bamboo-events")
_EVENT_ROW = re.compile(r"^\s*\d+\s*,\s*(add|remove)\s*,\s*\S+\s*$")
# Bounds on what a trace may say: no real trace comes near them (the shipped ones: <= 64
# instances, <= 1,100 h, <= 200 KB), but one absurd row would otherwise rescale or stretch
# the whole trace silently, or reach int() as inf.
MAX_COUNT = MAX_GPUS  # instances in one sample (the config's bound on any GPU or instance count)
MAX_SPAN_S = MAX_HOURS * 3600.0  # from the trace's first time to its last
MAX_GAP_S = 86_400.0  # skypilot: seconds between samples
MAX_BYTES = 64 * 2**20
_COUNT = f"an instance count from 0 to {MAX_COUNT}"
_SPAN = f"within {MAX_HOURS:g} h of the trace's other rows"


@dataclass(frozen=True)
class AvailabilityTrace:
    """Elastic GPUs available from times_s[i] (seconds from the window start) until times_s[i+1]."""

    times_s: tuple[float, ...]
    gpus: tuple[int, ...]
    source: str
    duration_s: float

    def at(self, t_s: float) -> int:
        i = int(np.searchsorted(np.asarray(self.times_s), t_s, side="right")) - 1
        return self.gpus[max(i, 0)]

    def changes(self) -> list[tuple[float, int]]:
        """(time, gpus) at the start and wherever the GPU count changes."""
        out: list[tuple[float, int]] = []
        for t, g in zip(self.times_s, self.gpus):
            if not out or g != out[-1][1]:
                out.append((t, g))
        return out

    def mean_gpus(self) -> float:
        """Time-weighted mean over the window."""
        t = np.asarray(self.times_s + (self.duration_s,))
        return float(np.sum(np.diff(t) * np.asarray(self.gpus)) / max(self.duration_s, 1e-9))


@dataclass(frozen=True)
class RawTrace:
    """Instance counts over trace time (seconds from the trace's first sample)."""

    times_s: np.ndarray
    counts: np.ndarray
    end_s: float  # the trace covers [0, end_s)


Row = tuple[int, list[str]]  # (line number in the file, cells)


def _bad(path: Path, where: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(path, where, value, allowed)


def _text(path: Path) -> str:
    """The file as text; a binary, unreadable or oversized file is one ConfigError (not a
    UnicodeDecodeError or csv.Error halfway through a reader)."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise _bad(path, "<file>", f"{size} bytes", f"a trace file of at most {MAX_BYTES // 2**20} MiB")
        data = path.read_bytes()
    except OSError as exc:
        raise _bad(path, "trace.path", str(path), f"a readable trace file ({exc.strerror})") from None
    if b"\x00" not in data:
        try:
            return data.decode("utf-8-sig")
        except UnicodeDecodeError:
            pass
    raise _bad(path, "<file>", "binary data", f"a text trace file (CSV or JSON; formats {list(FORMATS)})")


def _detect(path: Path, text: str) -> str:
    if path.suffix.lower() == ".json":
        return "skypilot"
    head = text.lstrip().split("\n", 1)[0].strip().lower().replace(" ", "")
    if head == "timestamp,count":
        return "bamboo-count"
    if head == "time,count":
        return "bamboo-minute"
    if head in (",timestamp,dt,count", "timestamp,number", ",dt,count"):
        return "bamboo-delta"
    if _EVENT_ROW.match(head):
        return "bamboo-events"
    if head.startswith("{"):
        return "skypilot"
    raise _bad(path, "<header>", head[:60], f"a known trace header (formats {list(FORMATS)})")


def detect_format(path: Path) -> str:
    return _detect(path, _text(path))


def _parse_time(path: Path, line: int, text: str, column: str) -> float:
    s = text.strip().replace("Z", "+00:00")
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        raise _bad(path, f"line {line}", text, f"column '{column}': a timestamp like 2021-07-26T18:42:00Z") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def _number(path: Path, line: int, text: str, column: str, hi: float = MAX_COUNT, allowed: str = _COUNT) -> float:
    """A finite number in [0, hi] from one cell; the error names the line and the column."""
    try:
        v = float(text)
    except ValueError:
        raise _bad(path, f"line {line}", text, f"column '{column}': {allowed}") from None
    if not (math.isfinite(v) and 0 <= v <= hi):
        raise _bad(path, f"line {line}", text, f"column '{column}': {allowed}")
    return v


def _check_span(path: Path, times: list[float], lines: list[int], cells: list[str], column: str) -> None:
    """All times within MAX_SPAN_S of each other; else blame the row farthest from the median
    (one absurd time, a year 1900 or ms 1e30, would stretch the trace)."""
    t = np.asarray(times, dtype=float)
    if t.size and float(t.max() - t.min()) > MAX_SPAN_S:
        i = int(np.argmax(np.abs(t - np.median(t))))
        raise _bad(path, f"line {lines[i]}", cells[i], f"column '{column}': a time {_SPAN}")


def _rows(path: Path, text: str) -> list[Row]:
    reader = csv.reader(io.StringIO(text, newline=""))
    out: list[Row] = []
    try:
        for r in reader:
            if r and any(c.strip() for c in r):
                out.append((reader.line_num, r))
    except csv.Error as exc:
        raise _bad(path, f"line {reader.line_num}", str(exc)[:60], "well-formed CSV") from None
    return out


def _from_points(times: list[float], counts: list[float], tail_s: float) -> RawTrace:
    t = np.asarray(times, dtype=float)
    order = np.argsort(t, kind="stable")
    t, c = t[order], np.asarray(counts, dtype=float)[order]
    t0 = t[0]
    t = t - t0
    return RawTrace(t, c, float(t[-1] + tail_s))


def read_skypilot(path: Path, text: str) -> RawTrace:
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise _bad(path, "<json>", str(exc)[:60], "valid JSON {\"metadata\": {\"gap_seconds\": G}, \"data\": [...]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("metadata"), dict):
        raise _bad(path, "metadata", type(data).__name__, "an object with metadata.gap_seconds")
    gap = data["metadata"].get("gap_seconds")
    if not _is_number(gap) or not 1e-3 <= gap <= MAX_GAP_S:
        raise _bad(path, "metadata.gap_seconds", gap, f"a number of seconds from 0.001 to {MAX_GAP_S:g}")
    vals = data.get("data")
    if not isinstance(vals, list):
        raise _bad(path, "data", type(vals).__name__, "a list of instance counts")
    if not vals:
        raise _bad(path, "data", "[]", "at least one sample")
    for i, v in enumerate(vals):
        if not _is_number(v) or not 0 <= v <= MAX_COUNT:
            raise _bad(path, f"data[{i}]", v, _COUNT)
    n = len(vals)
    if n * float(gap) > MAX_SPAN_S:
        raise _bad(path, "data", f"{n} samples every {gap:g} s", f"a trace of at most {MAX_HOURS:g} h")
    return RawTrace(np.arange(n) * float(gap), np.asarray(vals, dtype=float), n * float(gap))


def _is_number(v: object) -> bool:
    """A finite JSON number (Python's json reads NaN, Infinity and 1e400 as floats; true/false as bools)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_count_csv(path: Path, text: str, tail_s: float) -> RawTrace:
    rows = _rows(path, text)
    head = [c.strip().lower() for c in rows[0][1]] if rows else []
    tname, cname = head if len(head) == 2 else ("time", "count")  # the columns as the file names them
    rows = rows[1:]
    if not rows:
        raise _bad(path, "<rows>", "none", "at least one `time,count` row after the header")
    times, counts, lines, cells = [], [], [], []
    for i, r in rows:
        if len(r) != 2:
            raise _bad(path, f"line {i}", ",".join(r), "two columns: time,count")
        times.append(_parse_time(path, i, r[0], tname))
        counts.append(_number(path, i, r[1], cname))
        lines.append(i)
        cells.append(r[0])
    _check_span(path, times, lines, cells, tname)
    return _from_points(times, counts, tail_s)


def read_delta_csv(path: Path, text: str, initial: int | None) -> RawTrace:
    rows = _rows(path, text)
    if not rows:
        raise _bad(path, "<rows>", "none", "a header and at least one change row")
    header = [c.strip().lower() for c in rows[0][1]]
    body = rows[1:]
    if not body:
        raise _bad(path, "<rows>", "none", "at least one change row after the header")
    if header == ["", "timestamp", "dt", "count"]:
        sign, tcol, ccol = 1.0, 1, 3
    elif header == ["timestamp", "number"]:
        sign, tcol, ccol = -1.0, 0, 1
    elif header == ["", "dt", "count"]:
        sign, tcol, ccol = -1.0, 1, 2
    else:
        raise _bad(path, "<header>", ",".join(rows[0][1]), "`,timestamp,dt,count`, `timestamp,number` or `,dt,count`")
    if initial is not None and not 0 <= initial <= MAX_COUNT:
        raise _bad(path, "trace.initial_instances", initial, _COUNT)
    times, deltas, lines, cells = [], [], [], []
    for i, r in body:
        if len(r) != len(header):
            raise _bad(path, f"line {i}", ",".join(r), f"{len(header)} columns like the header")
        times.append(_parse_time(path, i, r[tcol], header[tcol]))
        deltas.append(sign * _number(path, i, r[ccol], header[ccol]))
        lines.append(i)
        cells.append(r[tcol])
    _check_span(path, times, lines, cells, header[tcol])
    order = np.argsort(times, kind="stable")
    d = np.asarray(deltas)[order]
    start = initial if initial is not None else (0 if sign > 0 else int(-d.sum()))
    counts = np.maximum(start + np.cumsum(d), 0.0)
    if start > MAX_COUNT or counts.max() > MAX_COUNT:
        k = int(np.argmax(counts > MAX_COUNT)) if counts.max() > MAX_COUNT else 0
        raise _bad(path, f"line {lines[int(order[k])]}", f"{max(start, float(counts.max())):g} instances in all",
                   f"changes whose running count stays from 0 to {MAX_COUNT}")
    t = np.asarray(times)[order]
    return RawTrace(t - t[0], counts, float(t[-1] - t[0] + 60.0))  # the trace starts at its first change


def read_events_csv(path: Path, text: str) -> RawTrace:
    rows = _rows(path, text)
    if not rows:
        raise _bad(path, "<rows>", "none", "at least one `ms,add|remove,node` row")
    alive: set[str] = set()
    times: list[float] = []
    counts: list[int] = []
    parsed = []
    for i, r in rows:
        if len(r) != 3 or r[1].strip() not in ("add", "remove"):
            raise _bad(path, f"line {i}", ",".join(r), "`ms,add|remove,nodeN`")
        ms = _number(path, i, r[0], "ms", hi=MAX_SPAN_S * 1000.0, allowed=f"milliseconds from 0 to {MAX_SPAN_S * 1000.0:.0f}")
        parsed.append((ms, r[1].strip(), r[2].strip(), i))
    parsed.sort(key=lambda e: e[0])
    for ms, kind, node, line in parsed:
        (alive.add if kind == "add" else alive.discard)(node)
        if len(alive) > MAX_COUNT:
            raise _bad(path, f"line {line}", node, f"at most {MAX_COUNT} nodes up at once")
        if times and times[-1] == ms / 1000.0:
            counts[-1] = len(alive)
        else:
            times.append(ms / 1000.0)
            counts.append(len(alive))
    t = np.asarray(times)
    if t[0] > 0:  # nothing was up before the first event
        t, counts = np.concatenate([[0.0], t]), [0] + counts
    return RawTrace(t, np.asarray(counts, dtype=float), float(t[-1] + 60.0))


def read_raw(path: Path, fmt: str = "auto", initial: int | None = None) -> RawTrace:
    if path.is_dir():
        raise _bad(path, "trace.path", str(path), "a trace file, not a folder (shipped ones: data/traces/)")
    if not path.is_file():
        raise _bad(path, "trace.path", str(path), "an existing trace file (shipped ones: data/traces/)")
    text = _text(path)
    if not text.strip():
        raise _bad(path, "<file>", "empty", "a non-empty trace file")
    if fmt == "auto":
        return _read_as(path, text, _detect(path, text), initial)
    try:
        return _read_as(path, text, fmt, initial)
    except ConfigError as exc:
        own = _own_format(path, text)
        if own is None or own == fmt:
            raise
        # the file is fine in its own format: the forced one is the mistake, not the rows it found
        raise _bad(path, "trace.format", fmt, f"'{own}' or 'auto' for this file (read as '{fmt}': {exc.field}: {exc.allowed})") from None


def _own_format(path: Path, text: str) -> str | None:
    """The format `auto` detects and reads the file as, else None."""
    try:
        own = _detect(path, text)
        _read_as(path, text, own, None)
    except ConfigError:
        return None
    return own


def _read_as(path: Path, text: str, fmt: str, initial: int | None) -> RawTrace:
    if fmt == "skypilot":
        return read_skypilot(path, text)
    if fmt in ("bamboo-count", "bamboo-minute"):
        return read_count_csv(path, text, tail_s=60.0)
    if fmt == "bamboo-delta":
        return read_delta_csv(path, text, initial)
    if fmt == "bamboo-events":
        return read_events_csv(path, text)
    raise _bad(path, "trace.format", fmt, f"one of {['auto', *FORMATS]}")


def load_trace(spec: TraceSpec, pool_gpus: int | None = None, offset_hours: float | None = None, hours: float | None = None) -> AvailabilityTrace:
    """Read `spec.path` and map it to elastic GPUs over the requested window (CLI flags override)."""
    path = Path(spec.path)
    raw = read_raw(path, spec.format, spec.initial_instances)
    off = (spec.offset_hours if offset_hours is None else offset_hours) * 3600.0
    span = spec.hours if hours is None else hours
    end = raw.end_s if span is None else off + span * 3600.0
    if off >= raw.end_s:
        raise _bad(path, "trace.offset_hours", off / 3600.0, f"< {raw.end_s / 3600.0:.2f} (the trace spans {raw.end_s / 3600.0:.2f} h)")
    if end > raw.end_s + 1e-6:
        raise _bad(path, "trace.hours", span, f"<= {(raw.end_s - off) / 3600.0:.2f} from offset {off / 3600.0:g} h (the trace spans {raw.end_s / 3600.0:.2f} h)")
    i0 = max(int(np.searchsorted(raw.times_s, off, side="right")) - 1, 0)
    inside = (raw.times_s > off) & (raw.times_s < end)
    t = np.concatenate([[off], raw.times_s[inside]]) - off
    c = np.concatenate([[raw.counts[i0]], raw.counts[inside]])
    inst = np.round(c * spec.sample_fraction)
    gpus = inst * spec.gpus_per_instance
    if spec.scale_to_pool:
        pool = spec.max_gpus or pool_gpus
        if pool is None:
            raise _bad(path, "trace.scale_to_pool", True, "max_gpus set, or an elastic pool in the cluster")
        peak = float(inst.max())
        if peak > 0:
            gpus = np.round(inst / peak * (pool // spec.gpus_per_instance)) * spec.gpus_per_instance
    if spec.max_gpus is not None:
        gpus = np.minimum(gpus, spec.max_gpus)
    ts = tuple(float(x) / spec.time_scale for x in t)
    return AvailabilityTrace(ts, tuple(int(g) for g in gpus), str(path), (end - off) / spec.time_scale)
