"""vLLM worker extension that loads new policy weights in place.

vLLM mixes this class into each of its GPU/CPU workers when an engine is created with
`worker_extension_cls="runtime.ray_runtime.weight_sync.WeightSyncExtension"`; the rollout
worker reaches it through `AsyncLLM.collective_rpc`. Weights travel as safetensors bytes
(msgpack-native, so no pickle over the engine's RPC) and go through the worker's own
`reload_weights`, which handles the CPU backend's weight repacking (`load_weights` after a
reload does not).
"""

from __future__ import annotations

import safetensors.torch


class WeightSyncExtension:
    reload_weights: object  # provided by the vLLM worker this class is mixed into
    model_runner: object

    def pearl_load_weights(self, blob: bytes) -> int:
        """Load a full state dict given as safetensors bytes; return the tensor count."""
        state = safetensors.torch.load(bytes(blob))
        self.reload_weights(weights_iterator=iter(state.items()), is_checkpoint_format=True)  # type: ignore[operator]
        return len(state)

    def pearl_weights_checksum(self) -> float:
        """Sum of all parameters: lets tests prove the engine now holds the trainer's weights."""
        model = self.model_runner.model  # type: ignore[attr-defined]
        return float(sum(float(p.detach().double().sum()) for p in model.parameters()))
