"""Simulator speed: 24 h of a 256-GPU cluster under PEARL (configs/experiments/bench-256.yaml).

Target: <= 60 s on one core. Writes results/bench_sim.json and prints a table.
    python experiments/bench_sim.py [--hours 24] [--policy pearl] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs/experiments/bench-256.yaml"))
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--policy", default="pearl")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "results/bench_sim.json"))
    args = ap.parse_args()
    from models.config import load_experiment
    from runtime.sim.run import TraceFlags, simulate

    spec = load_experiment(args.config)
    gpus = sum(g.count * g.gpus_per_node for g in spec.cluster.nodes)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    r = simulate(spec, args.policy, TraceFlags(), hours=args.hours)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    out = {
        "config": Path(args.config).name, "policy": args.policy, "gpus": gpus, "simulated_hours": args.hours,
        "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "events": r.events, "events_per_s": round(r.events / wall, 0),
        "target_wall_s": 60.0, "meets_target": wall <= 60.0, "decisions": r.decisions,
        "policy_wall_s": round(r.policy_wall_s, 2), "simulator_wall_s": round(wall - r.policy_wall_s, 2),
        "simulator_events_per_s": round(r.events / max(wall - r.policy_wall_s, 1e-9), 0), "policy_failures": r.policy_failures,
        "trajectories": r.finished, "steps": r.steps, "tokens_per_s": round(r.tokens_per_s, 1),
        "lost_trajectories": r.lost_trajectories, "late_returns": r.late_returns,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    if args.json:
        print(json.dumps(out))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"simulator benchmark: {gpus} GPUs, {args.hours:g} h, {args.policy}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in out.items():
        t.add_row(k, str(v))
    Console().print(t)


if __name__ == "__main__":
    main()
