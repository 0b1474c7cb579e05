"""Bad YAML configs end in ONE `pearl: error:` line and exit 2: never a traceback, a hang or a silent number (issue 16).

Two halves, both through the real CLI in-process (typer's CliRunner on `runtime.cli.app`,
`pearl predict --json`, the cheapest command that loads and builds a whole experiment):

- a corpus of bad files under tests/data/bad/config/<kind>/, each placed into a copy of
  configs/ (an experiment as itself, a workload or cluster named by a cpu-tiny experiment,
  hardware/ and llms/ files as hardware.yaml and llms.yaml); the first line of a text case
  says `# field: <field>`, the field its error must name (binary files and directories: `<file>`);
- a hypothesis property: one field of a valid config tree mutated to a bad value (non-finite,
  huge, negative, wrong type, missing, boolean, a duplicated key, binary, a directory) gives
  either that one error line naming the mutated file, or exit 0 with strict JSON.

Each case runs under a wall-clock alarm, so a hang fails the test instead of stalling it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_cases import Outcome, invoke, one_error, strict_loads
from conftest import CONFIGS

CORPUS = Path(__file__).resolve().parent / "data" / "bad" / "config"
CASE_SECONDS = 10  # one predict on the tiny config takes ~0.05 s; a hang or a runaway allocation takes far longer
BASE_EXPERIMENT = {"name": "case", "model": "tiny", "workload": "cpu-tiny", "cluster": "cpu-2", "profile": "cpu-tiny"}


def predict(config: Path) -> Outcome:
    return invoke(["predict", "--config", str(config), "--json"], CASE_SECONDS)


def assert_one_error(out: Outcome, file: Path, field: str | None) -> str:
    """One clear error (cli_cases.one_error) naming `file` (and `field`)."""
    line = one_error(out).string
    assert file.name in line, (file.name, line)
    if field is not None:
        assert f"field '{field}'" in line, (field, line)
    return line


# ----------------------------------------------------------------------------- corpus
def corpus_cases() -> list[Path]:
    return sorted(p for kind in ("experiments", "workloads", "clusters", "hardware", "llms") for p in (CORPUS / kind).iterdir())


def expected_field(case: Path) -> str:
    if case.is_dir():
        return "<file>"
    try:
        first = case.read_text().splitlines()[0]
    except UnicodeDecodeError:
        return "<file>"
    assert first.startswith("# field: "), f"{case}: the first line must say '# field: <field>'"
    return first.removeprefix("# field: ")


def place(case: Path, tree: Path) -> tuple[Path, Path]:
    """Put a corpus case into the config tree: (the experiment to run, the file its error must name)."""
    kind = case.parent.name
    target = {"hardware": tree / "hardware.yaml", "llms": tree / "llms.yaml"}.get(kind, tree / kind / case.name)
    if target.exists():
        target.unlink()
    (shutil.copytree if case.is_dir() else shutil.copyfile)(case, target)
    if kind == "experiments":
        return target, target
    experiment = tree / "experiments" / "case.yaml"
    ref = {"workloads": {"workload": case.stem}, "clusters": {"cluster": case.stem}}.get(kind, {})
    experiment.write_text(yaml.safe_dump({**BASE_EXPERIMENT, **ref}))
    return experiment, target


def test_corpus_is_complete() -> None:
    """Every family of issue 16's config list has a case (the property test then roams around them)."""
    names = {p.name for p in corpus_cases()}
    for needed in ("binary.yaml", "is-a-directory.yaml", "duplicate-model.yaml", "inf-cost-weight.yaml", "huge-time-limit.yaml",
                   "bool-seed.yaml", "budget-below-prompt.yaml", "no-rollout-pool.yaml", "tp-leaves-gpus-idle.yaml",
                   "profile-other-model.yaml", "profile-other-gpu.yaml", "million-nodes.yaml", "ten-million-batch.yaml"):
        assert needed in names, needed


@pytest.mark.parametrize("case", corpus_cases(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_corpus_case_gives_one_error_line(case: Path, config_tree: Path) -> None:
    experiment, named = place(case, config_tree)
    assert_one_error(predict(experiment), named, expected_field(case))


# ----------------------------------------------------------------------------- property
# The valid tree the property test mutates: the tiny CPU experiment with every section set
# (so costs, solver, trace, training and runtime fields are mutated too) and a workload
# with spread, not only constants.
FULL_EXPERIMENT: dict[str, Any] = {
    **BASE_EXPERIMENT,
    "workload": "case",
    "cluster": "case",
    "profile_by_engines": {2: {"colocated": "cpu-tiny-served-x2", "disaggregated": "cpu-tiny-served-pd"}},
    "costs": {"transition_weight": 1.0, "ratio_change_margin": 0.03, "mode_switch_margin": 0.08, "borrow_threshold_s": 0.0,
              "horizon_batches": 4.0, "background_weight": 0.1},
    "transition_costs": {"expand_prepare_s": 30.0, "engine_start_s": 20.0, "role_switch_s": 25.0},
    "solver": {"backend": "cbc", "time_limit_s": 1.0, "workers": 2, "relative_gap": 0.0, "exact_backend": "cpsat", "slot_pricing": False},
    "training": {"mfu": 0.35, "staleness": 1, "optimizer_overhead_s": 5.0},
    "trace": {"path": "data/traces/bamboo/trace--full-64-node-trace/full-64-node-trace.csv", "format": "bamboo-count",
              "gpus_per_instance": 1, "time_scale": 9.0, "max_gpus": 2, "offset_hours": 0.0, "hours": 2.0, "sample_fraction": 1.0},
    # no runtime.elastic_events: beside `trace` they are refused (corpus: experiments/million-elastic-gpus.yaml)
    "runtime": {"backend": "emulated", "steps": 3, "max_model_len": 1024, "time_scale": 40.0, "max_restarts_per_slot": 3,
                "restart_backoff_s": 1.0, "load_changes": [{"at_step": 2, "workload": {"trajectories_per_batch": 16}}]},
    "seed": 0,
}
FULL_WORKLOAD: dict[str, Any] = {
    "trajectories_per_batch": 8,
    "group_size": 4,
    "turns": {"kind": "lognormal", "mean": 3.0, "cv": 0.5, "min": 1.0, "max": 6.0},
    "initial_prompt_tokens": {"kind": "constant", "mean": 96.0},
    "new_tokens_per_turn": {"kind": "uniform", "min": 16.0, "max": 48.0},
    "response_tokens_per_turn": {"kind": "normal", "mean": 32.0, "cv": 0.2, "min": 8.0},
    "env_latency_s": {"kind": "exponential", "mean": 0.3, "max": 3.0},
    "max_trajectory_tokens": 1024,
    "prefix_cache_hit": 0.5,
}
# cpu-2 plus an elastic group for the trace to drive (a trace's max_gpus may not exceed the elastic GPUs)
CPU_2 = yaml.safe_load((CONFIGS / "clusters" / "cpu-2.yaml").read_text())
# file (relative to the tree) -> its valid content
FILES: dict[str, dict[str, Any]] = {
    "experiments/full.yaml": FULL_EXPERIMENT,
    "workloads/case.yaml": FULL_WORKLOAD,
    "clusters/case.yaml": {**CPU_2, "nodes": [*CPU_2["nodes"], {"count": 1, "gpus_per_node": 2, "gpu": "cpu", "pool": "elastic"}]},
    "hardware.yaml": yaml.safe_load((CONFIGS / "hardware.yaml").read_text()),
    "llms.yaml": yaml.safe_load((CONFIGS / "llms.yaml").read_text()),
}

FieldPath = tuple[Any, ...]


def leaves(data: Any, prefix: FieldPath = ()) -> list[FieldPath]:
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in leaves(v, (*prefix, k))]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in leaves(v, (*prefix, i))]
    return [prefix]


LEAVES = [(rel, path) for rel, data in FILES.items() for path in leaves(data)]
BAD_VALUES: dict[str, list[Any]] = {
    "non-finite": [float("inf"), float("-inf"), float("nan")],
    "huge": [1e308, 10**12, 2**64, 100_000_000],
    "negative": [-1, -1e-9, -(10**9)],
    "wrong type": ["many", [1], {"a": 1}, None, "1e400"],
    "bool": [True, False],
}
KINDS = [*BAD_VALUES, "missing", "duplicate", "binary", "directory"]


def _set(data: Any, path: FieldPath, value: Any) -> None:
    for p in path[:-1]:
        data = data[p]
    data[path[-1]] = value


def _delete(data: Any, path: FieldPath) -> None:
    for p in path[:-1]:
        data = data[p]
    del data[path[-1]]


def mutate(file: Path, original: dict[str, Any], path: FieldPath, kind: str, value: Any) -> None:
    """Write `file` as `original` with one mutation of the field at `path`."""
    data = yaml.safe_load(yaml.safe_dump(original))  # a deep copy
    if kind == "binary":
        file.write_bytes(b"\x00\x9f\x92\x96 not text \xff\xfe" * 8)
    elif kind == "directory":
        file.unlink()
        file.mkdir()
    elif kind == "duplicate":
        # the top-level key again, with another value: PyYAML alone would keep the second silently
        top = path[0]
        file.write_text(yaml.safe_dump(data, sort_keys=False) + yaml.safe_dump({top: value}, sort_keys=False))
    else:
        if kind == "missing":
            _delete(data, path)
        else:
            _set(data, path, value)
        file.write_text(yaml.safe_dump(data, sort_keys=False))


def restore(file: Path, original: dict[str, Any]) -> None:
    if file.is_dir():
        shutil.rmtree(file)
    file.write_text(yaml.safe_dump(original, sort_keys=False))


@pytest.fixture(scope="module")
def valid_tree() -> Iterator[Path]:
    """A copy of configs/ holding FILES; the full experiment predicts fine (exit 0, strict JSON)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "configs"
        shutil.copytree(CONFIGS, tree)
        for rel, data in FILES.items():
            (tree / rel).write_text(yaml.safe_dump(data, sort_keys=False))
        out = predict(tree / "experiments/full.yaml")
        assert out.exit_code == 0 and out.exception is None, out.stderr
        strict_loads(out.stdout)
        yield tree


@st.composite
def mutations(draw: st.DrawFn) -> tuple[str, FieldPath, str, Any]:
    rel, path = draw(st.sampled_from(LEAVES))
    kind = draw(st.sampled_from(KINDS))
    value = draw(st.sampled_from(BAD_VALUES[kind])) if kind in BAD_VALUES else draw(st.sampled_from([v for vs in BAD_VALUES.values() for v in vs]))
    return rel, path, kind, value


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=mutations())
def test_one_bad_field_gives_one_error_or_a_clean_result(valid_tree: Path, case: tuple[str, FieldPath, str, Any]) -> None:
    rel, path, kind, value = case
    file = valid_tree / rel
    try:
        mutate(file, FILES[rel], path, kind, value)
        out = predict(valid_tree / "experiments/full.yaml")
    finally:
        restore(file, FILES[rel])
    assert not isinstance(out.exception, Exception), f"uncaught {out.exception!r} for {rel}:{path} = {value!r} ({kind})"
    if out.exit_code == 0:
        assert kind not in ("non-finite", "binary", "directory", "duplicate"), (rel, path, kind, value)
        strict_loads(out.stdout)
        return
    assert_one_error(out, file, None)


def test_property_would_catch_a_silent_bool(valid_tree: Path) -> None:
    """The property's oracle is not vacuous: a boolean batch size is refused, not read as 1."""
    file = valid_tree / "workloads/case.yaml"
    try:
        mutate(file, FULL_WORKLOAD, ("trajectories_per_batch",), "bool", True)
        out = predict(valid_tree / "experiments/full.yaml")
    finally:
        restore(file, FULL_WORKLOAD)
    assert "trajectories_per_batch" in assert_one_error(out, file, "trajectories_per_batch")
