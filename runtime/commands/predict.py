"""`pearl predict`: predicted rollout-batch completion for colocation and the best P:D split."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from runtime.cli import app, user_errors
from runtime.flags import batch_option, gpus_option


@app.command()
@user_errors
def predict(
    config: Path = typer.Option(..., "--config", "-c", help="experiment YAML (configs/experiments/*.yaml)"),
    gpus: Optional[int] = gpus_option("rollout GPUs (default: rollout + elastic pools; on a mixed cluster the rollout GPU type's)"),
    batch: Optional[int] = batch_option("trajectories per batch (default: workload's)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Predict rollout-batch completion under colocation and under the best disaggregation ratio."""
    from models.builder import build_models, rollout_gpu_count
    from models.config import load_experiment
    from runtime.jsonout import print_json

    spec = load_experiment(config)
    m = build_models(spec, batch=batch)
    # a mixed cluster: the two modes are the rollout type's, on its own GPUs; each type alone follows (by_kind)
    n_gpus = gpus or rollout_gpu_count(spec, gpu_type=m.rollout_gpu if m.variants else None)
    n_col = n_gpus // m.tp_colocated
    n_dis = n_gpus // m.tp_decode
    col = m.predictor.colocated(n_col)
    dis = m.predictor.best_disaggregated(n_dis)
    col_why = infeasible(col.completion_s, n_gpus, n_col, 1, m.tp_colocated)
    dis_why = infeasible(dis.completion_s, n_gpus, n_dis, 2, m.tp_decode)
    feasible = {"colocated": col_why is None, "disaggregated": dis_why is None}
    best = min((k for k, ok in feasible.items() if ok), key=lambda k: col.completion_s if k == "colocated" else dis.completion_s, default=None)
    out = {
        "colocated": {"feasible": col_why is None, "reason": col_why, "completion_s": round(col.completion_s, 3), "instances": n_col,
                      "mean_decode_concurrency": round(col.mean_concurrency, 2), "profile": spec.colocated_profile_name(n_col)},
        "disaggregated": {
            "feasible": dis_why is None, "reason": dis_why,
            "completion_s": round(dis.completion_s, 3), "prefill": dis.prefill, "decode": dis.decode,
            "prefill_path_s": round(dis.prefill_path_s, 3), "decode_path_s": round(dis.decode_path_s, 3),
            "prefill_queue_s": round(dis.prefill_queue_s, 3), "profile": spec.pd_profile_name or spec.profile_name,
        },
        "feasible": best is not None,
        "best": best,
        "gpus": n_gpus,
        "batch": m.predictor.shape.batch,
        "model": spec.model_name,
        "profile": {"name": m.profile.name, "label": m.profile.label},
    }
    if m.variants:
        out["gpu_type"] = m.rollout_gpu
        out["by_kind"] = by_kind(spec, m)
    if as_json:
        print_json(out)
        return
    from rich.table import Table

    from runtime.tables import table_console
    whose = f"{n_gpus} rollout {m.rollout_gpu} GPUs" + (f" of the mixed cluster's {rollout_gpu_count(spec)}" if m.variants else "")
    t = Table(title=f"{spec.name}: {spec.model_name}, batch {out['batch']}, {whose} (profile {m.profile.name}, {m.profile.label})")
    for col_name in ("mode", "instances", "completion (s)", "detail"):
        t.add_column(col_name)
    t.add_row("colocated", f"{n_col} x TP{m.tp_colocated}", _seconds(col.completion_s, col_why), col_why or f"mean decode concurrency {col.mean_concurrency:.1f}/instance; profile {out['colocated']['profile']}")
    t.add_row("disaggregated", f"{dis.prefill}P{dis.decode}D x TP{m.tp_decode}", _seconds(dis.completion_s, dis_why),
              dis_why or f"prefill path {dis.prefill_path_s:.1f} s, decode path {dis.decode_path_s:.1f} s, + prefill queue {dis.prefill_queue_s:.1f} s; profile {out['disaggregated']['profile']}")
    con = table_console()
    con.print(t)
    if m.variants:
        k = Table(title="each GPU type alone, at each TP degree (its rollout and elastic GPUs; the mixed layout is `pearl plan`'s)")
        for col_name in ("GPU type", "GPUs", "TP", "colocated (s)", "best P:D (s)"):
            k.add_column(col_name)
        for row in out["by_kind"]:
            dis_s = "-" if row["disaggregated_s"] is None else f"{row['disaggregated_s']:.1f} ({row['prefill']}P{row['decode']}D)"
            k.add_row(row["gpu_type"], str(row["gpus"]), str(row["tp"]), "-" if row["colocated_s"] is None else f"{row['colocated_s']:.1f}", dis_s)
        con.print(k)
    if best is None:
        con.print("best: [bold]none[/bold] (no mode is feasible)")
        return
    other = dis.completion_s if best == "colocated" else col.completion_s
    mine = col.completion_s if best == "colocated" else dis.completion_s
    gain = f"{(other - mine) / other * 100:.1f}% faster" if math.isfinite(other) else "the only feasible mode"
    con.print(f"best: [bold]{best}[/bold] ({gain})")


def by_kind(spec, m) -> list[dict]:
    """Per (GPU type, TP degree) of a mixed cluster: that type's rollout and elastic GPUs alone,
    colocated and at the best P:D split, each at this degree where the role may use it (None:
    it may not, or no instance fits)."""
    from models.builder import rollout_gpu_count

    rows = []
    tp = spec.cluster.tp
    for typ, t, p in m.variants:
        n = rollout_gpu_count(spec, gpu_type=typ) // t
        col = p.colocated(n).completion_s if t in tp.colocated else math.inf  # n = 0: inf
        dis = p.best_disaggregated(n) if t in tp.prefill and t in tp.decode else None  # n < 2: inf
        dis = dis if dis is not None and math.isfinite(dis.completion_s) else None
        rows.append({"gpu_type": typ, "tp": t, "gpus": n * t, "colocated_s": round(col, 3) if math.isfinite(col) else None,
                     "disaggregated_s": round(dis.completion_s, 3) if dis else None,
                     "prefill": dis.prefill if dis else None, "decode": dis.decode if dis else None})
    return rows


def infeasible(completion_s: float, gpus: int, instances: int, needed: int, tp: int) -> str | None:
    """Why a mode has no finite completion time (None: it has one). Without this the JSON said
    `null` and the table `inf`, leaving the user to guess."""
    if math.isfinite(completion_s):
        return None
    if instances < needed:
        return f"{gpus} rollout GPU(s) host {instances} TP{tp} instance(s); this mode needs {needed} ({needed * tp} GPUs)"
    return "no finite completion time: an instance's KV cache cannot hold one sequence"


def _seconds(value: float, why: str | None) -> str:
    return "infeasible" if why else f"{value:.1f}"
