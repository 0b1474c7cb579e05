"""Sensitivity of PEARL to its cost weights: transition weight and switching margins.

The study the paper would show: one-at-a-time sweeps (the other keys at the config's values)
of `costs.transition_weight`, `costs.mode_switch_margin` (colocated <-> disaggregated) and
`costs.ratio_change_margin` (P:D ratio changes), through the discrete-event simulator, on
Qwen3-8B (configs/experiments/default.yaml) and Qwen3-30B-A3B (configs/experiments/paper-30b.yaml),
each over two real availability traces of the 12 preemptible GPUs:

  bamboo    Bamboo full-64-node trace (the configs' own trace section), hours [0, H)
  skypilot  SkyPilot 16-node AWS us-west-2a (trace section of paper-8b-skypilot.yaml),
            hours [126, 126 + H): a volatile window (0 <-> 12 GPUs several times)

Every point runs `runtime.sweep` (the code behind `pearl sweep`): cached per config hash in
runs/sweep-cache, so a rerun only computes what changed. Writes results/sensitivity.json
(every record and the per-point aggregates), results/sensitivity.md (main finding, tables)
and PNGs: results/sensitivity.png (all scenarios, throughput and reconfigurations relative
to the config's values) and results/sensitivity-<model>-<trace>.png (per scenario, with the
throughput/reconfigurations Pareto front). Bands and ± are mean ± 1 std across seeds.

    .venv/bin/python experiments/sensitivity.py            # 2 simulated h, 2 seeds, 2 processes
    .venv/bin/python experiments/sensitivity.py --hours 1 --seeds 1   # quicker look
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.config import ExperimentSpec, TraceSpec, load_experiment
from runtime.sim.run import TraceFlags
from runtime.sweep.report import BAND, markdown_table, plot_sweep
from runtime.sweep.runner import code_digest
from runtime.sweep.study import LABELS, SweepResult, run_study

ROOT = Path(__file__).resolve().parent.parent
EXP = ROOT / "configs" / "experiments"
MODELS = {"qwen3-8b": EXP / "default.yaml", "qwen3-30b-a3b": EXP / "paper-30b.yaml"}
TRACES = {"bamboo": (EXP / "default.yaml", 0.0), "skypilot": (EXP / "paper-8b-skypilot.yaml", 126.0)}
SETS: dict[str, list[float]] = {
    "costs.transition_weight": [0.0, 0.25, 1.0, 4.0, 16.0],
    "costs.mode_switch_margin": [0.0, 0.08, 0.3, 1.0],
    "costs.ratio_change_margin": [0.0, 0.03, 0.1, 0.3],
}
TABLE = ("tokens_per_s", "steps_per_h", "switches", "reconfigurations", "elastic_gpus_serving", "lends", "gated", "lost_trajectories",
         "late_returns")


@dataclass(frozen=True)
class Scenario:
    model: str
    trace: str

    @property
    def slug(self) -> str:
        return f"{self.model}-{self.trace}"


def trace_section(config: Path) -> TraceSpec:
    spec = load_experiment(config)
    assert spec.trace is not None, f"{config} has no trace section"
    return spec.trace


def with_trace(spec: ExperimentSpec, trace: TraceSpec) -> ExperimentSpec:
    """The experiment with another trace section, re-validated like any other override."""
    return ExperimentSpec.model_validate({**spec.model_dump(), "trace": trace.model_dump()})


def base_values(spec: ExperimentSpec) -> dict[str, float]:
    return {k: float(getattr(spec.costs, k.split(".")[1])) for k in SETS}


def curve(res: SweepResult, key: str, metric: str) -> tuple[list[float], list[float], list[float]]:
    pts = sorted((a for a in res.aggregated if a["varied"] == key), key=lambda a: float(a["values"][key]))
    return [float(a["values"][key]) for a in pts], [a[metric]["mean"] for a in pts], [a[metric]["std"] for a in pts]


def effects(res: SweepResult, base: dict[str, float]) -> dict[str, Any]:
    """Per key: throughput, churn and elastic use at each value, and throughput relative to the config's value."""
    out: dict[str, Any] = {}
    for key in SETS:
        xs, tok, tok_sd = curve(res, key, "tokens_per_s")
        b = xs.index(base[key])
        best = int(np.argmax(tok))
        e: dict[str, Any] = {"values": xs, "tokens_per_s": tok, "tokens_std": tok_sd, "base_value": base[key], "best_value": xs[best]}
        for m in ("reconfigurations", "switches", "mode_switches", "elastic_gpus_serving", "lent_gpus_serving"):
            e[m] = curve(res, key, m)[1]
        e["tokens_rel_to_base_pct"] = [round((t / tok[b] - 1) * 100, 2) for t in tok]
        e["reconf_rel_to_base_pct"] = [round((r / e["reconfigurations"][b] - 1) * 100, 1) if e["reconfigurations"][b] else None
                                       for r in e["reconfigurations"]]
        e["base_loss_vs_best_pct"] = round((1 - tok[b] / tok[best]) * 100, 2)
        e["spread_pct"] = round((max(tok) - min(tok)) / tok[b] * 100, 2)
        e["max_seed_std_pct"] = round(max(tok_sd) / tok[b] * 100, 2)
        out[key] = e
    return out


def _span(xs: list[float]) -> str:
    return f"{min(xs):.1f}" if round(min(xs), 1) == round(max(xs), 1) else f"{min(xs):.1f}-{max(xs):.1f}"


def _range(xs: list[float], digits: int = 1, unit: str = "%") -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:.{digits}f}{unit}" if round(lo, digits) == round(hi, digits) else f"{lo:.{digits}f} to {hi:.{digits}f}{unit}"


def gate_totals(results: dict[Scenario, SweepResult]) -> dict[str, int]:
    """Decisions and what the hysteresis gate saw, summed over every simulation of the study."""
    keys = ("decisions", "gate_mode_switches", "gate_ratio_changes", "gate_scale_changes", "gated")
    unique = {(r["config_hash"], r["seed"]): r for res in results.values() for r in res.run.records}  # a one-way sweep repeats the base
    recs = list(unique.values())
    return {"runs": len(recs), **{k: int(sum(r[k] for r in recs)) for k in keys}}


def finding(eff: dict[str, dict[str, Any]], gate: dict[str, int], hours: float, seeds: int) -> str:
    """The main finding in one paragraph; every number and every comparison is read from the runs."""
    tw, msm, rcm = "costs.transition_weight", "costs.mode_switch_margin", "costs.ratio_change_margin"
    es = list(eff.values())
    base = es[0][tw]["base_value"]
    spread = {k: max(e[k]["spread_pct"] for e in es) for k in SETS}
    knob = max(spread, key=lambda k: spread[k])
    seeds_txt = f"{seeds} seeds per point" if seeds > 1 else "1 seed per point"
    others = [k for k in SETS if k != knob]
    lead = (f"{knob.split('.')[1]} moves throughput most: {spread[knob]:.1f}% between its best and worst value, against "
            f"{' and '.join(f'{spread[k]:.1f}%' for k in others)} for {' and '.join(k.split('.')[1] for k in others)}.")
    per_value = []
    for i, v in enumerate(es[0][tw]["values"]):
        if v == base:
            continue
        rel = [e[tw]["tokens_rel_to_base_pct"][i] for e in es]
        quiet = seeds > 1 and not any(_beyond_noise(e[tw], i) for e in es)
        per_value.append(f"{_range(rel)} at {v:g}" + (" (within noise)" if quiet else ""))
    first, last = es[0][tw]["values"][0], es[0][tw]["values"][-1]
    rec_first = [e[tw]["reconf_rel_to_base_pct"][0] for e in es if e[tw]["reconf_rel_to_base_pct"][0] is not None]
    rec_last = [e[tw]["reconf_rel_to_base_pct"][-1] for e in es if e[tw]["reconf_rel_to_base_pct"][-1] is not None]
    el0 = [e[tw]["elastic_gpus_serving"][0] for e in es]
    elN = [e[tw]["elastic_gpus_serving"][-1] for e in es]
    base_loss = [e[tw]["base_loss_vs_best_pct"] for e in es]
    fewer = [(1 - 1 / (1 + r / 100)) * 100 for r in rec_first]  # the base's reconfigurations below weight `first`'s, in %
    noise_txt = f"'within noise': within the two points' seed std" if seeds > 1 else "one seed: no noise estimate"
    return " ".join([
        f"**Main finding.** Over four scenarios (Qwen3-8B and Qwen3-30B-A3B, each on a Bamboo and a SkyPilot spot-trace window; "
        f"{hours:g} simulated hours, {seeds_txt}; {noise_txt}), {lead}",
        f"Relative to the configured transition weight {base:g}, throughput changes by {', '.join(per_value)}, while the policy's "
        f"reconfigurations (engine starts, stops, role changes) change by {_range(rec_first, 0)} at weight {first:g} and "
        f"{_range(rec_last, 0)} at {last:g}.",
        f"A heavy weight buys stability by leaving spot capacity idle: the mean number of elastic GPUs serving rollout falls from "
        f"{_span(el0)} at weight {first:g} to {_span(elN)} at {last:g} (of 12).",
        f"The configured weight {base:g} gives up {_range(base_loss)} of each scenario's best throughput for "
        f"{_range(fewer, 0)} fewer reconfigurations than weight {first:g}.",
        _margins(eff, gate, seeds > 1),
    ])


def _beyond_noise(e: dict[str, Any], i: int) -> bool:
    """Does value i differ from the config's value by more than the two points' seed std together?"""
    b = e["values"].index(e["base_value"])
    return abs(e["tokens_per_s"][i] - e["tokens_per_s"][b]) > e["tokens_std"][i] + e["tokens_std"][b]


def _margins(eff: dict[str, dict[str, Any]], gate: dict[str, int], several_seeds: bool) -> str:
    """Where the switching margins move throughput beyond seed noise, and what the gate saw overall."""
    seen = (f"over all {gate['runs']} distinct simulations ({gate['decisions']} decisions) the gate saw {gate['gate_mode_switches']} "
            f"colocated<->disaggregated candidates, {gate['gate_ratio_changes']} P:D ratio changes and {gate['gate_scale_changes']} "
            f"scale changes (joins/leaves, which pass with margin 0) and held back {gate['gated']}")
    notable: dict[tuple, list[float]] = {}  # (scenario, key, change, std, switches) -> values with that effect
    quiet_max = 0.0
    for slug, e in eff.items():
        for key in ("costs.mode_switch_margin", "costs.ratio_change_margin"):
            k = e[key]
            b = k["values"].index(k["base_value"])
            for i, v in enumerate(k["values"]):
                if i == b:
                    continue
                rel = k["tokens_rel_to_base_pct"][i]
                if several_seeds and _beyond_noise(k, i):
                    sd = max(k["tokens_std"][i], k["tokens_std"][b]) / k["tokens_per_s"][b] * 100
                    notable.setdefault((slug, key.split(".")[1], round(rel, 1), round(sd, 1), k["mode_switches"][b], k["mode_switches"][i]), []).append(v)
                else:
                    quiet_max = max(quiet_max, abs(rel))
    elsewhere = f"by at most {quiet_max:.1f}% (within seed noise)" if quiet_max > 0 else "not at all"
    if not notable:
        kind = "beyond seed noise" if several_seeds else "(one seed: no noise estimate)"
        return f"The switching margins do not move throughput {kind} (at most {quiet_max:.1f}%): {seen}."
    cases = [f"on {slug}, {key} {' and '.join(f'{v:g}' for v in vs)} change{'s' if len(vs) == 1 else ''} throughput by {rel:+.1f}% "
             f"(seed std <= {sd:.1f}%; colocated<->disaggregated switches per run {m0:g} -> {m1:g})"
             for (slug, key, rel, sd, m0, m1), vs in notable.items()]
    return (f"The switching margins matter only where the gate has a close call: {'; '.join(cases)}; elsewhere they change "
            f"throughput {elsewhere}. Overall, {seen}.")


def summary_plot(results: dict[Scenario, SweepResult], path: Path, hours: float, seeds: int) -> None:
    """Throughput and reconfigurations relative to the config's value, per key, all scenarios on one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(SETS), figsize=(4.6 * len(SETS), 6.4), squeeze=False)
    for j, key in enumerate(SETS):
        for sc, res in results.items():
            base = base_values(res.spec)[key]
            xs, tok, sd = curve(res, key, "tokens_per_s")
            _, rec, _ = curve(res, key, "reconfigurations")
            b = xs.index(base)
            rel = np.array(tok) / tok[b] * 100 - 100
            band = np.array(sd) / tok[b] * 100
            line = axes[0, j].plot(xs, rel, marker="o", ms=3, label=sc.slug)[0]
            if seeds > 1:
                axes[0, j].fill_between(xs, rel - band, rel + band, alpha=0.15, color=line.get_color())
            axes[1, j].plot(xs, rec, marker="o", ms=3, color=line.get_color(), label=sc.slug)
        for ax in axes[:, j]:
            if max(SETS[key]) / min(v for v in SETS[key] if v > 0) >= 50:
                ax.set_xscale("symlog", linthresh=min(v for v in SETS[key] if v > 0))
            ax.grid(alpha=0.3)
            ax.axvline(base_values(next(iter(results.values())).spec)[key], color="0.5", lw=0.8, ls=":")
        axes[0, j].axhline(0, color="0.5", lw=0.8)
        axes[1, j].set_xlabel(key)
    axes[0, 0].set_ylabel("tokens/s vs config value (%)")
    axes[1, 0].set_ylabel("reconfigurations")
    axes[0, 0].legend(fontsize=7)
    band = f"bands: {BAND} ({seeds} seeds)" if seeds > 1 else "1 seed: no band"
    fig.suptitle(f"PEARL sensitivity to cost weights ({hours:g} simulated h per point; dotted: config value; {band})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _sim_seconds(results: dict[Scenario, SweepResult]) -> float:
    """Simulator wall time summed over the distinct runs (as measured when each ran, cached or not)."""
    unique = {(r["config_hash"], r["seed"]): r["wall_s"] for res in results.values() for r in res.run.records}
    return float(sum(unique.values()))


def _git_head() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=2.0, help="simulated hours per point")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per point")
    ap.add_argument("--jobs", type=int, default=2, help="parallel processes")
    ap.add_argument("--out", type=Path, default=ROOT / "results", help="output folder")
    ap.add_argument("--cache", type=Path, default=ROOT / "runs" / "sweep-cache")
    args = ap.parse_args()
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[Scenario, SweepResult] = {}
    for model, cfg in MODELS.items():
        for trace, (tcfg, offset) in TRACES.items():
            sc = Scenario(model, trace)
            spec = with_trace(load_experiment(cfg), trace_section(tcfg))
            print(f"{sc.slug}: {spec.name} with the {trace} trace from {offset:g} h", flush=True)
            res = run_study(spec, SETS, "oneway", flags=TraceFlags(offset_hours=offset), hours=args.hours, seeds=args.seeds,
                            jobs=args.jobs, cache_dir=args.cache, pareto_cost="reconfigurations")
            results[sc] = res
            plot_sweep(res.aggregated, res.keys, args.out / f"sensitivity-{sc.slug}.png", f"{sc.slug}: {res.title()}", res.gain,
                       ["tokens_per_s", "switches", "reconfigurations"], "reconfigurations", LABELS)
    eff = {sc.slug: effects(res, base_values(res.spec)) for sc, res in results.items()}
    summary_plot(results, args.out / "sensitivity.png", args.hours, args.seeds)
    wall = time.perf_counter() - t0
    computed = sum(r.run.computed for r in results.values())
    cached = sum(r.run.cached for r in results.values())
    doc = {
        "study": "one-way sweeps of cost weights through the simulator", "hours": args.hours, "seeds": args.seeds, "band": BAND,
        "sets": SETS, "traces": {k: {"config": str(v[0].relative_to(ROOT)), "offset_hours": v[1]} for k, v in TRACES.items()},
        "models": {k: str(v.relative_to(ROOT)) for k, v in MODELS.items()}, "wall_s": round(wall, 1), "computed": computed, "cached": cached,
        "gate": gate_totals(results), "effects": eff,
        "scenarios": {sc.slug: res.to_json() for sc, res in results.items()},
    }
    doc["finding"] = finding(eff, doc["gate"], args.hours, args.seeds)
    doc["code"] = {"git_head": _git_head(), "digest": code_digest()}
    (args.out / "sensitivity.json").write_text(json.dumps(doc, indent=1))
    lines = [
        "# Sensitivity to cost weights", "",
        doc["finding"], "",
        f"Setup: `experiments/sensitivity.py --hours {args.hours:g} --seeds {args.seeds} --jobs {args.jobs}` "
        f"({computed} simulations computed now and {cached} records from the cache in {wall:.0f} s wall; the {doc['gate']['runs']} distinct "
        f"simulations took {_sim_seconds(results):.0f} s of simulator wall time in total on this shared 2-core machine; "
        f"code at {doc['code']['git_head']}, model/planner/simulator digest {doc['code']['digest']}). "
        "One-way sweeps: each key varies while the others stay at the config's values "
        f"(transition_weight {base_values(next(iter(results.values())).spec)['costs.transition_weight']:g}, "
        "mode_switch_margin 0.08, ratio_change_margin 0.03). Policy `pearl`, cluster paper-32xh800 "
        "(16 training, 4 reserved rollout, 12 preemptible H800). Traces: Bamboo full-64-node from hour 0; SkyPilot us-west-2a "
        f"16-node from hour {TRACES['skypilot'][1]:g}; both rescaled to the 12 preemptible GPUs in 2-GPU instances. "
        f"`±` and the bands are {BAND}. reconfigurations = engine starts (lends included) + stops + role changes, "
        "the warm initial starts included; switches = role changes + colocated<->disaggregated mode changes "
        "(the `pearl compare` counter).", "",
        "![summary](sensitivity.png)", "",
        "| scenario | key | value | tokens/s vs config value | reconfigurations vs config value |",
        "|---|---|---:|---:|---:|",
    ]
    for slug, e in eff.items():
        for key in SETS:
            k = e[key]
            for v, dt, dr in zip(k["values"], k["tokens_rel_to_base_pct"], k["reconf_rel_to_base_pct"]):
                if v == k["base_value"]:
                    continue
                lines.append(f"| {slug} | {key.split('.')[1]} | {v:g} | {dt:+.2f}% | {'-' if dr is None else f'{dr:+.0f}%'} |")
    for sc, res in results.items():
        lines += ["", f"## {sc.slug}", "", f"{res.title()}; Pareto: tokens/s vs reconfigurations (`*`: the key this row varies).", "",
                  f"![{sc.slug}](sensitivity-{sc.slug}.png)", "", markdown_table(res.aggregated, res.keys, TABLE, LABELS)]
    (args.out / "sensitivity.md").write_text("\n".join(lines) + "\n")
    print(doc["finding"])
    print(f"{computed} computed, {cached} cached, {wall:.0f} s -> {args.out / 'sensitivity.md'}")


if __name__ == "__main__":
    main()
