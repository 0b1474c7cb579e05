"""Step latency of one engine instance: roofline terms times fitted coefficients.

A step is what a continuous-batching engine runs in one forward pass: some new prefill
tokens (possibly on top of a cached prefix) and some decode sequences. Its time is

    t = fixed + sum_i c_i * feature_i

where each feature is a datasheet time (FLOPs / peak, bytes / bandwidth) or, for
"requests", the count of sequences the step samples (each costs the engine host-side
scheduling, sampling and output handling that no datasheet term sees: seconds per
request), and each c_i >= 0 is fitted to measurements (`pearl fit`). Prefill-bearing and decode-only steps have their
own coefficient sets because their kernels reach very different efficiency.

"spill" is the one term no datasheet gives: the matmul time times the step's prefill tokens
(per 1024). On CPU a prefill step's activations outgrow the caches and each token costs more
the more there are (a 2048-token step of the runtime's tiny engines takes 1.9-2.5x a 1024-token
one); NNLS leaves it at 0 where steps grow linearly, and datasheet-derived profiles have none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from models import architecture as arch
from models.config import GPUSpec, LLMSpec

FEATURES: tuple[str, ...] = ("fixed", "requests", "compute", "attn", "weights", "kv", "comm", "spill")
SPILL_TOKENS = 1024.0  # the spill term's unit: matmul time x prefill tokens / SPILL_TOKENS
StepKind = Literal["prefill", "decode"]


@dataclass(frozen=True)
class StepShape:
    """What one forward step processes. Arrays allowed (one entry per step)."""

    prefill_tokens: np.ndarray | float = 0.0
    prefill_requests: np.ndarray | float = 0.0
    prefill_prefix_tokens: np.ndarray | float = 0.0  # cached context the new tokens attend to (summed over requests)
    decode_seqs: np.ndarray | float = 0.0
    decode_context_tokens: np.ndarray | float = 0.0  # summed over decode sequences

    def attended_pairs(self) -> np.ndarray:
        """(query, key) pairs: new tokens attend to their prefix and causally to each other; decodes to their context."""
        p = np.asarray(self.prefill_tokens, dtype=float)
        r = np.maximum(np.asarray(self.prefill_requests, dtype=float), 1.0)
        prefix = np.asarray(self.prefill_prefix_tokens, dtype=float)
        per_req = p / r
        prefill_pairs = p * (prefix / r) + r * per_req * (per_req + 1) / 2
        prefill_pairs = np.where(p > 0, prefill_pairs, 0.0)
        return prefill_pairs + np.asarray(self.decode_context_tokens, dtype=float)


def step_features(shape: StepShape, llm: LLMSpec, gpu: GPUSpec, tp: int) -> np.ndarray:
    """Datasheet times (s) of each term, shape (..., len(FEATURES))."""
    p = np.asarray(shape.prefill_tokens, dtype=float)
    d = np.asarray(shape.decode_seqs, dtype=float)
    tokens = p + d
    sampled = np.asarray(shape.prefill_requests, dtype=float) + d
    peak = gpu.bf16_tflops * 1e12 * tp
    hbm = gpu.hbm_tb_s * 1e12 * tp
    kv_tokens = np.asarray(shape.prefill_prefix_tokens, dtype=float) + np.asarray(shape.decode_context_tokens, dtype=float) + tokens
    compute = arch.matmul_flops(llm, tokens, sampled) / peak
    cols = [
        np.ones_like(tokens),
        sampled,
        compute,
        arch.attention_flops(llm, tokens, shape.attended_pairs()) / peak,
        arch.weight_bytes_read(llm, tokens) / hbm,
        arch.kv_bytes_per_token(llm) * kv_tokens / hbm,
        arch.tp_allreduce_bytes(llm, tokens, tp) / (gpu.intra_node_gb_s * 1e9),
        compute * p / SPILL_TOKENS,
    ]
    return np.stack(np.broadcast_arrays(*cols), axis=-1)


@dataclass(frozen=True)
class StepCoefficients:
    """Non-negative multipliers of each feature (fixed is in seconds)."""

    fixed: float = 0.0
    requests: float = 0.0  # seconds per sampled sequence; 0 in datasheet-derived profiles
    compute: float = 1.0
    attn: float = 1.0
    weights: float = 1.0
    kv: float = 1.0
    comm: float = 1.0
    spill: float = 0.0  # superlinear prefill (see the module's docstring); measured profiles only

    def vector(self) -> np.ndarray:
        return np.array([getattr(self, f) for f in FEATURES], dtype=float)

    @classmethod
    def from_vector(cls, v: np.ndarray) -> "StepCoefficients":
        return cls(**{f: float(x) for f, x in zip(FEATURES, v)})


@dataclass(frozen=True)
class KVHandoff:
    """Measured time for a decode engine to take over requests prefilled elsewhere: the KV
    connector's load plus the engine step that admits them (`pearl profile --pd`).

    It replaces the link-bandwidth estimate where it was measured: on CPU the ExampleConnector
    writes and reads one file per layer, a cost no bandwidth figure describes.
    """

    fixed_s: float = 0.0
    per_request_s: float = 0.0
    per_token_s: float = 0.0  # per KV token loaded

    def time(self, requests: np.ndarray | float, tokens: np.ndarray | float) -> np.ndarray:
        """One admitting step for `requests` requests loading `tokens` KV tokens in all."""
        return self.fixed_s + self.per_request_s * np.asarray(requests, dtype=float) + self.per_token_s * np.asarray(tokens, dtype=float)

    def vector(self) -> np.ndarray:
        """Its terms in `time`'s order: (fixed, per request, per token)."""
        return np.array([self.fixed_s, self.per_request_s, self.per_token_s])

    def scaled(self, k: float) -> "KVHandoff":
        return KVHandoff(self.fixed_s * k, self.per_request_s * k, self.per_token_s * k)

    def to_json(self) -> dict:
        return {"fixed_s": self.fixed_s, "per_request_s": self.per_request_s, "per_token_s": self.per_token_s}


@dataclass(frozen=True)
class RequestOverhead:
    """Measured time a request spends outside its engine on each turn: the driver -> worker
    actor -> engine core hops before it is queued and its last token's way back
    (`pearl profile --clock runtime`). On a machine whose cores the engines fill, those
    processes wait for CPU, so the time grows with the requests in flight per engine.
    A P/D turn makes two calls (prefill, then decode): its profile holds their sum."""

    fixed_s: float = 0.0
    per_request_s: float = 0.0  # per request in flight on the engine

    def time(self, requests: np.ndarray | float) -> np.ndarray:
        return self.fixed_s + self.per_request_s * np.asarray(requests, dtype=float)

    def vector(self) -> np.ndarray:
        """Its terms in `time`'s order: (fixed, per request)."""
        return np.array([self.fixed_s, self.per_request_s])

    def scaled(self, k: float) -> "RequestOverhead":
        return RequestOverhead(self.fixed_s * k, self.per_request_s * k)

    def to_json(self) -> dict:
        return {"fixed_s": self.fixed_s, "per_request_s": self.per_request_s}


@dataclass(frozen=True)
class EngineProfile:
    """Fitted coefficients of one (hardware, model) engine, with provenance.

    label is 'measured' (fitted to real engine timings) or 'derived' (datasheet-derived,
    not yet measured on that hardware).
    """

    name: str
    hardware: str
    model: str
    label: Literal["measured", "derived"]
    prefill: StepCoefficients
    decode: StepCoefficients
    machine: str = ""
    notes: str = ""
    fit: dict = field(default_factory=dict, compare=False, hash=False)
    kv_handoff: KVHandoff | None = None  # measured P -> D takeover (P/D profiles only)
    request_overhead: RequestOverhead | None = None  # measured outside the engine (runtime-clock profiles only)

    def coefficients(self, kind: StepKind) -> StepCoefficients:
        return self.prefill if kind == "prefill" else self.decode

    def outside_engine_s(self, requests: np.ndarray | float) -> np.ndarray:
        """A turn's time outside its engine with `requests` in flight on it, where the profile
        measured it (`request_overhead`, runtime clock); else 0."""
        r = np.asarray(requests, dtype=float)
        return np.zeros_like(r) if self.request_overhead is None else self.request_overhead.time(r)

    def scaled(self, k: float) -> "EngineProfile":
        """Every term k times slower (k > 1) or faster: a measured speed applied to this profile."""
        if k == 1.0:
            return self
        return replace(self, prefill=StepCoefficients.from_vector(self.prefill.vector() * k), decode=StepCoefficients.from_vector(self.decode.vector() * k),
                       kv_handoff=None if self.kv_handoff is None else self.kv_handoff.scaled(k),
                       request_overhead=None if self.request_overhead is None else self.request_overhead.scaled(k),
                       notes=f"{self.notes} (runtime-calibrated x{k:.3g})".strip())

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "hardware": self.hardware,
            "model": self.model,
            "label": self.label,
            "machine": self.machine,
            "notes": self.notes,
            "coefficients": {
                "prefill": dict(zip(FEATURES, self.prefill.vector().tolist())),
                "decode": dict(zip(FEATURES, self.decode.vector().tolist())),
            },
            "fit": self.fit,
            **({"kv_handoff": self.kv_handoff.to_json()} if self.kv_handoff is not None else {}),
            **({"request_overhead": self.request_overhead.to_json()} if self.request_overhead is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict) -> "EngineProfile":
        c = data["coefficients"]
        return cls(
            name=data["name"],
            hardware=data["hardware"],
            model=data["model"],
            label=data["label"],
            prefill=StepCoefficients(**c["prefill"]),
            decode=StepCoefficients(**c["decode"]),
            machine=data.get("machine", ""),
            notes=data.get("notes", ""),
            fit=data.get("fit", {}),
            kv_handoff=KVHandoff(**data["kv_handoff"]) if data.get("kv_handoff") else None,
            request_overhead=RequestOverhead(**data["request_overhead"]) if data.get("request_overhead") else None,
        )


def load_profile(path: str | Path) -> EngineProfile:
    """Read a profile JSON; ConfigError names the file and field on bad input."""
    from models.config import ConfigError

    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(path, "<file>", str(path), "an existing profile JSON") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(path, "<json>", f"line {exc.lineno}", "valid JSON") from None
    for key in ("name", "hardware", "model", "label", "coefficients"):
        if key not in data:
            raise ConfigError(path, key, "<missing>", "a profile field")
    if data["label"] not in ("measured", "derived"):
        raise ConfigError(path, "label", data["label"], "'measured' or 'derived'")
    for kind in ("prefill", "decode"):
        coeffs = data["coefficients"].get(kind)
        if not isinstance(coeffs, dict) or set(coeffs) - set(FEATURES):
            raise ConfigError(path, f"coefficients.{kind}", coeffs, f"a mapping with keys from {list(FEATURES)}")
        for k, v in coeffs.items():
            if not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(path, f"coefficients.{kind}.{k}", v, "a number >= 0")
    for key, allowed in (("kv_handoff", ("fixed_s", "per_request_s", "per_token_s")), ("request_overhead", ("fixed_s", "per_request_s"))):
        terms = data.get(key)
        if terms is None:
            continue
        if not isinstance(terms, dict) or set(terms) - set(allowed):
            raise ConfigError(path, key, terms, f"a mapping with keys {', '.join(allowed)}")
        for k, v in terms.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < 1e6:
                raise ConfigError(path, f"{key}.{k}", v, "a number >= 0 and < 1e6")
    return EngineProfile.from_json(data)


DEFAULT_STEP_TOKENS = 8192  # vLLM's max_num_batched_tokens for served engines, and the engine model's


@dataclass(frozen=True)
class StepLatencyModel:
    """Step time of one engine instance (one TP group) of a given model on a given GPU."""

    llm: LLMSpec
    gpu: GPUSpec
    tp: int
    profile: EngineProfile

    def step_time(self, shape: StepShape) -> np.ndarray:
        feats = step_features(shape, self.llm, self.gpu, self.tp)
        has_prefill = np.asarray(shape.prefill_tokens, dtype=float) > 0
        tp_ = feats @ self.profile.prefill.vector()
        td = feats @ self.profile.decode.vector()
        return np.where(has_prefill, tp_, td)

    def prefill_time(self, tokens: np.ndarray | float, requests: np.ndarray | float = 1.0, prefix_tokens: np.ndarray | float = 0.0) -> np.ndarray:
        """One prefill step over `tokens` new tokens of `requests` requests on top of cached prefixes."""
        return self.step_time(StepShape(prefill_tokens=tokens, prefill_requests=requests, prefill_prefix_tokens=prefix_tokens))

    def prefill_work(self, tokens: np.ndarray | float, requests: np.ndarray | float = 1.0, prefix_tokens: np.ndarray | float = 0.0) -> np.ndarray:
        """Engine time to prefill `tokens` new tokens of `requests` requests as the engine runs
        them: chunked into steps of at most `step_token_budget()` tokens, each paying the fixed
        and weight-read terms again (one step's price for a whole turn's load was 11-14% short
        of the engine model's busy time on prefill instances). A request's attention pairs are
        the same however it is cut, so they are the whole load's; a request a step boundary
        cuts is sampled in each step it appears in, and its later piece reads its prefix again
        and the KV of the part already done (on average half a request). Every boundary is taken
        to cut a request, as it does unless a request's tokens divide the budget."""
        t = np.asarray(tokens, dtype=float)
        r = np.maximum(np.asarray(requests, dtype=float), 1.0)
        prefix = np.asarray(prefix_tokens, dtype=float)
        steps = self.prefill_steps(t)
        read = prefix + (steps - 1.0) * (prefix + t / 2.0) / r
        feats = step_features(StepShape(t / steps, (r + steps - 1.0) / steps, read / steps), self.llm, self.gpu, self.tp) * steps[..., None]
        whole = step_features(StepShape(t, r, prefix), self.llm, self.gpu, self.tp)
        attn = FEATURES.index("attn")
        feats[..., attn] = whole[..., attn]
        return feats @ self.profile.prefill.vector()

    def prefill_steps(self, tokens: np.ndarray | float) -> np.ndarray:
        """Steps the engine takes to prefill `tokens` queued tokens: full steps of the budget, at least one."""
        return np.maximum(np.ceil(np.asarray(tokens, dtype=float) / self.step_token_budget() - 1e-9), 1.0)

    def decode_time(self, seqs: np.ndarray | float, context_tokens_per_seq: np.ndarray | float) -> np.ndarray:
        """One decode step of `seqs` sequences each holding `context_tokens_per_seq` tokens of KV."""
        seqs = np.asarray(seqs, dtype=float)
        return self.step_time(StepShape(decode_seqs=seqs, decode_context_tokens=seqs * np.asarray(context_tokens_per_seq, dtype=float)))

    def step_token_budget(self) -> float:
        """Tokens one step may prefill (vLLM's max_num_batched_tokens): the profiled engine's
        setting where the profile records it, else vLLM's (and the engine model's) default."""
        return float(self.profile.fit.get("engine", {}).get("max_num_batched_tokens", DEFAULT_STEP_TOKENS))

    def kv_capacity_tokens(self, memory_utilization: float = 0.9) -> float:
        """KV tokens that fit beside the weights on this instance's GPUs."""
        free = self.gpu.memory_gib * 2**30 * self.tp * memory_utilization - arch.weight_bytes(self.llm)
        return max(free, 0.0) / arch.kv_bytes_per_token(self.llm)
