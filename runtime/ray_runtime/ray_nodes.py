"""The planner's nodes as Ray nodes: which live Ray node holds each GPU slot, and what each
node must declare to hold its slots.

A slot is a Ray custom resource (`pearl_gpu_<n>`, see `resources.py`) that exactly one Ray
node declares: the node started for the planner node of that GPU (`ray start --resources`,
one node per `cluster.nodes` entry's node). So the mapping planner node -> Ray node needs no
table of ours: a slot lives where its resource is, a Ray node that dies takes its slots'
resources with it, and a node that joins again brings them back (under a new Ray node id).
The same holds on a real cluster and on the local one `scripts/local_cluster.sh` starts.

`slot_nodes` is pure (it reads `ray.nodes()` output); `cluster_resources` prints, per planner
node, the resources its `ray start` declares (its slots, and `pearl_node_<node>` naming it) (used by the local cluster script and shown in
the README for real clusters).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from runtime.ray_runtime.resources import Slot

RESOURCE_PREFIX = "pearl_gpu_"
NODE_RESOURCE_PREFIX = "pearl_node_"  # a resource naming the planner node a Ray node stands for (this Ray has no node labels)


@dataclass(frozen=True)
class NodeChange:
    """Slots whose Ray node went away, and slots that came back, between two looks."""

    lost: frozenset[str]  # slot resources
    joined: frozenset[str]


class OnANode:
    """Mixed into the actors whose Ray node the runtime checks (trainer, environment)."""

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


def slot_nodes(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """Slot resource -> id of the live Ray node declaring it (`ray.nodes()` entries)."""
    out: dict[str, str] = {}
    for n in nodes:
        if not n.get("Alive"):
            continue
        for res in n.get("Resources", {}):
            if res.startswith(RESOURCE_PREFIX):
                out[res] = n["NodeID"]
    return out


def change(before: dict[str, str], after: dict[str, str]) -> NodeChange:
    """A slot is lost when its resource left the live nodes, joined when it is back (on any node id)."""
    return NodeChange(frozenset(set(before) - set(after)), frozenset(set(after) - set(before)))


def node_slots(slots: tuple[Slot, ...], node_of_gpu: dict[str, str]) -> dict[str, list[Slot]]:
    """Planner node -> its slots, in slot order."""
    out: dict[str, list[Slot]] = defaultdict(list)
    for s in slots:
        out[node_of_gpu[s.gpu]].append(s)
    return dict(out)


def answers(address: str, timeout_s: float = 2.0) -> bool:
    """Does anything listen at a Ray head's `host:port`? (ray.init retries an absent head forever.)"""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def cluster_resources(config: str) -> list[dict[str, Any]]:
    """What each planner node's Ray node declares: its slots' resources and one naming the node."""
    from models.config import load_experiment
    from planner.state import state_from_cluster_spec
    from runtime.ray_runtime.resources import make_slots

    spec = load_experiment(config)
    state = state_from_cluster_spec(spec.cluster)
    slots = make_slots(state, spec.runtime.bindings)
    by_node = node_slots(slots, {g.id: g.node for g in state.gpus})
    return [{"node": node, "resources": {**{s.resource: 1.0 for s in ss}, f"{NODE_RESOURCE_PREFIX}{node}": 1.0}} for node, ss in by_node.items()]


def main(argv: list[str]) -> int:
    """`python -m runtime.ray_runtime.ray_nodes CONFIG`: one line per planner node,
    `<node> <resources json>` (what `ray start --resources` takes)."""
    if len(argv) != 1:
        print("usage: python -m runtime.ray_runtime.ray_nodes CONFIG", file=sys.stderr)
        return 2
    from models.config import ConfigError

    try:
        nodes = cluster_resources(argv[0])
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for n in nodes:
        print(n["node"], json.dumps(n["resources"], separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
