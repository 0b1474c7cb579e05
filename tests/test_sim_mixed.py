"""The simulator runs a mixed cluster: per-type elastic traces, engines of each (role, type, TP)."""

from __future__ import annotations

from models.config import load_experiment
from runtime.sim.metrics import layout_label, longest_held_layout
from models.builder import build_models
from runtime.sim.run import TraceFlags, load_availability, make_policy
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
