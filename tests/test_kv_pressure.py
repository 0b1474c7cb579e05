"""KV memory is a rate, not a wall: pressure evicts cached prefixes (re-prefilled, slower), never refuses a batch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from models.builder import build_models
from models.config import load_experiment
from models.engine import Engine, EngineConfig, Request

ROOT = Path(__file__).resolve().parent.parent
EXP = ROOT / "configs/experiments"


@pytest.fixture(scope="module")
def step():
    return build_models(load_experiment(EXP / "paper-8b-motivation.yaml")).predictor.colocated_engine


def _turns(engine: Engine, keys: list[int], prefix: int, new: int, decode: int, now: float) -> float:
    """Submit one turn per key (asking for `prefix` cached tokens) and run the engine until all finish."""
    for k in keys:
        engine.submit(Request(k, new, prefix, decode, cache_key=k), now)
    left = set(keys)
    while left:
        now = engine.next_event()
        for out in engine.on_event(now):
            left.discard(out.rid)
    return now


def test_an_evicted_prefix_is_prefilled_again(step) -> None:
    """Ample KV: the second turn of every trajectory hits its whole prefix. KV for a quarter
    of the contexts: least recently used contexts are gone and come back as prefill."""
    keys = list(range(8))
    ample = Engine(EngineConfig(step, "colocated", kv_capacity_tokens=1e7))
    tight = Engine(EngineConfig(step, "colocated", kv_capacity_tokens=2.2 * 4000))
    for eng in (ample, tight):
        t = _turns(eng, keys, 0, 3800, 200, 0.0)
        _turns(eng, keys, 4000, 500, 200, t)
    assert ample.stats.cache_miss_tokens == 0 and ample.stats.cache_hit_tokens == 8 * 4000
    assert tight.stats.cache_miss_tokens >= 5 * 4000  # at most ~2 of 8 contexts stayed
    assert tight.stats.prefill_tokens >= ample.stats.prefill_tokens + 5 * 4000
    assert tight.cache.tokens <= tight.free_kv_tokens() + 1e-6  # the cache never holds more than the free KV


def test_a_request_without_a_cache_key_is_taken_at_its_word(step) -> None:
    """The emulated engine manages its own block-level cache and passes no key: nothing is second-guessed."""
    eng = Engine(EngineConfig(step, "colocated", kv_capacity_tokens=1e7))
    eng.submit(Request(1, 100, 5000, 10), 0.0)
    assert eng.stats.cache_miss_tokens == 0 and eng.stats.cache_hit_tokens == 0


def test_fewer_gpus_mean_more_prefill_not_infeasibility() -> None:
    """The predictor prices memory pressure: 1,024 trajectories on 4 instances keep less of their
    prefixes cached than on 16, prefill more, and still complete (finite), slower."""
    spec = load_experiment(EXP / "paper-8b-motivation.yaml")
    spec = spec.model_copy(update={"workload": spec.workload.model_copy(update={"trajectories_per_batch": 1024, "group_size": 16, "prefix_cache_hit": 1.0})})
    p = build_models(spec).predictor
    few, many = p.colocated_engine_use(4), p.colocated_engine_use(16)
    assert few.cache_hit_share < many.cache_hit_share <= 1.0
    assert few.prefill_token_share > many.prefill_token_share
    t = p.colocated_many(np.array([4, 8, 16]))[0]
    assert np.all(np.isfinite(t)) and t[0] > t[1] > t[2]
    assert np.isfinite(p.best_disaggregated(4).completion_s)


def test_heavy_batches_run_with_every_policy(pearl, config_tree) -> None:
    """The issue's cases: batch 1,024 with every policy and ROLL at batch 256 produce tokens (no
    policy returns 0 tokens/s; infeasibility is only for weights that do not fit)."""
    base = (config_tree / "experiments/default.yaml").read_text()
    for batch, policies in ((1024, "pearl,roll,rlboost+,rlboost+pd"), (256, "roll")):
        cfg = config_tree / "experiments" / f"heavy-{batch}.yaml"
        cfg.write_text(base.replace("name: default", f"name: heavy-{batch}") + f"\nworkload_overrides: {{trajectories_per_batch: {batch}, group_size: 16}}\n")
        res = pearl("compare", "--config", str(cfg), "--policies", policies, "--hours", "0.1", "--json", timeout=600)
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)["policies"]
        for name, row in out.items():
            assert row["tokens_per_s"] > 0 and row["policy_failures"] == 0, (batch, name, row)
