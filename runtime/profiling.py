"""Measure per-step latency of a real vLLM engine over a grid of step shapes.

How a point (n requests, L new prompt tokens, C cached context tokens) is measured:
  1. warm: n fresh random prefixes of C tokens are run once (max_tokens=1), so their
     full KV blocks sit in the engine's prefix cache;
  2. measure: n prompts = prefix + L fresh random tokens are added at once with
     max_tokens = 1 + k and ignore_eos, and the engine is stepped by hand
     (`LLMEngine.step()`), timing each step with a monotonic clock. The first step must
     prefill all n prompts at once (checked: every request returns its first token and
     reports num_cached_tokens == the cached prefix); the next k steps are decode-only
     steps of n sequences.
  3. repeat r times with fresh tokens (so nothing but the prefix is ever cached), as r
     whole passes over the grid, and keep the median prefill step and the median (over
     repeats) of the median decode step.

Stepping the engine ourselves measures whole engine steps (schedule + forward + sample
+ output processing) without guessing from end-to-end request times. Requests are sent
as token ids with detokenize=False, like an RL rollout does. The engine runs in our
process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so a step pays no IPC; a served engine
(AsyncLLM, engine core in its own process) adds that, which experiments/
validate_predictor.py measures; `--clock served` measures that served engine instead
(runtime/profiling_served.py). Context lengths should be multiples of the block size
(only full blocks are cached). Shapes whose prefill exceeds the engine's token budget
(max_num_batched_tokens) are skipped: the engine would chunk them into several steps.

Samples file (JSONL, written by models.fit.write_samples, read by `pearl fit`):
  line 1: {"header": {
      "model_dir": str, "model": llms.yaml name, "hardware": hardware.yaml name, "tp": int,
      "machine": one-line description (host, CPU/GPU model, core count, vllm and torch versions),
      "machine_detail": {host, cpu, cores, gpu, vllm, torch, python},
      "date": ISO-8601 UTC time of the run,
      "grid": {"name", "batch": [...], "prompt_tokens": [...], "context_tokens": [...],
               "repeats": int, "decode_steps": int, "points": int},
      "engine": {dtype, load_format, max_model_len, block_size, max_num_batched_tokens,
                 enforce_eager, prefix_caching, kv_cache_gib, cpu_threads_bind, seed,
                 clock ("wall", "thread", "served" or "runtime": what "seconds" below measured),
                 engines (served engines measured at once on this machine),
                 load ("none"; "mirror": every engine ran the same point at the same time;
                       "pd-busy": engine 0 prefilled each point and handed its KV to engine 1, which
                       decoded it: prefill samples are engine 0's, decode and handoff engine 1's,
                       each measured while the other served its own role back to back;
                       "pd": the same with the other engine idle, samples before 2026-12-02)},
      "engine_start_s": seconds, "wall_s": seconds the whole run took,
      "load_avg": [1-min load average at start, at end] (contention on a shared machine),
      "steal_pct": the share of CPU time the hypervisor gave other guests meanwhile, % (null: no /proc/stat)}}
  then one object per measured step shape:
      {"kind": "prefill" | "decode",
       "prefill_tokens": new tokens prefilled in the step (sum over requests),
       "prefill_requests": requests prefilled in the step,
       "prefill_prefix_tokens": cached prefix tokens they attend to (sum over requests),
       "decode_seqs": sequences decoded in the step,
       "decode_context_tokens": KV tokens those sequences attend to (sum, at the mean step),
       "seconds": median step time,
       "repeat_spread": median relative deviation of the repeats from that median (the
                        measurement's noise; optional, 0 when not recorded)}
  A prefill sample has decode_seqs = 0; a decode sample has prefill_tokens = 0. A "handoff"
  sample (load "pd-busy" or "pd" only) is the decode engine's first step for n requests whose KV it loads
  through the connector: prefill_requests = n, prefill_prefix_tokens = KV tokens loaded,
  prefill_tokens = tokens it computed itself, seconds = median scheduled -> first token.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from models.config import ConfigError
from models.fit import StepSample
from runtime.host_steal import cpu_times, steal_pct


@dataclass(frozen=True)
class Grid:
    """Step shapes to measure: the cross product of batch x prompt x context, within max_model_len."""

    name: str
    batch: tuple[int, ...]
    prompt_tokens: tuple[int, ...]
    context_tokens: tuple[int, ...]
    repeats: int = 3
    decode_steps: int = 8

    def points(self, max_model_len: int, max_num_batched_tokens: int) -> list["GridPoint"]:
        """Points that fit one sequence in max_model_len and one prefill in one engine step.

        An engine never runs a step over its token budget (it chunks longer prefills), so
        shapes above the budget are not measured: they are not steps the engine runs.
        """
        return [
            GridPoint(n, l, c)
            for c in self.context_tokens
            for l in self.prompt_tokens
            for n in self.batch
            if c + l + self.decode_steps + 1 <= max_model_len and n * l <= max_num_batched_tokens
        ]


@dataclass(frozen=True)
class GridPoint:
    batch: int
    prompt_tokens: int
    context_tokens: int


GRIDS: dict[str, Grid] = {
    # For tests: a handful of points, seconds on the tiny model.
    "tiny": Grid("tiny", (1, 16), (16, 128), (0, 64), repeats=3, decode_steps=4),
    # Slow real architectures on CPU (e.g. Qwen3-0.6B): few tokens per step.
    "small": Grid("small", (1, 2, 4, 8, 16), (16, 64, 256), (0, 256), repeats=3, decode_steps=4),
    "medium": Grid("medium", (1, 2, 4, 8, 16, 32), (16, 64, 256), (0, 128, 512), repeats=5, decode_steps=8),
}


@dataclass(frozen=True)
class EngineSettings:
    """vLLM engine arguments the profile depends on (recorded in the samples header)."""

    model_dir: str
    dtype: str = "auto"
    load_format: str = "auto"
    max_model_len: int = 1024
    block_size: int = 32
    tp: int = 1
    enforce_eager: bool = True
    max_num_batched_tokens: int = 2048
    kv_cache_gib: int = 1
    cpu_threads_bind: str = "auto"
    seed: int = 0
    clock: str = "wall"  # "wall" | "thread": see EngineProfiler.run_point; "served": runtime.profiling_served; "runtime": runtime.profiling_runtime
    engines: int = 1  # served only: engines measured at once on one machine, each under the others' load
    pd: bool = False  # served, 2 engines: engine 0 prefills (KV producer), engine 1 decodes what it hands over

    def engine_bindings(self) -> list[str]:
        """Engine i's VLLM_CPU_OMP_THREADS_BIND: the i-th '|'-separated part of cpu_threads_bind."""
        if self.cpu_threads_bind == "auto":
            return ["auto"] * self.engines
        parts = self.cpu_threads_bind.split("|")
        return [parts[i % len(parts)] for i in range(self.engines)]

    def engine_kwargs(self) -> dict[str, Any]:
        return dict(
            model=self.model_dir,
            dtype=self.dtype,
            load_format=self.load_format,
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            tensor_parallel_size=self.tp,
            enforce_eager=self.enforce_eager,
            enable_prefix_caching=True,
            max_num_batched_tokens=self.max_num_batched_tokens,
            seed=self.seed,
        )


def check_model_dir(model_dir: str | Path, load_format: str) -> None:
    """A model directory vLLM can load: config.json, and weights unless load_format is dummy."""
    path = Path(model_dir)
    if not path.is_dir():
        raise ConfigError(path, "--model-dir", str(path), "an existing model directory (build the tiny one with scripts/make_tiny_model.py)")
    if not (path / "config.json").is_file():
        raise ConfigError(path, "config.json", "<missing>", "a Hugging Face model directory with config.json")
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    if load_format != "dummy" and not has_weights:
        raise ConfigError(path, "--load-format", load_format, "'dummy' for a config-only directory (no *.safetensors / *.bin weights)")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_detail() -> dict[str, Any]:
    import torch
    import vllm

    gpu = ""
    if torch.cuda.is_available():
        gpu = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return {
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "gpu": gpu,
        "vllm": getattr(vllm, "__version__", "unknown"),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def describe_machine(detail: dict[str, Any]) -> str:
    where = detail["gpu"] or f"{detail['cpu']} ({detail['cores']} cores)"
    return f"{detail['host']}: {where}; vllm {detail['vllm']}, torch {detail['torch']}"


def _spread(values: list[float]) -> float:
    """Median relative deviation from the median: the repeats' noise, robust to one outlier."""
    mid = statistics.median(values)
    return statistics.median(abs(v - mid) / mid for v in values) if mid > 0 else 0.0


@dataclass
class _Run:
    """Timings of one measured (prefill + k decodes) run."""

    prefill_s: float
    decode_s: list[float]
    cached_tokens: int
    new_tokens: int
    handoff_s: float = float("nan")  # P/D: the decode engine's admitting step (load + first token)
    loaded_tokens: int = 0  # P/D: KV tokens the decode engine loaded
    overhead_s: float = float("nan")  # runtime clock: a turn's time outside the engine (both calls of a P/D turn)


@dataclass
class EngineProfiler:
    """Owns one in-process vLLM engine and measures step times on it."""

    settings: EngineSettings
    _llm: Any = field(default=None, init=False, repr=False)
    _rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0), init=False, repr=False)
    _ids: Iterator[int] = field(default_factory=lambda: iter(range(1 << 62)), init=False, repr=False)
    engine_start_s: float = field(default=0.0, init=False)

    def start(self) -> None:
        # One process: the engine core runs inside ours, so engine.step() is exactly one
        # engine step (no IPC), and startup is seconds instead of tens of seconds.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(self.settings.kv_cache_gib)
        if self.settings.cpu_threads_bind != "auto":
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = self.settings.cpu_threads_bind
        from vllm import LLM

        t0 = time.perf_counter()
        self._llm = LLM(**self.settings.engine_kwargs())
        self.engine_start_s = time.perf_counter() - t0
        self._vocab = int(self._llm.llm_engine.model_config.get_vocab_size())

    def close(self) -> None:
        if self._llm is not None:
            engine = self._llm.llm_engine
            self._llm = None
            shutdown = getattr(engine.engine_core, "shutdown", None)
            if shutdown is not None:
                shutdown()

    def _tokens(self, n: int) -> list[int]:
        # Skip the lowest ids (special tokens of small vocabularies).
        return self._rng.integers(16, self._vocab, size=n).tolist()

    def _submit(self, prompts: list[list[int]], max_tokens: int) -> list[str]:
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        engine = self._llm.llm_engine
        ids = []
        for p in prompts:
            rid = f"p{next(self._ids)}"
            engine.add_request(rid, TokensPrompt(prompt_token_ids=p), params)
            ids.append(rid)
        return ids

    def _drain(self) -> None:
        engine = self._llm.llm_engine
        while engine.has_unfinished_requests():
            engine.step()

    def run_point(self, point: GridPoint, decode_steps: int) -> _Run:
        """One warm + measured run of a grid point."""
        engine = self._llm.llm_engine
        n, l, c = point.batch, point.prompt_tokens, point.context_tokens
        prefixes = [self._tokens(c) for _ in range(n)]
        if c:
            self._submit(prefixes, 1)
            self._drain()
        ids = self._submit([pre + self._tokens(l) for pre in prefixes], 1 + decode_steps)
        first: dict[str, Any] = {}
        step_s: list[float] = []
        # clock "thread" times the engine's own thread (CPU time): on a CPU engine whose
        # compute runs on that one pinned thread it equals the wall time of an idle
        # machine, and does not count time other processes took the core (a shared
        # machine). It is no measure of a GPU engine: use "wall" there.
        clock = time.thread_time if self.settings.clock == "thread" else time.perf_counter
        while engine.has_unfinished_requests():
            t0 = clock()
            outs = engine.step()
            step_s.append(clock() - t0)
            if len(step_s) == 1:
                first = {o.request_id: o for o in outs}
        if set(first) != set(ids):
            raise RuntimeError(
                f"prefill of {n} x {l} tokens did not fit in one engine step "
                f"(max_num_batched_tokens={self.settings.max_num_batched_tokens}); raise it"
            )
        cached = sum(int(o.num_cached_tokens or 0) for o in first.values())
        block = self.settings.block_size
        expected = n * (c // block) * block
        if cached != expected:
            raise RuntimeError(f"prefix cache hit {cached} tokens, expected {expected} (n={n}, context={c}, block={block})")
        decode = step_s[1:]
        if len(decode) != decode_steps:
            raise RuntimeError(f"expected {decode_steps} decode steps, engine ran {len(decode)}")
        return _Run(step_s[0], decode, cached, n * (l + c) - cached)

    @staticmethod
    def aggregate(point: GridPoint, runs: list[_Run], decode_steps: int) -> tuple[StepSample, ...]:
        """Median over repeats of the prefill step and of each run's median decode step."""
        n, l, c = point.batch, point.prompt_tokens, point.context_tokens
        prefill = StepSample(
            kind="prefill",
            prefill_tokens=float(runs[0].new_tokens),
            prefill_requests=float(n),
            prefill_prefix_tokens=float(runs[0].cached_tokens),
            decode_seqs=0.0,
            decode_context_tokens=0.0,
            seconds=statistics.median(r.prefill_s for r in runs),
            repeat_spread=_spread([r.prefill_s for r in runs]),
        )
        # Decode step j (1..k) attends to c + l + j tokens per sequence; mean over the k steps.
        mean_ctx = c + l + (decode_steps + 1) / 2.0
        decode = StepSample(
            kind="decode",
            prefill_tokens=0.0,
            prefill_requests=0.0,
            prefill_prefix_tokens=0.0,
            decode_seqs=float(n),
            decode_context_tokens=float(n * mean_ctx),
            seconds=statistics.median(statistics.median(r.decode_s) for r in runs),
            repeat_spread=_spread([statistics.median(r.decode_s) for r in runs]),
        )
        request = () if any(math.isnan(r.overhead_s) for r in runs) else (StepSample(
            kind="request", prefill_tokens=0.0, prefill_requests=float(n), prefill_prefix_tokens=0.0, decode_seqs=0.0, decode_context_tokens=0.0,
            seconds=statistics.median(r.overhead_s for r in runs), repeat_spread=_spread([r.overhead_s for r in runs])),)
        if any(math.isnan(r.handoff_s) for r in runs):  # not a P/D pair
            return (prefill, decode, *request)
        loaded = runs[0].loaded_tokens
        handoff = StepSample(
            kind="handoff",
            prefill_tokens=float(n * (l + c) - loaded),
            prefill_requests=float(n),
            prefill_prefix_tokens=float(loaded),
            decode_seqs=0.0,
            decode_context_tokens=0.0,
            seconds=statistics.median(r.handoff_s for r in runs),
            repeat_spread=_spread([r.handoff_s for r in runs]),
        )
        return (prefill, decode, handoff, *request)

    def warm_up(self) -> None:
        """First steps pay one-off costs (allocations, kernel selection): run some untimed."""
        for n in (1, 4):
            self._submit([self._tokens(64) for _ in range(n)], 4)
            self._drain()


def profile_engine(
    settings: EngineSettings,
    grid: Grid,
    on_point: Callable[[int, int, GridPoint], None] | None = None,
    on_started: Callable[[float, int], None] | None = None,
) -> tuple[list[StepSample], dict[str, Any]]:
    """Measure every grid point on one engine. Returns samples and run facts for the header."""
    points = grid.points(settings.max_model_len, settings.max_num_batched_tokens)
    if not points:
        raise ConfigError("--grid", grid.name, "no points", f"points with context + prompt + {grid.decode_steps + 1} <= --max-model-len {settings.max_model_len} and batch x prompt <= --max-num-batched-tokens {settings.max_num_batched_tokens}")
    if settings.clock == "served":
        from runtime.profiling_served import ServedProfiler

        profiler: EngineProfiler | ServedProfiler = ServedProfiler(settings)
    elif settings.clock == "runtime":
        from runtime.profiling_runtime import RuntimeProfiler

        profiler = RuntimeProfiler(settings)
    else:
        profiler = EngineProfiler(settings)
    load0, cpu0 = os.getloadavg()[0], cpu_times()
    t0 = time.perf_counter()
    profiler.start()
    samples: list[StepSample] = []
    try:
        profiler.warm_up()
        if on_started:
            on_started(profiler.engine_start_s, len(points))
        # Repeats are whole passes over the grid, not back-to-back runs of one point: a
        # transient disturbance (another process, a GC pause) then lands on different
        # points in different passes and the per-point median discards it.
        runs: list[list[_Run]] = [[] for _ in points]
        done = 0
        for rep in range(grid.repeats):
            if rep:
                # The pass boundary jumps from the largest shape to the smallest; untimed
                # requests first, so that jump does not land on a measured point.
                profiler.warm_up()
            for i, point in enumerate(points):
                runs[i].append(profiler.run_point(point, grid.decode_steps))
                done += 1
                if on_point:
                    on_point(done, len(points) * grid.repeats, point)
        for point, point_runs in zip(points, runs):
            samples.extend(EngineProfiler.aggregate(point, point_runs, grid.decode_steps))
        samples = merged_requests(samples)
    finally:
        profiler.close()
    facts = {"engine_start_s": round(profiler.engine_start_s, 2), "wall_s": round(time.perf_counter() - t0, 1), "points": len(points), "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)],
             "steal_pct": steal_pct(cpu0, cpu_times())}
    return samples, facts


def merged_requests(samples: list[StepSample]) -> list[StepSample]:
    """One `request` sample per requests-in-flight count: the median over the grid's points of
    that batch (a request's way to its engine and back does not depend on its token counts),
    so that a fit can hold a batch size out."""
    steps = [s for s in samples if s.kind != "request"]
    by_n: dict[float, list[StepSample]] = {}
    for s in samples:
        if s.kind == "request":
            by_n.setdefault(s.prefill_requests, []).append(s)
    merged = [replace(group[0], seconds=statistics.median(s.seconds for s in group), repeat_spread=statistics.median(s.repeat_spread for s in group)) for _, group in sorted(by_n.items())]
    return steps + merged


def samples_header(settings: EngineSettings, grid: Grid, model: str, hardware: str, facts: dict[str, Any], detail: dict[str, Any]) -> dict[str, Any]:
    engine = {k: v for k, v in asdict(settings).items() if k not in ("model_dir", "tp")}
    engine["prefix_caching"] = True
    engine["load"] = "pd-busy" if settings.pd else "mirror" if settings.engines > 1 else "none"  # what the other engines ran while one was measured
    if settings.clock in ("served", "runtime"):  # engines and requests as the runtime's (runtime/profiling_served.py)
        engine["requests"] = "runtime: sampled at temperature 1 with log-probabilities, streamed"
        if settings.clock == "runtime":
            engine["requests"] += "; engines in RolloutWorker Ray actors, requests sent through Ray"
        # the engine core's process layout (runtime/ray_runtime/vllm_args.py: executor_backend)
        from runtime.ray_runtime.vllm_args import executor_backend

        engine["executor"] = "vllm default" if executor_backend(settings.tp) is None else "in-process (uni)"
    return {
        "model_dir": str(settings.model_dir),
        "model": model,
        "hardware": hardware,
        "tp": settings.tp,
        "machine": describe_machine(detail),
        "machine_detail": detail,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "grid": {
            "name": grid.name,
            "batch": list(grid.batch),
            "prompt_tokens": list(grid.prompt_tokens),
            "context_tokens": list(grid.context_tokens),
            "repeats": grid.repeats,
            "decode_steps": grid.decode_steps,
            "points": facts["points"],
        },
        "engine": engine,
        "engine_start_s": facts["engine_start_s"],
        "wall_s": facts["wall_s"],
        "load_avg": facts["load_avg"],
        "steal_pct": facts["steal_pct"],
    }
