"""Per-GPU-type speeds in the Ray runtime: does the tracker find the type whose profile is off?

A mixed cluster's types are profiled apart, some datasheet-derived. This runs `pearl train`'s
runtime (`Controller`, emulated engines) on configs/experiments/train-mixed-emulated.yaml with
one type's engines slower than its profile (`runtime.emulated_slowdown`, default H20 x2; the
planner starts from the profiles) and every elastic GPU there from the start (`--traces`: the
config's traces, whose windows give a type only a few batches), each repeat twice: with per-type speeds
(`runtime.refit_types: true`, the default) and with one speed for all types (false, as before).
The truth is an input here; nothing is fitted to it.

The runtime runs at `--time-scale` (default 10) virtual seconds per wall second, not the
shipped config's 40: on a 2-core machine an emulated engine's late events then cost 4x fewer
virtual seconds. At 40x the H800 engines' busy time read 1.31-1.65x their profile and the
learned H20 / H800 was 1.56-1.66 for a true 2.0; at 10x, 1.08-1.15x and 1.85-2.01 (README,
"Per-type speeds").

Per run it reports: the learned speed of the slowed type over the rollout type's (the truth
is the slowdown), the slowed type's share of the generating requests in the batches after the
first one it served (the router follows the decisions' shares), the run's rollout seconds,
and the mean batch seconds and |prediction error| over the run's second half. Writes
results/type_speeds.json and prints a table.

    python experiments/type_speeds.py --repeats 3 --steps 12 [--wait-tail --out results/type_speeds_wait_tail.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from collections import Counter
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models.builder import rollout_gpu_type  # noqa: E402
from models.config import ConfigError, ElasticEventSpec, ExperimentSpec, TimeScale, load_experiment  # noqa: E402

CONFIG = ROOT / "configs/experiments/train-mixed-emulated.yaml"
MIN_REQUESTS = 16  # as the tracker's MIN_TYPE_REQUESTS: a type that served fewer says nothing


def run_once(spec: ExperimentSpec, steps: int) -> list[dict[str, Any]]:
    """One runtime run; its rollout_step metrics records."""
    from runtime.ray_runtime.controller import Controller

    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        ctl = Controller(spec, backend="emulated", metrics_path=str(metrics))

        async def main() -> Any:
            try:
                return await ctl.run(steps)
            finally:
                await ctl.shutdown()

        summary = asyncio.run(main())
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
    if summary.lost_trajectories:
        raise SystemExit(f"type_speeds: {summary.lost_trajectories} trajectories lost; the run is not valid")
    return [r for r in records if r["record"] == "rollout_step"]


def summarize(steps: list[dict[str, Any]], slow: str, home: str) -> dict[str, Any]:
    """What one run shows (module docstring); None where the slowed type never served."""
    first = next((i for i, s in enumerate(steps) if any(t == slow and n >= MIN_REQUESTS for t, n, _, _ in s["type_seconds"])), None)
    speeds = steps[-1]["type_speeds"] if steps else {}
    learned = speeds[slow] / speeds[home] if slow in speeds and home in speeds else None
    after = steps[first + 1 :] if first is not None else []
    served: Counter[str] = Counter()
    for s in after:
        served.update({t: n for t, n, _, _ in s["type_seconds"]})
    total = sum(served.values())
    late = steps[len(steps) // 2 :]  # both variants have seen the slowed type by then (it serves from batch 2-5)
    errors = [abs(s["error"]) * 100 for s in late if not s["disrupted"]]
    return {
        "first_batch_on_slow_type": first,
        "learned_ratio": round(learned, 3) if learned is not None else None,
        "slow_type_request_share_after": round(served.get(slow, 0) / total, 3) if total else None,
        "rollout_s": round(sum(s["rollout_s"] for s in steps), 1),
        "late_batch_s": round(statistics.mean(s["rollout_s"] for s in late), 1) if late else None,
        "late_abs_error_pct": round(statistics.mean(errors), 1) if errors else None,
        # the batch-level engine speed the fit ends at (the engines run ~1.1x their profile at 10x), and how far batches ran past their predictions
        "final_speed": round(steps[-1]["speed"], 3) if steps else None,
        "measured_over_predicted": round(sum(s["rollout_s"] for s in steps) / sum(s["predicted_s"] for s in steps), 3) if steps else None,
        "steps": [{"step": s["step"], "kinds": s["kinds"], "type_seconds": s["type_seconds"], "type_speeds": s["type_speeds"], "speed": s["speed"],
                   "rollout_s": round(s["rollout_s"], 2), "predicted_s": round(s["predicted_s"], 2), "error_pct": round(s["error"] * 100, 1), "disrupted": s["disrupted"]} for s in steps],
    }


def parse_slowdown(text: str) -> tuple[str, float]:
    typ, _, value = text.partition("=")
    try:
        return typ, float(value)
    except ValueError:
        raise SystemExit(f"--slow: got {text!r}; allowed: TYPE=FACTOR, e.g. H20=2.0") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(CONFIG))
    ap.add_argument("--slow", default="H20=2.0", help="TYPE=FACTOR: that type's emulated engines run FACTOR times slower than its profile")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--time-scale", type=float, default=10.0, help="virtual seconds per wall second (runtime.time_scale; the config's is 40)")
    ap.add_argument("--traces", action="store_true", help="elastic GPUs follow the config's traces (default: all there from the start; the traces' windows give a type few batches)")
    ap.add_argument("--wait-tail", action="store_true", help="predict with predictor.wait_tail (the batch's last finisher; README, \"The tool waits' tail\")")
    ap.add_argument("--out", default=str(ROOT / "results/type_speeds.json"))
    args = ap.parse_args()
    slow, factor = parse_slowdown(args.slow)
    if args.repeats < 1 or args.steps < 2:
        raise SystemExit(f"type_speeds: --repeats {args.repeats} --steps {args.steps}; allowed: --repeats >= 1, --steps >= 2")
    scale = TimeScale.__metadata__[0]  # runtime.time_scale's own range, not a copy of it
    if not scale.lo <= args.time_scale <= scale.hi:
        raise SystemExit(f"type_speeds: --time-scale {args.time_scale:g}; allowed: {scale.allowed()} (runtime.time_scale's range)")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    try:
        base = load_experiment(args.config)
        if args.wait_tail:
            base = base.model_copy(update={"predictor": base.predictor.model_copy(update={"wait_tail": True})})
        check = base.model_copy(update={"runtime": base.runtime.model_copy(update={"emulated_slowdown": {slow: factor}})})
        types = sorted({g.gpu for g in check.cluster.nodes})
        if slow not in types or not 0 < factor <= 100:
            raise ConfigError(args.config, "--slow", args.slow, f"TYPE=FACTOR, TYPE one of {types}, FACTOR in (0, 100]")
    except ConfigError as err:
        raise SystemExit(f"type_speeds: {err}") from None
    home = rollout_gpu_type(base)
    rows = []
    for rep in range(args.repeats):
        for per_type in (True, False):
            update: dict[str, Any] = {"emulated_slowdown": {slow: factor}, "refit_types": per_type, "refit": True, "time_scale": args.time_scale}
            spec_update: dict[str, Any] = {}
            if not args.traces:  # every elastic GPU from the start: the slowed type can serve every batch
                update["elastic_events"] = [ElasticEventSpec(at_s=0, available=base.cluster.gpus_in_pool("elastic"))]
                spec_update["elastic_traces"] = {}
            spec = base.model_copy(update={"runtime": base.runtime.model_copy(update=update), **spec_update})
            steps = run_once(spec, args.steps)
            row = {"repeat": rep, "per_type_speeds": per_type, **summarize(steps, slow, home)}
            rows.append(row)
            print(f"repeat {rep} per_type={per_type}: learned {row['learned_ratio']}, {slow} share after {row['slow_type_request_share_after']}, "
                  f"rollout {row['rollout_s']} s, late batches {row['late_batch_s']} s, |error| {row['late_abs_error_pct']}%", file=sys.stderr)
    meta = {"config": os.path.relpath(args.config, ROOT), "elastic": "traces" if args.traces else "all from the start", "slowed_type": slow, "slowdown": factor, "rollout_type": home, "steps": args.steps, "repeats": args.repeats,
            "time_scale": args.time_scale, "wait_tail": base.predictor.wait_tail,
            "machine": "shared 2-core VM", "load_average_1m": round(os.getloadavg()[0], 2)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))

    from rich.table import Table

    from runtime.tables import table_console

    t = Table(title=f"{slow} engines {factor:g}x slower than their profile; {args.steps} steps per run{'; predictor.wait_tail' if args.wait_tail else ''} ({args.out})")
    for c in ("repeat", "speeds", f"learned {slow}/{home}", f"{slow} request share", "rollout s (all)", "batch s (2nd half)", "|error| % (2nd half)",
              "final speed", "measured / predicted"):
        t.add_column(c, justify="right")
    keys = ("learned_ratio", "slow_type_request_share_after", "rollout_s", "late_batch_s", "late_abs_error_pct", "final_speed", "measured_over_predicted")
    for r in rows:
        t.add_row(str(r["repeat"]), "per type" if r["per_type_speeds"] else "one for all", *(str(r[k]) for k in keys))
    for per_type in (True, False):
        mine = [r for r in rows if r["per_type_speeds"] is per_type]

        def med(key: str) -> str:
            vals = [r[key] for r in mine if r[key] is not None]
            return f"{statistics.median(vals):g}" if vals else "-"

        t.add_row("median", "per type" if per_type else "one for all", *(med(k) for k in keys), style="bold")
    table_console().print(t)


if __name__ == "__main__":
    main()
