"""`fixed:<type>=<terms>,...`: a mixed layout held throughout, named per GPU type (runtime/sim/held_mixed.py)."""

from __future__ import annotations

import math

import pytest

from cli_cases import invoke, strict_loads
from models.builder import build_models
from models.config import load_experiment
from runtime.sim.held_mixed import parse_typed, typed_layout_problem
from runtime.sim.run import TraceFlags, load_availability, make_policy
from runtime.sim.simulator import Simulator

CONFIG = "configs/experiments/mixed-elastic.yaml"


def test_a_typed_layout_reads_as_pearl_compare_labels_it() -> None:
    got = parse_typed("fixed:H800=3D@TP4+8P@TP1,H20=3D@TP4")
    assert got == parse_typed("fixed:H20=3D@TP4, H800=8P@TP1 3D@TP4")  # order, spaces and '+' do not matter
    assert got.want() == {("H800", "decode", 4): 3, ("H800", "prefill", 1): 8, ("H20", "decode", 4): 3}
    assert got.label() == {"H20": "3D@TP4", "H800": "3D@TP4 8P@TP1"}  # runtime.sim.metrics.layout_label's form


@pytest.mark.parametrize("name", [
    "fixed:disaggregated:0:4:3",  # the homogeneous form
    "fixed:H800",  # no terms
    "fixed:=4P@TP1",  # no type
    "fixed:H800=0P@TP1,H20=3D@TP4",  # an empty kind
    "fixed:H800=4P@TP1+2P@TP1,H20=3D@TP4",  # a kind named twice
    "fixed:H800=4X@TP1",  # no such role
    "fixed:H800=4P@TPx",
])
def test_malformed_typed_layouts_are_not_read(name: str) -> None:
    assert parse_typed(name) is None


def test_what_a_cluster_cannot_hold_is_named() -> None:
    cluster = load_experiment(CONFIG).cluster  # 4 rollout H800 (training GPUs never count), 12 H20, 12 A100 in 4-GPU nodes
    problem = lambda name, fits=None: typed_layout_problem(parse_typed(name), cluster, fits)  # noqa: E731
    assert problem("fixed:H800=4P@TP1,H20=2D@TP4+2D@TP2") is None
    assert problem("fixed:H800=4C@TP1,A100=3C@TP4") is None
    assert "12 H20 GPU(s)" in problem("fixed:H800=4P@TP1,H20=3D@TP4+1D@TP1")
    assert "4 H800 GPU(s)" in problem("fixed:H800=2P@TP4,H20=1D@TP4")  # 8 H800 only with lent training GPUs
    assert "['A100', 'H20', 'H800']" in problem("fixed:H800=4P@TP1,V100=1D@TP4")
    assert "cluster.tp.decode" in problem("fixed:H800=4P@TP1,H20=1D@TP8")
    assert "one mode" in problem("fixed:H800=4C@TP1,H20=1D@TP4")
    assert "at least one prefill" in problem("fixed:H20=3D@TP4")
    assert "do not fit 1 H800" in problem("fixed:H800=4P@TP1,H20=1D@TP4", lambda typ, tp: tp > 1)


def test_a_held_layout_comes_back_with_its_gpus() -> None:
    """On the config's own traces (no H20 for the first 2,100 s, then one to three nodes, then
    none): the policy never runs more than the layout names, starts decode instances as H20
    nodes arrive, stops nothing itself, and predicts what runs: the full layout as the mixed
    program prices it, fewer decode instances slower."""
    spec = load_experiment(CONFIG)
    models = build_models(spec)
    pol = make_policy("fixed:H800=4P@TP1,H20=3D@TP4", models)
    r = Simulator(models, pol, load_availability(spec, TraceFlags(), 2.0), hours=2.0, seed=0).run()
    log = [info for _, _, _, info in r.decision_log]
    assert all(i["layout_by_type"]["H800"] == {"prefill": {1: 4}} and set(i["layout_by_type"]) <= {"H800", "H20"} for i in log), log
    h20 = [i["layout_by_type"].get("H20", {}).get("decode", {}).get(4, 0) for i in log]
    assert h20[0] == 0 and max(h20) == 3 and all(n <= 3 for n in h20), h20
    assert r.stops == 0 and r.starts >= 4 + 3 and r.policy_failures == 0
    all_up = build_models(spec.model_copy(update={"elastic_traces": None}))
    full = make_policy("fixed:H800=4P@TP1,H20=3D@TP4", all_up)
    Simulator(all_up, full, None, hours=0.01, seed=0).run()
    by_count = {n: i["predicted_s"] for n, i in zip(h20, log) if n}
    assert by_count[3] == round(full.batch_s, 2) and sorted(by_count, reverse=True) == sorted(by_count, key=by_count.get), by_count
    assert all(math.isnan(i["predicted_s"]) for n, i in zip(h20, log) if not n)  # no decode instance: no prediction


def test_compare_reports_a_typed_layout_beside_a_baseline() -> None:
    """`--policies` is comma-separated, and so is a typed layout: its pieces with '=' stay together."""
    out = invoke(["compare", "--config", CONFIG, "--policies", "fixed:H800=4P@TP1,H20=3D@TP4,roll", "--json"], 120)
    assert out.exit_code == 0, out.stderr[-800:]
    rows = strict_loads(out.stdout)["policies"]
    assert list(rows) == ["fixed:H800=4P@TP1,H20=3D@TP4", "roll"], list(rows)
    row = rows["fixed:H800=4P@TP1,H20=3D@TP4"]
    assert row["layout_by_type"] == {"H20": "3D@TP4", "H800": "4P@TP1"} and row["failure"] is None, row
