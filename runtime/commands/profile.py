"""`pearl profile`: measure step times of a real vLLM engine and write them as samples JSONL."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from runtime.cli import app, user_errors
from runtime.flags import int_option


@app.command()
@user_errors
def profile(
    model_dir: Path = typer.Option(..., "--model-dir", help="Hugging Face model directory vLLM loads"),
    model: str = typer.Option(..., "--model", help="model name in configs/llms.yaml"),
    hardware: str = typer.Option(..., "--hardware", help="accelerator name in configs/hardware.yaml"),
    out: Path = typer.Option(..., "--out", help="samples JSONL to write"),
    grid: str = typer.Option("small", "--grid", help="tiny | small | medium"),
    dtype: str = typer.Option("auto", "--dtype", help="auto | float32 | bfloat16 | float16"),
    load_format: str = typer.Option("auto", "--load-format", help="auto | dummy (random weights, config-only dir)"),
    max_model_len: int = int_option(1024, "--max-model-len", lo=64, hi=1 << 20, help="engine context length"),
    tp: int = int_option(1, "--tp", lo=1, hi=1024, help="tensor-parallel degree of the engine"),
    kv_cache_gib: int = int_option(1, "--kv-cache-gib", lo=1, hi=4096, help="KV cache size on CPU (VLLM_CPU_KVCACHE_SPACE)"),
    cpu_bind: str = typer.Option("auto", "--cpu-bind", help="CPU cores the engine's threads use (VLLM_CPU_OMP_THREADS_BIND), e.g. 0"),
    max_num_batched_tokens: int = int_option(2048, "--max-num-batched-tokens", lo=64, hi=1 << 20, help="engine token budget per step (vLLM serving default 2048); larger grid prefills are skipped"),
    clock: str = typer.Option("wall", "--clock", help="wall | thread (CPU engines pinned to one core: the engine thread's CPU time, blind to other processes on this machine though not to a VM host's stolen cycles) | served (an AsyncLLM engine in its own process: the engine core's per-request timestamps) | runtime (the same timestamps, engines inside the runtime's RolloutWorker Ray actors and requests sent through Ray, as `pearl train` runs them: the deployment)"),
    repeats: int = int_option(0, "--repeats", lo=0, hi=1000, help="repeats per point (0: the grid's default, >= 3)"),
    pd: bool = typer.Option(False, "--pd", help="with --clock served|runtime --engines 2: profile a disaggregated pair (engine 0 prefills and hands its KV to engine 1, which decodes) through the runtime's KV connector; adds 'handoff' samples"),
    engines: int = int_option(1, "--engines", lo=1, hi=64, help="with --clock served|runtime: engines run at once, as co-located rollout engines run (each point runs on all of them together; engine i binds to the i-th '|'-part of --cpu-bind, e.g. '0|1')"),
) -> None:
    """Drive a real vLLM engine over a grid of batch, prompt and cached-context sizes; write step timings."""
    from dataclasses import replace

    from models.config import ConfigError, lookup_model_and_hardware
    from models.fit import write_samples
    from runtime import profiling

    if grid not in profiling.GRIDS:
        raise ConfigError("--grid", "grid", grid, f"one of {sorted(profiling.GRIDS)}")
    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ConfigError("--dtype", "dtype", dtype, "auto, float32, bfloat16 or float16")
    if load_format not in ("auto", "dummy"):
        raise ConfigError("--load-format", "load_format", load_format, "auto or dummy")
    served = clock in ("served", "runtime")
    if clock not in ("wall", "thread", "served", "runtime"):
        raise ConfigError("--clock", "clock", clock, "wall, thread, served or runtime")
    if clock == "thread" and not cpu_bind.isdigit():
        raise ConfigError("--clock", "clock", clock, "'thread' only with --cpu-bind set to one core (e.g. 0): the engine must compute on one thread")
    if engines > 1 and not served:
        raise ConfigError("--engines", "engines", engines, "1 unless --clock served or runtime (several engines at once run as served AsyncLLM engines)")
    if pd and (not served or engines != 2):
        raise ConfigError("--pd", "pd", True, "only with --clock served or runtime and --engines 2 (a prefill engine and a decode engine)")
    parts = cpu_bind.split("|")
    if served and cpu_bind != "auto" and (any(not part for part in parts) or len(parts) not in (1, engines)):
        raise ConfigError("--cpu-bind", "cpu_bind", cpu_bind, f"one binding for all engines, or {engines} separated by '|' (one per engine), e.g. 0|1")
    lookup_model_and_hardware(model, hardware)  # bad --model / --hardware: one clear error before an engine starts
    profiling.check_model_dir(model_dir, load_format)
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise ConfigError("<environment>", "vllm", "not importable", "vllm (GPU) or vllm-cpu installed (make venv)") from None
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

    g = profiling.GRIDS[grid]
    if repeats:
        g = replace(g, repeats=max(repeats, 1))
    points = g.points(max_model_len, max_num_batched_tokens)
    settings = profiling.EngineSettings(
        model_dir=str(model_dir), dtype=dtype, load_format=load_format, max_model_len=max_model_len,
        tp=tp, max_num_batched_tokens=max_num_batched_tokens, kv_cache_gib=kv_cache_gib, cpu_threads_bind=cpu_bind, clock=clock, engines=engines, pd=pd,
    )

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    console.print(f"starting vLLM engine for {model_dir} ({model}, dtype {dtype}, load_format {load_format}) ...")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task(f"profiling grid '{grid}'", total=len(points) * g.repeats)

        def started(start_s: float, n: int) -> None:
            bar.console.print(f"engine started in {start_s:.1f} s; measuring {n} points x {g.repeats} repeats")

        def advanced(i: int, n: int, p: profiling.GridPoint) -> None:
            bar.update(task, completed=i, total=n, description=f"n={p.batch} prompt={p.prompt_tokens} context={p.context_tokens}")

        samples, facts = profiling.profile_engine(settings, g, on_point=advanced, on_started=started)
    header = profiling.samples_header(settings, g, model, hardware, facts, profiling.machine_detail())
    write_samples(out, header, samples)
    console.print(f"wrote {len(samples)} samples to {out} in {facts['wall_s']:.0f} s")
    sys.stderr.flush()
