"""The tool waits' tail: the predictor with and without `predictor.wait_tail` against the simulator.

By default the predictor follows the trajectory with the most turns at the mean tool wait; with
`predictor.wait_tail: true` it predicts the batch's last finisher (models/wait_tail.py). Two
settings, each simulated once and predicted both ways (the simulator runs the engine model step
by step and draws every trajectory's own waits; it never reads the predictor's completion):

  calibrated   configs/experiments/pd-crossover.yaml (Qwen3-30B-A3B, 16 H800 as 8 TP2 workers,
               the calibrated workload: waits lognormal, mean 9.4 s, cv 1): per batch size every
               layout, colocated(8) and each P:D split; the error of each prediction, and the
               simulated regret of each predictor's pick over the simulated best;
  mixed        configs/experiments/train-mixed-emulated.yaml (reserved and lent H800, spot A100
               and H20; waits lognormal, mean 3.95 s, cv 1, at most 30 s; batches of 64):
               fixed layouts on the reserved H800 (`--home`), and the layout the planner picks
               with every elastic GPU present (no lending, staleness 0, no refit) under each
               predictor, each simulated;
  elastic      configs/experiments/mixed-elastic.yaml (batches of 1,024, spot H20 and A100 on
               their traces): PEARL's 2 simulated hours under each predictor, per seed, as
               `pearl simulate` runs it (tokens/s, batches, mean batch time).

Writes results/wait_tail.json and prints a table per setting.

    python experiments/wait_tail.py [--batches 64,256,1024] [--simulated-batches 6] [--mixed-batches 20] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models.builder import ExperimentModels, build_models, rollout_gpu_count  # noqa: E402
from experiments.cli_args import int_list, load_spec, one_int  # noqa: E402
from experiments.predictor_vs_sim import layouts  # noqa: E402
from models.config import ElasticEventSpec, ExperimentSpec, layout_counts, repo_relative  # noqa: E402
from runtime.sim.layout import FixedLayout, Layout  # noqa: E402
from runtime.sim.planner_adapter import PlannerPolicy  # noqa: E402
from runtime.sim.simulator import Simulator  # noqa: E402

PREDICTORS = ("plain", "wait_tail")


def with_tail(spec: ExperimentSpec, on: bool) -> ExperimentSpec:
    return spec.model_copy(update={"predictor": spec.predictor.model_copy(update={"wait_tail": on})})


def predicted(models: ExperimentModels, lay: Layout) -> float:
    p = models.predictor
    return (p.colocated(lay.colocated) if lay.mode == "colocated" else p.disaggregated(lay.prefill, lay.decode)).completion_s


def simulated(models: ExperimentModels, lay: Layout, batches: int, horizon_s: float, seeds: list[int]) -> tuple[float, int]:
    """Mean batch time over each seed's batches after its first (it starts cold), and how many."""
    tp = {"colocated": models.tp_colocated, "prefill": models.tp_prefill, "decode": models.tp_decode}
    times: list[float] = []
    for seed in seeds:
        r = Simulator(models, FixedLayout(lay, tp), None, hours=max(horizon_s * batches, 60.0) / 3600.0, seed=seed, rollout_only=True).run()
        times += r.batch_times_s[1:] if len(r.batch_times_s) > 2 else r.batch_times_s
    return float(np.mean(times)), len(times)


def error_pct(pred: float, sim: float) -> float:
    return round((pred / sim - 1.0) * 100.0, 1)


def calibrated(spec: ExperimentSpec, batch: int, batches: int, seeds: list[int]) -> dict:
    wl = spec.workload.model_copy(update={"trajectories_per_batch": batch})
    s = spec.model_copy(update={"workload": wl, "trace": None, "training": spec.training.model_copy(update={"staleness": 0})})
    plain, tail = build_models(with_tail(s, False)), build_models(with_tail(s, True))
    workers = rollout_gpu_count(s) // plain.tp_colocated
    rows = []
    for name, lay in layouts(workers):
        p, t = predicted(plain, lay), predicted(tail, lay)
        sim, n = simulated(plain, lay, batches, p, seeds)
        rows.append({"layout": name, "plain_s": round(p, 1), "wait_tail_s": round(t, 1), "simulated_s": round(sim, 1), "batches": n,
                     "plain_error_pct": error_pct(p, sim), "wait_tail_error_pct": error_pct(t, sim)})
    best = min(rows, key=lambda r: r["simulated_s"])
    out = {"batch": batch, "layouts": rows, "simulator_best": best["layout"]}
    for k in PREDICTORS:
        pick = min(rows, key=lambda r: r[f"{k}_s"])
        errors = [r[f"{k}_error_pct"] for r in rows]
        out[k] = {"pick": pick["layout"], "regret_pct": round((pick["simulated_s"] / best["simulated_s"] - 1) * 100, 1),
                  "mean_abs_error_pct": round(statistics.mean(abs(e) for e in errors), 1), "mean_error_pct": round(statistics.mean(errors), 1)}
    return out


def mixed_spec(spec: ExperimentSpec) -> ExperimentSpec:
    """Every elastic GPU present from the start, nothing lent, no staleness, no refit: one layout, held."""
    return spec.model_copy(update={
        "training": spec.training.model_copy(update={"staleness": 0}),
        "policy": spec.policy.model_copy(update={"name": "pearl-no-borrow"}),
        "runtime": spec.runtime.model_copy(update={"refit": False, "elastic_events": [ElasticEventSpec(at_s=0, available=spec.cluster.gpus_in_pool("elastic"))]}),
        "elastic_traces": {}, "trace": None,
    })


def planner_layout(spec: ExperimentSpec, batches: int, seeds: list[int]) -> dict:
    """The planner's first layout and the batches it ran (every decision after the first keeps
    it: nothing changes on the cluster, and nothing is refitted)."""
    models = build_models(spec)
    pool = spec.cluster.gpus_in_pool("elastic")
    horizon = max(float(models.predictor.colocated(1).completion_s), 60.0) * 1.5 * (batches + 1)
    times: list[float] = []
    layouts: set[str] = set()
    first: dict = {}
    for seed in seeds:
        r = Simulator(models, PlannerPolicy(spec.policy.name, models), None, hours=horizon / 3600.0, seed=seed, elastic_events=((0.0, pool, None),)).run()
        applied = [info for _, _, _, info in r.decision_log if info.get("applied") and "layout_by_type" in info]
        first = first or (applied[0] if applied else {})
        layouts |= {json.dumps(a["layout_by_type"], sort_keys=True) for a in applied}
        times += r.batch_times_s[1 : batches + 1]
    return {"layout": first.get("layout_by_type"), "layouts_applied": len(layouts), "predicted_s": first.get("predicted_s"),
            "simulated_s": round(float(np.mean(times)), 1) if times else None, "batches": len(times)}


def mixed(spec: ExperimentSpec, home: list[str], batches: int, seeds: list[int]) -> dict:
    s = mixed_spec(spec)
    out: dict = {"home": [], "planner": {}}
    plain, tail = build_models(with_tail(s, False)), build_models(with_tail(s, True))
    for name in home:
        c, p_, d = layout_counts(name)  # checked in main
        lay = Layout("colocated" if c else "disaggregated", c, p_, d)
        p, t = predicted(plain, lay), predicted(tail, lay)
        sim, n = simulated(plain, lay, batches, p, seeds)
        out["home"].append({"layout": f"{name} H800 TP1", "plain_s": round(p, 1), "wait_tail_s": round(t, 1), "simulated_s": round(sim, 1), "batches": n,
                            "plain_error_pct": error_pct(p, sim), "wait_tail_error_pct": error_pct(t, sim)})
    for k, on in zip(PREDICTORS, (False, True)):
        row = planner_layout(with_tail(s, on), batches, seeds)
        if row["simulated_s"] and row["predicted_s"]:
            row["error_pct"] = error_pct(row["predicted_s"], row["simulated_s"])
        out["planner"][k] = row
    return out


def elastic(spec: ExperimentSpec, seeds: list[int]) -> list[dict]:
    """PEARL over the config's trace window under each predictor, per seed."""
    from runtime.sim.run import TraceFlags, run_hours
    from runtime.sim.run import simulate as run_sim

    hours = run_hours(spec)
    rows = []
    for seed in seeds:
        row: dict = {"seed": seed, "hours": hours}
        for k, on in zip(PREDICTORS, (False, True)):
            r = run_sim(with_tail(spec, on), "pearl", TraceFlags(), hours=hours, seed=seed)
            first = next((info.get("layout_by_type") for _, _, _, info in r.decision_log if info.get("applied") and "layout_by_type" in info), None)
            row[k] = {"tokens_per_s": round(r.tokens_per_s, 1), "batches": len(r.batch_times_s),
                      "mean_batch_s": round(float(np.mean(r.batch_times_s)), 1) if r.batch_times_s else None, "first_layout": first}
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=ROOT / "configs/experiments/pd-crossover.yaml", help="the calibrated setting")
    ap.add_argument("--mixed-config", type=Path, default=ROOT / "configs/experiments/train-mixed-emulated.yaml")
    ap.add_argument("--batches", type=int_list(1), default=[64, 256, 1024], help="trajectories per rollout batch (calibrated setting)")
    ap.add_argument("--simulated-batches", type=one_int(2), default=6, help="batches simulated per layout, calibrated setting (the first, cold one is dropped)")
    ap.add_argument("--mixed-batches", type=one_int(2), default=20, help="batches simulated per layout, mixed setting (the first is dropped)")
    ap.add_argument("--elastic-config", type=Path, default=ROOT / "configs/experiments/mixed-elastic.yaml")
    ap.add_argument("--elastic-seeds", type=int_list(0), default=[0, 1, 2, 3], help="seeds of the elastic setting's runs")
    ap.add_argument("--home", default="1C,2C,1P1D", help="fixed layouts on the mixed setting's reserved H800 (TP1)")
    ap.add_argument("--seeds", type=int_list(0), default=[0], help="simulator seeds; every layout's batches pooled over them")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "results")
    args = ap.parse_args()
    bad = [h for h in args.home.split(",") if h and layout_counts(h) is None]
    if bad:
        ap.error(f"argument --home: got {bad[0]!r}; allowed: layout labels like 1C or 1P1D, comma-separated")
    t0 = time.perf_counter()
    spec, mixed_spec, elastic_spec = (load_spec(c, "wait_tail") for c in (args.config, args.mixed_config, args.elastic_config))  # all before the work
    seeds = args.seeds
    cal = [calibrated(spec, b, args.simulated_batches, seeds) for b in args.batches]
    mix = mixed(mixed_spec, [h for h in args.home.split(",") if h], args.mixed_batches, seeds)
    ela = elastic(elastic_spec, args.elastic_seeds)
    wall = time.perf_counter() - t0
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / "wait_tail.json"
    out.write_text(json.dumps({"calibrated_config": repo_relative(args.config),
                               "mixed_config": repo_relative(args.mixed_config),
                               "seeds": seeds, "elastic_config": repo_relative(args.elastic_config),
                               "wall_s": round(wall, 1), "calibrated": cal, "mixed": mix, "elastic": ela}, indent=1))
    con = Console(width=140)
    t = Table(title=f"calibrated workload ({args.config.name}): predicted / simulated - 1, every layout")
    for c in ("batch", "mean |err| plain", "mean |err| wait_tail", "mean err plain", "mean err wait_tail", "picks plain (regret)", "picks wait_tail (regret)", "sim best"):
        t.add_column(c, justify="right")
    for r in cal:
        a, b = r["plain"], r["wait_tail"]
        t.add_row(str(r["batch"]), f"{a['mean_abs_error_pct']:.1f}%", f"{b['mean_abs_error_pct']:.1f}%", f"{a['mean_error_pct']:+.1f}%", f"{b['mean_error_pct']:+.1f}%",
                  f"{a['pick']} ({a['regret_pct']:+.1f}%)", f"{b['pick']} ({b['regret_pct']:+.1f}%)", r["simulator_best"])
    con.print(t)
    t = Table(title=f"mixed cluster ({args.mixed_config.name}): batch time, s")
    for c in ("layout", "predicted plain", "predicted wait_tail", "simulated", "batches"):
        t.add_column(c, justify="right")
    for r in mix["home"]:
        t.add_row(r["layout"], f"{r['plain_s']:.1f} ({r['plain_error_pct']:+.1f}%)", f"{r['wait_tail_s']:.1f} ({r['wait_tail_error_pct']:+.1f}%)", f"{r['simulated_s']:.1f}", str(r["batches"]))
    for k, r in mix["planner"].items():
        label = f"planner, {k}: " + ", ".join(f"{ty} {lay}" for ty, lay in (r["layout"] or {}).items())
        pred = f"{r['predicted_s']:.1f} ({r.get('error_pct', float('nan')):+.1f}%)" if r["predicted_s"] else "-"
        t.add_row(label, pred if k == "plain" else "", pred if k == "wait_tail" else "", f"{r['simulated_s']}", str(r["batches"]))
    con.print(t)
    t = Table(title=f"PEARL on {args.elastic_config.name}, {ela[0]['hours'] if ela else 0:g} simulated h per seed")
    for c in ("seed", "tokens/s plain", "tokens/s wait_tail", "batches plain / wait_tail", "mean batch s plain / wait_tail"):
        t.add_column(c, justify="right")
    for r in ela:
        a, b = r["plain"], r["wait_tail"]
        t.add_row(str(r["seed"]), f"{a['tokens_per_s']:,.0f}", f"{b['tokens_per_s']:,.0f}", f"{a['batches']} / {b['batches']}", f"{a['mean_batch_s']} / {b['mean_batch_s']}")
    con.print(t)
    print(f"wrote {out} ({wall:.0f} s)")


if __name__ == "__main__":
    main()
