"""`pearl calibrate --logs`: fitting a workload to per-trajectory JSONL logs.

Trajectories are drawn from a known workload with the simulator's own sampler, written with
the run's writer, fitted, and the fit must recover the workload; the rendered YAML must load
back through the config loader; bad logs must give one ConfigError naming file, line, field.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import yaml

from models.config import CONFIG_ROOT, ConfigError, WorkloadSpec, load_experiment
from runtime.calibration.from_logs import fit_workload, workload_yaml
from runtime.calibration.workload_file import DIST_FIELDS
from runtime.calibration.trajectory_log import TrajectoryLogWriter, TrajectoryRecord, log_path_for, read_records
from runtime.sim.workload import TrajectorySampler

SWE = WorkloadSpec.model_validate(yaml.safe_load((CONFIG_ROOT / "workloads" / "swe-agentic.yaml").read_text()))


def write_sampled(path: Path, w: WorkloadSpec, n: int, seed: int = 0, batch: int = 64, group: int = 16) -> list[TrajectoryRecord]:
    """n trajectories of `w` as the sampler plans them; truncated = the token budget cut turns
    (found by drawing the same trajectories again with no budget)."""
    capped = TrajectorySampler(w, np.random.default_rng(seed)).sample(n)
    free = TrajectorySampler(w.model_copy(update={"max_trajectory_tokens": 10**12}), np.random.default_rng(seed)).sample(n)
    recs = [
        TrajectoryRecord(turns=p.turns, initial_prompt_tokens=p.new_tokens[0], new_tokens=p.new_tokens[1:], response_tokens=p.response_tokens,
                         env_latency_s=p.env_s, truncated=p.turns < q.turns, token_budget=w.max_trajectory_tokens, id=f"t{i}", batch=i // batch, group=i % batch // group)
        for i, (p, q) in enumerate(zip(capped, free))
    ]
    log = TrajectoryLogWriter(path)
    for r in recs:
        log.write(r)
    log.close()
    return recs


@pytest.fixture(scope="module")
def swe_fit(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("logs") / "swe.trajectories.jsonl"
    recs = write_sampled(path, SWE, 3000)
    return path, recs, fit_workload([path])


def test_fit_recovers_the_workload_it_was_drawn_from(swe_fit: Any) -> None:
    _, recs, res = swe_fit
    assert res.trajectories == 3000 and res.turns == sum(r.turns for r in recs)
    assert res.truncated == sum(r.truncated for r in recs) > 50  # the censored-turns path is exercised
    for name in DIST_FIELDS:
        true, got = getattr(SWE, name), getattr(res.workload, name)
        assert got.kind == "lognormal", name
        assert got.mean == pytest.approx(true.mean, rel=0.05), name
        assert got.cv == pytest.approx(true.cv, rel=0.1), name
        assert got.expected() == pytest.approx(true.expected(), rel=0.05), name  # what the planner uses
    # truncated trajectories ran fewer turns than drawn: the fit corrects the observed mean upward
    turns = res.field("turns")
    assert turns.observed.mean < turns.fitted.mean <= SWE.turns.expected()
    assert res.workload.max_trajectory_tokens == SWE.max_trajectory_tokens  # the logged budget
    # batch and GRPO group sizes read back from the records' batch/group ids
    assert (res.workload.trajectories_per_batch, res.workload.group_size) == (64, 16)
    assert res.assumed == ("prefix_cache_hit",)


def test_fitted_stats_match_observed_for_uncensored_fields(swe_fit: Any) -> None:
    """The lognormal is solved so that, clipped to the observed range, it has the data's mean."""
    _, _, res = swe_fit
    for f in res.fields[1:]:
        assert f.fitted.mean == pytest.approx(f.observed.mean, rel=1e-3), f.name
        assert f.fitted.p90 == pytest.approx(f.observed.p90, rel=0.05), f.name
        assert f.fitted.max == f.observed.max, f.name


def test_base_workload_supplies_what_logs_do_not_show(swe_fit: Any) -> None:
    path, _, _ = swe_fit
    base = SWE.model_copy(update={"trajectories_per_batch": 32, "group_size": 8, "prefix_cache_hit": 0.28, "max_trajectory_tokens": 40000})
    w = fit_workload([path], base=base).workload
    assert (w.trajectories_per_batch, w.group_size, w.prefix_cache_hit, w.max_trajectory_tokens) == (32, 8, 0.28, 40000)


def test_constant_quantities_fit_as_constant(tmp_path: Path) -> None:
    w = SWE.model_copy(update={"turns": SWE.turns.model_copy(update={"kind": "constant", "mean": 5.0}),
                               "env_latency_s": SWE.env_latency_s.model_copy(update={"kind": "constant", "mean": 2.5}),
                               "max_trajectory_tokens": 10**6})
    write_sampled(tmp_path / "c.jsonl", w, 200)
    res = fit_workload([tmp_path / "c.jsonl"])
    assert res.workload.turns.model_dump(exclude_none=True) == {"kind": "constant", "mean": 5.0, "cv": 0.0}
    assert res.workload.env_latency_s.kind == "constant" and res.workload.env_latency_s.mean == 2.5
    assert res.truncated == 0 and res.workload.new_tokens_per_turn.kind == "lognormal"


def test_rendered_yaml_loads_back_through_the_config_loader(swe_fit: Any, tmp_path: Path) -> None:
    path, _, res = swe_fit
    text = workload_yaml(res, source="pearl calibrate --logs test")
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert any("pearl calibrate --logs test" in line for line in header)
    assert any(str(path) in line for line in header) and any("3000 trajectories" in line for line in header)
    # a configs root whose workload is the fitted file, loaded by load_experiment like any other
    root = tmp_path / "configs"
    (root / "workloads").mkdir(parents=True)
    (root / "experiments").mkdir()
    for part in ("hardware.yaml", "llms.yaml", "clusters", "profiles"):
        (root / part).symlink_to(CONFIG_ROOT / part)
    (root / "workloads" / "fitted.yaml").write_text(text)
    exp = yaml.safe_load((CONFIG_ROOT / "experiments" / "pd-crossover.yaml").read_text())
    exp.update(workload="fitted", workload_overrides={})
    (root / "experiments" / "x.yaml").write_text(yaml.safe_dump(exp))
    assert load_experiment(root / "experiments" / "x.yaml").workload == res.workload


GOOD = {"turns": 2, "initial_prompt_tokens": 100, "new_tokens": [7], "response_tokens": [30, 40], "env_latency_s": [1.5, 0.0], "truncated": False}


@pytest.mark.parametrize(
    "line, field, allowed",
    [
        ("{not json", "line 3", "one JSON object per line"),
        ("[1, 2]", "line 3: <record>", "JSON object"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "response_tokens"}), "line 3: response_tokens", "required"),
        (json.dumps({**GOOD, "response_tokens": [30]}), "line 3: response_tokens", "2 entries"),
        (json.dumps({**GOOD, "new_tokens": [7, 8]}), "line 3: new_tokens", "turns - 1"),
        (json.dumps({**GOOD, "env_latency_s": [1.5, -1]}), "line 3: env_latency_s", "non-negative seconds"),
        (json.dumps({**GOOD, "turns": "2"}), "line 3: turns", "integer"),
        (json.dumps({**GOOD, "turns": 0, "new_tokens": [], "response_tokens": [], "env_latency_s": []}), "line 3: turns", ">= 1"),
        (json.dumps({**GOOD, "truncated": "no"}), "line 3: truncated", "true or false"),
        (json.dumps({**GOOD, "tokens": 5}), "line 3: tokens", "one of"),
    ],
)
def test_bad_line_names_file_line_and_field(tmp_path: Path, line: str, field: str, allowed: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + line + "\n" + json.dumps(GOOD) + "\n")  # a blank line 2 is skipped
    with pytest.raises(ConfigError) as err:
        fit_workload([path])
    assert (err.value.file, err.value.field) == (str(path), field)
    assert allowed in err.value.allowed and "\n" not in str(err.value)


def test_missing_and_empty_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="existing JSONL file"):
        fit_workload([tmp_path / "nope.jsonl"])
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ConfigError, match="empty") as err:
        fit_workload([tmp_path / "empty.jsonl"])
    assert err.value.file == str(tmp_path / "empty.jsonl")
    with pytest.raises(ConfigError):
        fit_workload([])


def test_record_json_round_trip() -> None:
    r = TrajectoryRecord(3, 50, (10, 0), (20, 18, 1), (0.5, 1.25, 0.0), True, 98, "b0-1", 0, 1)
    assert TrajectoryRecord.from_json(json.loads(json.dumps(r.to_json()))) == r
    assert r.context_tokens == 99
    assert log_path_for("runs/train-x.jsonl") == Path("runs/train-x.trajectories.jsonl")


# ----------------------------------------------------------------------------- the Ray runtime's writer, without Ray
class _Env:
    """Scripted environment actor: `.remote` methods as awaitables, like a Ray actor handle's."""

    def __init__(self, turns: dict[str, int], prompt: int, obs: int) -> None:
        self.turns, self.prompt, self.obs, self.at = turns, prompt, obs, dict.fromkeys(turns, 0)
        self.reset = SimpleNamespace(remote=self._reset)
        self.step = SimpleNamespace(remote=self._step)
        self.forget = SimpleNamespace(remote=self._forget)

    async def _reset(self, tid: str, seed: int) -> list[int]:
        return [1] * self.prompt

    async def _step(self, tid: str, got: list[int]) -> tuple[list[int], bool, float]:
        self.at[tid] += 1
        done = self.at[tid] >= self.turns[tid]
        if not done:
            await asyncio.sleep(0.01)
        return ([] if done else [2] * self.obs), done, 1.0

    async def _forget(self, tid: str) -> None:
        pass


def test_rollout_driver_writes_records_the_fit_reads(tmp_path: Path) -> None:
    """RolloutDriver._trajectory's bookkeeping, driven with a scripted env and engine (no Ray)."""
    from runtime.ray_runtime.rollout_driver import RolloutDriver, Trajectory

    class Driver(RolloutDriver):
        async def _turn(self, t: Trajectory, max_tokens: int) -> tuple[list[int], list[float], int]:
            return [3] * max_tokens, [0.0] * max_tokens, 0

    d = Driver()
    d.env = _Env({"a": 1, "b": 3, "c": 9}, prompt=50, obs=10)
    d.rt, d.backend, d.scale, d.response_tokens = SimpleNamespace(max_model_len=0), "emulated", 10.0, 20
    d.spec = SimpleNamespace(workload=SimpleNamespace(max_trajectory_tokens=150))
    d.metrics = SimpleNamespace(write=lambda *a, **k: None)
    d.trajectory_log = TrajectoryLogWriter(log_path_for(tmp_path / "m.jsonl"))

    async def run() -> None:
        for i, tid in enumerate("abc"):
            await d._trajectory(Trajectory(tid, 0, i, 0))

    asyncio.run(run())
    recs = {r.id: r for _, r in read_records(tmp_path / "m.trajectories.jsonl")}
    a, b, c = recs["a"], recs["b"], recs["c"]
    assert (a.turns, a.new_tokens, a.response_tokens, a.truncated) == (1, (), (20,), False)
    assert (b.turns, b.initial_prompt_tokens, b.new_tokens, b.response_tokens, b.truncated) == (3, 50, (10, 10), (20, 20, 20), False)
    assert all(x >= 0.1 for x in b.env_latency_s[:2]) and b.env_latency_s[2] < 0.1  # virtual seconds (x time_scale); the last step is instant
    # budget 150 - 2: after 3 turns the context is 140; turn 4 gets the 8 tokens left, and its
    # observation no longer fits, so the trajectory ends there, cut (the env wanted 9 turns)
    assert (c.turns, c.response_tokens, c.truncated, c.token_budget, c.context_tokens) == (4, (20, 20, 20, 8), True, 148, 148)
    assert (b.batch, b.group) == (0, 1)
    res = fit_workload([tmp_path / "m.trajectories.jsonl"])
    assert res.trajectories == 3 and res.truncated == 1


def test_all_truncated_logs_fit_turns_as_a_lower_bound(tmp_path: Path) -> None:
    """With no finished trajectory the censored likelihood has no maximum: fall back, and say so."""
    path = tmp_path / "cut.jsonl"
    path.write_text("".join(json.dumps({**GOOD, "turns": k, "new_tokens": [7] * (k - 1), "response_tokens": [30] * k, "env_latency_s": [1.0] * k, "truncated": True}) + "\n" for k in (3, 4, 5)))
    res = fit_workload([path])
    assert res.workload.turns.min == 3 and res.workload.turns.max == 5
    assert "lower bound" in res.field("turns").note


def test_the_cli_fits_logs_and_writes_the_workload(pearl, tmp_path: Path) -> None:
    """`pearl calibrate --logs`: what a user types; the base experiment fills what logs do not show."""
    import json

    log = tmp_path / "run.trajectories.jsonl"
    write_sampled(log, SWE, 400)
    out = tmp_path / "mine.yaml"
    res = pearl("calibrate", "--logs", str(log), "--config", str(CONFIG_ROOT / "experiments/default.yaml"), "--out", str(out), "--json")
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    assert rep["workload"] == str(out) and rep["trajectories"] == 400
    fitted = WorkloadSpec.model_validate(yaml.safe_load(out.read_text()))
    assert abs(fitted.response_tokens_per_turn.mean / SWE.response_tokens_per_turn.mean - 1) < 0.1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": 2}\n')
    res = pearl("calibrate", "--logs", str(bad), "--out", str(tmp_path / "x.yaml"))
    assert res.returncode == 2 and "line 1" in res.stderr and "Traceback" not in res.stderr
    # a base whose token budget cannot hold these trajectories' first turn: one clear line, no traceback
    res = pearl("calibrate", "--logs", str(log), "--config", str(CONFIG_ROOT / "experiments/cpu-tiny.yaml"), "--out", str(tmp_path / "y.yaml"))
    assert res.returncode == 2 and "max_trajectory_tokens" in res.stderr and "Traceback" not in res.stderr, res.stderr
