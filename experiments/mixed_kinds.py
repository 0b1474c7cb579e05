"""Why the planner picks a role and TP degree per GPU type: each kind's predicted path on the same GPUs.

For every (GPU type, TP degree) of a mixed experiment (default configs/experiments/mixed-elastic.yaml)
and each role, the batch path when `--gpus` GPUs of that type alone serve it as GPUs / TP
instances (decode and prefill paths as the disaggregated program prices them, the prefill
queue included in the prefill column; colocated completion). The planner mixes kinds, so
this is not its decision, only the per-kind speeds behind it. Writes results/mixed_kinds.json
and prints a table.

    python experiments/mixed_kinds.py --gpus 12
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models.builder import build_models  # noqa: E402
from experiments.cli_args import load_spec  # noqa: E402
from models.config import ExperimentSpec, repo_relative  # noqa: E402


def kind_rows(spec: ExperimentSpec, gpus: int) -> list[dict]:
    models = build_models(spec)
    labels = {typ: label for typ, _, label in models.variant_profiles}
    rows = []
    for typ, tp, pred in models.variants:
        n = np.array([max(gpus // tp, 1)])
        rows.append({
            "gpu": typ, "tp": tp, "instances": int(n[0]), "profile": labels.get(typ, ""),
            "colocated_s": round(float(pred.colocated_many(n)[0][0]), 1),
            "prefill_s": round(float(pred.prefill_path_many(n)[0] + pred.prefill_queue_many(n)[0]), 1),
            "decode_s": round(float(pred.decode_path_many(n)[0][0]), 1),
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs/experiments/mixed-elastic.yaml"))
    ap.add_argument("--gpus", type=int, default=12)
    ap.add_argument("--out", default=str(ROOT / "results/mixed_kinds.json"))
    args = ap.parse_args()
    rows = kind_rows(load_spec(args.config, "mixed_kinds"), args.gpus)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"config": repo_relative(args.config), "gpus": args.gpus, "rows": rows}, indent=1))
    from rich.table import Table

    from runtime.tables import table_console

    t = Table(title=f"batch path on {args.gpus} GPUs of one type (s; lower is better)")
    for c in ("GPU", "TP", "instances", "colocated", "prefill (+queue)", "decode", "profile"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(r["gpu"], str(r["tp"]), str(r["instances"]), f"{r['colocated_s']:.0f}", f"{r['prefill_s']:.0f}", f"{r['decode_s']:.0f}", r["profile"])
    table_console().print(t)


if __name__ == "__main__":
    main()
