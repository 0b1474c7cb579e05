"""The simulator runs a mixed cluster: per-type elastic traces, engines of each (role, type, TP)."""

from __future__ import annotations

from pathlib import Path

import yaml

from cli_cases import invoke, strict_loads
from models.config import load_experiment
from runtime.sim.metrics import layout_label, longest_held_layout
from models.builder import build_models
from runtime.sim.run import TraceFlags, load_availability, make_policy, run_hours
from runtime.sim.simulator import Simulator

CONFIG = "configs/experiments/mixed-elastic.yaml"


def test_each_elastic_type_follows_its_own_trace() -> None:
    spec = load_experiment(CONFIG)
    avail = load_availability(spec, TraceFlags(), 2.0)
    assert set(avail) == {"H20", "A100"}
    for typ, trace in avail.items():
        pool = spec.cluster.gpus_in_pool("elastic", typ)
        assert max(trace.gpus) == pool and min(trace.gpus) == 0, typ  # scale_to_pool: that type's own pool
    assert list(avail["H20"].gpus) != list(avail["A100"].gpus)


def test_simulate_and_compare_span_the_per_type_trace_hours(config_tree: Path) -> None:
    """Without `trace`, a run spans `elastic_traces.<type>.hours` as `pearl plan` does: each type
    its own window, the run the longest (it once ran the default 2 h whatever they said)."""
    cfg = config_tree / "experiments/mixed-elastic.yaml"
    data = yaml.safe_load(cfg.read_text())
    data["elastic_traces"]["H20"]["hours"], data["elastic_traces"]["A100"]["hours"] = 0.05, 0.03
    cfg.write_text(yaml.safe_dump(data))
    spec = load_experiment(cfg)
    assert run_hours(spec) == 0.05 and run_hours(spec, TraceFlags(hours=0.02)) == 0.02
    avail = load_availability(spec, TraceFlags(), run_hours(spec))
    assert (avail["H20"].duration_s, avail["A100"].duration_s) == (0.05 * 3600, 0.03 * 3600)
    for argv in (["simulate"], ["compare", "--policies", "roll"]):
        out = invoke([*argv, "--config", str(cfg), "--json"], 60)
        assert out.exit_code == 0 and strict_loads(out.stdout)["hours"] == 0.05, (argv, out.stderr[-800:])


def test_pearl_plans_mixed_layouts_in_the_simulator() -> None:
    """Six simulated minutes with H20 and A100 spot GPUs up: every decision is made, the layouts
    name GPU types and TP degrees, and each instance runs the engine of its own role, GPU type
    and TP degree (its type's profile)."""
    spec = load_experiment(CONFIG)
    models = build_models(spec)
    hours = 0.1
    sim = Simulator(models, make_policy("pearl", models), load_availability(spec, TraceFlags(None, 0.7, None), hours), hours=hours)
    r = sim.run()
    assert r.decisions > 0 and r.policy_failures == 0, r.failure
    solver = r.to_json()["solver"]  # every decision's proof, summed up for `pearl simulate --json`
    assert solver["decisions"] == r.decisions and solver["proven_optimal"] == r.decisions, solver
    assert 0 < solver["solve_ms_p50"] <= solver["solve_ms_p95"] <= solver["solve_ms_max"], solver
    held = longest_held_layout(r.decision_log, hours * 3600)
    assert held and all("@TP" in lab for lab in held.values()), held
    kinds = set()
    for inst in sim.instances.values():
        if inst.engine is not None:
            gpu = sim.nodes[inst.nid].gpu
            assert inst.engine.cfg is sim.kind_cfg[(inst.role, gpu, len(inst.slots))]
            assert inst.engine.cfg.step.gpu == spec.gpu(gpu) and inst.engine.cfg.step.tp == len(inst.slots)
            kinds.add((gpu, len(inst.slots)))
    assert len({g for g, _ in kinds}) >= 2, kinds  # more than one GPU type serves


def test_layout_label_reads_roles_and_degrees() -> None:
    assert layout_label({"H20": {"decode": {4: 3}}, "H800": {"prefill": {1: 8}, "decode": {4: 2}}}) == {"H20": "3D@TP4", "H800": "2D@TP4 8P@TP1"}


def test_the_router_follows_the_decisions_shares_on_mixed_kinds() -> None:
    """Three TP4 H20 decode instances beside four TP1 A100 ones: at the predicted decode path the
    A100 kind carries nothing (share 0), so the router leaves it idle and the batches run as
    without it. Routed evenly instead, the slow A100 instances took trajectories and the batches
    took ~18% longer than predicted (the defect this guards against)."""
    spec = load_experiment(CONFIG).model_copy(update={"elastic_traces": None})  # every spot GPU up
    models = build_models(spec)
    runs = {}
    for name, layout in (("with", "fixed:H800=4P@TP1,A100=8P@TP1+4D@TP1,H20=3D@TP4"), ("without", "fixed:H800=4P@TP1,A100=8P@TP1,H20=3D@TP4")):
        pol = make_policy(layout, models)
        sim = Simulator(models, pol, None, hours=1.0, seed=0)
        runs[name] = (sim.run(), pol, sim)
    with_idle, pol, sim = runs["with"]
    assert ("decode", "A100", 1, 0.0) in pol.shares, pol.shares
    a100_decode = [i for i in sim.instances.values() if i.role == "decode" and sim.nodes[i.nid].gpu == "A100" and i.engine is not None]
    assert len(a100_decode) == 4 and all(i.engine.stats.decode_tokens == 0 for i in a100_decode)
    assert with_idle.batch_times_s == runs["without"][0].batch_times_s and len(with_idle.batch_times_s) >= 2
    assert max(with_idle.batch_times_s[1:]) <= 1.05 * pol.batch_s, (with_idle.batch_times_s, pol.batch_s)


def test_predict_on_a_mixed_cluster_reports_each_type_alone() -> None:
    """`pearl predict` on a mixed cluster once priced all 28 GPUs as H800; the main tables are
    now the rollout type's own GPUs, and each (type, TP) kind is predicted on its own GPUs."""
    out = invoke(["predict", "--config", CONFIG, "--json"], 60)
    assert out.exit_code == 0, out.stderr[-800:]
    got = strict_loads(out.stdout)
    spec = load_experiment(CONFIG)
    models = build_models(spec)
    own = {typ: spec.cluster.gpus_in_pool("rollout", typ) + spec.cluster.gpus_in_pool("elastic", typ) for typ in ("H800", "H20", "A100")}
    assert got["gpu_type"] == "H800" and got["gpus"] == own["H800"] == 4
    assert got["colocated"]["completion_s"] == round(models.predictor.colocated(4).completion_s, 3)
    rows = {(r["gpu_type"], r["tp"]): r for r in got["by_kind"]}
    assert set(rows) == {(typ, t) for typ, t, _ in models.variants} and len(rows) == 9
    for typ, t, p in models.variants:
        r = rows[(typ, t)]
        assert r["gpus"] == own[typ] // t * t
        assert r["colocated_s"] == round(p.colocated(own[typ] // t).completion_s, 3)
    assert rows[("A100", 4)]["colocated_s"] < rows[("H800", 4)]["colocated_s"]  # 12 A100 against 4 H800


def test_a_decode_kind_is_priced_with_the_prefill_instances_that_serve_it() -> None:
    """12 TP1 H20 decode instances behind H800 and A100 prefill, held 3 simulated hours: the
    prediction is within 5% of the simulated batches. A decode kind's path once charged its
    trajectory's own prefill on a prefill instance of its own type and degree (H20 TP1: 244 s
    over 45 turns, where the H800 TP1 instances take 38 s) and was 17% over."""
    spec = load_experiment(CONFIG).model_copy(update={"elastic_traces": None})  # every spot GPU up
    models = build_models(spec)
    pol = make_policy("fixed:H800=4P@TP1,A100=3P@TP4,H20=12D@TP1", models)
    r = Simulator(models, pol, None, hours=3.0, seed=0).run()
    simulated = sum(r.batch_times_s[1:]) / len(r.batch_times_s[1:])
    assert len(r.batch_times_s) >= 4 and abs(pol.batch_s / simulated - 1.0) <= 0.05, (pol.batch_s, r.batch_times_s)
