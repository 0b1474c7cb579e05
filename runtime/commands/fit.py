"""`pearl fit`: fit step-latency coefficients to samples from `pearl profile` and write a profile JSON."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from runtime.cli import app, user_errors


@app.command()
@user_errors
def fit(
    samples: Path = typer.Option(..., "--samples", help="samples JSONL written by `pearl profile`"),
    model: str = typer.Option(None, "--model", help="model name in configs/llms.yaml (default: the samples header's)"),
    hardware: str = typer.Option(None, "--hardware", help="accelerator in configs/hardware.yaml (default: the samples header's)"),
    tp: int = typer.Option(None, "--tp", min=1, help="tensor-parallel degree (default: the samples header's)"),
    out: Path = typer.Option(..., "--out", help="profile JSON to write (configs/profiles/NAME.json)"),
    holdout_every: int = typer.Option(4, "--holdout-every", min=2, help="hold out every k-th sample of each kind"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Fit prefill and decode coefficients (NNLS on relative error); report train and held-out MAPE."""
    from models.config import ConfigError, lookup_model_and_hardware
    from models.fit import fit_profile, read_samples
    from runtime.jsonout import print_json

    header, rows = read_samples(samples)
    model = model or header.get("model")
    hardware = hardware or header.get("hardware")
    tp = tp or int(header.get("tp", 1))
    llm, gpu = lookup_model_and_hardware(model, hardware)
    for kind in ("prefill", "decode"):
        if not any(s.kind == kind for s in rows):
            raise ConfigError(samples, "kind", f"no {kind} samples", "both prefill and decode samples")
    name = out.stem
    machine = header.get("machine", "")
    if header.get("date"):
        machine = f"{machine} (profiled {header['date']})" if machine else f"profiled {header['date']}"
    report = fit_profile(rows, llm, gpu, tp, name=name, hardware=hardware, model=model, machine=machine, holdout_every=holdout_every)
    prof = report.profile
    data = prof.to_json()
    notes = [prof.notes, f"samples {samples.name}"]
    engine = header.get("engine") or {}
    if engine.get("clock", "wall") != "wall":
        notes.append(f"step times by the {engine['clock']} clock")
    if header.get("load_avg"):
        cores = (header.get("machine_detail") or {}).get("cores", "?")
        notes.append(f"load average while profiling {header['load_avg'][0]} -> {header['load_avg'][1]} on {cores} cores")
    data["notes"] = "; ".join(notes)
    if header.get("engine"):
        data["fit"]["engine"] = header["engine"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")

    result = {
        "profile": str(out),
        "samples": str(samples),
        "model": model,
        "hardware": hardware,
        "tp": tp,
        "train_mape_pct": report.train_mape,
        "holdout_mape_pct": report.holdout_mape,
        "repeat_noise_pct": report.repeat_noise,
        "n_train": report.n_train,
        "n_holdout": report.n_holdout,
        "coefficients": data["coefficients"],
        **({"kv_handoff": data["kv_handoff"]} if "kv_handoff" in data else {}),
    }
    if as_json:
        print_json(result)
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"fit {model} on {hardware} (tp {tp}) from {samples.name}")
    for c in ("step kind", "train n", "train MAPE %", "held-out n", "held-out MAPE %", "repeat noise %"):
        t.add_column(c)
    for kind in report.train_mape:
        noise = report.repeat_noise[kind]
        t.add_row(kind, str(report.n_train[kind]), f"{report.train_mape[kind]:.2f}", str(report.n_holdout[kind]), f"{report.holdout_mape[kind]:.2f}", f"{noise:.2f}" if noise else "not recorded")
    Console().print(t)
    Console().print(f"wrote {out}")
