"""The simulator's cluster side: GPUs, engine instances, elastic availability, and plans executed
by the shared executor (`runtime/executor.py`) on the virtual clock.

Every action lasts the `duration_s` the planner gave it (zero for the warm initial layout)
and takes effect as the Ray runtime's does: a lend hands training GPUs to rollout, a start
brings up an engine that joins with its expansion group, a drain stops admission and hands
its requests back (they resume elsewhere with their generated tokens), a switch restarts
the engine in its new role, a stop frees the GPUs, a return gives training GPUs back (the
loan ledger measures whether in time). A group of new engines on elastic GPUs also pauses
admission for `expand_finalize_s` when it joins (the modelled cost of admitting it at
once). Mixed into `Simulator`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from models.engine import Engine
from planner.state import GPU, ClusterState, TrainerPhase, Worker
from planner.transition import Action
from runtime.executor import Progress
from runtime.naming import gpu_name, lead_gpu, node_name, worker_id
from runtime.sim.rollout import E_ACTION, E_PAUSE_END

ROLES = ("colocated", "prefill", "decode")


@dataclass
class Node:
    nid: int
    name: str
    pool: str
    gpu: str
    size: int
    available: bool = True
    slots: list = field(default_factory=list)  # owner iid per GPU, or None


@dataclass
class Instance:
    iid: int
    nid: int
    slots: tuple[int, ...]
    role: str
    pool: str
    lead: str  # GPU id of the first slot: the worker's name is worker_id(lead)
    state: str  # starting | ready | draining | switching
    engine: Engine | None = None
    gen: int = 0  # engine incarnation (a prefix cache lives as long as one engine)
    version: int = 0  # invalidates stale engine events
    weights: int = 0  # weight version the engine holds


def make_nodes(spec) -> list[Node]:
    nodes: list[Node] = []
    for gi, g in enumerate(spec.cluster.nodes):
        for n in range(g.count):
            nodes.append(Node(len(nodes), node_name(g.pool, gi, n), g.pool, g.gpu, g.gpus_per_node, True, [None] * g.gpus_per_node))
    return nodes


class ClusterSide:
    """Instances and plan execution for `Simulator` (attributes are the simulator's)."""

    # ------------------------------------------------------------------ state for the planner
    def cluster_state(self) -> ClusterState:
        gpus, workers = [], []
        lent = set(self.ledger.out)
        for node in self.nodes:
            for i in range(node.size):
                gid = gpu_name(node.name, i)
                gpus.append(GPU(gid, node.name, node.gpu, node.pool, available=node.available, borrowed=gid in lent))  # type: ignore[arg-type]
        for inst in self.instances.values():
            gids = tuple(gpu_name(self.nodes[inst.nid].name, s) for s in inst.slots)
            workers.append(Worker(worker_id(inst.lead), inst.role, gids, len(gids), inst.weights, inst.state == "draining"))  # type: ignore[arg-type]
        b = self.batches[-1] if self.batches else None  # the batch in rollout
        unfinished = (b.size - b.done) / b.size if b is not None else 1.0
        return self.executor.committed(ClusterState(tuple(gpus), tuple(workers), self.trainer_view(), self.version, min(max(unfinished, 0.0), 1.0)))

    def trainer_view(self) -> TrainerPhase:
        """The trainer as the planner sees it: waiting or not, and when it needs its GPUs."""
        ready = self.next_step < len(self.batches) and self.batches[self.next_step].done_at is not None
        waiting = self.phase == "waiting" and not ready  # a finished batch: the trainer needs its GPUs now
        elapsed = self.now - self.batches[-1].launched_at if self.batches else 0.0
        return TrainerPhase("waiting" if waiting else "training", self.timeline.needs_gpus_at(self.now, waiting, elapsed, self.predicted_s))

    # ------------------------------------------------------------------ instances
    def _instance_on(self, gid: str) -> Instance | None:
        nid, slot = self.gpu_at[gid]
        iid = self.nodes[nid].slots[slot]
        return self.instances.get(iid) if iid is not None else None

    def _worker(self, a: Action) -> Instance | None:
        inst = self._instance_on(lead_gpu(a.worker)) if a.worker else None
        return inst if inst is not None and worker_id(inst.lead) == a.worker else None

    def _retire_engine(self, inst: Instance) -> None:
        if inst.engine is not None:
            self.busy_retired[inst.role] += inst.engine.stats.busy_s
            inst.engine = None
            self._rerate(inst.nid)
        if inst.iid in self.ready[inst.role]:
            self.ready[inst.role].remove(inst.iid)

    def _rerate(self, nid: int) -> None:
        """A node's colocated engines run at the profile measured with as many engines on the
        node as it now runs (`profile_by_engines`; else a full node's), as the predictor prices
        a layout: re-rated whenever one starts or stops there."""
        if not self.colocated_by_engines:
            return
        on_node = [i for i in self.instances.values() if i.nid == nid and i.engine is not None]
        cfg = self.colocated_by_engines.get(len(on_node), self.cfg["colocated"])
        for inst in on_node:
            if inst.role == "colocated" and inst.engine.cfg is not cfg:
                inst.engine.retime(cfg, self.now)
                self._touch(inst)

    def _remove(self, inst: Instance) -> list[int]:
        resume = self._evict(inst)
        self._retire_engine(inst)
        node = self.nodes[inst.nid]
        for s in inst.slots:
            node.slots[s] = None
        inst.version += 1
        del self.instances[inst.iid]
        return resume

    def _new_instance(self, role: str, gpus: tuple[str, ...]) -> Instance | None:
        places = [self.gpu_at[g] for g in gpus]
        nid = places[0][0]
        node = self.nodes[nid]
        slots = tuple(s for _, s in places)
        if not node.available or any(n != nid for n, _ in places) or any(node.slots[s] is not None for s in slots):
            return None
        inst = Instance(self.next_iid, nid, slots, role, node.pool, gpus[0], "starting", weights=self.version)
        self.next_iid += 1
        for s in slots:
            node.slots[s] = inst.iid
        self.instances[inst.iid] = inst
        return inst

    def _serve(self, inst: Instance) -> None:
        """The instance's engine (new, or restarted in a new role) begins serving."""
        inst.state = "ready"
        inst.gen += 1
        node = self.nodes[inst.nid]
        inst.engine = Engine(self.kind_cfg.get((inst.role, node.gpu, len(inst.slots)), self.cfg[inst.role]), t=self.now)
        self._rerate(inst.nid)
        self.ready[inst.role].append(inst.iid)
        self._flush()

    def _set_elastic(self, gpus: int, gpu_type: str | None = None) -> None:
        """Make `gpus` elastic GPUs (of `gpu_type` only, if given) available: new nodes join in
        order, preempted ones are drawn at random."""
        el = [n for n in self.nodes if n.pool == "elastic" and (gpu_type is None or n.gpu == gpu_type)]
        up = [n for n in el if n.available]
        have = sum(n.size for n in up)
        resume: list[int] = []
        if gpus < have:
            for i in self.rng.permutation(len(up)):
                if have <= gpus:
                    break
                node = up[int(i)]
                node.available = False
                have -= node.size
                for iid in sorted({o for o in node.slots if o is not None}):
                    resume += self._remove(self.instances[iid])  # its plan actions fail when they end
                    self.r.preempted_instances += 1
        else:
            for node in el:
                if node.available:
                    continue
                if have + node.size > gpus:
                    break
                node.available = True
                have += node.size
        if gpu_type is not None:  # the series counts the whole elastic pool
            have = sum(n.size for n in self.nodes if n.pool == "elastic" and n.available)
        self.r.elastic_series.append((round(self.now, 1), have))
        self._resume(resume)

    # ------------------------------------------------------------------ plans
    def _execute(self, progress: Progress, warm: bool) -> None:
        for inst in self._instances_of(progress.cancelled):
            self._resume(self._remove(inst))
        joining = self._instances_of(progress.admitted)
        if joining and not warm and any(i.pool == "elastic" for i in joining):
            fin = self.costs.expand_finalize_s  # the group joins at once: admission pauses meanwhile
            self.paused_until = max(self.paused_until, self.now + fin)
            self.r.admission_pause_s += fin
            self._push(self.now + fin, E_PAUSE_END)
        for inst in joining:
            self._serve(inst)
        for inst in self._instances_of(progress.serving):
            self._serve(inst)
        for rid, a in progress.begin:
            self._begin(rid, a, warm)

    def _instances_of(self, actions: tuple[Action, ...]) -> list[Instance]:
        out = []
        for a in actions:
            inst = self._worker(a)
            if inst is not None and inst.state in ("starting", "switching"):
                out.append(inst)
        return out

    def _begin(self, rid: int, a: Action, warm: bool) -> None:
        """Begin one action now; it ends after its modelled duration (E_ACTION)."""
        inst = self._worker(a)
        ok = True
        resume: list[int] = []
        if a.kind == "lend":
            ok = self.phase == "waiting" and all(g not in self.ledger.out for g in a.gpus)
            if ok:
                self.ledger.lend(a.gpus, self.now)
                self.r.lends += len(a.gpus)
        elif a.kind == "start":
            inst = self._new_instance(a.role, a.gpus)  # type: ignore[arg-type]
            ok = inst is not None
            self.r.starts += ok
        elif a.kind == "load_weights":
            ok = inst is not None
            if ok and inst.engine is not None and not warm:
                inst.engine.stall(self.now, a.duration_s)
                self._touch(inst)
        elif a.kind == "drain":
            ok = inst is not None
            if ok:
                inst.state = "draining"
                if inst.iid in self.ready[inst.role]:
                    self.ready[inst.role].remove(inst.iid)
                resume = self._evict(inst)
        elif a.kind == "switch_role":
            ok = inst is not None
            if ok:
                resume = self._evict(inst)
                self._retire_engine(inst)
                inst.role, inst.state = a.role, "switching"  # type: ignore[assignment]
                self.r.role_switches += 1
        elif a.kind == "stop":
            if inst is not None:
                resume = self._remove(inst)
                self.r.stops += 1
        elif a.kind == "return":
            ok = all(self._instance_on(g) is None for g in a.gpus)
        self.acting[(rid, a.id)] = (a, inst if ok else None)
        self._resume(resume)
        if not ok:
            self._action_done(rid, a.id, ok=False)
            return
        self._push(self.now + (0.0 if warm else a.duration_s), E_ACTION, rid, a.id * 2 + int(warm))

    def _action_done(self, rid: int, aid: int, ok: bool = True, warm: bool = False) -> None:
        a, inst = self.acting.pop((rid, aid))
        if ok and a.kind in ("start", "load_weights", "switch_role") and inst is not None:
            ok = self.instances.get(inst.iid) is inst  # preempted meanwhile: the action did not land
            if ok and a.kind == "load_weights":
                inst.weights = self.version
        if ok and a.kind == "return":
            self.r.returns += len(a.gpus)
            if self.ledger.returned(a.gpus, self.now) and self.phase == "returning":
                self._start_training()
        self._execute(self.executor.complete(rid, aid, ok), warm)
