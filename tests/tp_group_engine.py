"""Run by tests/test_tp_group_vllm.py in its own process: one TP2 engine over two CPU ranks.

The engine starts as the runtime starts a TP group's engine: `RolloutWorker.start_slot` with
the kind (GPU type, 2), in a process whose binding names one core per rank ('0|1', what
`resources.group_env` sets for the group's actor). It generates, takes a weight push and is
probed; prints one JSON object."""

from __future__ import annotations

import asyncio
import json
import os
import sys


def main(model: str) -> None:
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    import torch

    from runtime.ray_runtime.engines import EngineSettings, GenRequest
    from runtime.ray_runtime.rollout_worker import RolloutWorker
    from runtime.ray_runtime.trainer import Trainer
    from runtime.ray_runtime.weight_sync import PROBE_TOKENS, model_probe_logprobs

    trainer = Trainer(model)
    with torch.no_grad():  # new weights the engine cannot have from disk
        for p in trainer.model.parameters():
            p.mul_(1.25)
    blob, expected = trainer.weights(), model_probe_logprobs(trainer.model)
    worker = RolloutWorker("vllm", EngineSettings(model), None)

    async def run() -> dict:
        info = await worker.start_slot(0, "colocated", ("cpu", 2))
        if not info.get("ok"):
            return {"ok": False, "error": info.get("error")}
        out = await worker.generate(0, GenRequest("a", tuple(range(5, 40)), 16, "full", 1.0))
        before = await worker.probe_logprobs(0, PROBE_TOKENS)
        await worker.load_weights(blob, 1)
        after = await worker.probe_logprobs(0, PROBE_TOKENS)
        await worker.shutdown()
        return {"ok": True, "tokens": len(out.token_ids), "finish": out.finish_reason, "before": list(before), "after": list(after), "expected": list(expected)}

    print(json.dumps(asyncio.run(run())))


if __name__ == "__main__":
    main(sys.argv[1])
