"""Do the TP degrees the planner prefers per GPU type hold in the simulator? Held mixed layouts, predicted and simulated.

configs/experiments/mixed-elastic.yaml with every spot GPU up (4 reserved H800, 12 H20 and 12
A100 in 4-GPU nodes; training GPUs are never used). Per set, one type's GPUs of one role run at
each allowed degree (12 TP1, 6 TP2 or 3 TP4 instances), everything else held the same, each
layout held with `fixed:<type>=...` (runtime/sim/held_mixed.py): priced by the mixed program's
definition (a fresh batch's predicted completion, what PEARL's decisions compare) and routed by
its shares, then simulated for `--hours` per seed (the engine model step by step; it never
reads the prediction). Per set: each layout's error, the degree the prediction ranks first (a
tie names both; the worse one counts) and the simulated regret of that pick. The batches after
each run's first (which starts cold) are pooled over seeds. Writes results/mixed_degrees.json
and prints a table.

    python experiments/mixed_degrees.py [--hours 3] [--seeds 0,1] [--wait-tail]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models.builder import build_models  # noqa: E402
from experiments.cli_args import int_list, load_spec  # noqa: E402
from models.config import repo_relative  # noqa: E402
from planner.inputs import memory_model  # noqa: E402
from runtime.sim.run import fixed_problem, make_policy  # noqa: E402
from runtime.sim.simulator import Simulator  # noqa: E402

DEGREES = {"12": "TP1", "6": "TP2", "3": "TP4"}  # instances on 12 GPUs at each degree
SETS = (  # (what varies, the held layout with {x} for it, the role's initial)
    ("H20 decode", "fixed:H800=4P@TP1,A100=12P@TP1,H20={x}", "D"),
    ("A100 prefill", "fixed:H800=4P@TP1,A100={x},H20=3D@TP4", "P"),
    ("A100 colocated", "fixed:H800=4C@TP1,A100={x},H20=3C@TP4", "C"),
    ("H20 colocated", "fixed:H800=4C@TP1,A100=3C@TP4,H20={x}", "C"),
)


def held(models, name: str, hours: float, seeds: list[int]) -> dict:
    times: list[float] = []
    predicted = None
    for seed in seeds:
        pol = make_policy(name, models)
        r = Simulator(models, pol, None, hours=hours, seed=seed).run()
        predicted = pol.batch_s
        times += r.batch_times_s[1:]
    sim = float(np.mean(times)) if times else float("nan")
    return {"layout": name.removeprefix("fixed:"), "predicted_s": round(predicted, 1), "simulated_s": round(sim, 1), "batches": len(times),
            "error_pct": round((predicted / sim - 1.0) * 100.0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=ROOT / "configs/experiments/mixed-elastic.yaml")
    ap.add_argument("--hours", type=float, default=3.0, help="simulated hours per layout and seed")
    ap.add_argument("--seeds", type=int_list(0), default=[0, 1], help="simulator seeds, comma-separated")
    ap.add_argument("--wait-tail", action="store_true", help="predict (and so route) with `predictor.wait_tail: true`")
    ap.add_argument("--out", type=Path, default=None, help="default results/mixed_degrees.json (with --wait-tail: mixed_degrees_wait_tail.json)")
    args = ap.parse_args()
    args.out = args.out or ROOT / ("results/mixed_degrees_wait_tail.json" if args.wait_tail else "results/mixed_degrees.json")
    if not 1.5 <= args.hours <= 24:
        ap.error(f"argument --hours: got {args.hours:g}; allowed: 1.5 to 24 (a run needs batches after its first; one takes 1,000-1,500 s)")
    seeds = args.seeds
    spec = load_spec(args.config, "mixed_degrees").model_copy(update={"elastic_traces": None})  # every spot GPU up
    spec = spec.model_copy(update={"predictor": spec.predictor.model_copy(update={"wait_tail": args.wait_tail or spec.predictor.wait_tail})})
    for _, template, role in SETS:
        for n, tp in DEGREES.items():
            name = template.format(x=f"{n}{role}@{tp}")
            if (problem := fixed_problem(name, spec, memory_model(spec).fits)) is not None:
                ap.error(f"{args.config}: the held layout {name} does not fit: {problem}")
    models = build_models(spec)
    t0 = time.perf_counter()
    sets = []
    for what, template, role in SETS:
        rows = [{"degree": tp, **held(models, template.format(x=f"{n}{role}@{tp}"), args.hours, seeds)} for n, tp in DEGREES.items()]
        low = min(r["predicted_s"] for r in rows)
        picks = [r for r in rows if r["predicted_s"] == low]  # a tie: both named, the worse one's regret
        best = min(rows, key=lambda r: r["simulated_s"])
        sets.append({"varies": what, "rows": rows, "predicted_pick": "=".join(r["degree"] for r in picks), "simulated_best": best["degree"],
                     "regret_pct": round((max(r["simulated_s"] for r in picks) / best["simulated_s"] - 1.0) * 100.0, 1)})
    wall = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": repo_relative(args.config),
                                    "hours": args.hours, "seeds": seeds, "wait_tail": spec.predictor.wait_tail, "wall_s": round(wall, 1), "sets": sets}, indent=1))
    from rich.console import Console
    from rich.table import Table

    tail = ", predictor.wait_tail" if spec.predictor.wait_tail else ""
    t = Table(title=f"held mixed layouts on {args.config.name}, every spot GPU up{tail}: batch s, {args.hours:g} simulated h x {len(seeds)} seeds")
    for c in ("varies", "degree", "layout", "predicted", "simulated", "error", "batches", "pick (regret)"):
        t.add_column(c, justify="right")
    for s in sets:
        for i, r in enumerate(s["rows"]):
            verdict = f"{s['predicted_pick']} ({s['regret_pct']:+.1f}%), sim best {s['simulated_best']}" if i == 0 else ""
            t.add_row(s["varies"] if i == 0 else "", r["degree"], r["layout"], f"{r['predicted_s']:.0f}", f"{r['simulated_s']:.0f}", f"{r['error_pct']:+.1f}%", str(r["batches"]), verdict)
    Console(width=160).print(t)
    print(f"wrote {args.out} ({wall:.0f} s)")


if __name__ == "__main__":
    main()
