"""FLOP and byte counts of one transformer forward step, from architecture numbers alone.

These are the physical terms the step-latency model scales by fitted coefficients. All
functions accept numpy arrays so the predictor can evaluate many steps at once.
"""

from __future__ import annotations

import numpy as np

from models.config import LLMSpec


def kv_bytes_per_token(llm: LLMSpec) -> int:
    """K and V for every layer: 2 * layers * kv_heads * head_dim * dtype bytes (Qwen3-8B bf16: 147,456)."""
    return 2 * llm.layers * llm.kv_heads * llm.head_dim * llm.dtype_bytes


def attention_params(llm: LLMSpec) -> int:
    q = llm.hidden * llm.q_heads * llm.head_dim
    kv = 2 * llm.hidden * llm.kv_heads * llm.head_dim
    o = llm.q_heads * llm.head_dim * llm.hidden
    return llm.layers * (q + kv + o)


def dense_ffn_params(llm: LLMSpec) -> int:
    """Per-layer gated FFN (gate, up, down) for dense models; 0 for MoE (experts counted apart)."""
    if llm.moe is not None:
        return 0
    return llm.layers * 3 * llm.hidden * llm.ffn


def expert_params(llm: LLMSpec) -> int:
    """Parameters of one expert across all layers."""
    if llm.moe is None:
        return 0
    return llm.layers * 3 * llm.hidden * llm.moe.expert_ffn


def embedding_params(llm: LLMSpec) -> int:
    return llm.vocab * llm.hidden


def total_params(llm: LLMSpec) -> float:
    """Parameters as stated in the spec (embeddings and everything included)."""
    return llm.params_b * 1e9


def active_params_per_token(llm: LLMSpec) -> float:
    """Matmul parameters one token passes through (no input embedding; LM head counted apart)."""
    moe = 0 if llm.moe is None else llm.moe.active_experts * expert_params(llm)
    return float(attention_params(llm) + dense_ffn_params(llm) + moe)


def weight_bytes(llm: LLMSpec) -> float:
    return total_params(llm) * llm.dtype_bytes


def experts_touched(llm: LLMSpec, tokens: np.ndarray | float) -> np.ndarray:
    """Expected distinct experts per layer when `tokens` tokens each route to k of E experts.

    Uniform routing: E * (1 - (1 - k/E)^n). This is why MoE decode steps read more weights
    as the batch grows, which moves the PD crossover.
    """
    tokens = np.asarray(tokens, dtype=float)
    if llm.moe is None:
        return np.zeros_like(tokens)
    e, k = llm.moe.experts, llm.moe.active_experts
    return e * (1.0 - np.power(1.0 - k / e, np.maximum(tokens, 0.0)))


def weight_bytes_read(llm: LLMSpec, tokens: np.ndarray | float) -> np.ndarray:
    """Bytes of weights one step reads for `tokens` tokens (dense parts always; experts touched only)."""
    tokens = np.asarray(tokens, dtype=float)
    dense = attention_params(llm) + dense_ffn_params(llm) + 2 * embedding_params(llm)
    experts = experts_touched(llm, tokens) * expert_params(llm)
    # Non-matmul params (norms, router) are negligible.
    return (dense + experts) * llm.dtype_bytes * np.ones_like(tokens)


def matmul_flops(llm: LLMSpec, tokens: np.ndarray | float, sampled: np.ndarray | float) -> np.ndarray:
    """2 * params FLOPs per token through the layers, plus the LM head for sampled positions."""
    tokens = np.asarray(tokens, dtype=float)
    sampled = np.asarray(sampled, dtype=float)
    return 2.0 * active_params_per_token(llm) * tokens + 2.0 * llm.hidden * llm.vocab * sampled


def attention_flops(llm: LLMSpec, query_tokens: np.ndarray | float, attended_pairs: np.ndarray | float) -> np.ndarray:
    """QK^T and PV: 4 * layers * q_heads * head_dim per (query, key) pair."""
    del query_tokens
    return 4.0 * llm.layers * llm.q_heads * llm.head_dim * np.asarray(attended_pairs, dtype=float)


def tp_allreduce_bytes(llm: LLMSpec, tokens: np.ndarray | float, tp: int) -> np.ndarray:
    """Ring all-reduce traffic per GPU: two per layer of hidden activations, 2(tp-1)/tp of the buffer."""
    tokens = np.asarray(tokens, dtype=float)
    if tp <= 1:
        return np.zeros_like(tokens)
    return 2 * llm.layers * tokens * llm.hidden * llm.dtype_bytes * 2.0 * (tp - 1) / tp
