"""Benchmark: time per candidate of the rollout predictor (target <= 1 ms per candidate).

The planner tabulates predictions for every instance count and P:D split, so what matters
is the cost of one candidate inside a vectorised call (colocated_many / decode_path_many /
prefill_path_many over 1..512 instances) and of the scalar conveniences. Reports the median
of several runs, for a cold predictor (first call builds per-turn constants) and a warm one.

    .venv/bin/python experiments/bench_predictor.py [--runs 7] [--max-instances 512]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import numpy as np
from rich.console import Console
from rich.table import Table

from models.builder import build_models
from models.config import load_experiment

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ["configs/experiments/pd-crossover.yaml", "configs/experiments/default.yaml", "configs/experiments/cpu-tiny.yaml"]
TARGET_MS = 1.0


def median_s(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_config(path: str, runs: int, max_instances: int) -> list[dict]:
    spec = load_experiment(ROOT / path)
    n = np.arange(1, max_instances + 1)
    rows: list[dict] = []

    def fresh():  # a new predictor: its per-turn constants are not cached yet
        return build_models(spec).predictor

    turns = fresh().shape.turns
    cases: list[tuple[str, int, Callable[[object], object]]] = [
        ("colocated_many", len(n), lambda p: p.colocated_many(n)),
        ("decode_path_many", len(n), lambda p: p.decode_path_many(n)),
        ("prefill_path_many", len(n), lambda p: p.prefill_path_many(n)),
        ("best_disaggregated(8)", 7, lambda p: p.best_disaggregated(8)),
        ("best_disaggregated(64)", 63, lambda p: p.best_disaggregated(64)),
        ("colocated(8) scalar", 1, lambda p: p.colocated(8)),
        ("disaggregated(4,4) scalar", 1, lambda p: p.disaggregated(4, 4)),
    ]
    for name, candidates, call in cases:
        warm_pred = fresh()
        call(warm_pred)
        warm = median_s(lambda: call(warm_pred), runs)
        cold_times = []
        for _ in range(runs):
            p = fresh()
            t0 = time.perf_counter()
            call(p)
            cold_times.append(time.perf_counter() - t0)
        cold = statistics.median(cold_times)
        rows.append({
            "config": Path(path).stem, "turns": turns, "call": name, "candidates": candidates,
            "warm_ms_per_call": warm * 1e3, "warm_ms_per_candidate": warm * 1e3 / candidates,
            "cold_ms_per_call": cold * 1e3, "cold_ms_per_candidate": cold * 1e3 / candidates,
            "meets_target": cold * 1e3 / candidates <= TARGET_MS,
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--max-instances", type=int, default=512)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_predictor.json")
    args = ap.parse_args()
    rows = [r for cfg in CONFIGS for r in bench_config(cfg, args.runs, args.max_instances)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"runs": args.runs, "max_instances": args.max_instances, "target_ms_per_candidate": TARGET_MS,
            "machine": f"{platform.processor() or platform.machine()} ({platform.system()}), python {platform.python_version()}",
            "statistic": "median over runs; cold = fresh predictor (per-turn constants built in the call)"}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    t = Table(title=f"predictor time per candidate (median of {args.runs}; target <= {TARGET_MS} ms)")
    for c in ("config", "turns", "call", "candidates", "warm ms/cand", "cold ms/cand", "cold ms/call", "<= 1 ms"):
        t.add_column(c, justify="right" if c not in ("config", "call") else "left")
    for r in rows:
        t.add_row(r["config"], str(r["turns"]), r["call"], str(r["candidates"]), f"{r['warm_ms_per_candidate']:.4f}",
                  f"{r['cold_ms_per_candidate']:.4f}", f"{r['cold_ms_per_call']:.3f}", "yes" if r["meets_target"] else "NO")
    Console(width=150).print(t)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
