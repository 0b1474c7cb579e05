"""The trainer loop and weight sync: train each batch once its GPUs are home, push the new
weights to every engine, and check that each engine really serves them.

When a batch is ready the trainer needs its GPUs: the policy decides (`training_begin`)
and its recall returns what is lent; the step starts when the loan ledger
(`runtime/loans.py`) says the last GPU is home, and a late one is counted with its delay.
Only if no plan brings a GPU back does the loop take it back itself (a forced return,
counted). After the step the new weights go to every live engine, never interleaved with
an engine start's own weight load, and every engine scores a fixed probe as the trainer
does (`weight_sync.PROBE_TOKENS`). Mixed into `Controller`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from runtime.ray_runtime.records import actor_errors
from runtime.ray_runtime.slot_table import SlotRuntime
from runtime.ray_runtime.trainer import TrainSample

WEIGHTS_MATCH_TOL = 1e-3  # max |log p| difference between an engine and the trainer at equal weights (fp32)


def step_detail(row: dict[str, Any]) -> dict[str, Any]:
    """One training step as `pearl train --json` lists it (steps_detail) and --plot draws it."""
    def num(key: str) -> float | None:  # the emulated trainer reports no loss or ratio
        return None if row.get(key) is None else round(float(row[key]), 6)

    return {"step": row["step"], "weight_version": row["weight_version"], "mean_reward": num("mean_reward"), "loss": num("train_loss"),
            "importance_ratio": num("train_ratio_mean"), "rollout_s": num("rollout_s"), "tok_per_s": num("tok_per_s"), "mode": row["mode"], "ratio": row["ratio"],
            "kinds": row.get("kinds", "")}


class TrainerLoop:
    """Training steps and weight pushes for `Controller` (attributes are the controller's)."""

    async def _train_loop(self, steps: int, queue: asyncio.Queue, version_event: asyncio.Event) -> None:
        for _ in range(steps):
            b, trajs, tel = await queue.get()
            self.ready_batches -= 1
            self.trainer_phase = "returning"
            home = self.ledger.trainer_needs(self.now())
            self.gpus_home.clear()
            await self.decide("training_begin")  # its recall brings lent GPUs back
            if not home:
                await self._await_gpus_home()
            self.trainer_phase = "training"
            samples = [TrainSample(t.id, t.group, tuple(t.tokens), tuple(t.mask), tuple(t.logprobs), float(t.reward or 0.0), t.min_version if t.min_version < 1 << 29 else self.version, max(t.max_version, -1)) for t in trajs]
            metrics_ref, blob_ref = self.trainer.train_step.options(num_returns=2).remote(samples, self.version)
            m = await metrics_ref
            await self._push_weights(blob_ref, int(m["version"]))
            version_event.set()
            self.trainer_phase = "waiting"
            rewards = [float(t.reward or 0.0) for t in trajs]
            self.rewards.extend(rewards)
            row = {"step": b, "weight_version": self.version, "mean_reward": float(np.mean(rewards)) if rewards else 0.0, "rollout_s": tel.rollout_s, "gen_tokens": tel.generated_tokens, "tok_per_s": tel.generated_tokens / max(tel.rollout_s / self.scale, 1e-9), "mode": tel.mode, "ratio": tel.ratio, "kinds": tel.kinds, "predicted_s": tel.predicted_s, "pred_error": tel.error, **{f"train_{k}": v for k, v in m.items()}}
            self.metrics.write("train_step", **row)
            self.steps_detail.append(step_detail(row))
            if self.on_step:
                self.on_step(row)
            await self.decide("training_end")

    async def _await_gpus_home(self) -> None:
        """Wait for the planned returns; past a generous bound take the GPUs back (forced, counted)."""
        bound = 2.0 * (self.inputs.costs.stop_s + self.inputs.costs.return_s) / self.scale + 5.0
        try:
            await asyncio.wait_for(self.gpus_home.wait(), timeout=bound)
            return
        except asyncio.TimeoutError:
            pass
        out = self.ledger.lent
        self.forced_returns += len(out)
        self.metrics.write("forced_return", gpus=list(out), after_s=round(bound, 3))
        for g in out:
            r = self.rec[g]
            await self._drain(r)
            r.status, r.parked = "parked", r.actor is not None
        self.ledger.returned(out, self.now())

    async def _push_weights(self, blob_ref: Any, version: int) -> None:
        async with self.weights_lock:
            await self._push_weights_locked(blob_ref, version)

    async def _push_weights_locked(self, blob_ref: Any, version: int) -> None:
        if self.rt.control == "frozen_engines":  # negative control: the engines keep their initial weights
            blob_ref = self.initial_blob_ref
        actors = {id(r.actor): r.actor for r in self.rec.values() if r.actor is not None and r.slot.gpu not in self.table.dead}
        import ray

        res = await asyncio.gather(*(a.load_weights.remote(blob_ref, version) for a in actors.values()), return_exceptions=True)
        failed = 0  # pushes that failed on a worker still meant to serve (not one being stopped)
        errors: list[str] = []
        for a, x in zip(actors.values(), res):
            if isinstance(x, BaseException):
                live = [r for r in self.rec.values() if r.actor is a and r.status in ("active", "draining", "switching")]
                failed += bool(live)
                if live:
                    errors.append(f"{live[0].worker_id}: {type(x).__name__}: {x}"[:500])
                    self.log(f"weight push to {live[0].worker_id} failed: {type(x).__name__}: {x}")
                for r in live:
                    if isinstance(x, actor_errors()):
                        self._mark_dead(r, f"died during a weight push: {type(x).__name__}")
        self.blob_ref, self.version = blob_ref, version
        for r in self.rec.values():
            if r.actor is not None and r.status in ("active", "parked", "starting") and r.slot.gpu not in self.table.dead:
                r.version = version
        self.metrics.write("weights_pushed", version=version, workers=len(actors), errors=failed, stopped_meanwhile=sum(isinstance(x, BaseException) for x in res) - failed, error_messages=errors)
        live = [r for r in self.rec.values() if r.actor is not None and r.status in ("active", "parked") and r.slot.gpu not in self.table.dead]
        await self._verify_weights(live, version, "push")
        del ray

    async def _verify_weights(self, slots: list[SlotRuntime], version: int, when: str) -> None:
        """Every engine that serves must score a fixed probe as the trainer does at the weights
        it was given (weight_sync.PROBE_TOKENS): after each push, and when an engine starts."""
        from runtime.ray_runtime.weight_sync import PROBE_TOKENS

        if not slots:
            return
        expected = np.asarray(await self.trainer.probe_logprobs.remote(version))
        # a worker lost while the trainer scored the probe (its node left: its actor is gone) is
        # checked when it starts again; asking it would end the run (fresh clone, 2026-12-02)
        asked = [r for r in slots if r.actor is not None]
        answers = await asyncio.gather(*(r.actor.probe_logprobs.remote(r.slot_no, PROBE_TOKENS) for r in asked), return_exceptions=True)
        compared, mismatched, max_diff = 0, [], 0.0
        for r, got in zip(asked, answers):
            if isinstance(got, BaseException) or len(got) != len(expected):
                continue  # stopped or re-roled meanwhile: it is checked again when it starts
            compared += 1
            diff = float(np.max(np.abs(np.asarray(got) - expected)))
            max_diff = max(max_diff, diff)
            if diff > WEIGHTS_MATCH_TOL:
                mismatched.append(r.worker_id)
        self.weights_verified += compared - len(mismatched)
        self.weights_mismatched += len(mismatched)
        self.metrics.write("weights_check", when=when, version=version, engines=len(slots), compared=compared, mismatched=mismatched, probe_max_diff=round(max_diff, 9))
        if mismatched:
            self.log(f"weights check ({when}, v{version}): {mismatched} differ from the trainer by up to {max_diff:.3g} in log-prob")

    async def worker_versions(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rec.values():
            if r.actor is not None and r.status == "active":
                try:
                    vs = await r.actor.versions.remote()
                    out[r.worker_id] = int(vs.get(r.slot_no, -1))
                except actor_errors():
                    pass
        return out

