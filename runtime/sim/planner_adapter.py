"""Planner policies inside the simulator: Snapshot -> planner ClusterState -> Step -> Changes.

The planner is pure and knows GPUs and workers by stable string ids; the simulator knows
nodes and instances by integers. This adapter translates both ways and nothing else:
start / switch_role / stop actions become simulator changes (their delays are modelled by
the simulator from the same transition costs); drain is part of switch and stop (the
requests keep their progress and resume elsewhere); lend / return are the simulator's
borrow and recall; load_weights is part of an engine start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from models.builder import ExperimentModels
from runtime.sim.layout import Change, PolicyStep, Snapshot

EVENT_NAMES = {"start": "initial", "availability": "availability", "batch": "rollout_step", "train_begin": "training_begin", "train_end": "training_end"}


def worker_id(iid: int) -> str:
    return f"i{iid}"


@dataclass
class PlannerPolicy:
    """Wraps `planner.policies.get_policy(name)` for the simulator."""

    name: str
    models: ExperimentModels
    node_names: dict[int, str]
    _policy: object = field(init=False, repr=False)
    _inputs: object = field(init=False, repr=False)
    _pred: dict = field(default_factory=dict, repr=False)
    failures: int = 0  # decisions the planner could not make (kept the current layout)

    def __post_init__(self) -> None:
        from planner.inputs import planning_inputs
        from planner.policies import get_policy

        spec = self.models.spec
        total = sum(g.count * g.gpus_per_node for g in spec.cluster.nodes)
        self._policy = get_policy(self.name)
        self._inputs = planning_inputs(self.models, total)
        self._by_name = {v: k for k, v in self.node_names.items()}

    def _predicted_batch_s(self, instances: int) -> float:
        n = max(instances, 1)
        if n not in self._pred:
            self._pred[n] = self.models.predictor.colocated(n).completion_s
        return self._pred[n]

    def state(self, snap: Snapshot) -> object:
        from planner.state import GPU, ClusterState, TrainerPhase, Worker

        owners: dict[int, list] = {}
        for inst in snap.instances:
            owners.setdefault(inst.nid, []).append(inst)
        gpus = []
        workers = []
        for node in snap.nodes:
            name = self.node_names[node.nid]
            insts = sorted(owners.get(node.nid, []), key=lambda i: i.iid)
            slot_owner: dict[int, int] = {}
            for inst in insts:
                for s in inst.slots:
                    slot_owner[s] = inst.iid
            for i in range(node.gpus):
                borrowed = node.pool == "training" and i in slot_owner
                gpus.append(GPU(f"{name}/{i}", name, node.gpu, node.pool, available=node.available, borrowed=borrowed))  # type: ignore[arg-type]
            for inst in insts:
                workers.append(Worker(worker_id(inst.iid), inst.role, tuple(f"{name}/{s}" for s in inst.slots), inst.gpus, weight_version=snap.version))  # type: ignore[arg-type]
        r_frac = min(max(snap.batch_unfinished / max(snap.batch_size, 1), 0.0), 1.0)
        if snap.trainer_phase == "idle":
            wait = snap.next_training_in_s
            if wait is None:
                live = sum(1 for i in snap.instances if not i.borrowed)
                wait = r_frac * self._predicted_batch_s(live)
            trainer = TrainerPhase("waiting", snap.now + wait)
        else:
            trainer = TrainerPhase("training", snap.now)
        return ClusterState(tuple(gpus), tuple(workers), trainer, snap.version, r_frac)

    def decide(self, snap: Snapshot) -> PolicyStep:
        from planner.policies import PlanningError

        state = self.state(snap)
        try:
            step = self._policy.decide(state, self._inputs, snap.now, EVENT_NAMES.get(snap.event, snap.event))  # type: ignore[attr-defined]
        except PlanningError as exc:
            # no decision this time (e.g. the solver's time limit ran out): keep the current layout
            self.failures += 1
            mode = "disaggregated" if any(i.role != "colocated" for i in snap.instances) else "colocated"
            return PolicyStep((), mode, {"error": str(exc)})
        changes: list[Change] = []
        for a in step.plan.actions:
            if a.kind == "start":
                node, slot = a.gpus[0].split("/")
                changes.append(Change("start", a.role, nid=self._by_name[node], gpu_slots=tuple(int(g.split("/")[1]) for g in a.gpus)))
            elif a.kind == "switch_role" and a.worker and a.worker.startswith("i"):
                changes.append(Change("switch", a.role, iid=int(a.worker[1:])))
            elif a.kind == "stop" and a.worker and a.worker.startswith("i"):
                changes.append(Change("stop", iid=int(a.worker[1:])))
        d = step.decision
        info = {
            "ratio": d.ratio, "applied": d.applied, "lent_gpus": d.lent_gpus, "predicted_s": round(d.predicted_completion_s, 2),
            "status": d.proof.status, "gap": d.proof.gap, "solve_ms": round(d.proof.solve_ms, 2), "reason": d.reason,
        }
        return PolicyStep(tuple(changes), d.mode, info)
