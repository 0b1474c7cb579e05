"""Real trace files: every format reads, maps to GPUs by config, and bad traces fail with one clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.config import ConfigError, TraceSpec
from runtime.traces import detect_format, load_trace

from conftest import REPO_ROOT

DATA = REPO_ROOT / "data" / "traces"  # shipped with the project (data/README.md)
BAMBOO = DATA / "bamboo"
SPOT = DATA / "skypilot"
ALL = sorted(p for p in DATA.rglob("*") if p.suffix in (".csv", ".json"))


def test_the_real_trace_folders_are_there() -> None:
    assert len(ALL) >= 40, f"expected the real traces under {DATA}"


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(DATA)))
def test_every_real_trace_file_loads(path: Path) -> None:
    tr = load_trace(TraceSpec(path=str(path)))
    assert len(tr.times_s) == len(tr.gpus) >= 1
    assert tr.times_s[0] == 0.0 and all(b > a for a, b in zip(tr.times_s, tr.times_s[1:]))
    assert min(tr.gpus) >= 0 and tr.duration_s > tr.times_s[-1]


def test_format_detection() -> None:
    assert detect_format(BAMBOO / "trace--full-64-node-trace/full-64-node-trace.csv") == "bamboo-count"
    assert detect_format(BAMBOO / "trace--full-64-node-trace/full-64-additions-trace.csv") == "bamboo-delta"
    assert detect_format(BAMBOO / "trace--full-64-node-trace/full-64-terminate-trace.csv") == "bamboo-delta"
    assert detect_format(BAMBOO / "events/p3-trace.csv") == "bamboo-events"
    minute = next((BAMBOO).glob("trace--preempt-trace*/preempt-trace-GroupInServiceInstances.csv"))
    assert detect_format(minute) == "bamboo-minute"
    assert detect_format(SPOT / "availability/16-node/aws-08-27-2023/us-east-2b_v100_1.json") == "skypilot"


def test_bamboo_count_values_and_mapping() -> None:
    path = BAMBOO / "trace--full-64-node-trace/full-64-node-trace.csv"
    raw = load_trace(TraceSpec(path=str(path)))
    assert raw.gpus[:3] == (8, 11, 13)  # 18:42 -> 8, 18:45 -> 11, 18:47 -> 13 instances
    assert raw.times_s[:3] == (0.0, 180.0, 300.0)
    m = load_trace(TraceSpec(path=str(path), gpus_per_instance=2, time_scale=2.0, max_gpus=12, scale_to_pool=True, hours=2.0))
    assert max(m.gpus) == 12 and all(g % 2 == 0 for g in m.gpus)
    assert m.times_s[1] == 90.0 and m.duration_s == 3600.0  # compressed 2x
    clipped = load_trace(TraceSpec(path=str(path), gpus_per_instance=2, max_gpus=12))
    assert max(clipped.gpus) == 12 and clipped.gpus[0] == 12  # 8 instances x 2 GPUs, clipped
    half = load_trace(TraceSpec(path=str(path), sample_fraction=0.5))
    assert half.gpus[:3] == (4, 6, 6)  # round(11 / 2) = 6 (banker's), round(13 / 2) = 6


def test_offset_window_starts_with_the_count_in_force() -> None:
    path = BAMBOO / "trace--full-64-node-trace/full-64-node-trace.csv"
    full = load_trace(TraceSpec(path=str(path)))
    w = load_trace(TraceSpec(path=str(path), offset_hours=1.0, hours=1.0))
    assert w.gpus[0] == full.at(3600.0) and w.duration_s == 3600.0
    assert all(0 <= t < 3600.0 for t in w.times_s)


def test_skypilot_ticks_and_events() -> None:
    path = SPOT / "availability/16-node/aws-08-27-2023/us-east-2b_v100_1.json"
    data = json.loads(path.read_text())
    tr = load_trace(TraceSpec(path=str(path), hours=1.0))
    gap = data["metadata"]["gap_seconds"]
    assert tr.at(0.0) == data["data"][0] and tr.at(3 * gap) == data["data"][3]
    ev = load_trace(TraceSpec(path=str(BAMBOO / "events/p3-trace.csv")))
    assert ev.gpus[:2] == (18, 19) and ev.times_s[1] == 60.0  # 18 nodes added at ms 0, node19 at 60 s
    adds = load_trace(TraceSpec(path=str(BAMBOO / "trace--full-64-node-trace/full-64-additions-trace.csv")))
    assert adds.gpus[:3] == (3, 5, 9) and list(adds.gpus) == sorted(adds.gpus)  # +3, +2, +4: additions only grow


@pytest.mark.parametrize(
    "content, suffix, field",
    [
        ("", ".csv", "<file>"),
        ("timestamp,count\n", ".csv", "<rows>"),
        ("timestamp,count\n2021-07-26T18:42:00Z,eight\n", ".csv", "line 2"),
        ("timestamp,count\nyesterday,3\n", ".csv", "line 2"),
        ("foo,bar\n1,2\n", ".csv", "<header>"),
        ('{"metadata": {"gap_seconds": 300}, "data": []}', ".json", "data"),
        ('{"metadata": {}, "data": [1]}', ".json", "metadata.gap_seconds"),
        ("{not json", ".json", "<json>"),
        ("0,add,node1\n5,explode,node1\n", ".csv", "line 2"),
    ],
)
def test_malformed_or_empty_traces_raise_one_clear_error(tmp_path: Path, content: str, suffix: str, field: str) -> None:
    p = tmp_path / f"bad{suffix}"
    p.write_text(content)
    with pytest.raises(ConfigError) as exc:
        load_trace(TraceSpec(path=str(p)))
    assert exc.value.field == field and str(p) in str(exc.value) and "\n" not in str(exc.value)


def test_missing_and_too_short() -> None:
    with pytest.raises(ConfigError, match="an existing trace file"):
        load_trace(TraceSpec(path="/nonexistent/trace.csv"))
    path = str(BAMBOO / "trace--full-64-node-trace/full-64-node-trace.csv")
    with pytest.raises(ConfigError, match=r"trace spans 5\.\d+ h"):
        load_trace(TraceSpec(path=path, hours=7.0))
    with pytest.raises(ConfigError, match="offset_hours"):
        load_trace(TraceSpec(path=path, offset_hours=6.0, hours=1.0))
    with pytest.raises(ConfigError, match="trace.hours"):
        load_trace(TraceSpec(path=path, offset_hours=5.0, hours=1.0))


@pytest.mark.parametrize("path, forced, own", [
    (SPOT / "availability/16-node/aws-08-27-2023/us-west-2a_v100_1.json", "bamboo-count", "skypilot"),
    (BAMBOO / "trace--full-64-node-trace/full-64-node-trace.csv", "bamboo-events", "bamboo-count"),
], ids=["skypilot-as-bamboo-count", "bamboo-count-as-events"])
def test_a_forced_format_the_file_is_not_in_blames_the_format(path: Path, forced: str, own: str) -> None:
    """A real file read as another format once failed on its rows (`<rows>: at least one
    time,count row`), sending the user to a file that is fine; the mistake is `format`."""
    with pytest.raises(ConfigError) as exc:
        load_trace(TraceSpec(path=str(path), format=forced))  # type: ignore[arg-type]
    err = exc.value
    assert err.field == "trace.format" and err.value == forced and f"'{own}' or 'auto'" in err.allowed, str(err)
    assert load_trace(TraceSpec(path=str(path), format=own)).gpus  # its own format reads


def test_a_broken_file_in_its_forced_format_still_names_the_row(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("timestamp,count\n2021-07-26T18:42:00Z,eight\n")
    with pytest.raises(ConfigError) as exc:
        load_trace(TraceSpec(path=str(p), format="bamboo-count"))
    assert exc.value.field == "line 2", str(exc.value)
