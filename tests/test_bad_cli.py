"""Bad traces, flags and output paths end in ONE `pearl: error:` line and exit 2 (issue 16).

Never a traceback, a hang, click's usage box, or a run that computes and then loses its
result; `--json` stays strict JSON and says `"feasible": false` with a reason instead of
null/Infinity. Four parts, run in-process with typer's CliRunner on `runtime.cli.app` (the
same `PearlGroup.main` the `pearl` script runs; one test checks the script and
`python -m runtime.cli` in subprocesses):

- a corpus of bad availability traces under tests/data/bad/traces/ (EXPECTED names the field
  and the allowed text each must report), each given to `pearl simulate --trace`;
- a table of bad flags (framework errors, ranges, policies, backends) and of bad output paths;
- `--json` feasibility: a GPU count too small for the model, an elastic pool that runs dry;
- a hypothesis property: one line or field of a small shipped trace mutated (non-finite, huge,
  negative, wrong type, missing, binary, dropped or doubled) gives either that one error line
  naming the trace, or exit 0 with strict JSON, within CASE_SECONDS.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_cases import Outcome, invoke, one_error, strict_loads
from conftest import REPO_ROOT, pearl_executable

CORPUS = Path(__file__).resolve().parent / "data" / "bad" / "traces"
DEFAULT = str(REPO_ROOT / "configs/experiments/default.yaml")
MIXED = str(REPO_ROOT / "configs/experiments/mixed-elastic.yaml")  # 4 rollout H800 + 12 H20 + 12 A100 elastic, TP1 first
COUNT_TRACE = REPO_ROOT / "data/traces/bamboo/trace--full-64-node-trace/full-64-node-trace.csv"
EVENTS_TRACE = REPO_ROOT / "data/traces/bamboo/events/g4dn-trace.csv"
SKY_TRACE = REPO_ROOT / "data/traces/skypilot/availability/16-node/aws-08-27-2023/us-east-2b_v100_1.json"
CASE_SECONDS = 15  # a refused input answers in ~0.1 s, a 3-minute plan in ~0.2 s; a hang or a runaway allocation takes far longer
# the runs refused for an output path would take 16-60 s if they computed first (alone; more beside the other xdist
# worker, where a refusal that imports matplotlib once took 5.2 s on 2026-12-02); `pearl plan` computes in ~2 s,
# so its work is replaced by a trap instead (test_bad_output_path_fails_before_the_work)
BEFORE_WORK_SECONDS = 8


def pearl(*args: str) -> Outcome:
    return invoke(list(args), CASE_SECONDS)


def strict_json(out: Outcome) -> dict[str, Any]:
    assert out.exit_code == 0 and out.exception is None, (out.exit_code, out.exception, out.stderr[-1500:])
    obj = strict_loads(out.stdout)
    assert isinstance(obj, dict)
    return obj


# ----------------------------------------------------------------------------- the trace corpus
# file -> (field its error names, a substring of what is allowed)
EXPECTED = {
    "binary.csv": ("<file>", "a text trace file"),
    "binary.json": ("<file>", "a text trace file"),
    "nul-byte.csv": ("<file>", "a text trace file"),
    "count-nan.csv": ("line 3", "column 'count': an instance count from 0 to 65536"),
    "count-inf.csv": ("line 4", "column 'count': an instance count from 0 to 65536"),
    "count-huge.csv": ("line 3", "column 'count': an instance count from 0 to 65536"),
    "count-negative.csv": ("line 3", "column 'count'"),
    "time-absurd.csv": ("line 4", "column 'timestamp': a time within 10000 h"),
    "minute-inf.csv": ("line 3", "column 'count'"),
    "delta-huge.csv": ("line 3", "column 'count'"),
    "delta-overflow.csv": ("line 3", "running count stays from 0 to 65536"),
    "delta-nan.csv": ("line 3", "column 'number'"),
    "events-ms-absurd.csv": ("line 3", "column 'ms'"),
    "events-ms-inf.csv": ("line 2", "column 'ms'"),
    "skypilot-nan.json": ("data[2]", "an instance count from 0 to 65536"),
    "skypilot-infinity.json": ("data[2]", "an instance count"),
    "skypilot-huge.json": ("data[2]", "an instance count"),
    "skypilot-overflow.json": ("data[2]", "an instance count"),
    "skypilot-string-count.json": ("data[1]", "an instance count"),
    "skypilot-gap-huge.json": ("metadata.gap_seconds", "from 0.001 to 86400"),
    "skypilot-gap-nan.json": ("metadata.gap_seconds", "from 0.001 to 86400"),
    "skypilot-gap-bool.json": ("metadata.gap_seconds", "from 0.001 to 86400"),
    "skypilot-span.json": ("data", "at most 10000 h"),
    "skypilot-deep.json": ("<json>", "valid JSON"),
}


def test_the_corpus_is_complete() -> None:
    assert sorted(p.name for p in CORPUS.iterdir()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_trace_gives_one_error_naming_file_line_and_field(name: str) -> None:
    m = one_error(pearl("simulate", "--config", DEFAULT, "--trace", str(CORPUS / name), "--hours", "0.05", "--json"))
    field, allowed = EXPECTED[name]
    assert m["place"].endswith(name) and m["field"] == field and allowed in m["allowed"], m.group(0)


def test_a_folder_as_trace_names_it() -> None:
    m = one_error(pearl("simulate", "--config", DEFAULT, "--trace", str(CORPUS), "--hours", "0.05", "--json"))
    assert m["place"] == str(CORPUS) and m["field"] == "trace.path" and "not a folder" in m["allowed"]


# ----------------------------------------------------------------------------- flags
# (argv, place, field, substring of value or allowed)
FLAGS = [
    (["predict", "--config", DEFAULT, "--gpus", "many"], "pearl predict", "--gpus", "an integer from 1 to 65536"),
    (["predict", "--config", DEFAULT, "--gpus", "0"], "pearl predict", "--gpus", "'0'"),
    (["predict", "--config", DEFAULT, "--gpus", "100000000"], "pearl predict", "--gpus", "65536"),
    (["predict", "--config", DEFAULT, "--gpus", "1e3"], "pearl predict", "--gpus", "'1e3'"),
    (["predict", "--config", DEFAULT, "--batch", "-4"], "pearl predict", "--batch", "1000000"),
    (["predict", "--config", DEFAULT, "--gpus"], "pearl predict", "--gpus", "<missing>"),
    (["predict"], "pearl predict", "--config", "required"),
    (["predict", "--config", DEFAULT, "--bogus"], "pearl predict", "<option>", "--bogus"),
    (["predict", "--config", DEFAULT, "8"], "pearl predict", "<arguments>", "'8'"),
    (["predict", "--config", DEFAULT, "--json=yes"], "pearl predict", "--json", "is a switch"),
    (["predictt", "--config", DEFAULT], "pearl", "<command>", "predict"),
    (["simulate", "--config", DEFAULT, "--hours", "0"], "pearl simulate", "--hours", "> 0 and <= 10000"),
    (["simulate", "--config", DEFAULT, "--hours", "inf"], "pearl simulate", "--hours", "finite"),
    (["simulate", "--config", DEFAULT, "--hours", "nan"], "pearl simulate", "--hours", "'nan'"),
    (["simulate", "--config", DEFAULT, "--hours", "1e9"], "pearl simulate", "--hours", "'1e9'"),
    (["simulate", "--config", DEFAULT, "--trace-offset-hours", "-1"], "pearl simulate", "--trace-offset-hours", ">= 0"),
    (["simulate", "--config", DEFAULT, "--hours", "50"], "pearl simulate", "--hours", "the trace spans 5.93 h"),
    (["compare", "--config", DEFAULT, "--trace-offset-hours", "7"], "pearl compare", "--trace-offset-hours", "full-64-node-trace.csv"),
    (["simulate", "--config", MIXED, "--hours", "5000"], "pearl simulate", "--hours", "the trace spans 394.67 h"),  # elastic_traces: still the flag
    (["plan", "--config", DEFAULT, "--out", "/dev/null", "--hours", "9"], "pearl plan", "--hours", "the trace spans 5.93 h"),
    (["simulate", "--config", DEFAULT, "--seed", "-1"], "pearl simulate", "--seed", "4294967295"),
    (["simulate", "--config", DEFAULT, "--policy", "bogus"], "pearl simulate", "--policy", "'bogus'"),
    (["simulate", "--config", DEFAULT, "--policy", "fixed:sideways:1:1:1"], "pearl simulate", "--policy", "fixed:<colocated"),
    (["simulate", "--config", MIXED, "--policy", "fixed:colocated:4:0:0"], "pearl simulate", "--policy", "a layout per GPU type: fixed:<type>="),
    (["simulate", "--config", MIXED, "--policy", "fixed:H20=3D@TP4"], "pearl simulate", "--policy", "at least one prefill (P) and one decode (D)"),
    (["compare", "--config", MIXED, "--policies", "roll,fixed:H800=4P@TP1,H20=4D@TP4"], "pearl compare", "--policies", "fit the 12 H20 GPU(s)"),
    (["sweep", "--config", MIXED, "--set", "costs.transition_weight=0,1", "--policy", "fixed:H800=4P@TP1,H20=1D@TP8"], "pearl sweep", "--policy", "(cluster.tp.decode): [1, 2, 4]"),
    (["simulate", "--config", MIXED, "--policy", "bogus"], "pearl simulate", "--policy", "or fixed:<type>="),
    (["compare", "--config", DEFAULT, "--policies", "roll,fixed:colocated:0:0:0"], "pearl compare", "--policies", "at least one colocated"),
    (["sweep", "--config", DEFAULT, "--set", "costs.transition_weight=0,1", "--policy", "fixed:disaggregated:9:9:0"], "pearl sweep", "--policy", "one decode"),
    (["compare", "--config", DEFAULT, "--policies", "pearl,bogus"], "pearl compare", "--policies", "'bogus'"),
    (["compare", "--config", DEFAULT, "--hours", "-2"], "pearl compare", "--hours", "'-2'"),
    (["sweep", "--config", DEFAULT, "--set", "costs.transition_weight=0,1", "--seeds", "0"], "pearl sweep", "--seeds", "from 1 to 1000"),
    (["sweep", "--config", DEFAULT, "--set", "costs.transition_weight=0,1", "--jobs", "0"], "pearl sweep", "--jobs", "'0'"),
    (["sweep", "--config", DEFAULT, "--set", "costs.transition_weight=0,1", "--mode", "diagonal"], "pearl sweep", "--mode", "'oneway'"),
    (["sweep", "--config", DEFAULT, "--set", "costs.transition_weight=0,1", "--pareto-x", "vibes"], "pearl sweep", "--pareto-x", "'switches'"),
    (["plan", "--config", DEFAULT, "--out", "/dev/null", "--policy", "bogus"], "pearl plan", "--policy", "'bogus'"),
    (["plan", "--config", DEFAULT, "--out", "/dev/null", "--backend", "bogus"], "pearl plan", "--backend", "'cbc'"),
    (["plan", "--config", DEFAULT, "--out", "/dev/null", "--policy", ""], "pearl plan", "--policy", "got ''; allowed: one of ['pearl'"),
    (["simulate", "--config", DEFAULT, "--policy", ""], "pearl simulate", "--policy", "got ''; allowed: one of ['pearl'"),
    (["sweep", "--config", DEFAULT, "--set", "costs.transition_weight=0,1", "--policy", ""], "pearl sweep", "--policy", "got ''; allowed: one of ['pearl'"),
    (["plan", "--config", DEFAULT, "--out", "/dev/null", "--backend", ""], "pearl plan", "--backend", "got ''; allowed: one of ['cpsat'"),
    (["plan", "--config", DEFAULT, "--out", "/dev/null", "--hours", "0"], "pearl plan", "--hours", "'0'"),
    (["train", "--config", DEFAULT, "--steps", "0"], "pearl train", "--steps", "1000000"),
    (["train", "--config", DEFAULT, "--backend", "bogus"], "pearl train", "--backend", "'bogus'"),
    (["train", "--config", DEFAULT, "--backend", ""], "pearl train", "--backend", "got ''; allowed: vllm or emulated"),
]


@pytest.mark.parametrize("argv, place, field, text", FLAGS, ids=[" ".join(a[:1] + a[3:]) for a, *_ in FLAGS])
def test_bad_flag_gives_one_error_naming_the_flag(argv: list[str], place: str, field: str, text: str) -> None:
    m = one_error(pearl(*argv))
    assert (m["place"], m["field"]) == (place, field) and text in m.group(0), m.group(0)


def test_flag_errors_read_the_same_from_the_script_and_python_m() -> None:
    """The console script and `python -m runtime.cli` run the same handler as CliRunner: no box, stderr, exit 2."""
    argv = ["predict", "--config", DEFAULT, "--gpus", "many"]
    expected = one_error(pearl(*argv)).group(0)
    for exe in (pearl_executable(), [sys.executable, "-m", "runtime.cli"]):
        proc = subprocess.run([*exe, *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
        assert (proc.returncode, proc.stdout, proc.stderr.strip()) == (2, "", expected), (exe, proc.stderr)


def test_policy_name_in_a_config_blames_the_config(tmp_path: Path) -> None:
    cfg = tmp_path / "bad-policy.yaml"  # outside an experiments/ folder: names resolve under configs/
    data = yaml.safe_load(Path(DEFAULT).read_text())
    data["policy"] = {"name": "bogus"}
    data["trace"]["path"] = str(REPO_ROOT / data["trace"]["path"])
    cfg.write_text(yaml.safe_dump(data))
    for argv in (["simulate", "--hours", "0.05"], ["plan", "--out", str(tmp_path / "p.json")],
                 ["sweep", "--set", "costs.transition_weight=0,1", "--cache", str(tmp_path / "c"), "--out", str(tmp_path / "s")]):
        m = one_error(pearl(argv[0], "--config", str(cfg), *argv[1:]))
        assert (m["place"], m["field"]) == (str(cfg), "policy.name") and "'bogus'" in m["value"], m.group(0)


def test_a_swept_trace_cap_above_the_elastic_pool_names_the_set(tmp_path: Path) -> None:
    """`--set trace.max_gpus=...` is checked against the elastic pool as the config's own value is."""
    m = one_error(pearl("sweep", "--config", DEFAULT, "--set", "trace.max_gpus=12,500", "--hours", "0.05",
                        "--cache", str(tmp_path / "c"), "--out", str(tmp_path / "s")))
    assert (m["place"], m["field"], m["value"]) == ("--set", "trace.max_gpus", "500") and "at most 12 (the elastic GPUs)" in m["allowed"], m.group(0)


def test_an_emulated_slowdown_with_real_engines_blames_the_backend_flag(tmp_path: Path) -> None:
    """A config that slows its emulated engines, run with `--backend vllm`: the slowdown would be
    ignored, so the flag is refused (the config's own backend is checked when it loads)."""
    cfg = tmp_path / "slowed.yaml"
    data = yaml.safe_load((REPO_ROOT / "configs/experiments/train-mixed-emulated.yaml").read_text())
    data["runtime"]["emulated_slowdown"] = {"H20": 2.0}
    for trace in data["elastic_traces"].values():
        trace["path"] = str(REPO_ROOT / trace["path"])
    cfg.write_text(yaml.safe_dump(data))
    m = one_error(pearl("train", "--config", str(cfg), "--backend", "vllm"))
    assert (m["place"], m["field"]) == ("pearl train", "--backend") and "'vllm'" in m["value"] and "runtime.emulated_slowdown" in m["allowed"], m.group(0)


# ----------------------------------------------------------------------------- output paths
def output_cases(tmp: Path) -> list[tuple[list[str], str, str]]:
    """(argv, flag, allowed substring): each run would compute (or start Ray) for 10-60 s before writing."""
    afile = tmp / "afile"
    afile.write_text("x")
    sweep = ["sweep", "--config", DEFAULT, "--set", "costs.transition_weight=0,1,4", "--hours", "1", "--jobs", "1"]
    return [
        (["plan", "--config", DEFAULT, "--out", str(afile / "plan.json")], "--out", f"{afile} is a file"),
        (["plan", "--config", DEFAULT, "--out", str(tmp)], "--out", "this is a folder"),
        (["plan", "--config", DEFAULT, "--out", "/proc/pearl-plan.json"], "--out", "writable"),
        (["compare", "--config", DEFAULT, "--plot", str(tmp / "c.bogus")], "--plot", ".png"),
        (["compare", "--config", DEFAULT, "--plot", str(tmp / "no-extension")], "--plot", ".svg"),
        (["compare", "--config", DEFAULT, "--plot", str(afile / "c.png")], "--plot", f"{afile} is a file"),
        ([*sweep, "--out", str(tmp / "s"), "--cache", str(afile)], "--cache", "this is a file"),
        ([*sweep, "--cache", str(tmp / "c"), "--out", str(afile)], "--out", "this is a file"),
        ([*sweep, "--cache", str(tmp / "c"), "--out", str(tmp / "s"), "--plot", str(tmp / "s.txt")], "--plot", ".pdf"),
        (["calibrate", "--targets", str(REPO_ROOT / "configs/calibration/paper-8b.yaml"), "--out", str(afile / "w.yaml")], "--out", "is a file"),
        (["train", "--config", DEFAULT, "--backend", "emulated", "--metrics", str(afile / "m.jsonl")], "--metrics", "is a file"),
    ]


def test_bad_output_path_fails_before_the_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.offline_plan

    def planned(*args, **kwargs):
        raise AssertionError("pearl plan planned before it checked --out")

    monkeypatch.setattr(runtime.offline_plan, "plan_over_trace", planned)  # too quick (~2 s) for the clock to tell
    for argv, flag, allowed in output_cases(tmp_path):
        out = pearl(*argv)
        m = one_error(out)
        assert (m["place"], m["field"]) == (f"pearl {argv[0]}", flag) and allowed in m["allowed"], m.group(0)
        assert out.seconds < BEFORE_WORK_SECONDS, (argv, out.seconds)
    assert [p for p in tmp_path.rglob("*") if not p.is_dir()] == [tmp_path / "afile"]  # the checks leave no file behind


# ----------------------------------------------------------------------------- --json feasibility
def test_predict_json_says_which_mode_is_infeasible_and_why() -> None:
    one = strict_json(pearl("predict", "--config", DEFAULT, "--gpus", "1", "--json"))  # TP2: one GPU hosts no instance
    assert one["feasible"] is False and one["best"] is None
    for mode in ("colocated", "disaggregated"):
        assert one[mode]["feasible"] is False and "TP2" in one[mode]["reason"] and one[mode]["completion_s"] is None
    two = strict_json(pearl("predict", "--config", DEFAULT, "--gpus", "2", "--json"))
    assert two["feasible"] is True and two["best"] == "colocated"
    assert two["colocated"]["feasible"] is True and two["colocated"]["reason"] is None
    assert two["disaggregated"]["feasible"] is False and "needs 2" in two["disaggregated"]["reason"]


def test_simulate_compare_plan_json_say_when_the_pool_runs_dry(config_tree: Path, tmp_path: Path) -> None:
    """An elastic-only cluster whose trace drops to 0 instances: no layout exists then."""
    (config_tree / "clusters/elastic-only.yaml").write_text(
        "nodes:\n  - {count: 1, gpus_per_node: 8, gpu: H800, pool: training}\n  - {count: 2, gpus_per_node: 2, gpu: H800, pool: elastic}\n"
        "tp: {colocated: [2], prefill: [2], decode: [2]}\ninter_node_gb_s: 100\nstorage_gb_s: 2.0\n")
    trace = tmp_path / "dry.csv"
    trace.write_text("timestamp,count\n2021-07-26T18:00:00Z,2\n2021-07-26T18:02:00Z,0\n2021-07-26T18:30:00Z,0\n")
    cfg = config_tree / "experiments/dry.yaml"
    cfg.write_text(f"name: dry\nmodel: qwen3-8b\nworkload: paper-8b-calibrated\ncluster: elastic-only\nprofile: h800-qwen3-8b\n"
                   f"trace: {{path: {trace}, format: bamboo-count, gpus_per_instance: 2}}\nseed: 0\n")
    sim = pearl("simulate", "--config", str(cfg), "--hours", "0.05", "--json")
    doc = strict_loads(sim.stdout)
    assert doc["feasible"] is False and "no feasible rollout configuration" in doc["failure"]
    cmp_ = pearl("compare", "--config", str(cfg), "--policies", "pearl,roll", "--hours", "0.05", "--json")
    pols = strict_loads(cmp_.stdout)["policies"]
    assert all(p["feasible"] is False and p["failure"] for p in pols.values())
    # plan cannot skip an event it has no layout for: one error naming the config and the cluster
    m = one_error(pearl("plan", "--config", str(cfg), "--hours", "0.05", "--out", str(tmp_path / "p.json"), "--json"))
    assert m["place"] == str(cfg) and m["field"] == "cluster" and not (tmp_path / "p.json").exists()
    ok = strict_json(pearl("plan", "--config", DEFAULT, "--hours", "0.05", "--out", str(tmp_path / "ok.json"), "--json"))
    assert ok["feasible"] is True and ok["reason"] is None
    strict_loads((tmp_path / "ok.json").read_text())


# ----------------------------------------------------------------------------- property: mutated traces
# Cells no trace column accepts (a node name excepted): non-finite, negative, absurd, not a number or time.
NEVER_OK = ["nan", "NaN", "inf", "-inf", "Infinity", "1e12", "1e308", "1e400", "-5", "-0.5", "many", "", " ", "true", "null",
            "99999999999999999999", "2021-13-45T99:00:00Z", "1900-01-01T00:00:00Z", "9999-12-31T23:59:59Z"]
MAYBE_OK = ["0", "3.5", "2021-07-26T18:44:00Z"]
NEVER_OK_JSON = ["NaN", "Infinity", "-Infinity", "1e400", "1e12", "-1", '"7"', "true", "null", "[]", "{}", "86401"]
BINARY = [b"\xff\xfe", b"\x00", b"\x80abc", bytes(range(256))[:40]]
Mutation = tuple[bytes, bool]  # (file, whether every reader must refuse it)


@st.composite
def bad_cell(draw: st.DrawFn) -> Mutation:
    kind = draw(st.sampled_from(["never", "never", "maybe", "float", "int", "binary"]))
    if kind == "binary":
        return draw(st.sampled_from(BINARY)), True
    if kind == "never":
        return draw(st.sampled_from(NEVER_OK)).encode(), True
    if kind == "maybe":
        return draw(st.sampled_from(MAYBE_OK)).encode(), False
    if kind == "float":
        return repr(draw(st.floats(allow_nan=True, allow_infinity=True))).encode(), False
    return str(draw(st.integers(-10**30, 10**30))).encode(), False


@st.composite
def mutated_csv(draw: st.DrawFn, source: Path, free_column: int | None = None) -> Mutation:
    """The CSV with one line changed: a cell replaced, a cell dropped, the line dropped or doubled, or
    bytes appended. `free_column` takes any text (the events trace's node names)."""
    lines = source.read_bytes().splitlines()
    i = draw(st.integers(0, len(lines) - 1))
    cells = lines[i].split(b",")
    how = draw(st.sampled_from(["replace", "replace", "replace", "drop-cell", "drop-line", "double-line", "append"]))
    must_fail = how in ("drop-cell", "append")
    if how == "replace":
        j = draw(st.integers(0, len(cells) - 1))
        cells[j], must_fail = draw(bad_cell())
        must_fail = must_fail and (j != free_column or cells[j] in BINARY)
    elif how == "drop-cell":
        del cells[draw(st.integers(0, len(cells) - 1))]
    elif how == "append":
        cells[-1] += draw(st.sampled_from(BINARY))
    new = [b",".join(cells)] if how not in ("drop-line", "double-line") else ([] if how == "drop-line" else [lines[i], lines[i]])
    return b"\n".join(lines[:i] + new + lines[i + 1:]) + b"\n", must_fail


@st.composite
def mutated_skypilot(draw: st.DrawFn) -> Mutation:
    """The JSON with one field changed: a sample or gap_seconds replaced or renamed away, or the text cut or spliced with bytes."""
    values = [str(v) for v in json.loads(SKY_TRACE.read_text())["data"][:40]]
    gap, gap_key, data_key = "300", "gap_seconds", "data"
    how = draw(st.sampled_from(["sample", "sample", "gap", "drop-gap", "drop-data", "cut", "binary"]))
    bad = draw(st.sampled_from(NEVER_OK_JSON + ["0.5", "0", "1e-300"]))
    must_fail = how not in ("sample", "gap") or bad in NEVER_OK_JSON or (how == "gap" and bad != "0.5")
    if how == "sample":
        values[draw(st.integers(0, len(values) - 1))] = bad
    elif how == "gap":
        gap = bad
    elif how == "drop-gap":
        gap_key = "gap"
    elif how == "drop-data":
        data_key = "dat"
    text = f'{{"metadata": {{"{gap_key}": {gap}}}, "{data_key}": [{", ".join(values)}]}}'
    if how in ("cut", "binary"):  # a cut object is never valid JSON
        k = draw(st.integers(1, len(text) - 1))
        return text[:k].encode() + (draw(st.sampled_from(BINARY)) if how == "binary" else b""), True
    return text.encode(), must_fail


def check_mutated(tmp_path: Path, name: str, mutation: Mutation) -> None:
    """Exit 2 with one error line naming the trace (always, for a value no trace may hold), or exit
    0 with strict JSON; either within CASE_SECONDS."""
    body, must_fail = mutation
    trace = tmp_path / name
    trace.write_bytes(body)
    out = pearl("plan", "--config", DEFAULT, "--trace", str(trace), "--hours", "0.05", "--out", str(tmp_path / "plan.json"), "--json")
    if out.exit_code == 0 and not must_fail:
        assert strict_json(out)["decisions"] >= 1
        strict_loads((tmp_path / "plan.json").read_text())
    else:
        m = one_error(out)
        assert m["place"] == str(trace), m.group(0)


PROPERTY = settings(max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@PROPERTY
@given(mutation=mutated_csv(COUNT_TRACE))
def test_mutated_count_trace(tmp_path: Path, mutation: Mutation) -> None:
    check_mutated(tmp_path, "count.csv", mutation)


@PROPERTY
@given(mutation=mutated_csv(EVENTS_TRACE, free_column=2))
def test_mutated_events_trace(tmp_path: Path, mutation: Mutation) -> None:
    check_mutated(tmp_path, "events.csv", mutation)


@PROPERTY
@given(mutation=mutated_skypilot())
def test_mutated_skypilot_trace(tmp_path: Path, mutation: Mutation) -> None:
    check_mutated(tmp_path, "sky.json", mutation)


@pytest.mark.parametrize("scale", ["0", "2e6"])
def test_type_speeds_time_scale_range_is_runtime_time_scales(scale: str) -> None:
    """The experiment's --time-scale is refused where the config's runtime.time_scale would be,
    with that field's own range in the one line (the bounds are read from it, not copied)."""
    proc = subprocess.run([sys.executable, "experiments/type_speeds.py", "--time-scale", scale], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (f"type_speeds: --time-scale {float(scale):g}; allowed: a finite number greater than or equal to 0.001 "
                                   "and less than or equal to 1000000 (runtime.time_scale's range)")


@pytest.mark.parametrize(("flag", "value", "allowed"), [("--hours", "0.5", "allowed: 1.5 to 24"), ("--seeds", "0,x", "comma-separated whole numbers")])
def test_mixed_degrees_refuses_a_bad_flag_in_one_line(flag: str, value: str, allowed: str) -> None:
    proc = subprocess.run([sys.executable, "experiments/mixed_degrees.py", flag, value], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and last.startswith(f"mixed_degrees.py: error: argument {flag}: got") and allowed in last, proc.stderr


@pytest.mark.parametrize(("script", "flag"), [(s, "--config") for s in ("bench_planner", "mixed_search_stats", "mixed_kinds", "mixed_why", "pd_crossover",
                                                                         "predictor_vs_sim", "late_returns", "bench_sim", "pd_ratio_table", "mixed_degrees", "wait_tail")]
                         + [("wait_tail", "--mixed-config"), ("wait_tail", "--elastic-config")])
def test_an_experiment_names_a_missing_config_in_one_line(script: str, flag: str, tmp_path: Path) -> None:
    """Until 2026-12-05 each of these raised the config's error as a traceback (experiments/cli_args.load_spec); wait_tail
    reads its three configs before any work."""
    missing = tmp_path / "nope.yaml"
    proc = subprocess.run([sys.executable, f"experiments/{script}.py", flag, str(missing)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == f"{script}: error: {missing}: field '<file>': got '{missing}'; allowed: an existing YAML file"


@pytest.mark.parametrize(("script", "flag", "value", "allowed"), [
    ("bench_planner", "--gpus", "abc", "comma-separated whole numbers"),  # a traceback until 2026-12-05
    ("bench_planner", "--events", "0", "one whole number >= 1"),  # a traceback
    ("bench_planner", "--backends", "cbc,foo", "comma-separated, of cpsat, highs, highspy, cbc, scip, pulp"),  # ran a row labelled foo
    ("bench_planner", "--batch-per-gpu", "0", "one number > 0"),
    ("bench_planner", "--batch-per-gpu", "2,4", "one number > 0"),
    ("mixed_search_stats", "--batch-per-gpu", "0", "one number > 0"),
    ("late_returns", "--factors", "0.5,x", "comma-separated numbers > 0"),
    ("predictor_vs_sim", "--batches", "64,x", "comma-separated whole numbers")])
def test_an_experiments_flag_is_refused_in_one_line(script: str, flag: str, value: str, allowed: str, tmp_path: Path) -> None:
    out = ["--out-dir", str(tmp_path)] if script == "predictor_vs_sim" else ["--out", str(tmp_path / "out.json")]  # a regression writes there, not in results/
    proc = subprocess.run([sys.executable, f"experiments/{script}.py", flag, value, *out], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and last == f"{script}.py: error: argument {flag}: got {value!r}; allowed: {allowed}", proc.stderr
