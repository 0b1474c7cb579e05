"""`pearl predict`: predicted rollout-batch completion for colocation and the best P:D split."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from runtime.cli import app, user_errors


@app.command()
@user_errors
def predict(
    config: Path = typer.Option(..., "--config", "-c", help="experiment YAML (configs/experiments/*.yaml)"),
    gpus: Optional[int] = typer.Option(None, "--gpus", min=1, help="rollout GPUs (default: rollout + elastic pools)"),
    batch: Optional[int] = typer.Option(None, "--batch", min=1, help="trajectories per batch (default: workload's)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Predict rollout-batch completion under colocation and under the best disaggregation ratio."""
    from models.builder import build_models, rollout_gpu_count
    from models.config import load_experiment
    from runtime.jsonout import print_json

    spec = load_experiment(config)
    m = build_models(spec, batch=batch)
    n_gpus = gpus or rollout_gpu_count(spec)
    n_col = n_gpus // m.tp_colocated
    n_dis = n_gpus // m.tp_decode
    col = m.predictor.colocated(n_col)
    dis = m.predictor.best_disaggregated(n_dis)
    best = "colocated" if col.completion_s <= dis.completion_s else "disaggregated"
    out = {
        "colocated": {"completion_s": round(col.completion_s, 3), "instances": n_col, "mean_decode_concurrency": round(col.mean_concurrency, 2)},
        "disaggregated": {
            "completion_s": round(dis.completion_s, 3), "prefill": dis.prefill, "decode": dis.decode,
            "prefill_path_s": round(dis.prefill_path_s, 3), "decode_path_s": round(dis.decode_path_s, 3),
            "prefill_queue_s": round(dis.prefill_queue_s, 3),
        },
        "best": best,
        "gpus": n_gpus,
        "batch": m.predictor.shape.batch,
        "model": spec.model_name,
        "profile": {"name": m.profile.name, "label": m.profile.label},
    }
    if as_json:
        print_json(out)
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{spec.name}: {spec.model_name}, batch {out['batch']}, {n_gpus} rollout {m.rollout_gpu} GPUs (profile {m.profile.name}, {m.profile.label})")
    for col_name in ("mode", "instances", "completion (s)", "detail"):
        t.add_column(col_name)
    t.add_row("colocated", f"{n_col} x TP{m.tp_colocated}", f"{col.completion_s:.1f}", f"mean decode concurrency {col.mean_concurrency:.1f}/instance")
    t.add_row("disaggregated", f"{dis.prefill}P{dis.decode}D x TP{m.tp_decode}", f"{dis.completion_s:.1f}", f"prefill path {dis.prefill_path_s:.1f} s, decode path {dis.decode_path_s:.1f} s, + prefill queue {dis.prefill_queue_s:.1f} s")
    Console().print(t)
    gain = abs(col.completion_s - dis.completion_s) / max(col.completion_s, dis.completion_s) * 100
    Console().print(f"best: [bold]{best}[/bold] ({gain:.1f}% faster)")
