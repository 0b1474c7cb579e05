"""`pearl plan`: an offline plan over a real availability trace, one decision per event.

Walks the trace's elastic-GPU changes (each one an `availability` event; the first is
`initial`), asks the policy for a decision, applies its transition plan to the state and
moves on. The trainer is modelled as always training (offline there is no step timeline,
so no training GPUs are lent); the simulator adds the training/rollout cycle.

plan.json schema:
  {"config": str, "policy": str, "backend": str,
   "trace": {"path", "offset_hours", "hours", "events", "mean_elastic_gpus"},   # with elastic_traces:
                                          # path "TYPE: file; ...", offset_hours / hours per type
   "decisions": [
     {"t_s": float,                      # seconds from the window start (after time_scale)
      "event": "initial" | "availability",
      "elastic_gpus": int,               # elastic GPUs available from t_s on (all types)
      "gpu_type": str | null,            # with elastic_traces: the type(s) whose availability changed
      "decision": {mode, ratio, colocated, prefill, decode, per_node: {node: {role: n}}, extras (borrow gate: t_dedicated_s, t_dedicated_bound, t_borrow_s, borrow_benefit_s, toggle_s, borrow),
                   lent_gpus, predicted_completion_s, transition_cost_s, objective_ms,
                   applied, forced, reason,
                   proof: {status, objective, best_bound, gap, solve_ms, backend, infeasible_family}},
      "plan": {"joins", "leaves", "role_changes", "lent", "returned",
               "actions": [{id, kind, worker, gpus, role, from_role, after, duration_s, deadline_s}]}}]}
`--json` prints {"decisions", "solve_ms_p50", "solve_ms_p95", "optimal_fraction",
"role_changes", "predicted_rollout_s", "feasible", "reason"} (predicted_rollout_s: time-weighted
mean predicted batch completion over the window; feasible: every decision has a finite
predicted completion, else reason names the first that has none and predicted_rollout_s is null).
Both plan.json and the summary are strict JSON (non-finite numbers are null).
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer

from runtime.cli import app, user_errors
from runtime.flags import hours_option, offset_option, window_flags


@app.command()
@user_errors
def plan(
    config: Path = typer.Option(..., "--config", "-c", help="experiment YAML (configs/experiments/*.yaml)"),
    policy: Optional[str] = typer.Option(None, "--policy", "-p", help="pearl, pearl-no-borrow, pearl-fixed-pd, pearl-no-gate, roll, rlboost+, rlboost+pd"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="trace file (default: the config's trace.path)"),
    trace_offset_hours: Optional[float] = offset_option("window start in trace hours"),
    hours: Optional[float] = hours_option("window length in trace hours"),
    out: Path = typer.Option(..., "--out", "-o", help="where to write plan.json"),
    backend: Optional[str] = typer.Option(None, "--backend", help="solver backend of the integer programs (default: the config's); plain-slot single-type programs are priced without one unless solver.slot_pricing is false"),
    as_json: bool = typer.Option(False, "--json", help="print a one-object summary on stdout"),
) -> None:
    """Plan rollout configurations over an availability trace and write every decision and plan."""
    import numpy as np
    from rich.progress import Progress

    from models.config import ConfigError, load_experiment
    from planner.backends import BACKENDS
    from runtime.flags import check_policies
    from runtime.jsonout import dumps, print_json, stdout_to_stderr
    from runtime.offline_plan import load_typed_windows, load_window, plan_over_trace, trace_spec_for
    from runtime.outputs import check_file

    spec = load_experiment(config)
    name = spec.policy.name if policy is None else policy  # `--policy ""` is refused, not read as absent
    check_policies([name], spec, "--policy" if policy is not None else None, "plan", fixed=False)
    be = spec.solver.backend if backend is None else backend  # `--backend ""` is refused, not read as absent
    if be not in BACKENDS:
        raise ConfigError(*(("pearl plan", "--backend") if backend is not None else (config, "solver.backend")), be, f"one of {list(BACKENDS)}")
    check_file(out, "pearl plan", "--out")
    typed = bool(spec.elastic_traces) and trace is None  # each elastic GPU type follows its own trace
    tspec = spec.elastic_traces if typed else trace_spec_for(spec, trace)
    with window_flags("plan", hours, trace_offset_hours):
        avail = load_typed_windows(spec, trace_offset_hours, hours) if typed else load_window(spec, tspec, trace_offset_hours, hours)
    with stdout_to_stderr(), Progress(transient=True, console=_stderr_console()) as bar:
        task = bar.add_task(f"planning {name}", total=None)
        result = plan_over_trace(spec, name, be, tspec, avail, on_event=lambda i, n: bar.update(task, completed=i, total=n))
    records = []
    solve_ms: list[float] = []
    optimal = 0
    role_changes = 0
    for ev in result.events:
        d, p = ev.step.decision, ev.step.plan
        solve_ms.append(d.proof.solve_ms)
        optimal += d.proof.status == "optimal"
        role_changes += p.role_changes
        records.append({
            "t_s": round(ev.t_s, 3), "event": ev.event, "elastic_gpus": ev.elastic_gpus, **({"gpu_type": ev.gpu_type} if typed else {}),
            "decision": d.to_json(),
            "plan": {"joins": p.joins, "leaves": p.leaves, "role_changes": p.role_changes,
                     "lent": p.lent, "returned": p.returned,
                     "actions": [asdict(a) for a in p.actions]},
        })
    mean_completion = result.mean_predicted_completion_s()
    doc = {
        "config": str(config), "policy": name, "backend": be,
        "trace": {"path": result.source, "offset_hours": trace_offset_hours if trace_offset_hours is not None else _per_type(tspec, "offset_hours"),
                  "hours": hours if hours is not None else _per_type(tspec, "hours"), "events": len(result.events), "mean_elastic_gpus": round(result.mean_elastic_gpus, 3)},
        "decisions": records,
    }
    out.write_text(dumps(doc, indent=1))
    unbounded = next((r for r in records if not math.isfinite(r["decision"]["predicted_completion_s"])), None)
    summary = {
        "decisions": len(records),
        "solve_ms_p50": round(float(np.percentile(solve_ms, 50)), 3),
        "solve_ms_p95": round(float(np.percentile(solve_ms, 95)), 3),
        "optimal_fraction": round(optimal / max(len(records), 1), 4),
        "role_changes": role_changes,
        "predicted_rollout_s": round(mean_completion, 3),
        # a decision without a finite predicted completion makes the mean meaningless: say why
        "feasible": unbounded is None,
        "reason": None if unbounded is None else f"the decision at t={unbounded['t_s']:g} s has no finite predicted completion",
    }
    if as_json:
        print_json(summary)
    else:
        print(f"{name}: {summary['decisions']} decisions, solve p50 {summary['solve_ms_p50']} ms / p95 {summary['solve_ms_p95']} ms, "
              f"optimal {summary['optimal_fraction']:.0%}, role changes {role_changes}, mean predicted rollout {mean_completion:.1f} s -> {out}", file=sys.stderr)


def _per_type(tspec, field: str):
    """A trace field, or {GPU type: field} with `elastic_traces`."""
    return {typ: getattr(t, field) for typ, t in tspec.items()} if isinstance(tspec, dict) else getattr(tspec, field)


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)
