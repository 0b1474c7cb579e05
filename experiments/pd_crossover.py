"""PD crossover: colocation vs the best prefill/decode split as the rollout batch grows.

The paper's setting: Qwen3-30B-A3B, 16 H800 as 8 TP2 workers, SWE-like agentic workload
(configs/experiments/pd-crossover.yaml). Sweeps the batch from 16 to 128 in steps of 16 and
writes results/pd_crossover.json (one object per batch: batch_size, colocated_s,
disaggregated_s, best_ratio, winner, ...) and results/pd_crossover.md with the paper's numbers
beside ours. Everything comes from the predictor (models/predictor.py) with the experiment's
profile; no constant here is tuned to the paper's crossover.

Two readings of "batch" are reported, since the paper does not say which one its sweep uses.
The primary one is the calibrated workload's: its trajectories_per_batch over the paper's
batch of 64 (configs/workloads/paper-8b-calibrated.yaml: 1024 / 64 = 16 trajectories per unit,
"64 prompts x group 16", chosen by `pearl calibrate` on the motivation and engine statistics,
never on this crossover); the other reading (batch = trajectories, or groups x group_size)
is the sensitivity (results/pd_crossover_sensitivity.json).
Also reported: the model's engine statistics next to the paper's, and the primary sweep with
tool latency halved and doubled.

    .venv/bin/python experiments/pd_crossover.py [--config configs/experiments/pd-crossover.yaml]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from experiments.cli_args import load_spec  # noqa: E402
from models.builder import build_models, rollout_gpu_count  # noqa: E402
from models.config import ExperimentSpec, repo_relative  # noqa: E402

BATCHES = list(range(16, 129, 16))
# The paper's numbers for this claim (PAPER.md): signed gain of disaggregation over colocation.
PAPER_GAIN_PCT = {32: 9.7, 80: 1.4, 96: -6.1}
PAPER_RATIO = {48: "4P4D", 64: "5P3D"}
PAPER_ENGINE = {"prefill_share_of_tokens_pct": 96.68, "prefill_share_of_engine_time_pct": 26.48, "decode_tok_s_per_gpu": 400.0}
PAPER_BATCH = 64  # "rollout batch 64" in the paper's main setting


def trajectories_per_unit(spec: ExperimentSpec) -> int:
    """Trajectories one unit of the paper's batch stands for in this workload (1: batch = trajectories)."""
    return max(spec.workload.trajectories_per_batch // PAPER_BATCH, 1)


def sweep(spec: ExperimentSpec, trajectories_per_item: int = 1, env_scale: float = 1.0) -> list[dict]:
    gpus = rollout_gpu_count(spec)
    rows = []
    for b in BATCHES:
        m = build_models(spec, batch=b * trajectories_per_item, env_scale=env_scale)
        n_col, n_dis = gpus // m.tp_colocated, gpus // m.tp_decode
        col = m.predictor.colocated(n_col)
        dis = m.predictor.best_disaggregated(n_dis)
        winner = "colocated" if col.completion_s <= dis.completion_s else "disaggregated"
        use = m.predictor.colocated_engine_use(n_col)
        rows.append({
            "batch_size": b,
            "trajectories": b * trajectories_per_item,
            "colocated_s": round(col.completion_s, 2),
            "disaggregated_s": round(dis.completion_s, 2),
            "best_ratio": f"{dis.prefill}P{dis.decode}D",
            "winner": winner,
            "disaggregation_gain_pct": round((col.completion_s / dis.completion_s - 1.0) * 100.0, 2),
            "prefill_path_s": round(dis.prefill_path_s, 2),
            "decode_path_s": round(dis.decode_path_s, 2),
            "prefill_queue_s": round(dis.prefill_queue_s, 2),
            "colocated_decode_concurrency": round(col.mean_concurrency, 2),
            "colocated_prefill_share_of_engine_time_pct": round(use.prefill_time_share * 100.0, 2),
            "colocated_decode_tok_s_per_gpu": round(use.decode_tok_s / m.tp_colocated, 1),
            "prefill_share_of_tokens_pct": round(use.prefill_token_share * 100.0, 2),
        })
    return rows


def crossover(rows: list[dict]) -> str:
    """First batch at which colocation wins after disaggregation did (or a statement that none does)."""
    for prev, cur in zip(rows, rows[1:]):
        if prev["winner"] == "disaggregated" and cur["winner"] == "colocated":
            return f"between batch {prev['batch_size']} and {cur['batch_size']}"
    return f"none in {BATCHES[0]}..{BATCHES[-1]} (winner throughout: {rows[0]['winner']})" if len({r['winner'] for r in rows}) == 1 else "no single crossover"


def paper_cells(b: int) -> tuple[str, str]:
    gain = PAPER_GAIN_PCT.get(b)
    return (f"{gain:+.1f}%" if gain is not None else "", PAPER_RATIO.get(b, ""))


def markdown(spec: ExperimentSpec, primary: list[dict], expanded: list[dict], env_rows: dict[float, list[dict]]) -> str:
    lines = [
        "# PD crossover: colocation vs disaggregation (model prediction beside the paper)",
        "",
        f"Setting: {spec.model_name}, {rollout_gpu_count(spec)} {spec.cluster.nodes[0].gpu} GPUs as TP{spec.cluster.tp.colocated[0]} workers, "
        f"the experiment's workload at {trajectories_per_unit(spec)} trajectories per unit of the paper's batch (profile `{spec.profile_name}`). Generated by `experiments/pd_crossover.py`.",
        "Gain = colocated time / disaggregated time - 1 (positive: disaggregation faster). Paper: +9.7% at 32, +1.4% at 80, "
        "-6.1% at 96 (colocation 6.1% better); best ratio 4P4D at 48, 5P3D at 64.",
        "",
    ]

    def table(title: str, rows: list[dict]) -> None:
        lines.extend([f"## {title}", "", f"Crossover: {crossover(rows)}.", "",
                      "| batch | trajectories | colocated (s) | disaggregated (s) | best ratio | winner | gain (model) | gain (paper) | ratio (paper) | coloc prefill time share | coloc decode tok/s/GPU |",
                      "|---:|---:|---:|---:|:---:|:---|---:|---:|:---:|---:|---:|"])
        for r in rows:
            pg, pr = paper_cells(r["batch_size"])
            lines.append(f"| {r['batch_size']} | {r['trajectories']} | {r['colocated_s']:.1f} | {r['disaggregated_s']:.1f} | {r['best_ratio']} | {r['winner']} | "
                         f"{r['disaggregation_gain_pct']:+.1f}% | {pg} | {pr} | {r['colocated_prefill_share_of_engine_time_pct']:.1f}% | {r['colocated_decode_tok_s_per_gpu']:.0f} |")
        lines.append("")

    unit = primary[0]["trajectories"] // primary[0]["batch_size"]
    table(f"Batch = {unit} trajectories per unit (primary, the calibrated reading; results/pd_crossover.json)", primary)
    table(f"Batch = {expanded[0]['trajectories'] // expanded[0]['batch_size']} trajectories per unit (the other reading)", expanded)
    lines.extend(["## Tool latency sensitivity (primary reading)", "", "| batch | " + " | ".join(f"gain, env x{k}" for k in env_rows) + " |",
                  "|---:|" + "---:|" * len(env_rows)])
    for i, b in enumerate(BATCHES):
        lines.append(f"| {b} | " + " | ".join(f"{rows[i]['disaggregation_gain_pct']:+.1f}% ({rows[i]['best_ratio']})" for rows in env_rows.values()) + " |")
    p64 = next(r for r in primary if r["batch_size"] == 64)
    e64 = next(r for r in expanded if r["batch_size"] == 64)
    lines.extend(["", "## Engine statistics at batch 64, colocated (checks, not inputs)", "",
                  "| statistic | paper | model, primary reading | model, other reading |", "|---|---:|---:|---:|",
                  f"| prefill share of processed tokens | {PAPER_ENGINE['prefill_share_of_tokens_pct']}% | {p64['prefill_share_of_tokens_pct']}% | {e64['prefill_share_of_tokens_pct']}% |",
                  f"| prefill share of engine time | {PAPER_ENGINE['prefill_share_of_engine_time_pct']}% | {p64['colocated_prefill_share_of_engine_time_pct']}% | {e64['colocated_prefill_share_of_engine_time_pct']}% |",
                  f"| decode tokens/s per GPU between prefills | ~{PAPER_ENGINE['decode_tok_s_per_gpu']:.0f} | {p64['colocated_decode_tok_s_per_gpu']:.0f} | {e64['colocated_decode_tok_s_per_gpu']:.0f} |",
                  "", "All three are calibration targets of configs/calibration/paper-8b.yaml (fitted there, so checks of the fit here).", ""])
    return "\n".join(lines)


def print_table(title: str, rows: list[dict]) -> None:
    t = Table(title=title)
    for c in ("batch", "traj", "colocated s", "disagg s", "best", "winner", "gain", "paper gain", "paper ratio"):
        t.add_column(c, justify="right")
    for r in rows:
        pg, pr = paper_cells(r["batch_size"])
        t.add_row(str(r["batch_size"]), str(r["trajectories"]), f"{r['colocated_s']:.1f}", f"{r['disaggregated_s']:.1f}", r["best_ratio"], r["winner"],
                  f"{r['disaggregation_gain_pct']:+.1f}%", pg, pr)
    Console(width=140).print(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "experiments" / "pd-crossover.yaml")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "results")
    args = ap.parse_args()
    spec = load_spec(args.config, "pd_crossover")
    unit = trajectories_per_unit(spec)
    primary = sweep(spec, trajectories_per_item=unit)
    group = 1 if unit > 1 else spec.workload.group_size
    expanded = sweep(spec, trajectories_per_item=group)
    env_rows = {k: sweep(spec, trajectories_per_item=unit, env_scale=k) for k in (0.5, 1.0, 2.0)}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "pd_crossover.json").write_text(json.dumps(primary, indent=1))
    (args.out_dir / "pd_crossover_sensitivity.json").write_text(json.dumps({
        "config": repo_relative(args.config), "profile": spec.profile_name,
        "paper": {"gain_pct": PAPER_GAIN_PCT, "best_ratio": PAPER_RATIO, "engine": PAPER_ENGINE},
        "crossover": {"trajectories": crossover(primary), f"groups_x{group}": crossover(expanded)},
        f"groups_x{group}": expanded,
        "env_scale": {str(k): v for k, v in env_rows.items()},
    }, indent=1))
    (args.out_dir / "pd_crossover.md").write_text(markdown(spec, primary, expanded, env_rows))
    print_table(f"{spec.model_name}: batch unit = {unit} trajectories (crossover: {crossover(primary)})", primary)
    print_table(f"{spec.model_name}: batch unit = {group} trajectories (crossover: {crossover(expanded)})", expanded)
    print(f"wrote {args.out_dir / 'pd_crossover.json'}, pd_crossover_sensitivity.json, pd_crossover.md")


if __name__ == "__main__":
    main()
