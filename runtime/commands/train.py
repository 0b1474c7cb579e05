"""`pearl train`: online solver-in-the-loop agentic RL on Ray (real vLLM or emulated engines)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from runtime.cli import app, user_errors
from runtime.flags import steps_option


# Set in the child process that drives a run on a cluster: the file it writes when it ends by itself.
DRIVER_ENDED = "PEARL_TRAIN_DRIVER_ENDED"
# How long the head may not answer before the run is stopped: beyond a GCS restart's blip, far
# below the 60 s that Ray's own driver waits for a lost GCS (gcs_rpc_server_reconnect_timeout_s).
HEAD_SILENCE_S = 10.0
HEAD_CHECK_S = 1.0
DRIVER_STOP_GRACE_S = 5.0
# How long a head may still answer after the driver ended before it is said to answer: Ray's
# processes end after their parent, not with it (a fresh clone's head answered at the instant
# its killed driver had ended, 2026-12-05)
HEAD_SETTLE_S = 5.0


def _drive_in_child(args: list[str], address: str, metrics: Path) -> int:
    """Run the same training (the parsed options, passed again) in a child process and say how it ended.

    On a cluster the driver lives only as long as the head node. When the driver's own raylet
    (the head's) dies first, Ray's core worker ends the process at once, with no Python handler
    run (exit 1, no message, 6-12 s after the head stopped); when the head's GCS goes first, the
    driver retries it for Ray's 60 s before it ends (measured: the same test took 6-67 s). So the
    child drives the run, and this process watches the head: when nothing has answered at the
    address for HEAD_SILENCE_S it stops the child. Either way a child that ended without
    finishing becomes one clear error; the metrics JSONL, written line by line, stays readable."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pearl-train-") as d:
        ended = Path(d) / "ended"
        proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "train", *args], env={**os.environ, DRIVER_ENDED: str(ended)})
        try:
            head_lost = _head_lost_before_end(proc, address)
        finally:  # also on Ctrl-C, which the child got too: it may end by itself first
            _stop(proc)
        if head_lost:  # checked first: a stopped driver may still run its own exit path and say it ended
            print(f"pearl: error: run failed: the Ray head node at {address} is gone (nothing answered there for {HEAD_SILENCE_S:.0f} s): "
                  f"the driver was stopped (metrics so far: {metrics})", file=sys.stderr)
            return 1
        if ended.exists():
            return proc.returncode
    head = "still answers (see Ray's logs)" if _answers_after(address, HEAD_SETTLE_S) else "is gone (nothing answers there)"
    print(f"pearl: error: run failed: the driver ended without finishing (exit {proc.returncode}): the Ray head node at {address} {head} (metrics so far: {metrics})", file=sys.stderr)
    return 1


def _head_lost_before_end(proc: Any, address: str) -> bool:
    """Wait for the child; True when the head stopped answering for HEAD_SILENCE_S before it ended."""
    import subprocess
    import time

    from runtime.ray_runtime.ray_nodes import answers

    silent_since: float | None = None
    while True:
        try:
            proc.wait(timeout=HEAD_CHECK_S)
            return False
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if answers(address, timeout_s=HEAD_CHECK_S):
            silent_since = None
        elif silent_since is None:
            silent_since = now
        elif now - silent_since >= HEAD_SILENCE_S:
            return True


def _answers_after(address: str, seconds: float) -> bool:
    """Does the head still answer `seconds` from now (or stop answering before)?"""
    import time

    from runtime.ray_runtime.ray_nodes import answers

    deadline = time.monotonic() + seconds
    while answers(address, timeout_s=HEAD_CHECK_S):
        if time.monotonic() >= deadline:
            return True
        time.sleep(HEAD_CHECK_S / 4)
    return False


def _stop(proc: Any) -> None:
    """End the child if it still runs: TERM, then KILL after DRIVER_STOP_GRACE_S."""
    import subprocess

    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=DRIVER_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _has_vllm() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


@app.command()
@user_errors
def train(
    config: str = typer.Option(..., "--config", help="experiment YAML (configs/experiments/train-*.yaml)"),
    backend: Optional[str] = typer.Option(None, "--backend", help="vllm | emulated (default: the config's runtime.backend)"),
    steps: Optional[int] = steps_option("training steps (default: runtime.steps)"),
    address: Optional[str] = typer.Option(None, "--address", help="connect to an existing Ray cluster instead of starting one"),
    metrics: Optional[str] = typer.Option(None, "--metrics", help="JSONL metrics file (default: runtime.metrics_path)"),
    as_json: bool = typer.Option(False, "--json", help="print the run summary as one JSON object on stdout"),
    plot: Optional[str] = typer.Option(None, "--plot", help="draw reward and rollout throughput per step to this image (.png, .svg, .pdf)"),
) -> None:
    """Train with the planner in the loop; a progress bar per training step; metrics streamed to JSONL."""
    from models.config import ConfigError, load_experiment

    for k, v in {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}.items():
        os.environ.setdefault(k, v)
    spec = load_experiment(config)
    chosen = spec.runtime.backend if backend is None else backend  # `--backend ""` is refused, not read as absent
    where = ("pearl train", "--backend") if backend is not None else (config, "runtime.backend")
    if chosen not in ("vllm", "emulated"):
        raise ConfigError(*where, chosen, "vllm or emulated")
    if spec.runtime.emulated_slowdown and chosen != "emulated":  # the config's own backend was checked when it loaded
        raise ConfigError(*where, chosen, f"emulated: {config} sets runtime.emulated_slowdown (real engines run at their own speed)")
    if chosen == "vllm" and not _has_vllm():
        raise ConfigError(*where, chosen, "emulated (vLLM is not installed here)")
    n = steps or spec.runtime.steps
    from runtime.outputs import check_file, check_plot

    # the metrics file opens before Ray and the engines start: a bad path fails here, in one line
    if metrics is not None:
        check_file(Path(metrics), "pearl train", "--metrics")
    else:
        check_file(Path(__file__).resolve().parents[2] / spec.runtime.metrics_path, config, "runtime.metrics_path")
    if plot is not None:
        check_plot(Path(plot), "pearl train", "--plot")
    metrics_path = Path(metrics) if metrics is not None else Path(__file__).resolve().parents[2] / spec.runtime.metrics_path
    if address and not os.environ.get(DRIVER_ENDED):
        args = ["--config", config, "--address", address, "--steps", str(n), "--backend", chosen, "--metrics", str(metrics_path)]
        raise typer.Exit(_drive_in_child([*args, *(["--json"] if as_json else []), *(["--plot", plot] if plot else [])], address, metrics_path))
    try:
        _run(spec, chosen, n, address, metrics, as_json, plot)
    finally:
        if os.environ.get(DRIVER_ENDED):  # the run ended by itself (a result or its own error): say so to the parent
            Path(os.environ[DRIVER_ENDED]).write_text("ended")


def _run(spec: Any, chosen: str, n: int, address: str | None, metrics: str | None, as_json: bool, plot: str | None) -> None:
    """The run in this process: Ray, engines, trainer, the planner in the loop."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from runtime.jsonout import print_json, stdout_to_stderr
    from runtime.ray_runtime.controller import Controller, RunFailed, RuntimeStartError
    from runtime.ray_runtime.engines import EngineStartError

    console = Console(stderr=True)
    progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console, transient=False)
    task = progress.add_task("train", total=n, info="starting Ray and engines...")

    def on_step(row: dict[str, Any]) -> None:
        info = f"step {row['step']} v{row['weight_version']} reward {row['mean_reward']:.3f} {row['tok_per_s']:.0f} tok/s {row['mode']} {row['ratio']}"
        progress.update(task, advance=1, info=info)

    ctl = Controller(spec, backend=chosen, address=address, metrics_path=metrics, on_step=on_step, log=lambda m: progress.console.print(f"[dim]{m}[/dim]"))

    async def main() -> Any:
        try:
            return await ctl.run(n)
        finally:
            await ctl.shutdown()

    try:
        # Ray and vLLM (whose logger writes to stdout) run in this process: keep them off `--json`
        with stdout_to_stderr(as_json), progress:
            summary = asyncio.run(main())
    except (RuntimeStartError, EngineStartError) as exc:
        print(f"pearl: error: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    except RunFailed as exc:  # the run itself gave up (e.g. a slot past its restart bound): not bad input
        print(f"pearl: error: run failed: {exc} (metrics so far: {ctl.metrics.path})", file=sys.stderr)
        raise typer.Exit(1) from None
    console.print(f"metrics: {ctl.metrics.path}")
    if plot is not None:
        from runtime.learning_plot import plot_steps

        control = "" if spec.runtime.control == "none" else f", control {spec.runtime.control}"
        plot_steps(summary.steps_detail, Path(plot), f"pearl train {spec.name}: {chosen} engines, {n} steps{control}")
        console.print(f"plot: {plot}")
    if as_json:
        print_json(summary.to_json())
    else:
        s = summary.to_json()
        console.print(" ".join(f"{k}={v}" for k, v in s.items()))
