"""What changing the cluster costs, in seconds: from measurements where config has them, else physics.

Physics: weights stream from storage (or a peer over the network), engines pay a fixed
start-up, a role switch drains in-flight decodes and restarts the engine with a new KV
role, and lending a training GPU offloads the trainer's state (weights, gradients,
optimizer: ~16 bytes per parameter under mixed-precision Adam, sharded) to host memory
over PCIe and loads rollout weights; returning reverses it.
"""

from __future__ import annotations

from dataclasses import dataclass

from models import architecture as arch
from models.config import ClusterSpec, GPUSpec, LLMSpec, TransitionCostsSpec

ENGINE_FIXED_START_S = 15.0  # process spawn, CUDA context, graph capture (vLLM on a GPU)
TRAIN_STATE_BYTES_PER_PARAM = 16.0


@dataclass(frozen=True)
class TransitionCosts:
    """Seconds per kind of change, for one engine instance of `tp` GPUs."""

    engine_start_s: float
    weight_load_storage_s: float
    weight_load_peer_s: float
    role_switch_s: float
    drain_s: float
    expand_prepare_s: float  # background: new elastic workers start and sync weights
    expand_finalize_s: float  # admission paused while the group is admitted atomically
    borrow_s: float  # lend a training GPU to rollout (offload train state, load rollout weights)
    return_s: float  # give it back before the next training step
    kv_migration_s_per_token: float

    def stop_s(self) -> float:
        return self.drain_s


def transition_costs(llm: LLMSpec, gpu: GPUSpec, cluster: ClusterSpec, tp: int, measured: TransitionCostsSpec, training_gpus: int = 1) -> TransitionCosts:
    wbytes = arch.weight_bytes(llm)
    storage = wbytes / (cluster.storage_gb_s * 1e9)
    peer = wbytes / (cluster.inter_node_gb_s * 1e9 * tp)
    start = measured.engine_start_s if measured.engine_start_s is not None else ENGINE_FIXED_START_S + peer
    drain = 2.0
    role = measured.role_switch_s if measured.role_switch_s is not None else drain + start
    shard = TRAIN_STATE_BYTES_PER_PARAM * arch.total_params(llm) / max(training_gpus, 1)
    pcie = gpu.pcie_gb_s * 1e9
    borrow = measured.borrow_s if measured.borrow_s is not None else shard / pcie + wbytes / tp / pcie
    ret = measured.return_s if measured.return_s is not None else shard / pcie
    prep = measured.expand_prepare_s if measured.expand_prepare_s is not None else start + storage
    fin = measured.expand_finalize_s if measured.expand_finalize_s is not None else peer + 1.0
    kv_tok = arch.kv_bytes_per_token(llm) / (cluster.inter_node_gb_s * 1e9)
    return TransitionCosts(start, storage, peer, role, drain, prep, fin, borrow, ret, kv_tok)
