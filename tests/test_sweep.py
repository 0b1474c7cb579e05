"""`pearl sweep`: overrides reach the simulator, the cache resumes, the Pareto front, bad --set input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.config import ConfigError, load_experiment
from runtime.sim import run as sim_run
from runtime.sweep.keys import apply_overrides, numeric_keys, parse_sets
from runtime.sweep.report import pareto_front
from runtime.sweep.study import run_study

from conftest import CONFIGS, REPO_ROOT

CONFIG = CONFIGS / "experiments" / "default.yaml"
HOURS = 0.2  # simulated hours per point: a few seconds each on this machine
REAL_SIMULATE = sim_run.simulate


@pytest.fixture(scope="module")
def spec():
    """The default experiment at 64 trajectories per batch: several steps fit in HOURS."""
    base = load_experiment(CONFIG)
    return base.model_copy(update={"workload": base.workload.model_copy(update={"trajectories_per_batch": 64})})


@pytest.fixture
def sim_calls(monkeypatch):
    """Count real simulator calls and keep the experiment each one was given."""
    seen = []

    def counting(spec, *args, **kwargs):
        seen.append(spec)
        return REAL_SIMULATE(spec, *args, **kwargs)

    monkeypatch.setattr(sim_run, "simulate", counting)
    return seen


def test_swept_keys_reach_the_simulator_and_move_its_metrics(spec, sim_calls, tmp_path):
    sets = parse_sets(["training.staleness=0,1", "costs.transition_weight=0,16"], spec)
    res = run_study(spec, sets, "grid", hours=HOURS, jobs=1, cache_dir=tmp_path, show_progress=False)
    assert len(sim_calls) == 4
    seen = {(s.training.staleness, s.costs.transition_weight) for s in sim_calls}
    assert seen == {(0, 0.0), (0, 16.0), (1, 0.0), (1, 16.0)}
    assert len({r["config_hash"] for r in res.run.records}) == 4
    by = {(r["values"]["training.staleness"], r["values"]["costs.transition_weight"]): r for r in res.run.records}
    # staleness 0 makes every batch wait for the previous update: fewer trajectories in the same hours
    # (rollout of the next batch no longer overlaps training; whole steps can tie in a short run)
    assert by[(0, 0.0)]["trajectories_per_h"] < by[(1, 0.0)]["trajectories_per_h"]
    # a heavy transition weight makes the planner change the layout less often
    assert by[(1, 16.0)]["reconfigurations"] < by[(1, 0.0)]["reconfigurations"]


def test_cache_resumes_an_interrupted_sweep(spec, sim_calls, tmp_path, monkeypatch):
    sets = parse_sets(["costs.transition_weight=0,1,4"], spec)
    real = REAL_SIMULATE

    def interrupt_on_second(spec, *args, **kwargs):
        sim_calls.append(spec)
        if len(sim_calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the second point runs
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(sim_run, "simulate", interrupt_on_second)
    with pytest.raises(KeyboardInterrupt):
        run_study(spec, sets, hours=HOURS, jobs=1, cache_dir=tmp_path, show_progress=False)
    assert len(list(tmp_path.glob("*.json"))) == 1  # the finished point survived the interrupt
    monkeypatch.setattr(sim_run, "simulate", lambda s, *a, **k: (sim_calls.append(s), real(s, *a, **k))[1])
    sim_calls.clear()  # resume: only the two unfinished points run
    first = run_study(spec, sets, hours=HOURS, jobs=1, cache_dir=tmp_path, show_progress=False)
    assert (first.run.computed, first.run.cached, len(sim_calls)) == (2, 1, 2)
    sim_calls.clear()
    again = run_study(spec, sets, hours=HOURS, jobs=1, cache_dir=tmp_path, show_progress=False)
    assert (again.run.computed, again.run.cached, len(sim_calls)) == (0, 3, 0)
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("cached", "wall_s")} for r in rs]  # noqa: E731
    assert strip(again.run.records) == strip(first.run.records)


def test_identical_points_run_once(spec, sim_calls, tmp_path):
    # one-way: transition_weight=1 and mode_switch_margin=0.08 are both the config's own values
    assert (spec.costs.transition_weight, spec.costs.mode_switch_margin) == (1.0, 0.08)
    sets = parse_sets(["costs.transition_weight=1,4", "costs.mode_switch_margin=0.08"], spec)
    res = run_study(spec, sets, "oneway", hours=0.1, jobs=1, cache_dir=tmp_path, show_progress=False)
    assert len(sim_calls) == 2 and (res.run.computed, res.run.cached) == (2, 1)
    a, b, c = res.run.records
    assert a["config_hash"] == c["config_hash"] != b["config_hash"]
    assert a["tokens_per_s"] == c["tokens_per_s"] and [r["cached"] for r in (a, b, c)] == [False, False, True]


def test_pareto_front_on_a_hand_made_example():
    # (switches, tokens/s): fewer switches and more throughput are better
    pts = [(0, 5.0), (1, 7.0), (1, 6.0), (2, 7.0), (3, 9.0), (2, 9.0), (0, 5.0), (4, 8.0)]
    front = pareto_front([p[0] for p in pts], [p[1] for p in pts])
    # (1,6) and (2,7) lose to (1,7); (3,9) and (4,8) lose to (2,9); the two (0,5) tie and both stay
    assert front == [0, 6, 1, 5]
    assert pareto_front([3.0], [1.0]) == [0]
    assert pareto_front([1, 2, 3], [3, 2, 1]) == [0]


def test_keys_are_the_numeric_fields_and_values_are_revalidated(spec):
    keys = numeric_keys(spec)
    for k in ("costs.transition_weight", "costs.mode_switch_margin", "costs.ratio_change_margin", "costs.borrow_threshold_s",
              "training.staleness", "transition_costs.role_switch_s"):
        assert k in keys
    assert keys["training.staleness"] is int and keys["costs.transition_weight"] is float
    assert not {"policy.name", "trace.path", "trace.hours", "trace.scale_to_pool", "seed"} & set(keys)
    changed = apply_overrides(spec, {"costs.mode_switch_margin": 0.5, "transition_costs.role_switch_s": 5})
    assert changed.costs.mode_switch_margin == 0.5 and changed.transition_costs.role_switch_s == 5.0
    assert changed.costs.transition_weight == spec.costs.transition_weight and spec.costs.mode_switch_margin != 0.5
    with pytest.raises(ConfigError, match="costs.transition_weight"):
        apply_overrides(spec, {"costs.transition_weight": -1.0})
    with pytest.raises(ConfigError, match="workload.prefix_cache_hit"):
        apply_overrides(spec, {"workload.prefix_cache_hit": 2.0})


@pytest.mark.parametrize("bad", ["costs.nope=1,2", "costs.transition_weight=a,1", "costs.transition_weight=", "costs.transition_weight=,",
                                 "costs.transition_weight", "training.staleness=1.5", "=1", "costs.transition_weight=nan"])
def test_bad_set_is_one_clear_error(bad, pearl):
    r = pearl("sweep", "--config", str(CONFIG), "--set", bad, "--hours", "0.05")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert "valid keys:" in lines[0] and "costs.transition_weight" in lines[0] and "training.staleness" in lines[0]


def test_cli_runs_in_parallel_writes_outputs_and_resumes(pearl, tmp_path):
    args = ["sweep", "--config", str(CONFIG), "--set", "training.staleness=0,1", "--hours", "0.1", "--jobs", "2",
            "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache"), "--json"]
    first = pearl(*args)
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    assert (doc["computed"], doc["cached"]) == (2, 0)
    assert [r["values"]["training.staleness"] for r in doc["records"]] == [0, 1]
    for k in ("steps_per_h", "trajectories_per_h", "tokens_per_s", "rollout_share", "switches", "lost_trajectories", "late_returns", "seed"):
        assert k in doc["records"][0]
    for f in ("sweep.json", "sweep.md", "sweep.png"):
        assert (tmp_path / "out" / f).stat().st_size > 0
    again = json.loads(pearl(*args).stdout)
    assert (again["computed"], again["cached"]) == (0, 2)
    assert Path(tmp_path / "out" / "sweep.md").read_text().count("\n| ") >= 3


def test_planner_only_runs_the_plan_loop_on_a_trace_given_by_flag(spec, sim_calls, tmp_path):
    """--trace names a SkyPilot JSON under a config whose trace section is bamboo-count: read with its own format."""
    from runtime.sim.run import TraceFlags

    sky = REPO_ROOT / "data/traces/skypilot/availability/16-node/aws-08-27-2023/us-west-2a_v100_1.json"  # as the configs name it
    sets = parse_sets(["costs.transition_weight=0,16"], spec)
    res = run_study(spec, sets, flags=TraceFlags(str(sky), 126.0), hours=2.0, jobs=1, planner_only=True, cache_dir=tmp_path,
                    show_progress=False)
    assert sim_calls == []  # the planner alone, no simulator
    free, heavy = res.run.records
    assert free["decisions"] == heavy["decisions"] > 1  # same availability changes in the window
    assert heavy["reconfigurations"] < free["reconfigurations"]  # the weight reaches the planner's objective
    assert heavy["predicted_trajectories_per_h"] <= free["predicted_trajectories_per_h"]
