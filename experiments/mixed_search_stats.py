"""Where the mixed program's decisions spend their work, per cluster size: the searches' corner
programs and fractional bounds, the usable GPUs, the table entries left after the entry
pruning, the time inside CP-SAT's native solve of the programs, and the time outside the search.

Why: `bench_planner.py --mixed` times whole decisions; this says why one size is slow and another
fast. It walks the same seeded events (`bench_planner.walk`, CBC, the default backend) and counts
what `planner/mixed_search.py` does by wrapping its module functions for the run (the planner
itself is unchanged). Counts are the same from run to run; times move with the machine.
Writes results/mixed_search_stats.json and prints a table. `--batch-per-gpu B`: each size plans
B trajectories per GPU (bench_planner's flag), written to results/mixed_search_stats_per_gpu<B>.json.

    python experiments/mixed_search_stats.py --gpus 16,64,256,512,1024,4096
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from ortools.sat.python import cp_model_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

import bench_planner as bp  # noqa: E402

from experiments.cli_args import int_list, load_spec, one_int, one_positive  # noqa: E402
from models.builder import build_models  # noqa: E402
from models.config import repo_relative  # noqa: E402
from planner import mixed_search  # noqa: E402
from planner.inputs import planning_inputs  # noqa: E402
from planner.policies import get_policy  # noqa: E402
from runtime.jsonout import print_json, stdout_to_stderr  # noqa: E402

ROLE_NAMES = ("colocated", "prefill", "decode")


class SearchLog:
    """Counts corner programs and bounds per search, and searches per decision, while installed;
    and the time each decision spends inside CP-SAT's native solve (the corner programs' solver,
    `solver.exact_backend`): the part of a decision no Python-side change can shorten."""

    def __init__(self) -> None:
        self.searches: list[dict] = []
        self.decision = 0
        self.native_ms: dict[int, float] = {}  # per decision: ms inside CP-SAT's native solve
        self._programs = self._bounds = 0

    def install(self) -> None:
        solve, bound, search = mixed_search.solve_model, mixed_search._lp_bound, mixed_search.search_mixed
        policy = type(get_policy("pearl", "cbc"))
        decide = policy.decide

        def counted_solve(*a, **k):
            self._programs += 1
            return solve(*a, **k)

        def counted_bound(*a, **k):
            self._bounds += 1
            return bound(*a, **k)

        def logged_search(p, *a, **k):
            programs, bounds, t0 = self._programs, self._bounds, time.perf_counter()
            out = search(p, *a, **k)
            self.searches.append({"decision": self.decision, "ms": (time.perf_counter() - t0) * 1000.0, "programs": self._programs - programs,
                                  "bounds": self._bounds - bounds, "usable_gpus": sum(g.total_cap for g in p.groups),
                                  "entries": [sum(kt.k.size for kt in rk.kinds) for rk in p.roles]})
            return out

        log, native = self, cp_model_helper.SolveWrapper

        class TimedSolveWrapper:
            """cp_model_helper.SolveWrapper, timing its native solve (the planner builds one per program)."""

            def __init__(self) -> None:
                self._wrapper = native()

            def set_parameters(self, params) -> None:
                self._wrapper.set_parameters(params)

            def solve(self, proto):
                t0 = time.perf_counter()
                try:
                    return self._wrapper.solve(proto)
                finally:
                    log.native_ms[log.decision] = log.native_ms.get(log.decision, 0.0) + (time.perf_counter() - t0) * 1000.0

        cp_model_helper.SolveWrapper = TimedSolveWrapper

        def counted_decide(pol, *a, **k):
            try:
                return decide(pol, *a, **k)
            finally:
                self.decision += 1

        mixed_search.solve_model, mixed_search._lp_bound, mixed_search.search_mixed = counted_solve, counted_bound, logged_search
        policy.decide = counted_decide


def size_row(models, n: int, events: int, seed: int, log: SearchLog, batch_per_gpu: float | None = None) -> dict:
    inputs = planning_inputs(bp.models_at(models, n, batch_per_gpu), n)
    inputs = replace(inputs, solver=replace(inputs.solver, time_limit_s=10.0))
    base, evs = bp.mixed_cluster(n), bp.events(n, events, seed)
    bp.walk(base, inputs, "cbc", evs[:2])  # warm: imports, the solver's first call
    log.searches.clear()
    first = log.decision
    total, *_ = bp.walk(base, inputs, "cbc", evs)
    s = log.searches
    in_search = np.zeros(len(total))
    for x in s:
        in_search[x["decision"] - first] += x["ms"]
    programs = np.array([x["programs"] for x in s])
    native = np.array([log.native_ms.get(first + i, 0.0) for i in range(len(total))])
    med = lambda key: float(np.median([x[key] for x in s]))  # noqa: E731
    return {
        "gpus": n, "batch": inputs.batch, "decisions": len(total), "searches": len(s),
        "decision_ms_p50": round(float(np.percentile(total, 50)), 1), "decision_ms_p95": round(float(np.percentile(total, 95)), 1),
        "outside_search_ms_median": round(float(np.median(np.asarray(total) - in_search)), 1),
        "native_solve_ms_p50": round(float(np.percentile(native, 50)), 1), "native_solve_ms_p95": round(float(np.percentile(native, 95)), 1),
        "search_ms_median": round(med("ms"), 1), "search_ms_max": round(max(x["ms"] for x in s), 1),
        "programs_median": float(np.median(programs)), "programs_max": int(programs.max()), "programs_total": int(programs.sum()),
        "bounds_median": med("bounds"), "usable_gpus_median": med("usable_gpus"),
        "entries_median": {r: float(np.median([x["entries"][i] for x in s])) for i, r in enumerate(ROLE_NAMES)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int_list(1), default=[16, 64, 256, 512, 1024, 4096], help="cluster sizes, comma-separated")
    ap.add_argument("--events", type=one_int(1), default=20, help="events per walk (>= 1)")
    ap.add_argument("--seed", type=one_int(0), default=0)
    ap.add_argument("--config", default=str(ROOT / "configs/experiments/mixed-elastic.yaml"))
    ap.add_argument("--out", default=str(ROOT / "results/mixed_search_stats.json"))
    ap.add_argument("--batch-per-gpu", type=one_positive, default=None,
                    help="trajectories per batch per GPU of each size, as bench_planner's (default: the config's batch at every size)")
    ap.add_argument("--json", action="store_true", help="print the document as one JSON object on stdout")
    args = ap.parse_args()
    if args.batch_per_gpu and args.out == str(ROOT / "results/mixed_search_stats.json"):
        args.out = args.out.removesuffix(".json") + f"_per_gpu{args.batch_per_gpu:g}.json"
    spec = load_spec(args.config, "mixed_search_stats")
    bp.check_batches(spec, args.gpus, args.batch_per_gpu, "mixed_search_stats")
    models = build_models(spec)
    log = SearchLog()
    log.install()
    with stdout_to_stderr(args.json):
        rows = [size_row(models, n, args.events, args.seed, log, args.batch_per_gpu) for n in args.gpus]
    doc = {"config": repo_relative(args.config), "events": args.events, "seed": args.seed, "backend": "cbc", "batch_per_gpu": args.batch_per_gpu, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    from rich.table import Table

    from runtime.tables import table_console

    per_gpu = f", {args.batch_per_gpu:g} trajectories per batch per GPU" if args.batch_per_gpu else ""
    t = Table(title=f"mixed search work per decision, {args.events}-event walk (pearl, CBC{per_gpu}), medians over searches")
    for c in ("GPUs", "batch", "decision p50 / p95 ms", "in CP-SAT p50 / p95 ms", "outside search ms", "search ms (max)", "programs (max)", "bounds", "usable GPUs", "entries C / P / D"):
        t.add_column(c, justify="right")
    for r in rows:
        e = r["entries_median"]
        t.add_row(str(r["gpus"]), str(r["batch"]), f"{r['decision_ms_p50']:.1f} / {r['decision_ms_p95']:.1f}",
                  f"{r['native_solve_ms_p50']:.1f} / {r['native_solve_ms_p95']:.1f}", f"{r['outside_search_ms_median']:.1f}",
                  f"{r['search_ms_median']:.1f} ({r['search_ms_max']:.0f})", f"{r['programs_median']:g} ({r['programs_max']})", f"{r['bounds_median']:g}",
                  f"{r['usable_gpus_median']:g}", f"{e['colocated']:g} / {e['prefill']:g} / {e['decode']:g}")
    table_console(stderr=args.json).print(t)
    if args.json:
        print_json(doc)


if __name__ == "__main__":
    main()
