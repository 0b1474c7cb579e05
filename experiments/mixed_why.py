"""Why PEARL runs each GPU type at the TP degree it does: every layout it applies in a mixed run, against the same GPUs at the other degrees.

Simulates a mixed experiment (default configs/experiments/mixed-elastic.yaml, its trace hours
and seed) under the pearl policy. At each decision that applies a new layout (by GPU type, role
and TP degree), every group's instances of a role are moved in turn to each other degree the
role may use there, on the same GPUs (as many instances as fit), everything else kept, and
priced by the decision's own program (`planner.mixed.degree_alternatives`): the priced
completion and the transition cost, each as the change from the layout PEARL chose. No
alternative of a decision proven optimal (`status` in the JSON) is cheaper in all; the two
columns say whether a degree lost on the batch's path or on the cost of getting there. Writes
results/mixed_why.json and prints a table.

    python experiments/mixed_why.py
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models.builder import build_models  # noqa: E402
from experiments.cli_args import load_spec  # noqa: E402
from models.config import ExperimentSpec, repo_relative  # noqa: E402
from planner.mixed import build_mixed_problem, degree_alternatives, evaluate_mixed, group_transition_ms, layout_of  # noqa: E402
from planner.policies import get_policy  # noqa: E402
from planner.state import ROLES  # noqa: E402
from runtime.sim.metrics import layout_label  # noqa: E402
from runtime.sim.planner_adapter import PlannerPolicy  # noqa: E402
from runtime.sim.run import TraceFlags, load_availability, run_hours  # noqa: E402
from runtime.sim.simulator import Simulator  # noqa: E402


def explain(spec: ExperimentSpec, hours: float | None, seed: int | None) -> list[dict]:
    hours = run_hours(spec, TraceFlags(hours=hours))
    models = build_models(spec)
    if not models.variants:
        raise SystemExit(f"mixed_why: {spec.source} has one GPU type and one TP degree per role; it needs a mixed cluster (configs/experiments/mixed-elastic.yaml)")
    record: list = []
    pol = PlannerPolicy("pearl", models, record=record)
    Simulator(models, pol, load_availability(spec, TraceFlags(), hours), hours=hours, seed=seed).run()
    pearl = get_policy("pearl")
    rows, last = [], None
    for now, event, state, inputs, step in record:
        d = step.decision
        layout = d.layout_by_type()
        if not d.applied or layout == last:
            continue
        last = layout
        borrow = bool(d.extras.get("borrow")) or d.lent_gpus > 0
        # the decision's program, its nodes apart and every entry kept (alternatives may be worse than any seed)
        problem = build_mixed_problem(state, inputs, now, replace(pearl.options(state, inputs, borrow), fold_running=False), prune=False)
        x = layout_of(problem, d.targets)
        chosen = evaluate_mixed(problem, x)
        assert chosen == d.objective_ms, (now, chosen, d.objective_ms)  # the decision reads back at its own price
        trans = sum(group_transition_ms(g, v) for g, v in zip(problem.groups, x)) + problem.constant_ms
        for a in degree_alternatives(problem, x):
            g = problem.groups[a.group]
            rows.append({
                "t_s": round(now), "event": event, "status": d.proof.status, "layout": "; ".join(f"{ty} {lab}" for ty, lab in layout_label(layout).items()),
                "gpu": g.gpu_type, "pool": g.pool, "nodes": list(g.nodes), "gpus": g.total_cap, "role": ROLES[a.role],
                "chosen": f"{a.instances}{ROLES[a.role][0].upper()}@TP{a.tp}", "alternative": f"{a.alt_instances}{ROLES[a.role][0].upper()}@TP{a.alt_tp}",
                "completion_delta_s": None if a.completion_ms is None else round((a.completion_ms - (chosen - trans)) / 1000, 1),
                "transition_delta_s": round((a.transition_ms - trans) / 1000, 1),
                "objective_delta_s": None if a.objective_ms is None else round((a.objective_ms - chosen) / 1000, 1),
            })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs/experiments/mixed-elastic.yaml"))
    ap.add_argument("--hours", type=float, default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", default=str(ROOT / "results/mixed_why.json"))
    args = ap.parse_args()
    rows = explain(load_spec(args.config, "mixed_why"), args.hours, args.seed)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"config": repo_relative(args.config), "rows": rows}, indent=1))
    from rich.console import Console
    from rich.table import Table

    t = Table(title="each applied layout against the same GPUs at another TP degree (s; + = the alternative is worse)")
    for c in ("t s", "event", "GPU", "pool", "GPUs", "chosen", "alternative", "completion", "transition", "objective"):
        t.add_column(c, justify="right")
    for r in rows:
        fmt = lambda v: "infeasible" if v is None else f"{v:+.1f}"  # noqa: E731
        t.add_row(str(r["t_s"]), r["event"], r["gpu"], r["pool"], str(r["gpus"]), r["chosen"], r["alternative"], fmt(r["completion_delta_s"]), fmt(r["transition_delta_s"]), fmt(r["objective_delta_s"]))
    Console(width=150).print(t)


if __name__ == "__main__":
    main()
