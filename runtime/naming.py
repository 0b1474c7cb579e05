"""Names both runtimes and the planner share: nodes, GPUs, workers, decision events, trainer phases.

A worker (one engine on a TP group) is named by the GPU that leads its group: GPUs never
move between nodes and a GPU holds one worker at a time, so `w:<gpu>` is stable for as
long as the worker lives, and a restarted worker on the same GPUs gets the same name.
"""

from __future__ import annotations

from planner.policies import EVENTS
from planner.state import gpu_name, node_name

__all__ = ["EVENTS", "TRAINER_PHASES", "gpu_name", "lead_gpu", "node_name", "worker_id"]

# The trainer's phases as both runtimes report them: `waiting` for a batch (its GPUs may be
# lent), `returning` (the batch is ready; lent GPUs are on their way back), `training`,
# `syncing` (new weights go to the engines). The planner sees waiting vs the rest.
TRAINER_PHASES: tuple[str, ...] = ("waiting", "returning", "training", "syncing")


def worker_id(lead: str) -> str:
    return f"w:{lead}"


def lead_gpu(worker: str) -> str:
    if not worker.startswith("w:"):
        raise ValueError(f"{worker!r} is not a worker id (w:<gpu>)")
    return worker[2:]
