"""`pearl fit`: fit step-latency coefficients to samples from `pearl profile` and write a profile JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

import typer

from models.fit import MAX_TP
from runtime.cli import app, user_errors
from runtime.flags import int_option

MAX_HOLDOUT_EVERY = 1_000  # more holds nothing out of any real grid, which the fit then refuses anyway


def _check_out(out: Path) -> None:
    """--out must be writable before the work: a directory there, or a file where a folder must
    go, would otherwise end a finished fit in a traceback."""
    from models.config import ConfigError

    if out.is_dir():
        raise ConfigError("pearl fit", "--out", str(out), "a file path for the profile JSON, not a directory")
    parent = next((p for p in out.absolute().parents if p.exists()), None)
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ConfigError("pearl fit", "--out", str(out), f"a path under a writable folder ({parent} is not one)")


# Header fields `pearl fit` reads, and their JSON types (others are carried as they are).
HEADER_TYPES: dict[str, type] = {"model": str, "hardware": str, "machine": str, "date": str, "engine": dict, "machine_detail": dict, "load_avg": list}
TYPE_NAMES: dict[type, str] = {dict: "a JSON object", list: "a JSON array", str: "a string"}


def _check_header(samples: Path, header: dict) -> None:
    """The header fields this command reads have the types it reads them as (read_samples
    checked the rest: an object, tp, no NaN or infinity)."""
    from models.config import ConfigError
    from models.fit import MAX_TOKENS, brief_value, check_number

    for key, typ in HEADER_TYPES.items():
        if key in header and not isinstance(header[key], typ):
            raise ConfigError(samples, f"header.{key}", brief_value(header[key]), TYPE_NAMES[typ])
    for i, v in enumerate(header.get("load_avg") or []):
        check_number(samples, f"header.load_avg[{i}]", v, 0, 1e6)
    if "load_avg" in header and len(header["load_avg"]) != 2:
        raise ConfigError(samples, "header.load_avg", brief_value(header["load_avg"]), "[before, after]: two load averages")
    if header.get("steal_pct") is not None:
        check_number(samples, "header.steal_pct", header["steal_pct"], 0, 100)
    engine = header.get("engine") or {}
    if not isinstance(engine.get("clock", ""), str):
        raise ConfigError(samples, "header.engine.clock", brief_value(engine["clock"]), "wall, thread, served or runtime")
    if "max_num_batched_tokens" in engine:  # predictions read it from the profile (a step's token budget)
        check_number(samples, "header.engine.max_num_batched_tokens", engine["max_num_batched_tokens"], 1, MAX_TOKENS, integer=True)


def _pick(key: str, flag_value: str | None, header: dict, samples: Path, catalog_file: str, known: Mapping[str, object]) -> str:
    """The catalog name from --KEY, else from the samples header; an unknown one blames where it
    came from (the flag, or the header's field in the samples file)."""
    from models.config import ConfigError

    if flag_value is not None:
        if flag_value not in known:
            raise ConfigError("pearl fit", f"--{key}", flag_value, f"one of {sorted(known)} (in {catalog_file})")
        return flag_value
    if header.get(key) not in known:  # _check_header made it a string where present
        raise ConfigError(samples, f"header.{key}", header.get(key, "<missing>"), f"one of {sorted(known)} (in {catalog_file}), or pass --{key}")
    return header[key]


@app.command()
@user_errors
def fit(
    samples: Path = typer.Option(..., "--samples", help="samples JSONL written by `pearl profile`"),
    model: str = typer.Option(None, "--model", help="model name in configs/llms.yaml (default: the samples header's)"),
    hardware: str = typer.Option(None, "--hardware", help="accelerator in configs/hardware.yaml (default: the samples header's)"),
    tp: int = int_option(None, "--tp", lo=1, hi=MAX_TP, help="tensor-parallel degree (default: the samples header's)"),
    out: Path = typer.Option(..., "--out", help="profile JSON to write (configs/profiles/NAME.json)"),
    holdout_every: int = int_option(4, "--holdout-every", lo=2, hi=MAX_HOLDOUT_EVERY, help="k-fold cross-validation: each sample of each kind is predicted by the fit on the other k-1 folds (k >= samples: leave one out)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Fit prefill and decode coefficients (NNLS on relative error) on every sample; report their MAPE and the held-out MAPE of k-fold cross-validation."""
    from models.config import ConfigError, load_hardware, load_llms
    from models.fit import fit_profile, read_samples
    from runtime.jsonout import print_json

    _check_out(out)
    header, rows = read_samples(samples)
    _check_header(samples, header)
    llms, gpus = load_llms().models, load_hardware().gpus
    model = _pick("model", model, header, samples, "configs/llms.yaml", llms)
    hardware = _pick("hardware", hardware, header, samples, "configs/hardware.yaml", gpus)
    llm, gpu = llms[model], gpus[hardware]
    tp = tp or int(header.get("tp", 1))
    for kind in ("prefill", "decode"):
        if not any(s.kind == kind for s in rows):
            raise ConfigError(samples, "kind", f"no {kind} samples", "both prefill and decode samples")
    name = out.stem
    machine = header.get("machine", "")
    if header.get("date"):
        machine = f"{machine} (profiled {header['date']})" if machine else f"profiled {header['date']}"
    report = fit_profile(rows, llm, gpu, tp, name=name, hardware=hardware, model=model, machine=machine, holdout_every=holdout_every, source=samples)
    prof = report.profile
    data = prof.to_json()
    notes = [prof.notes, f"samples {samples.name}"]
    engine = header.get("engine") or {}
    if engine.get("clock", "wall") != "wall":
        notes.append(f"step times by the {engine['clock']} clock")
    if header.get("load_avg"):
        cores = (header.get("machine_detail") or {}).get("cores", "?")
        notes.append(f"load average while profiling {header['load_avg'][0]} -> {header['load_avg'][1]} on {cores} cores")
    if header.get("steal_pct") is not None:
        notes.append(f"hypervisor steal {header['steal_pct']}% of the CPU time")
    data["notes"] = "; ".join(notes)
    if header.get("engine"):
        data["fit"]["engine"] = header["engine"]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    except OSError as exc:
        raise ConfigError("pearl fit", "--out", str(out), f"a writable file path ({exc.strerror or exc})") from None

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
        **({"request_overhead": data["request_overhead"]} if "request_overhead" in data else {}),
        **({"skipped": prof.fit["skipped"]} if "skipped" in prof.fit else {}),
    }
    if as_json:
        print_json(result)
        return
    from rich.table import Table

    from runtime.tables import table_console
    t = Table(title=f"fit {model} on {hardware} (tp {tp}) from {samples.name}")
    for c in ("step kind", "samples", "fit MAPE %", "held out", f"held-out MAPE % ({holdout_every}-fold)", "repeat noise %"):
        t.add_column(c)
    for kind in report.train_mape:
        noise = report.repeat_noise[kind]
        t.add_row(kind, str(report.n_train[kind]), f"{report.train_mape[kind]:.2f}", str(report.n_holdout[kind]), f"{report.holdout_mape[kind]:.2f}", f"{noise:.2f}" if noise else "not recorded")
    con = table_console()
    con.print(t)
    for kind, why in prof.fit.get("skipped", {}).items():
        con.print(f"{kind} samples: {why}")
    con.print(f"wrote {out}")
