"""One engine model: continuous batching over the step-latency model, advanced analytically.

The simulator (virtual clock) and the emulated Ray engine (wall clock) both drive this
class, so both see the same engine. It is pure: it never reads a clock; every call is
given the current time and the engine answers with the time of its next event.

What it models (vLLM v1 semantics):
- requests carry new tokens to prefill on top of a cached prefix, and tokens to decode;
- roles: `colocated` (prefill then decode here), `prefill` (prefill only; the KV is sent
  away), `decode` (KV arrives from a prefill instance; decode only; where the profile
  measured the takeover, `kv_handoff`, the step that admits arrivals costs its time, with the
  running decodes stalled, as the predictor charges it);
- a step is one forward pass: waiting prefills are chunked into a token budget and ride
  along with the running decodes (mixed step, prefill coefficients), else a decode-only
  step over all running sequences;
- admission is limited by KV capacity (a request reserves its whole context plus its
  decode tokens) and by a sequence cap; requests that do not fit wait;
- the prefix cache lives in the KV the running requests leave free: a finished request's
  context stays cached until admissions need the room (least recently used first), so
  under memory pressure a trajectory back from its tool finds its prefix evicted and
  prefills it again. KV pressure is a rate (slower turns), never a refusal.

Why it is fast: between request events (an arrival or a sequence finishing) the decode
batch is constant, and the decode-only step time is affine in the batch's summed context
(t = alpha(c) + beta * C, C growing by c per step), so the time of k steps is a quadratic
in k. The engine jumps straight to the next finish instead of simulating every step; an
arrival in the middle of such a segment is served at the next step boundary, exactly as a
real engine would.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Literal

from models import architecture as arch
from models.step_latency import DEFAULT_STEP_TOKENS, SPILL_TOKENS, KVHandoff, StepLatencyModel

Role = Literal["colocated", "prefill", "decode"]
ROLES: tuple[Role, ...] = ("colocated", "prefill", "decode")


@dataclass(frozen=True)
class StepCost:
    """Pure-float twin of `StepLatencyModel.step_time` for the hot path (no numpy per call)."""

    p: tuple[float, ...]  # prefill-step coefficients x scale, per term
    d: tuple[float, ...]  # decode-step coefficients x scale
    two_a: float
    two_hv: float
    attn_k: float
    dense_bytes: float
    expert_bytes: float
    experts: int
    active: int
    kvb: float
    comm_k: float

    @classmethod
    def of(cls, m: StepLatencyModel) -> "StepCost":
        llm, gpu, tp = m.llm, m.gpu, m.tp
        peak = gpu.bf16_tflops * 1e12 * tp
        hbm = gpu.hbm_tb_s * 1e12 * tp
        comm = 0.0 if tp <= 1 else 2 * llm.layers * llm.hidden * llm.dtype_bytes * 2.0 * (tp - 1) / tp / (gpu.intra_node_gb_s * 1e9)
        dense = (arch.attention_params(llm) + arch.dense_ffn_params(llm) + 2 * arch.embedding_params(llm)) * llm.dtype_bytes

        def scaled(c: object) -> tuple[float, ...]:
            v = c.vector()  # type: ignore[attr-defined]
            fixed, requests, compute, attn, weights, kv, comm, spill = (float(x) for x in v)
            return (fixed, requests, compute / peak, attn / peak, weights / hbm, kv / hbm, comm, spill / peak / SPILL_TOKENS)

        return cls(
            p=scaled(m.profile.prefill),
            d=scaled(m.profile.decode),
            two_a=2.0 * arch.active_params_per_token(llm),
            two_hv=2.0 * llm.hidden * llm.vocab,
            attn_k=4.0 * llm.layers * llm.q_heads * llm.head_dim,
            dense_bytes=float(dense),
            expert_bytes=float(arch.expert_params(llm) * llm.dtype_bytes),
            experts=llm.moe.experts if llm.moe else 0,
            active=llm.moe.active_experts if llm.moe else 0,
            kvb=float(arch.kv_bytes_per_token(llm)),
            comm_k=comm,
        )

    def __call__(self, prefill_tokens: float, prefill_requests: float, prefix_tokens: float, decode_seqs: float, decode_context: float) -> float:
        tok = prefill_tokens + decode_seqs
        if prefill_tokens > 0:
            r = max(prefill_requests, 1.0)
            per = prefill_tokens / r
            pairs = prefill_tokens * (prefix_tokens / r) + r * per * (per + 1) / 2 + decode_context
            sampled = prefill_requests + decode_seqs
            c = self.p
        else:
            pairs = decode_context
            sampled = decode_seqs
            c = self.d
        weights = self.dense_bytes
        if self.experts:
            weights += self.experts * (1.0 - (1.0 - self.active / self.experts) ** max(tok, 0.0)) * self.expert_bytes
        flops = self.two_a * tok + self.two_hv * sampled
        return (
            c[0]
            + c[1] * sampled
            + c[2] * flops
            + c[3] * self.attn_k * pairs
            + c[4] * weights
            + c[5] * self.kvb * (prefix_tokens + decode_context + tok)
            + c[6] * self.comm_k * tok
            + c[7] * flops * prefill_tokens
        )

    def decode_affine(self, c: int) -> tuple[float, float]:
        """(alpha(c), beta): a decode-only step over c sequences of summed context C takes alpha + beta*C."""
        a = self(0.0, 0.0, 0.0, float(c), 0.0)
        return a, self(0.0, 0.0, 0.0, float(c), 1.0) - a


@dataclass(frozen=True)
class EngineConfig:
    step: StepLatencyModel
    role: Role
    kv_capacity_tokens: float
    max_seqs: int = 256
    max_batched_tokens: int = DEFAULT_STEP_TOKENS

    @classmethod
    def for_model(cls, step: StepLatencyModel, role: Role, memory_utilization: float = 0.9, max_seqs: int = 256, max_batched_tokens: int | None = None) -> "EngineConfig":
        """An engine of `step`'s model; its step budget the profiled engine's (`step_token_budget`,
        as the predictor prices steps) unless given."""
        budget = int(step.step_token_budget()) if max_batched_tokens is None else max_batched_tokens
        return cls(step, role, step.kv_capacity_tokens(memory_utilization), max_seqs, budget)


@dataclass(frozen=True)
class Request:
    """One turn's work on this engine. prefix: cached context; prefill: new tokens; decode: tokens to generate."""

    rid: int
    prefill_tokens: int
    prefix_tokens: int
    decode_tokens: int
    width: int = 1  # identical sequences this request stands for (a cohort); token counts are per sequence
    cache_key: Hashable | None = None  # set: the prefix counts only as far as this engine still caches it under the key


@dataclass
class PrefixCache:
    """Contexts kept after their requests finished, least recently used first out.

    Entries are (tokens per sequence, width); the engine bounds the total by the KV its
    running requests leave free. One policy at two grains: the simulator keys a whole
    trajectory's context, the emulated engine keys blocks of token ids.
    """

    entries: OrderedDict = field(default_factory=OrderedDict)
    tokens: float = 0.0

    def put(self, key: Hashable, tokens: float, width: int = 1) -> None:
        self.take(key)
        self.entries[key] = (tokens, width)
        self.tokens += tokens * width

    def peek(self, key: Hashable) -> float:
        hit = self.entries.get(key)
        return hit[0] if hit is not None else 0.0

    def touch(self, key: Hashable) -> bool:
        if key not in self.entries:
            return False
        self.entries.move_to_end(key)
        return True

    def take(self, key: Hashable) -> float:
        """Claim an entry (its request is back: its tokens move into that request's reservation)."""
        hit = self.entries.pop(key, None)
        if hit is None:
            return 0.0
        self.tokens -= hit[0] * hit[1]
        return hit[0]

    def shrink(self, limit: float) -> None:
        while self.entries and self.tokens > limit + 1e-9:
            _, (tok, width) = self.entries.popitem(last=False)
            self.tokens -= tok * width
        if not self.entries:
            self.tokens = 0.0


@dataclass(frozen=True)
class Output:
    """A request that finished its part here: `prefilled` (prefill role) or `decoded`."""

    rid: int
    time: float
    kind: Literal["prefilled", "decoded"]
    generated: int


@dataclass(frozen=True)
class Evicted:
    """A request taken off the engine (preemption, role switch, return): progress kept."""

    rid: int
    generated: int  # tokens already decoded (kept: the turn resumes with them as context)


@dataclass
class _Waiting:
    req: Request
    done: int = 0  # prefill tokens already processed (chunked prefill)
    admitted: bool = False


@dataclass
class _Seq:
    rid: int
    start_step: int
    ctx0: float
    total: int  # tokens this request decodes in all (first one may come from its prefill step)
    pre: int  # tokens generated before joining the decode batch
    reserve: float
    width: int = 1
    key: Hashable | None = None


@dataclass
class EngineStats:
    busy_s: float = 0.0
    steps: int = 0
    prefill_tokens: float = 0.0
    decode_tokens: float = 0.0
    cache_hit_tokens: float = 0.0  # prefix tokens requests asked for that the cache still held
    cache_miss_tokens: float = 0.0  # ... that it had evicted (prefilled again)


@dataclass
class Engine:
    """Mutable state machine of one instance. Call `submit`, `on_event` at `next_event()`, `evict_all`."""

    cfg: EngineConfig
    t: float = 0.0  # time up to which the state is materialized (a step boundary while busy)
    cost: StepCost = field(init=False)
    _handoff: KVHandoff | None = field(init=False, default=None)
    stats: EngineStats = field(default_factory=EngineStats)
    cache: PrefixCache = field(default_factory=PrefixCache)
    _waiting: deque = field(default_factory=deque)
    _seqs: dict = field(default_factory=dict)
    _finish: list = field(default_factory=list)  # heap of (finish_step, rid)
    _steps: int = 0
    _C: float = 0.0  # summed context of running sequences
    _c: int = 0  # running sequences (a cohort request counts its width)
    _adm_seqs: int = 0  # sequences of admitted requests still prefilling
    _kv: float = 0.0
    _admitted_prefill: int = 0
    # the current segment
    _kind: str = "idle"  # idle | mixed | decode | takeover
    _seg_t0: float = 0.0
    _seg_end: float = math.inf
    _seg_k: int = 0
    _alpha: float = 0.0
    _beta: float = 0.0
    _mixed: list = field(default_factory=list)  # [(waiting, tokens)] in the current mixed step
    _hold: float = 0.0  # no step starts before this (weight sync)

    def __post_init__(self) -> None:
        self._rate()

    def _rate(self) -> None:
        """The step costs of `cfg`'s step model."""
        self.cost = _cost_of(self.cfg.step)
        # a measured P -> D takeover (P/D profiles): decode instances pay it when arrivals join
        self._handoff = self.cfg.step.profile.kv_handoff if self.cfg.role == "decode" else None
        self._affine = _affine_table(self.cost, self.cfg.max_seqs)

    # ------------------------------------------------------------------ queries
    @property
    def role(self) -> Role:
        return self.cfg.role

    def next_event(self) -> float:
        return self._seg_end

    def load(self) -> int:
        """Requests on this engine (waiting or running): what a router balances."""
        return len(self._waiting) + len(self._seqs)

    def idle(self) -> bool:
        return self._kind == "idle"

    def holds(self, rid: int) -> bool:
        """Is this request on the engine (waiting or running)? For conservation checks."""
        return rid in self._seqs or any(w.req.rid == rid for w in self._waiting)

    # ------------------------------------------------------------------ commands
    def submit(self, req: Request, now: float) -> None:
        """A request arrives at `now`; it is scheduled from the next step boundary."""
        self._sync(now, ceil=True)
        req = self._apply_cache(req)
        self._waiting.append(_Waiting(req))
        if self._kind in ("mixed", "takeover") and now <= self._seg_t0:
            self._kind = "idle"  # the step has not started yet: it takes this request too
        if self._kind == "idle":
            self.t = max(self.t, now)
            self._plan()

    def on_event(self, now: float) -> list[Output]:
        """Complete the segment ending at `now` (== next_event()) and plan the next one."""
        out: list[Output] = []
        if self._kind == "idle" or now < self._seg_end:
            return out
        if self._kind == "mixed":
            self._finish_mixed(out)
        elif self._kind == "takeover":
            self.stats.busy_s += self._seg_end - self._seg_t0
            self.t = self._seg_end
            self._join_admitted()
        else:
            self._advance_decode(self._seg_k)
            self.t = self._seg_end
        self._collect(out)
        self._plan()
        return out

    def stall(self, now: float, seconds: float) -> None:
        """Pause for `seconds` from the next step boundary (weight sync)."""
        self._sync(now, ceil=True)
        self._hold = max(self._hold, max(self.t, now) + seconds)
        if self._kind == "idle":
            self.t = max(self.t, now)
            self._plan()

    def retime(self, cfg: EngineConfig, now: float) -> None:
        """Run at `cfg`'s step model from the next step boundary on: the engines that share this
        one's node changed in number, and engines that share cores each run slower when more do
        (`profile_by_engines`). A step under way ends at the old speed."""
        self._sync(now, ceil=True)
        self.cfg = cfg
        self._rate()
        if self._kind == "idle":
            self.t = max(self.t, now)
            self._plan()

    def evict_all(self, now: float) -> list[Evicted]:
        """Take every request off (the step in progress is lost); the engine ends idle."""
        self._sync(now, ceil=False)
        out = [Evicted(s.rid, s.pre + (self._steps - s.start_step)) for s in self._seqs.values()]
        out += [Evicted(w.req.rid, 0) for w in self._waiting]
        self._waiting.clear()
        self._seqs.clear()
        self._finish.clear()
        self._C = self._kv = 0.0
        self._c = self._adm_seqs = 0
        self._admitted_prefill = 0
        self._mixed = []
        self._kind, self._seg_end = "idle", math.inf
        self.t = max(self.t, now)
        return out

    def free_kv_tokens(self) -> float:
        """KV no running or admitted request reserves: the room the prefix cache may use."""
        return max(self.cfg.kv_capacity_tokens - self._kv, 0.0)

    # ------------------------------------------------------------------ internals
    def _apply_cache(self, req: Request) -> Request:
        """The prefix counts as far as this engine still caches it; the rest is prefilled again."""
        if req.cache_key is None or req.prefix_tokens <= 0:
            return req
        held = min(self.cache.take(req.cache_key), float(req.prefix_tokens))
        miss = req.prefix_tokens - int(held)
        self.stats.cache_hit_tokens += int(held) * req.width
        self.stats.cache_miss_tokens += miss * req.width
        if miss <= 0:
            return req
        return Request(req.rid, req.prefill_tokens + miss, int(held), req.decode_tokens, req.width, req.cache_key)

    def _keep(self, key: Hashable | None, tokens: float, width: int) -> None:
        if key is not None:
            self.cache.put(key, tokens, width)
            self.cache.shrink(self.free_kv_tokens())

    def _sync(self, now: float, ceil: bool) -> None:
        """Materialize a decode segment up to the step boundary at/after (ceil) or before `now`.

        Leaves the engine idle at that boundary (the caller re-plans), unless the boundary
        is the segment's own end, which `on_event` handles.
        """
        if self._kind != "decode" or now >= self._seg_end:
            return
        dt = now - self._seg_t0
        k = self._steps_by(dt) if dt > 0 else 0
        if ceil and dt > 0 and self._seg_time(k) < dt - 1e-12:
            k += 1
        if k >= self._seg_k:
            return
        if k > 0:
            self.t = self._seg_t0 + self._advance_decode(k)
        self._kind, self._seg_end = "idle", math.inf

    def _seg_time(self, k: int) -> float:
        c = self._c
        return k * self._alpha + self._beta * (k * self._C + c * k * (k - 1) / 2.0)

    def _steps_by(self, dt: float) -> int:
        """Largest k with seg_time(k) <= dt."""
        c = self._c
        qa = self._beta * c / 2.0
        qb = self._alpha + self._beta * self._C - qa
        if qa <= 0:
            k = int(dt / qb) if qb > 0 else self._seg_k
        else:
            k = int((-qb + math.sqrt(qb * qb + 4 * qa * dt)) / (2 * qa))
        while k > 0 and self._seg_time(k) > dt:
            k -= 1
        while self._seg_time(k + 1) <= dt and k < self._seg_k:
            k += 1
        return k

    def _advance_decode(self, k: int) -> float:
        """Run k decode steps of the current segment; returns their duration."""
        c = self._c
        dt = self._seg_time(k)
        self.stats.busy_s += dt
        self.stats.steps += k
        self.stats.decode_tokens += c * k
        self._C += c * k
        self._steps += k
        return dt

    def _collect(self, out: list[Output]) -> None:
        while self._finish and self._finish[0][0] <= self._steps:
            _, rid = heapq.heappop(self._finish)
            s = self._seqs.pop(rid)
            self._C -= s.width * (s.ctx0 + (self._steps - s.start_step))
            self._c -= s.width
            self._kv -= s.reserve
            self._keep(s.key, s.ctx0 + s.total - s.pre, s.width)
            out.append(Output(rid, self.t, "decoded", s.total))
        if not self._seqs:
            self._C = 0.0
            self._c = 0

    def _reserve_of(self, req: Request) -> float:
        if self.cfg.role == "prefill":
            return float(req.width * (req.prefix_tokens + req.prefill_tokens))
        return float(req.width * (req.prefix_tokens + req.prefill_tokens + req.decode_tokens))

    def _can_admit(self, reserve: float) -> bool:
        busy = self._c + self._adm_seqs
        if busy == 0:
            return True  # never deadlock: a lone oversized request runs anyway
        return busy < self.cfg.max_seqs and self._kv + reserve <= self.cfg.kv_capacity_tokens

    def _admit_waiting(self) -> None:
        for w in self._waiting:
            if w.admitted:
                continue
            res = self._reserve_of(w.req)
            if not self._can_admit(res):
                break
            w.admitted = True
            self._kv += res
            self.cache.shrink(self.free_kv_tokens())
            if self.cfg.role == "decode":
                continue
            self._admitted_prefill += 1
            self._adm_seqs += w.req.width
        if self.cfg.role == "decode" and self._handoff is None:
            self._join_admitted()

    def _join_admitted(self) -> None:
        """Admitted arrivals on a decode instance start decoding (their KV is here)."""
        while self._waiting and self._waiting[0].admitted:
            r = self._waiting.popleft().req
            self._join(r.rid, float(r.prefix_tokens + r.prefill_tokens), r.decode_tokens, 0, self._reserve_of(r), r.width, r.cache_key)

    def _join(self, rid: int, ctx: float, total: int, pre: int, reserve: float, width: int = 1, key: Hashable | None = None) -> None:
        left = total - pre
        self._seqs[rid] = _Seq(rid, self._steps, ctx, total, pre, reserve, width, key)
        self._C += width * ctx
        self._c += width
        heapq.heappush(self._finish, (self._steps + max(left, 0), rid))

    def _plan(self) -> None:
        self.t = max(self.t, self._hold)
        self._admit_waiting()
        if self._handoff is not None and self._waiting and self._waiting[0].admitted:
            # one step takes over every admitted arrival (loads its KV); the decodes wait
            arrived = [w for w in self._waiting if w.admitted]
            dt = float(self._handoff.time(sum(w.req.width for w in arrived), sum(w.req.width * w.req.prefill_tokens for w in arrived)))
            self._kind, self._seg_t0, self._seg_end = "takeover", self.t, self.t + dt
            return
        c = self._c
        budget = self.cfg.max_batched_tokens - c
        batch: list[tuple[_Waiting, int]] = []
        ptok = prefix = nreq = 0
        if self._admitted_prefill:
            for w in self._waiting:
                if not w.admitted or budget <= 0:
                    break
                r = w.req
                left = r.width * r.prefill_tokens - w.done
                n = (left if left < budget else budget) if left > 0 else 0
                batch.append((w, n))
                budget -= n
                ptok += n
                prefix += r.width * r.prefix_tokens + w.done
                nreq += r.width
        if batch:
            dt = self.cost(float(ptok) if ptok > 1 else 1.0, float(nreq), float(prefix), float(c), self._C)
            self._kind, self._mixed = "mixed", batch
            self._seg_t0, self._seg_end = self.t, self.t + dt
            return
        if c:
            self._alpha, self._beta = self._affine[c] if c < len(self._affine) else self.cost.decode_affine(c)
            self._seg_k = max(self._finish[0][0] - self._steps, 1)
            self._kind, self._seg_t0 = "decode", self.t
            self._seg_end = self.t + self._seg_time(self._seg_k)
            return
        self._kind, self._seg_end = "idle", math.inf

    def _finish_mixed(self, out: list[Output]) -> None:
        dt = self._seg_end - self._seg_t0
        c = self._c
        self.stats.busy_s += dt
        self.stats.steps += 1
        self.stats.decode_tokens += c
        self._C += c
        self._steps += 1
        self.t = self._seg_end
        for w, n in self._mixed:
            w.done += n
            self.stats.prefill_tokens += n
            r = w.req
            if w.done < r.width * r.prefill_tokens:
                continue
            self._waiting.remove(w)
            self._admitted_prefill -= 1
            self._adm_seqs -= r.width
            if self.cfg.role == "prefill":
                self._kv -= self._reserve_of(r)
                self._keep(r.cache_key, r.prefix_tokens + r.prefill_tokens, r.width)
                out.append(Output(r.rid, self.t, "prefilled", 0))
            elif r.decode_tokens <= 1:
                self._kv -= self._reserve_of(r)
                self._keep(r.cache_key, r.prefix_tokens + r.prefill_tokens + r.decode_tokens, r.width)
                out.append(Output(r.rid, self.t, "decoded", r.decode_tokens))
            else:
                # the prefill step sampled the first token; decoding continues from the next step
                self._join(r.rid, float(r.prefix_tokens + r.prefill_tokens + 1), r.decode_tokens, 1, self._reserve_of(r), r.width, r.cache_key)
        self._mixed = []


_COSTS: dict[int, StepCost] = {}
_AFFINE: dict[int, list] = {}


def _cost_of(step: StepLatencyModel) -> StepCost:
    key = id(step)
    hit = _COSTS.get(key)
    if hit is None:
        hit = _COSTS[key] = StepCost.of(step)
        _KEEP.append(step)  # keep the id stable for the cache's lifetime
    return hit


def _affine_table(cost: StepCost, max_seqs: int) -> list:
    key = id(cost)
    tab = _AFFINE.get(key)
    if tab is None or len(tab) <= max_seqs:
        tab = _AFFINE[key] = [(0.0, 0.0)] + [cost.decode_affine(c) for c in range(1, max_seqs + 1)]
    return tab


_KEEP: list = []
