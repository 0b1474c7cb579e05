"""Training step time: 6 * params * tokens FLOPs (forward + backward) at a configured MFU."""

from __future__ import annotations

from models import architecture as arch
from models.config import GPUSpec, LLMSpec


def training_step_s(llm: LLMSpec, gpu: GPUSpec, gpus: int, tokens: float, mfu: float, overhead_s: float) -> float:
    """Seconds for one optimizer step over `tokens` tokens on `gpus` GPUs (MoE: active params only)."""
    if gpus <= 0:
        return float("inf")
    active = arch.active_params_per_token(llm) + llm.hidden * llm.vocab
    flops = 6.0 * active * tokens
    return flops / (gpus * gpu.bf16_tflops * 1e12 * mfu) + overhead_s
