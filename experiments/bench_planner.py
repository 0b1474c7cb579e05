"""Benchmark full planning steps (state -> decision -> transition plan) per solver backend.

Clusters of N GPUs shaped like the paper's (half training GPUs in 8-GPU nodes, one eighth
reserved rollout GPUs, three eighths elastic in 2-GPU spot instances, TP2 workers, the
Qwen3-8B / H800 models of configs/experiments/default.yaml). Each backend walks the same
seeded event sequence with the `pearl` policy: elastic availability changes, preemption
notices, training begins / ends (borrowing windows), different unfinished fractions;
every step's plan is applied, so states evolve as they would online. A step is timed from
the state to the plan (including the borrow-gate second solve when the trainer waits);
the prediction tables are built once per N (once per refit online) and timed apart.
Each decision runs inside `runtime.gc_pause.gc_deferred()`, as the runtimes call it.

`--mixed`: three GPU types and TP in {1, 2, 4} for every role (the models of
configs/experiments/mixed-elastic.yaml: H800 for training and reserved rollout, elastic H20
and A100 in 4-GPU instances, each elastic type following its own seeded availability), solved
by the mixed program (planner/mixed.py); writes results/bench_planner_mixed.json. Every row
solves the search's exact-units programs on the config's `solver.exact_backend` (default
cpsat; `meta.exact_backend`) and the rest on the row's backend.

`--slot-pricing` (the default config's `solver.slot_pricing: true`): single-type programs whose
groups are plain instance slots (one TP degree, roles priced alike) are priced directly, exactly,
without a solver (planner/uniform.py); the row's `slot_priced_fraction` says how many decisions
were; writes results/bench_planner_slots.json. `--no-slot-pricing`: every program on the row's
backend (the MILP), the backends compared; writes results/bench_planner.json.

`--batch-per-gpu B`: each size plans a batch of B trajectories per GPU (whole GRPO groups)
instead of the config's batch at every size (`with_batch_per_gpu`); writes
results/bench_planner[_mixed or _slots]_per_gpu<B>.json. The config's batch leaves a large
cluster GPUs to spare, which makes its decisions easy; B = the config's batch / a size keeps
that size's load.

`--gap G`: `solver.relative_gap` = G, every decision proven within G of its objective rather
than exactly (`optimal_fraction` then counts those; `meta.relative_gap` says which); writes
results/bench_planner[_mixed]_gap<G>.json, so the exact runs' files stay.

Each file holds one object per GPU count and backend (gpus, backend,
solve_ms_p50, solve_ms_p95, optimal_fraction, decisions, solver_ms_p95, default) and prints
a table (also cpu_ms_p95: CPU time of the step, which a busy shared machine inflates less than wall time). The default backend is the one that proves every decision optimal with the lowest
p95 at the largest size. `--json` prints the same document ({"meta", "rows"}) as the one
JSON object on stdout and the table on stderr.

    python experiments/bench_planner.py --gpus 16,64,256,1024,4096 --no-slot-pricing --json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models.builder import ExperimentModels, build_models  # noqa: E402
from experiments.cli_args import int_list, load_spec, one_int, one_positive  # noqa: E402
from models.config import ExperimentSpec, repo_relative  # noqa: E402
from planner.backends import BACKENDS  # noqa: E402
from planner.inputs import planning_inputs  # noqa: E402
from planner.policies import PlanningError, get_policy  # noqa: E402
from planner.state import ClusterState, TrainerPhase, initial_state  # noqa: E402
from planner.transition import apply_plan  # noqa: E402
from runtime.gc_pause import gc_deferred  # noqa: E402
from runtime.jsonout import print_json, stdout_to_stderr  # noqa: E402


def cluster(n: int) -> ClusterState:
    train, reserved = n // 2, max(n // 8, 2)
    elastic = n - train - reserved
    per_train = min(8, train)
    per_res = min(8, reserved)
    return initial_state([
        (train // per_train, per_train, "H800", "training"),
        (reserved // per_res, per_res, "H800", "rollout"),
        (elastic // 2, 2, "H800", "elastic"),
    ], TrainerPhase("training", 0.0))


def mixed_cluster(n: int) -> ClusterState:
    """Half training H800 (8-GPU nodes), an eighth reserved H800, the rest elastic H20 and A100 halves (4-GPU nodes)."""
    train, reserved = n // 2, max(n // 8, 4)
    elastic = n - train - reserved
    h20 = (elastic // 2) // 4 * 4
    a100 = (elastic - h20) // 4 * 4
    return initial_state([
        (max(train // 8, 1), min(8, train), "H800", "training"),
        (max(reserved // 8, 1), min(8, reserved), "H800", "rollout"),
        (h20 // 4, 4, "H20", "elastic"),
        (a100 // 4, 4, "A100", "elastic"),
    ], TrainerPhase("training", 0.0))


def events(n: int, count: int, seed: int) -> list[dict]:
    """A seeded sequence of (elastic fraction, trainer phase, unfinished fraction, notices)."""
    rng = random.Random(seed * 100003 + n)
    out = []
    frac = 0.6
    for i in range(count):
        frac = min(1.0, max(0.2, frac + rng.uniform(-0.25, 0.25)))
        waiting = i % 3 == 1
        out.append({
            "elastic_fraction": frac,
            "trainer": TrainerPhase("waiting", 300.0) if waiting else TrainerPhase("training", 0.0),
            "unfinished": rng.uniform(0.1, 1.0),
            "notice_fraction": rng.choice([0.0, 0.0, 0.1]),
        })
    return out


def walk(state: ClusterState, inputs, backend: str, evs: list[dict]) -> tuple[list[float], list[float], list[bool], list[float], list[str]]:
    pol = get_policy("pearl", backend)
    total, solver, optimal, cpu, proved_by = [], [], [], [], []
    types = sorted({g.type for g in state.gpus if g.pool == "elastic"})
    n_elastic = {t: sum(1 for g in state.gpus if g.pool == "elastic" and g.type == t) for t in types}
    for k, ev in enumerate(evs):
        for i, t in enumerate(types):  # each elastic type follows its own availability (a phase shift per type)
            frac = ev["elastic_fraction"] if i == 0 else evs[(k + 7 * i) % len(evs)]["elastic_fraction"]
            state = state.with_availability("elastic", int(round(frac * n_elastic[t])), t if len(types) > 1 else None)
        if ev["notice_fraction"]:
            nodes = sorted({g.node for g in state.gpus if g.pool == "elastic" and g.available})
            noticed = set(random.Random(k).sample(nodes, int(len(nodes) * ev["notice_fraction"])))
            hit = {g.id for g in state.gpus if g.node in noticed}
            state = replace(state, gpus=tuple(replace(g, preempt_notice=g.id in hit) for g in state.gpus))
        state = replace(state, trainer=ev["trainer"], unfinished_fraction=ev["unfinished"])
        with gc_deferred():  # as the runtimes make decisions: no GC pass inside one
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                step = pol.decide(state, inputs, 0.0, "availability")
            except PlanningError:  # the time limit passed with no layout at all: a failed (not optimal) decision
                step = None
            total.append((time.perf_counter() - t0) * 1000.0)
            cpu.append((time.process_time() - c0) * 1000.0)
        solver.append(step.decision.proof.solve_ms if step else total[-1])
        optimal.append(step is not None and step.decision.proof.status == "optimal")
        proved_by.append(step.decision.proof.backend if step else "none")
        if step is not None:
            state = apply_plan(state, step.plan)
        # the noticed GPUs are gone before the next event; everything else carries over
        gone = {g.id for g in state.gpus if g.preempt_notice}
        gpus = tuple(replace(g, available=g.available and g.id not in gone, preempt_notice=False) for g in state.gpus)
        state = replace(state, gpus=gpus, workers=tuple(w for w in state.workers if not gone & set(w.gpus)))
    return total, solver, optimal, cpu, proved_by


def with_batch_per_gpu(spec: ExperimentSpec, n: int, per_gpu: float, prog: str = "bench_planner") -> ExperimentSpec:
    """`spec` with `per_gpu` trajectories per batch for each of `n` GPUs, rounded up to whole GRPO groups.

    Why: the config's batch is one number at every cluster size, so a large cluster has GPUs to
    spare and its decisions are easy (at 4096 GPUs a 1,024-trajectory batch needs a few percent
    of them); scaling the batch with the cluster keeps the load per GPU, and so the decision's
    difficulty, that of the size the config's batch was chosen for."""
    w = spec.workload
    group = w.group_size
    batch = max(group, math.ceil(per_gpu * n / group) * group)
    try:
        w = type(w).model_validate({**w.model_dump(), "trajectories_per_batch": batch})
    except ValidationError as e:
        err = e.errors()[0]
        raise SystemExit(f"{prog}: error: --batch-per-gpu {per_gpu:g} at {n} GPUs gives {batch} trajectories per batch; "
                         f"{'.'.join(map(str, err['loc']))}: {err['msg'].removeprefix('Value error, ')}") from None
    return spec.model_copy(update={"workload": w})


def check_batches(spec: ExperimentSpec, sizes: list[int], per_gpu: float | None, prog: str) -> None:
    """Exit with `with_batch_per_gpu`'s one line, naming `prog`, if any size's batch is one the config refuses, before any work."""
    for n in sizes if per_gpu else ():
        with_batch_per_gpu(spec, n, per_gpu, prog)


def models_at(models: ExperimentModels, n: int, per_gpu: float | None) -> ExperimentModels:
    """The models for `n` GPUs: `models` as configured (per_gpu None), else rebuilt at `per_gpu` trajectories per GPU."""
    return models if per_gpu is None else build_models(with_batch_per_gpu(models.spec, n, per_gpu))


def bench(models: ExperimentModels, sizes: list[int], backends: list[str], n_events: int, seed: int, mixed: bool = False, gap: float = 0.0,
          slot_pricing: bool | None = None, batch_per_gpu: float | None = None) -> list[dict]:
    """One row per (GPU count, backend): the timings of walking the same seeded events (slot_pricing
    None: the config's; batch_per_gpu None: the config's batch at every size, else `with_batch_per_gpu`)."""
    rows: list[dict] = []
    for n in sizes:
        at_n = models_at(models, n, batch_per_gpu)
        t0 = time.perf_counter()
        inputs = planning_inputs(at_n, n)
        slots = inputs.solver.slot_pricing if slot_pricing is None else slot_pricing
        inputs = replace(inputs, solver=replace(inputs.solver, time_limit_s=10.0, relative_gap=gap, slot_pricing=slots))
        tab_ms = (time.perf_counter() - t0) * 1000.0
        base = mixed_cluster(n) if mixed else cluster(n)
        evs = events(n, n_events, seed)
        for be in backends:
            walk(base, inputs, be, evs[:2])  # warm up imports / solver libraries
            total, solver, optimal, cpu, proved_by = walk(base, inputs, be, evs)
            rows.append({
                "gpus": n, "backend": be, "batch": inputs.batch,
                "solve_ms_p50": round(float(np.percentile(total, 50)), 2),
                "solve_ms_p95": round(float(np.percentile(total, 95)), 2),
                "optimal_fraction": round(float(np.mean(optimal)), 4),
                "decisions": len(total),
                "solver_ms_p95": round(float(np.percentile(solver, 95)), 2),
                "cpu_ms_p95": round(float(np.percentile(cpu, 95)), 2),
                "tabulate_ms": round(tab_ms, 1),
                "slot_priced_fraction": round(proved_by.count("slots") / len(proved_by), 4),
            })
            print(f"{n:>5} GPUs {be:>6}: p50 {rows[-1]['solve_ms_p50']:.1f} ms, p95 {rows[-1]['solve_ms_p95']:.1f} ms, optimal {rows[-1]['optimal_fraction']:.0%}", file=sys.stderr)
    return rows


def backend_list(text: str) -> list[str]:
    """An argparse type: comma-separated solver backends (a bad one is argparse's one-line error)."""
    names = text.split(",")
    if not all(n in BACKENDS for n in names):
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: comma-separated, of {', '.join(BACKENDS)}")
    return names


DEFAULT_CONFIG = str(ROOT / "configs/experiments/default.yaml")
DEFAULT_OUT = str(ROOT / "results/bench_planner.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int_list(1), default=[16, 64, 256, 1024, 4096], help="cluster sizes, comma-separated")
    ap.add_argument("--backends", type=backend_list, default=list(BACKENDS), help=f"comma-separated, of {', '.join(BACKENDS)}")
    ap.add_argument("--events", type=one_int(1), default=20, help="events per walk (>= 1)")
    ap.add_argument("--config", default=DEFAULT_CONFIG)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print {meta, rows} as one JSON object on stdout")
    ap.add_argument("--mixed", action="store_true", help="three GPU types, TP 1/2/4 per role (configs/experiments/mixed-elastic.yaml's models)")
    ap.add_argument("--batch-per-gpu", type=one_positive, default=None,
                    help="trajectories per batch per GPU of each size, rounded up to whole groups (default: the config's batch at every size)")
    ap.add_argument("--gap", type=float, default=0.0, help="solver.relative_gap: decisions proven within this share of the objective (default 0: exact)")
    ap.add_argument("--slot-pricing", action=argparse.BooleanOptionalAction, default=None,
                    help="plain-slot single-type programs priced directly, exactly (solver.slot_pricing), or every program on the row's backend (--no-slot-pricing); default: the config's")
    args = ap.parse_args()
    if not 0.0 <= args.gap <= 0.5:
        raise SystemExit(f"--gap: got {args.gap}; allowed: 0 to 0.5 (solver.relative_gap)")
    default_out = args.out == DEFAULT_OUT
    if args.mixed:
        if args.config == DEFAULT_CONFIG:
            args.config = str(ROOT / "configs/experiments/mixed-elastic.yaml")
        if args.out == DEFAULT_OUT:
            args.out = str(ROOT / "results/bench_planner_mixed.json")
    if args.gap and args.out in (DEFAULT_OUT, str(ROOT / "results/bench_planner_mixed.json")):
        args.out = args.out.removesuffix(".json") + f"_gap{args.gap:g}.json"
    load_start = os.getloadavg()[0]
    spec = load_spec(args.config, "bench_planner")
    slots = spec.solver.slot_pricing if args.slot_pricing is None else args.slot_pricing
    if slots and not args.mixed and args.out == DEFAULT_OUT:
        args.out = str(ROOT / "results/bench_planner_slots.json")
    if args.batch_per_gpu and default_out:
        args.out = args.out.removesuffix(".json") + f"_per_gpu{args.batch_per_gpu:g}.json"
    check_batches(spec, args.gpus, args.batch_per_gpu, "bench_planner")
    models = build_models(spec)
    if args.mixed and not models.variants:
        raise SystemExit(f"--mixed needs a mixed cluster (several GPU types or TP degrees); {args.config} has one type and degree")
    with stdout_to_stderr(args.json):
        rows = bench(models, args.gpus, args.backends, args.events, args.seed, args.mixed, args.gap, slots, args.batch_per_gpu)
    largest = max(r["gpus"] for r in rows)
    ok = {r["backend"] for r in rows} - {r["backend"] for r in rows if r["optimal_fraction"] < 1.0}
    cands = [r for r in rows if r["gpus"] == largest and r["backend"] in ok] or [r for r in rows if r["gpus"] == largest]
    default = min(cands, key=lambda r: r["solve_ms_p95"])["backend"]
    for r in rows:
        r["default"] = r["backend"] == default
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": "shared 2-core VM", "cores": os.cpu_count(), "load_average_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)], "events_per_row": args.events, "config": repo_relative(args.config), "policy": "pearl", "default_backend": default,
            "mixed": args.mixed, "relative_gap": args.gap, "exact_backend": spec.solver.exact_backend if args.mixed else None,
            "slot_pricing": slots and not args.mixed,
            "batch_per_gpu": args.batch_per_gpu}
    doc = {"meta": meta, "rows": rows}
    Path(args.out).write_text(json.dumps(doc, indent=1))
    from rich.table import Table

    from runtime.tables import table_console

    exact = f" (exact-units programs on {spec.solver.exact_backend}, solver.exact_backend)" if args.mixed and spec.solver.exact_backend else ""
    kind = f"mixed: H800 + H20 + A100, TP 1/2/4 per role{exact}, " if args.mixed else ""
    within = f", proven within a relative gap of {args.gap:g}" if args.gap else ""
    within += f", {args.batch_per_gpu:g} trajectories per batch per GPU" if args.batch_per_gpu else ""
    if not args.mixed:
        within += ", plain-slot programs priced directly (solver.slot_pricing)" if slots else ", every program on the row's backend"
    t = Table(title=f"full planning step (state -> decision -> plan), {kind}pearl policy, {args.events} events per row{within}; default = {default}")
    for c in ("GPUs", "batch", "backend", "p50 ms", "p95 ms", "CPU p95 ms", "solver p95 ms", "proven optimal" if not args.gap else "proven within gap", "slot-priced", "tables ms"):
        t.add_column(c, justify="right")
    for r in rows:
        style = "bold" if r["default"] else None
        t.add_row(str(r["gpus"]), str(r["batch"]), r["backend"] + (" *" if r["default"] else ""), f"{r['solve_ms_p50']:.1f}", f"{r['solve_ms_p95']:.1f}", f"{r['cpu_ms_p95']:.1f}",
                  f"{r['solver_ms_p95']:.1f}", f"{r['optimal_fraction']:.0%}", f"{r['slot_priced_fraction']:.0%}", f"{r['tabulate_ms']:.0f}", style=style)
    table_console(stderr=args.json).print(t)
    if args.json:
        print_json(doc)


if __name__ == "__main__":
    main()
