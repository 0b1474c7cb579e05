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

        env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "TOKENIZERS_PARALLELISM": "false", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO_ROOT)}
        if ray.is_initialized():
            return
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

    async def setup(self) -> None:
        from models.builder import load_profiles
        from planner.inputs import planning_inputs
        from planner.policies import get_policy
        from runtime.ray_runtime.env_worker import EnvWorker
        from runtime.ray_runtime.fsdp_trainer import FSDPTrainer
        from runtime.ray_runtime.rollout_worker import EmulatedSettings, RolloutWorker
        from runtime.ray_runtime.telemetry import RuntimeTracker
        from runtime.ray_runtime.trainer import Trainer

        self._ray_init()
        self._make_sync_primitives()
        spec, rt = self.spec, self.rt
        w = spec.workload
        self.tracker = RuntimeTracker(spec, *load_profiles(spec), env_scale=1.0)
        self.policy = get_policy(spec.policy.name)
        self.inputs = planning_inputs(self.tracker.models(), max_gpus=len(self.table.slots))
        self.predicted_s = self.timeline_s = prior_batch_s(self.inputs, spec.cluster.gpus_in_pool("rollout"))  # until a decision predicts
        emulated_train_s = train_step_s(spec, expected_batch_tokens(spec))
        sign = -1.0 if rt.control == "flipped_advantage" else 1.0
        if self.trainer_backend == "fsdp":  # same interface; the actor spawns its rank processes
            self.trainer = self._remote(FSDPTrainer).remote(self.model_path, rt.lr, rt.clip_eps, spec.training.staleness, spec.seed, 1, world_size=rt.trainer_world_size, advantage_sign=sign)
        else:
            self.trainer = self._remote(Trainer).remote(
                self.model_path if self.trainer_backend == "torch" else None, rt.lr, rt.clip_eps, spec.training.staleness, spec.seed, 1, self.trainer_backend, emulated_train_s, self.scale, advantage_sign=sign
            )
        tok = self.model_path if self.backend == "vllm" and rt.task == "calculator" else None
        self.env = self._remote(EnvWorker, max_concurrency=100000).remote(tok, w.turns, w.env_latency_s, w.initial_prompt_tokens, w.new_tokens_per_turn, self.scale, spec.seed)
        if self.backend == "emulated":
            models = self.tracker.models()
            costs = models.costs
            em = EmulatedSettings(models.predictor.colocated_engine, self.scale, spec.model.vocab, costs.role_switch_s, costs.engine_start_s, spec.workload.prefix_cache_hit)
            self.hosts = [self._remote(RolloutWorker, max_concurrency=100000).remote("emulated", None, em, self._faults()) for _ in range(rt.hosts)]
            for r in self.rec.values():
                r.actor = self.hosts[r.slot.index % len(self.hosts)]
        self.blob_ref = self.initial_blob_ref = self.trainer.weights.remote()
        self.metrics.write("setup", backend=self.backend, trainer=self.trainer_backend, slots=[s.__dict__ for s in self.table.slots], kv_store=self.kv_store)

    def _faults(self) -> tuple[tuple[str, str], ...]:
        return tuple((f.request, f.role) for f in self.rt.faults)

    def _engine_settings(self) -> EngineSettings:
        rt = self.rt
        assert self.model_path is not None
        return EngineSettings(self.model_path, rt.dtype, rt.max_model_len, rt.block_size, kv_connector=rt.kv_connector, kv_store=self.kv_store, kv_buffer_device=rt.kv_buffer_device, seed=self.spec.seed)

    async def shutdown(self) -> None:
        import ray

        for r in self.rec.values():
            if r.actor is not None:
                try:
                    await asyncio.wait_for(r.actor.shutdown.remote(), timeout=30)
                except Exception:
                    pass
        self.metrics.close()
        shutil.rmtree(self.kv_store, ignore_errors=True)
        if not self.address and ray.is_initialized():
            ray.shutdown()
