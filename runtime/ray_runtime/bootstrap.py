"""Bringing a Ray run up and down: Ray itself, the trainer, the environment and the engine hosts.

Locally every GPU slot is declared as a Ray custom resource when Ray starts; with
`--address` the cluster's nodes declare their own. vLLM workers are created per slot when
a plan starts them (`runtime/ray_runtime/plan_runner.py`); emulated engines share a few
host actors. Mixed into `Controller`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

from models.config import ConfigError, ExperimentSpec
from runtime.ray_runtime.engines import EngineSettings
from runtime.ray_runtime.records import RuntimeStartError
from runtime.ray_runtime.resources import ray_resources
from runtime.timeline import expected_batch_tokens, prior_batch_s, train_step_s

REPO_ROOT = Path(__file__).resolve().parents[2]


def resolve_model_path(spec: ExperimentSpec) -> str:
    p = Path(spec.runtime.model_path)
    if not p.is_absolute():
        p = REPO_ROOT / p
    if not (p / "config.json").exists():
        raise ConfigError(spec.source, "runtime.model_path", spec.runtime.model_path, "a model directory with config.json (build the tiny one: make model)")
    return str(p)


class Bootstrap:
    """Ray, actors and their teardown for `Controller` (attributes are the controller's)."""

    def _ray_init(self) -> None:
        import ray

        env = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO_ROOT)}
        if ray.is_initialized():
            return
        if self.address and self.address != "auto":
            from runtime.ray_runtime.ray_nodes import answers

            if not answers(self.address):
                raise RuntimeStartError(f"no Ray cluster answers at --address {self.address} (start one with `ray start --head`, or scripts/local_cluster.sh up CONFIG)")
        try:
            if self.address:
                ray.init(address=self.address, runtime_env={"env_vars": env}, log_to_driver=False)
            else:
                ray.init(address="local", num_cpus=os.cpu_count() or 1, resources=ray_resources(self.table.slots), include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env}, object_store_memory=256 * 2**20)
        except Exception as exc:  # connection refused, bad address, ...
            raise RuntimeStartError(f"Ray failed to start or connect (address {self.address!r}): {exc}") from None

    def _remote(self, cls: type, **opts: Any) -> Any:
        import ray

        return ray.remote(cls).options(num_cpus=0, **opts)

    def _on_node(self, node_id: str) -> dict[str, Any]:
        """Actor options that place it on one Ray node (and nowhere else if that node dies)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}

    def _driver_node(self) -> dict[str, Any]:
        """On a cluster the trainer and the environment run beside the driver, on the head node:
        a worker node's loss must not take them (a head node's loss ends the run anyway)."""
        import ray

        return self._on_node(ray.get_runtime_context().get_node_id()) if self.address else {}

    def _place_hosts(self, records: list[Any]) -> None:
        """Emulated engines on a cluster: one host actor per planner node, on the Ray node that
        declares that node's slots, hosting them (a node's loss takes exactly its slots)."""
        from runtime.ray_runtime.rollout_worker import RolloutWorker

        by_node: dict[str, list[Any]] = {}
        for r in records:
            by_node.setdefault(self.table.node_of[r.slot.gpu], []).append(r)
        for node, recs in by_node.items():
            ray_node = self.slot_node.get(recs[0].slot.resource)
            if ray_node is None:
                continue  # that node is not in the cluster now: its slots wait for it
            host = self._remote(RolloutWorker, max_concurrency=100000, **self._on_node(ray_node)).remote("emulated", None, self.emulated, self._faults())
            self.hosts.append(host)
            for r in recs:
                r.actor = host

    async def setup(self) -> None:
        from models.builder import load_fewer_engine_profiles, load_profiles
        from planner.policies import get_policy
        from runtime.ray_runtime.env_worker import EnvWorker
        from runtime.ray_runtime.fsdp_trainer import FSDPTrainer
        from runtime.ray_runtime.rollout_worker import EmulatedSettings, RolloutWorker
        from runtime.ray_runtime.telemetry import RuntimeTracker
        from runtime.ray_runtime.trainer import Trainer

        self._ray_init()
        self._make_sync_primitives()
        self.slot_node = await self._live_slots()
        if self.address:
            missing = [s.resource for s in self.table.slots if s.resource not in self.slot_node]
            self.table.lost |= {s.gpu for s in self.table.slots if s.resource in missing}
            if missing:
                self.metrics.write("nodes_absent_at_start", resources=missing)
        spec, rt = self.spec, self.rt
        w = spec.workload
        self.tracker = RuntimeTracker(spec, *load_profiles(spec), env_scale=1.0, base_fewer_engines=load_fewer_engine_profiles(spec))
        self.policy = get_policy(spec.policy.name)
        self._refresh_inputs()
        self.predicted_s = self.timeline_s = prior_batch_s(self.inputs, spec.cluster.gpus_in_pool("rollout"))  # until a decision predicts
        emulated_train_s = train_step_s(spec, expected_batch_tokens(spec))
        sign = -1.0 if rt.control == "flipped_advantage" else 1.0
        if self.trainer_backend == "fsdp":  # same interface; the actor spawns its rank processes
            self.trainer = self._remote(FSDPTrainer, **self._driver_node()).remote(self.model_path, rt.lr, rt.clip_eps, spec.training.staleness, spec.seed, 1, world_size=rt.trainer_world_size, advantage_sign=sign)
        else:
            self.trainer = self._remote(Trainer, **self._driver_node()).remote(
                self.model_path if self.trainer_backend == "torch" else None, rt.lr, rt.clip_eps, spec.training.staleness, spec.seed, 1, self.trainer_backend, emulated_train_s, self.scale, advantage_sign=sign
            )
        tok = self.model_path if self.backend == "vllm" and rt.task == "calculator" else None
        self.env = self._remote(EnvWorker, max_concurrency=100000, **self._driver_node()).remote(tok, w.turns, w.env_latency_s, w.initial_prompt_tokens, w.new_tokens_per_turn, self.scale, spec.seed)
        if self.backend == "emulated":
            models = self.tracker.models(type_speeds=rt.emulated_slowdown)  # the engines' truth: the planner starts from the profiles
            costs = models.costs
            self.emulated = EmulatedSettings(models.predictor.colocated_engine, self.scale, spec.model.vocab, costs.role_switch_s, costs.engine_start_s, spec.workload.prefix_cache_hit,
                                             engines=models.engines(), colocated_by_engines=models.predictor.colocated_by_engines,
                                             slot_node={sl.index: self.table.node_of[sl.gpu] for sl in self.table.slots})
            if self.address and len(set(self.slot_node.values())) > 1:
                self._place_hosts(list(self.rec.values()))
            else:
                self.hosts = [self._remote(RolloutWorker, max_concurrency=100000).remote("emulated", None, self.emulated, self._faults()) for _ in range(rt.hosts)]
                for r in self.rec.values():
                    r.actor = self.hosts[r.slot.index % len(self.hosts)]
        if self.address:
            await self._check_services()
        self.blob_ref = self.initial_blob_ref = self.trainer.weights.remote()
        self.metrics.write("setup", backend=self.backend, trainer=self.trainer_backend, slots=[s.__dict__ for s in self.table.slots], kv_store=self.kv_store)

    async def _check_services(self) -> None:
        """On a cluster the trainer and the environment must run on the driver's (head) node."""
        import ray

        driver = ray.get_runtime_context().get_node_id()
        self.services = {"driver": driver, "trainer": await self.trainer.node_id.remote(), "env": await self.env.node_id.remote()}
        for name, node in self.services.items():
            if node != driver:
                self.placement_mismatches += 1
                self.metrics.write("placement_mismatch", worker=name, node=node, expected=driver)

    def _faults(self) -> tuple[tuple[str, str], ...]:
        return tuple((f.request, f.role) for f in self.rt.faults)

    def _engine_settings(self) -> EngineSettings:
        rt = self.rt
        assert self.model_path is not None
        return EngineSettings(self.model_path, rt.dtype, rt.max_model_len, rt.block_size, kv_connector=rt.kv_connector, kv_store=self.kv_store, kv_buffer_device=rt.kv_buffer_device, seed=self.spec.seed, cpu_kv_cache_mib=rt.cpu_kv_cache_mib)

    async def shutdown(self) -> None:
        import ray

        async def stop(actor: Any) -> None:
            try:
                await asyncio.wait_for(actor.shutdown.remote(), timeout=30)
            except Exception:
                pass

        # every worker process at once: each stop waits out its engine core's exit grace
        await asyncio.gather(*(stop(a) for a in {id(r.actor): r.actor for r in self.rec.values() if r.actor is not None}.values()))
        self.metrics.close()
        shutil.rmtree(self.kv_store, ignore_errors=True)
        if not self.address and ray.is_initialized():
            ray.shutdown()
