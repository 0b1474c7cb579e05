"""`pearl compare`: several policies on the same trace and seed; a table and a plot."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from runtime.cli import app, user_errors
from runtime.flags import hours_option, offset_option, seed_option, window_flags

if TYPE_CHECKING:
    from runtime.sim.metrics import SimResult

# late_returns / train_delay_s are measured by the loan ledger (runtime/loans.py): lent GPUs
# still out when the trainer needed them, and how long its steps waited for them
CONTRACT = ("steps_per_h", "trajectories_per_h", "tokens_per_s", "rollout_share", "switches", "lost_trajectories", "late_returns", "train_delay_s",
            "decisions", "policy_failures", "failure")  # failure: the first failed decision's reason (null: none)


def plot_comparison(results: dict, path: Path, title: str, reserved: int = 0) -> None:
    """Throughput over time (top) and GPUs per role over time for each policy (below)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    fig, axes = plt.subplots(n + 1, 1, figsize=(10, 2.6 * (n + 1)), sharex=True)
    ax = axes[0]
    for name, r in results.items():
        s = r.series
        if len(s) < 2:
            continue
        ts = [x["t"] / 3600 for x in s]
        tok = [x["generated_tokens"] + x["trained_tokens"] for x in s]
        window = 10
        rate = [(tok[i] - tok[max(i - window, 0)]) / max(s[i]["t"] - s[max(i - window, 0)]["t"], 1e-9) for i in range(1, len(s))]
        ax.plot(ts[1:], rate, label=f"{name} ({r.tokens_per_s:,.0f} tok/s)")
    ax.set_ylabel("tokens/s\n(gen + trained)")
    ax.legend(fontsize=8)
    ax.set_title(title)
    roles = ["colocated", "prefill", "decode", "transitioning", "training"]
    colors = {"colocated": "tab:blue", "prefill": "tab:orange", "decode": "tab:green", "transitioning": "tab:gray", "training": "tab:red"}
    for ax, (name, r) in zip(axes[1:], results.items()):
        s = r.series
        ts = [x["t"] / 3600 for x in s]
        stacks = []
        for role in roles:
            if role == "training":  # instances on lent training GPUs, whatever their role
                stacks.append([sum(v for k, v in x["gpus"].items() if k.startswith("training:") and k != "training:training") for x in s])
            else:
                stacks.append([sum(v for k, v in x["gpus"].items() if k.endswith(":" + role) and not k.startswith("training:")) for x in s])
        ax.stackplot(ts, stacks, labels=[f"rollout {r_}" if r_ != "training" else "lent training GPUs" for r_ in roles], colors=[colors[r_] for r_ in roles], alpha=0.8)
        if r.elastic_series:
            ex = [p[0] / 3600 for p in r.elastic_series] + [ts[-1] if ts else 0.0]
            ey = [p[1] + reserved for p in r.elastic_series]
            ey.append(ey[-1])
            ax.step(ex, ey, where="post", color="k", lw=1, label="reserved + elastic GPUs available")
        ax.set_ylabel(f"{name}\nGPUs")
        ax.legend(fontsize=7, loc="upper right", ncol=3)
        if held := held_layouts(r):  # mixed layouts: what the policy ran per GPU type, longest held
            ax.set_title(f"{name}: " + ", ".join(f"{ty} {lab}" for ty, lab in held.items()), fontsize=8, loc="left")
    axes[-1].set_xlabel("simulated hours")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


@app.command()
@user_errors
def compare(
    config: Path = typer.Option(..., "--config", "-c", help="experiment YAML"),
    policies: str = typer.Option("pearl,roll,rlboost+", "--policies", help="comma-separated policy names (a fixed layout per GPU type keeps its commas)"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="availability trace for the elastic pool (overrides the config's)"),
    trace_offset_hours: Optional[float] = offset_option("start this many hours into the trace"),
    hours: Optional[float] = hours_option("simulated hours (default: the config's trace hours, else 2)"),
    seed: Optional[int] = seed_option("random seed (default: the config's)"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write a PNG: throughput and GPU roles over time per policy"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Run every policy on the same trace and seed; print a table (and a plot)."""
    from models.builder import build_models
    from models.config import ConfigError, load_experiment
    from runtime.commands.simulate import trace_progress, warn_failures
    from runtime.flags import check_policies, split_policies
    from runtime.jsonout import print_json, stdout_to_stderr
    from runtime.outputs import check_plot
    from runtime.sim.run import TraceFlags, run_hours
    from runtime.sim.run import simulate as run_sim

    spec = load_experiment(config)
    names = split_policies(policies)
    if not names:
        raise ConfigError("pearl compare", "--policies", policies, "a comma-separated list of policy names")
    check_policies(names, spec, "--policies", "compare")
    if plot is not None:
        check_plot(plot, "pearl compare", "--plot")
    flags = TraceFlags(str(trace) if trace else None, trace_offset_hours, hours)
    h = run_hours(spec, flags)
    models = build_models(spec)
    results = {}
    for name in names:
        prog, update = trace_progress(h, f"simulating {name}")
        with stdout_to_stderr(as_json), prog, window_flags("compare", hours, trace_offset_hours):
            results[name] = run_sim(spec, name, flags, hours=h, seed=seed, progress=update, models=models)
    if plot is not None:
        plot_comparison(results, plot, f"{spec.name}: {spec.model_name}, {h:g} h", reserved=spec.cluster.gpus_in_pool("rollout"))
    if as_json:
        # feasible: the policy found a layout at every decision (else `failure` says why)
        rows = {n: {**{k: r.summary()[k] for k in CONTRACT}, "feasible": r.policy_failures == 0} for n, r in results.items()}
        for n, r in results.items():
            if held := held_layouts(r):
                rows[n]["layout_by_type"] = held
        out = {"policies": rows, "hours": h, "seed": next(iter(results.values())).seed}
        if plot is not None:
            out["plot"] = str(plot)
        print_json(out)
    else:
        print_table(results, f"{spec.name}: {spec.model_name}, {h:g} simulated h, seed {next(iter(results.values())).seed}")
        if plot is not None:
            from rich.console import Console

            Console(stderr=True).print(f"plot: {plot}")
    if warn_failures(results):
        raise typer.Exit(1)


def print_table(results: dict[str, SimResult], title: str) -> None:
    """One row per policy; a `failed decisions` column appears when any policy failed one."""
    from rich.table import Table

    from runtime.commands.simulate import failed_cell
    from runtime.tables import table_console

    first = next(iter(results))
    base = results[first].tokens_per_s
    failures = any(r.policy_failures for r in results.values())
    t = Table(title=title)
    cols = ["policy", "tokens/s", f"vs {first}", "steps/h", "traj/h", "rollout share", "switches", "lent", "lost", "late returns", "train delay s"]
    held = {n: held_layouts(r) for n, r in results.items()}
    mixed = any(held.values())
    if failures:
        cols.append("failed decisions")
    if mixed:
        cols.append("roles @ TP per GPU type (longest held)")
    for col in cols:
        t.add_column(col, justify="right" if col != "policy" else "left")
    for n, r in results.items():
        s = r.summary()
        rel = f"{(r.tokens_per_s / base - 1) * 100:+.1f}%" if base else "-"
        cells = [n, f"{s['tokens_per_s']:,.0f}", rel, f"{s['steps_per_h']:.1f}", f"{s['trajectories_per_h']:.0f}", f"{s['rollout_share']:.1%}",
                 str(s["switches"]), str(s["lends"]), str(s["lost_trajectories"]), str(s["late_returns"]), f"{s['train_delay_s']:.1f}"]
        t.add_row(*cells, *([failed_cell(r)] if failures else []), *(["; ".join(f"{ty} {lab}" for ty, lab in held[n].items())] if mixed else []))
    table_console().print(t)


def held_layouts(r: SimResult) -> dict[str, str]:
    """Mixed layouts: per GPU type, the roles and TP degrees the policy held longest (empty otherwise)."""
    from runtime.sim.metrics import longest_held_layout

    return longest_held_layout(r.decision_log, r.hours * 3600.0)
