"""Late returns, measured: what happens to lent training GPUs when the plan misjudges the trainer.

A fixed layout of 16 colocated TP2 engines, 8 of them on lent training GPUs, on the
default cluster (Qwen3-8B, 32 x H800), no elastic GPUs. The trainer timeline starts from
the plan's batch time; the recall is decided when the borrow window closes
(`return_due`). The plan's batch time is the predictor's own, scaled by each factor:
below 1 the plan expects the trainer early and recalls in time; above 1 the batch ends
before the recall, the training step waits for its GPUs and the loan ledger counts it.
Also PEARL on the default config's Bamboo trace with a planner whose tool latency is off
by each factor (the simulated system keeps the configured one).

Writes results/late_returns.json and prints a table.
    python experiments/late_returns.py [--hours 1] [--factors 0.5,0.7,1.0,1.5,3.0]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.cli_args import load_spec, positive_floats  # noqa: E402


def _row(kind: str, factor: float, r) -> dict:
    s = r.summary()
    return {"scenario": kind, "factor": factor, "steps": s["steps"], "lends": s["lends"], "returns": s["returns"],
            "late_returns": s["late_returns"], "train_delay_s": s["train_delay_s"], "forced_returns": s["forced_returns"],
            "tokens_per_s": s["tokens_per_s"], "lost": s["lost_trajectories"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs/experiments/default.yaml"))
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--factors", type=positive_floats, default=[0.5, 0.7, 1.0, 1.5, 3.0], help="tool-latency factors the planner believes, comma-separated")
    ap.add_argument("--out", default=str(ROOT / "results/late_returns.json"))
    args = ap.parse_args()
    from models.builder import build_models
    from models.config import repo_relative
    from runtime.sim.layout import FixedLayout, Layout
    from runtime.sim.planner_adapter import PlannerPolicy
    from runtime.sim.run import TraceFlags, load_availability
    from runtime.sim.simulator import Simulator

    factors = args.factors
    spec = load_spec(args.config, "late_returns")
    rows = []
    quiet = spec.model_copy(update={"trace": None})
    m = build_models(quiet)
    tp = {"colocated": m.tp_colocated, "prefill": m.tp_prefill, "decode": m.tp_decode}
    pred = m.predictor.colocated(16).completion_s
    for f in factors:
        pol = FixedLayout(Layout("colocated", colocated=16, borrow=8), tp, predicted_s=f * pred)
        rows.append(_row("fixed 16C, 8 on lent GPUs", f, Simulator(m, pol, None, hours=args.hours).run()))
    true = build_models(spec)
    avail = load_availability(spec, TraceFlags(), args.hours)
    for f in factors:
        w = spec.workload
        env = w.env_latency_s.model_copy(update={k: v * f for k, v in w.env_latency_s.model_dump().items() if k in ("mean", "min", "max") and v is not None})
        believed = build_models(spec.model_copy(update={"workload": w.model_copy(update={"env_latency_s": env})}))
        rows.append(_row("pearl, tool latency believed x factor", f, Simulator(true, PlannerPolicy("pearl", believed), avail, hours=args.hours).run()))
    out = {"config": repo_relative(args.config), "hours": args.hours, "predicted_batch_s": round(pred, 2), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"late returns, measured ({args.hours:g} simulated h; predicted batch {pred:.0f} s)")
    for col in ("scenario", "factor", "steps", "GPUs lent", "late returns", "train delay s", "forced", "tokens/s", "lost"):
        t.add_column(col, justify="left" if col == "scenario" else "right")
    for r in rows:
        t.add_row(r["scenario"], f"{r['factor']:g}", str(r["steps"]), str(r["lends"]), str(r["late_returns"]), f"{r['train_delay_s']:.1f}",
                  str(r["forced_returns"]), f"{r['tokens_per_s']:,.0f}", str(r["lost"]))
    Console(width=160).print(t)


if __name__ == "__main__":
    main()
