"""Ray nodes leaving and joining a run, as the planner's availability events.

A slot lives on the Ray node that declares its resource (`ray_nodes.py`). The watch looks at
the cluster's live nodes every WATCH_PERIOD_S: when a node dies, its slots leave the planner's
state (their GPUs are unavailable, their workers gone, their trajectories resume elsewhere with
their prefix and environment progress) and the policy decides again; when it joins again, its
slots come back and the policy decides again. Only a run on a cluster (`--address`) watches: a
local run's one node is the driver's own. Mixed into `Controller`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from runtime.ray_runtime.ray_nodes import change, slot_nodes
from runtime.ray_runtime.slot_table import SlotRuntime

WATCH_PERIOD_S = 0.5
# An actor that died on a node the head has not yet declared dead: how long to wait for the
# verdict before calling it a worker death (the local cluster's health checks take ~1.5 s).
NODE_VERDICT_S = 5.0


class NodeWatch:
    """Node loss and return for `Controller` (attributes are the controller's)."""

    def _init_nodes(self) -> None:
        self.slot_node: dict[str, str] = {}  # slot resource -> live Ray node id
        self.node_events: list[dict[str, Any]] = []
        self.placements: dict[str, str] = {}  # worker -> Ray node id its actor runs on (last start)
        self.placement_mismatches = 0
        self.services: dict[str, str] = {}  # driver, trainer, env -> Ray node id (on a cluster)

    async def _live_slots(self) -> dict[str, str]:
        import ray

        return slot_nodes(await asyncio.to_thread(ray.nodes))

    async def watch_nodes(self) -> None:
        """Turn node deaths and joins into availability events, until cancelled."""
        while True:
            await asyncio.sleep(WATCH_PERIOD_S)
            now = await self._live_slots()
            ch = change(self.slot_node, now)
            self.slot_node = now
            if ch.lost:
                await self._nodes_lost(ch.lost)
            if ch.joined:
                await self._nodes_joined(ch.joined)

    def _planner_nodes(self, gpus: set[str]) -> list[str]:
        return sorted({self.table.node_of[g] for g in gpus})

    def _event(self, kind: str, gpus: set[str]) -> None:
        event = {"t": round(time.monotonic() - self.t0, 3), "event": kind, "nodes": self._planner_nodes(gpus), "gpus": sorted(gpus)}
        self.node_events.append(event)
        self.metrics.write(f"node_{kind}", **{k: v for k, v in event.items() if k != "t"})
        self.log(f"node {kind}: {', '.join(event['nodes'])} ({len(gpus)} GPU slots)")

    async def _nodes_lost(self, resources: frozenset[str]) -> None:
        import ray

        gpus = {s.gpu for s in self.table.slots if s.resource in resources}
        self.table.lost |= gpus
        self._event("lost", gpus)
        for r in self.rec.values():
            if r.slot.gpu not in gpus:
                continue
            r.failures = 0  # the node's loss explains its workers' deaths: no restart bound is spent on them
            if r.actor is not None and self.backend == "vllm":
                ray.kill(r.actor)  # dead with its node, or still waiting for that node to create it
            r.actor, r.status, r.role = None, "down", None
        await self.preempt(gpus)
        await self.decide("availability")

    async def _nodes_joined(self, resources: frozenset[str]) -> None:
        gpus = {s.gpu for s in self.table.slots if s.resource in resources}
        self.table.lost -= gpus
        self._event("joined", gpus)
        if self.backend == "emulated":
            self._place_hosts([self.rec[g] for g in sorted(gpus)])
        await self.decide("availability")

    async def _lost_with_node(self, r: SlotRuntime) -> bool:
        """Did `r`'s actor die with its node (an availability event, not a worker death)?"""
        if not self.address:
            return False
        deadline = time.monotonic() + NODE_VERDICT_S
        while time.monotonic() < deadline:
            if r.slot.gpu in self.table.lost:
                return True
            if r.slot.resource not in await self._live_slots():
                return True
            await asyncio.sleep(WATCH_PERIOD_S)
        return False

    async def _check_placement(self, r: SlotRuntime) -> None:
        """Record where the slot's actor runs; it must be the Ray node that declares the slot."""
        node = await r.actor.node_id.remote()
        want = self.slot_node.get(r.slot.resource) or (await self._live_slots()).get(r.slot.resource)
        self.placements[r.worker_id] = node
        if node != want:
            self.placement_mismatches += 1
            self.metrics.write("placement_mismatch", worker=r.worker_id, node=node, expected=want)

    def node_report(self) -> dict[str, dict[str, Any]]:
        """Per planner node: the Ray node now holding it (None while lost) and its slots started there."""
        out: dict[str, dict[str, Any]] = {}
        for s in self.table.slots:
            entry = out.setdefault(self.table.node_of[s.gpu], {"ray_node": None, "slots": 0, "workers_placed": 0})
            entry["slots"] += 1
            ray_node = self.slot_node.get(s.resource)
            entry["ray_node"] = ray_node[:12] if ray_node else None
            entry["workers_placed"] += int(self.placements.get(self.rec[s.gpu].worker_id) is not None)
        return out
