"""A colocated layout is predicted with the profile measured with as many engines on a node as it
runs (`profile_by_engines`): on a node whose engines share its cores, one engine alone runs
faster than each of two, so a 1-engine layout priced on the 2-engine profile was over-predicted."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from models.builder import build_models, load_fewer_engine_profiles
from models.config import ClusterSpec, ConfigError, ExperimentSpec, busiest_node_engines, layout_counts, load_experiment, rollout_nodes
from models.step_latency import load_profile
from planner.inputs import planning_inputs
from runtime.ray_runtime.telemetry import RuntimeTracker

BOTH = {1: "cpu-tiny-runtime-x1", 2: {"colocated": "cpu-tiny-runtime-x2", "disaggregated": "cpu-tiny-runtime-pd"}}


def _deploy(config_tree: Path, by_engines: dict) -> ExperimentSpec:
    path = config_tree / "experiments/cpu-tiny.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["profile_by_engines"] = by_engines
    path.write_text(yaml.safe_dump(doc))
    return load_experiment(path)


def test_a_layout_of_fewer_engines_than_a_full_node_is_predicted_with_their_profile(config_tree: Path) -> None:
    spec = _deploy(config_tree, BOTH)
    assert spec.profile_name == "cpu-tiny-runtime-x2" and spec.colocated_by_engines == {1: ("cpu-tiny-runtime-x1", "profile_by_engines.1")}
    assert [spec.profile_of_layout(r) for r in ("1C", "2C", "1P1D")] == ["cpu-tiny-runtime-x1", "cpu-tiny-runtime-x2", "cpu-tiny-runtime-pd"]
    x1 = load_profile(config_tree / "profiles/cpu-tiny-runtime-x1.json")
    keyed = build_models(spec).predictor
    alone = build_models(spec, profile=x1, fewer_engines={}).predictor  # every count on the 1-engine profile
    shared = build_models(spec, fewer_engines={}).predictor  # every count on the 2-engine profile, as before
    assert alone.colocated(1).completion_s != pytest.approx(shared.colocated(1).completion_s, rel=0.02)  # the two profiles differ
    assert keyed.colocated(1).completion_s == pytest.approx(alone.colocated(1).completion_s)
    assert keyed.colocated(2).completion_s == pytest.approx(shared.colocated(2).completion_s)
    assert keyed.colocated_engine_for(1).profile.name == "cpu-tiny-runtime-x1" and keyed.colocated_engine_for(2).profile.name == "cpu-tiny-runtime-x2"
    # P/D instances keep the pair's profile
    assert keyed.disaggregated(1, 1).completion_s == pytest.approx(shared.disaggregated(1, 1).completion_s)
    # the planner's table, vectorised over counts, holds the same numbers
    table = planning_inputs(build_models(spec), max_gpus=2).colocated
    assert table.seconds[1] == pytest.approx(keyed.colocated(1).completion_s) and table.seconds[2] == pytest.approx(keyed.colocated(2).completion_s)
    # a measured speed scales the fewer-engine profile too
    assert build_models(spec, speed=1.5).predictor.colocated(1).completion_s == pytest.approx(
        build_models(spec, profile=x1, fewer_engines={}, speed=1.5).predictor.colocated(1).completion_s)


def test_the_runtime_tracker_refits_on_the_profile_of_the_layout_it_ran(config_tree: Path) -> None:
    spec = _deploy(config_tree, BOTH)
    x2, pd = (load_profile(config_tree / f"profiles/{n}.json") for n in ("cpu-tiny-runtime-x2", "cpu-tiny-runtime-pd"))
    tracker = RuntimeTracker(spec, x2, pd, base_fewer_engines=load_fewer_engine_profiles(spec))
    keyed = build_models(spec).predictor
    assert tracker._layout_s("1C", 1.0) == pytest.approx(keyed.colocated(1).completion_s)
    assert tracker._layout_s("2C", 1.0) == pytest.approx(keyed.colocated(2).completion_s)
    # unset, the tracker reads them as the deployment names them
    assert RuntimeTracker(spec, x2, pd)._layout_s("1C", 1.0) == pytest.approx(keyed.colocated(1).completion_s)


def test_engines_on_the_busiest_node_spread_over_the_rollout_nodes() -> None:
    two_by_two = ClusterSpec.model_validate({"nodes": [{"count": 2, "gpus_per_node": 2, "gpu": "cpu", "pool": "rollout"},
                                                       {"count": 1, "gpus_per_node": 2, "gpu": "cpu", "pool": "training"}]})
    assert rollout_nodes(two_by_two) == 2  # the training node hosts no engines of its own
    assert [busiest_node_engines(n, rollout_nodes(two_by_two)) for n in (1, 2, 3, 4)] == [1, 1, 2, 2]


def test_layout_labels_parse_to_instance_counts() -> None:
    assert [layout_counts(r) for r in ("2C", "1P3D", "", "2C1P", "C")] == [(2, 0, 0), (0, 1, 3), None, None, None]


def test_a_profile_for_more_engines_than_a_node_runs_is_one_clear_error(config_tree: Path) -> None:
    with pytest.raises(ConfigError) as info:
        _deploy(config_tree, {**BOTH, 3: "cpu-tiny-runtime-x2"})
    assert info.value.field == "profile_by_engines.3" and "at most 2" in info.value.allowed and "cpu-2" in info.value.allowed


def test_a_fewer_engine_profile_of_another_model_names_its_field(config_tree: Path) -> None:
    spec = _deploy(config_tree, {**BOTH, 1: "h800-qwen3-8b"})
    with pytest.raises(ConfigError) as info:
        build_models(spec)
    assert info.value.field == "profile_by_engines.1" and info.value.value == "h800-qwen3-8b"


def test_the_simulator_runs_a_lone_engine_at_the_profile_the_planner_priced_it_at(config_tree: Path) -> None:
    """One colocated engine on the two-slot node: the planner prices it on the one-engine profile,
    and the simulator's engine runs at that profile too (re-rated as the node's engines change),
    not at a full node's."""
    from runtime.sim.run import TraceFlags, simulate

    spec = _deploy(config_tree, BOTH)
    keyed = build_models(spec)
    r = simulate(spec, "roll", TraceFlags(), hours=0.05, models=keyed)
    assert {d[3]["ratio"] for d in r.decision_log if "ratio" in d[3]} == {"1C"}, r.decision_log[:3]
    one, full = keyed.predictor.colocated(1).completion_s, build_models(spec, fewer_engines={}).predictor.colocated(1).completion_s
    # the two profiles must differ for the batches to tell them apart; then they sit near the lone engine's
    assert abs(full - one) > 0.05 * one, (one, full)
    assert abs(r.mean_batch_s - one) < 0.25 * abs(full - one), (r.mean_batch_s, one, full)


def test_an_engine_retimed_mid_decode_runs_its_next_steps_at_the_new_speed() -> None:
    from models.engine import Engine, EngineConfig, Request

    spec = load_experiment("configs/experiments/cpu-tiny.yaml")
    step = build_models(spec).predictor.colocated_engine
    fast = EngineConfig.for_model(step, "colocated")
    slow = EngineConfig.for_model(type(step)(step.llm, step.gpu, step.tp, step.profile.scaled(2.0)), "colocated")

    def finish(retime_at: float | None) -> float:
        e = Engine(fast)
        e.submit(Request(0, 64, 0, 200), 0.0)
        t, done = 0.0, None
        while done is None:
            nxt = e.next_event()
            if retime_at is not None and retime_at < nxt:
                e.retime(slow, retime_at)
                retime_at = None
                continue
            t = nxt
            done = next((o for o in e.on_event(t) if o.rid == 0), None)
        return t

    alone, halfway = finish(None), finish(finish(None) / 2)
    # the second half of the decode ran at half the speed: about 1.5x in all
    assert halfway == pytest.approx(1.5 * alone, rel=0.05)


def test_rays_emulated_engines_are_rerated_by_the_engines_their_node_runs(config_tree: Path) -> None:
    """The emulated backend's host re-rates its colocated engines as the simulator does: alone on
    the node, the one-engine model; beside a second, a full node's; alone again after a stop."""
    import asyncio

    from runtime.ray_runtime.rollout_worker import EmulatedSettings, RolloutWorker

    models = build_models(_deploy(config_tree, BOTH))
    full, alone = models.predictor.colocated_engine, models.predictor.colocated_engine_for(1)
    assert full is not alone
    settings = EmulatedSettings(full, time_scale=1000.0, role_switch_s=0.0, engine_start_s=0.0, engines=models.engines(),
                                colocated_by_engines=models.predictor.colocated_by_engines, slot_node={0: "node0", 1: "node0", 2: "node1"})

    async def scenario() -> list[list[object]]:
        w = RolloutWorker("emulated", None, settings)
        seen = []
        for change in (w.start_slot(0, "colocated"), w.start_slot(2, "colocated"), w.start_slot(1, "colocated"), w.stop_slot(1)):
            await change
            seen.append([w.engines[s]._step_model for s in sorted(w.engines)])
        for s in list(w.engines):
            await w.stop_slot(s)
        return seen

    assert asyncio.run(scenario()) == [[alone], [alone, alone], [full, full, alone], [alone, alone]]
