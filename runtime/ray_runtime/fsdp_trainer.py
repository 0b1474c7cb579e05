"""FSDP2 trainer (backend 'fsdp'): the GRPO step of trainer.py, sharded over a process group.

`FSDPTrainer` keeps `Trainer`'s interface (`weights()`, `train_step()`, `get_version()`), so
the controller holds either as its trainer actor. It spawns one process per rank (FSDP
needs one process per device); each rank loads the model, wraps every decoder layer and
the root with `fully_shard` (FSDP2), and keeps an Adam over its parameter shards. The
process group is NCCL when CUDA is available (rank r on cuda:r), gloo otherwise.

Per step every rank derives the same `Batch` (trainer.select_batch), trains the samples
`fresh[rank::world_size]` with the shared `sample_loss`, which divides by the batch's
GLOBAL action-token count, and FSDP sums the gradients (divide factor 1, not the default
mean), so the update equals the single-process one. Ranks holding fewer samples run
zero-loss passes so that all ranks issue the same collectives. Rank 0 gathers the full
state dict to CPU and returns the safetensors blob rollout workers load.

Tested on CPU with two gloo ranks against `Trainer`, and as the controller's Ray actor in
the real-engine NIXL run (tests/test_ray_vllm_nixl.py). Not run yet: NCCL on GPUs (rank r
takes cuda:r of the node it runs on, not a training-pool slot).
"""

from __future__ import annotations

import math
import os
import queue
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any

from runtime.ray_runtime.ray_nodes import OnANode
from runtime.ray_runtime.trainer import Batch, LossStats, TrainSample, sample_loss, select_batch, tensors_blob

_POLL_S = 1.0  # how often a waiting side checks that the other side is alive


@dataclass(frozen=True)
class RankSetup:
    """What a rank process needs to build its shard of the model and optimizer."""

    rank: int
    world_size: int
    init_method: str
    model_path: str
    lr: float
    clip_eps: float
    seed: int
    threads: int


@dataclass(frozen=True)
class RankReply:
    """A rank's answer to setup or a step: its loss statistics, rank 0's weight blob, or an error."""

    rank: int
    stats: LossStats | None = None
    blob: bytes | None = None
    error: str | None = None


def validate_world_size(world_size: Any, cuda_devices: int) -> int:
    """World size check shared by the trainer and its tests: one clear ValueError."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"fsdp trainer world_size must be a positive integer, got {world_size!r}")
    if cuda_devices and world_size > cuda_devices:
        raise ValueError(f"fsdp trainer world_size {world_size} exceeds the {cuda_devices} visible CUDA devices (one rank per device)")
    return world_size


def shard_model(model: Any, mesh: Any) -> None:
    """FSDP2: one unit per transformer block (the model's `_no_split_modules`), then the root."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    block_names = set(getattr(model, "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if type(module).__name__ in block_names:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # sum, not mean: each rank's loss already carries the global 1/action_tokens
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM


def full_state_blob(model: Any) -> bytes | None:
    """Collective: every rank must call; rank 0 gets the safetensors blob of the full state dict."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return tensors_blob(state) if dist.get_rank() == 0 else None


def rank_step(model: Any, opt: Any, batch: Batch, clip_eps: float, rank: int, world_size: int) -> LossStats:
    """This rank's share of one update; the same number of forward/backward passes on every rank."""
    import torch

    shard = list(zip(batch.fresh[rank::world_size], batch.advantages[rank::world_size]))
    passes = math.ceil(len(batch.fresh) / world_size)
    device = next(model.parameters()).device
    stats = LossStats()
    opt.zero_grad()
    for i in range(passes):
        model.set_requires_gradient_sync(i == passes - 1)  # accumulate locally, reduce once
        if i < len(shard):
            loss, part = sample_loss(model, shard[i][0], shard[i][1], clip_eps, batch.action_tokens, batch.version)
            stats = stats.merge(part)
        else:  # padding pass: zero gradient, but the collectives every rank must join
            loss = model(input_ids=torch.zeros((1, 2), dtype=torch.long, device=device)).logits.sum() * 0.0
        loss.backward()
    if passes:
        opt.step()
    return stats


def _rank_main(setup: RankSetup, inbox: Any, outbox: Any) -> None:
    """Rank process: build the sharded model, then serve steps until told to stop or orphaned."""
    parent = os.getppid()
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from transformers import AutoModelForCausalLM

        torch.manual_seed(setup.seed)
        torch.set_num_threads(setup.threads)
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(setup.rank)
        dist.init_process_group("nccl" if cuda else "gloo", init_method=setup.init_method, rank=setup.rank, world_size=setup.world_size)
        mesh = init_device_mesh("cuda" if cuda else "cpu", (setup.world_size,))
        model = AutoModelForCausalLM.from_pretrained(setup.model_path, dtype=torch.float32)
        model.train()
        shard_model(model, mesh)
        opt = torch.optim.Adam(model.parameters(), lr=setup.lr)
        outbox.put(RankReply(setup.rank, blob=full_state_blob(model)))
        while True:
            try:
                batch = inbox.get(timeout=_POLL_S)
            except queue.Empty:
                if os.getppid() != parent:  # the driver died (e.g. its Ray actor was killed)
                    return
                continue
            if batch is None:
                break
            stats = rank_step(model, opt, batch, setup.clip_eps, setup.rank, setup.world_size)
            outbox.put(RankReply(setup.rank, stats=stats, blob=full_state_blob(model)))
        dist.destroy_process_group()
    except Exception:
        outbox.put(RankReply(setup.rank, error=traceback.format_exc()))
        outbox.close()
        outbox.join_thread()  # the error reaches the driver before this process goes
        os._exit(1)  # not a normal exit: tearing down a process group whose peers are gone can block


class FSDPTrainer(OnANode):
    """Ray actor (or plain object) driving `world_size` FSDP2 rank processes; same interface as Trainer."""

    def __init__(self, model_path: str | None, lr: float = 1e-3, clip_eps: float = 0.2, staleness: int = 1, seed: int = 0, threads: int = 1, world_size: int = 1, advantage_sign: float = 1.0) -> None:
        import torch
        import torch.multiprocessing as mp

        if model_path is None:
            raise ValueError("the fsdp trainer needs a model path")
        self.world_size = validate_world_size(world_size, torch.cuda.device_count() if torch.cuda.is_available() else 0)
        self.staleness = staleness
        self.advantage_sign = advantage_sign
        self.version = 0
        self._model_path, self._probe_model = model_path, None
        self._probes: dict[int, tuple[float, ...]] = {}  # weights version -> probe log-probs
        self._dir = tempfile.mkdtemp(prefix="pearl-fsdp-")
        ctx = mp.get_context("spawn")  # CUDA and a threaded parent (Ray) both rule out fork
        self._inboxes = [ctx.Queue() for _ in range(self.world_size)]
        self._outbox = ctx.Queue()
        self._procs = [
            ctx.Process(
                target=_rank_main,
                args=(RankSetup(r, self.world_size, f"file://{self._dir}/rendezvous", model_path, lr, clip_eps, seed, threads), self._inboxes[r], self._outbox),
                name=f"pearl-fsdp-rank{r}",
                daemon=True,
            )
            for r in range(self.world_size)
        ]
        for p in self._procs:
            p.start()
        try:
            self._blob = self._collect()[0].blob or b""
        except BaseException:
            self.close()
            raise

    def _collect(self) -> list[RankReply]:
        """One reply per rank, in rank order; a rank's error or death raises here instead of hanging."""
        replies: dict[int, RankReply] = {}
        while len(replies) < self.world_size:
            try:
                reply = self._outbox.get(timeout=_POLL_S)
            except queue.Empty:
                dead = [(p.name, p.exitcode) for p in self._procs if p.exitcode is not None]
                if dead:
                    raise RuntimeError(f"fsdp trainer: rank process exited: {dead}") from None
                continue
            if reply.error is not None:
                raise RuntimeError(f"fsdp trainer rank {reply.rank} failed:\n{reply.error}")
            replies[reply.rank] = reply
        return [replies[r] for r in range(self.world_size)]

    def weights(self) -> bytes:
        return self._blob

    def train_step(self, samples: list[TrainSample], rollout_version: int) -> tuple[dict[str, float], bytes]:
        """One sharded update on a rollout batch; returns (metrics, new weights as safetensors bytes)."""
        t0 = time.perf_counter()
        batch, metrics = select_batch(samples, rollout_version, self.staleness, self.advantage_sign)
        self.probe_logprobs(self.version)  # the weights about to change: engines may still hold them when asked
        for box in self._inboxes:
            box.put(batch)
        replies = self._collect()
        stats = LossStats()
        for reply in replies:
            stats = stats.merge(reply.stats or LossStats())
        self._blob = replies[0].blob or b""
        self.version += 1
        metrics.update(stats.metrics(), version=float(self.version), train_s=time.perf_counter() - t0, action_tokens=float(batch.action_tokens), world_size=float(self.world_size))
        return metrics, self._blob

    def probe_logprobs(self, version: int) -> tuple[float, ...]:
        """What an engine holding weights `version` must answer: scored by a local unsharded
        copy of the model loaded from that version's blob (weight_sync.PROBE_TOKENS)."""
        if version not in self._probes:
            import safetensors.torch
            import torch
            from transformers import AutoModelForCausalLM

            from runtime.ray_runtime.weight_sync import model_probe_logprobs

            if version != self.version:
                raise KeyError(f"no probe for weights version {version} (the trainer is at {self.version})")
            if self._probe_model is None:
                self._probe_model = AutoModelForCausalLM.from_pretrained(self._model_path, dtype=torch.float32)
            self._probe_model.load_state_dict(safetensors.torch.load(self._blob))
            self._probes[version] = model_probe_logprobs(self._probe_model)
        return self._probes[version]

    def get_version(self) -> int:
        return self.version

    def close(self) -> None:
        """Stop the rank processes (politely, then by force) and remove the rendezvous directory."""
        for box, p in zip(self._inboxes, self._procs):
            if p.is_alive():
                box.put(None)
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
