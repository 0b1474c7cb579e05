"""The Ray runtime's pure slot table (runtime/ray_runtime/slot_table.py): slot records in,
the planner's ClusterState out; action -> slot resolution; serving slots; mode and ratio.
No Ray, no clock."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planner.state import ClusterState, StateError, TrainerPhase, Worker, initial_state, state_from_cluster_spec
from planner.transition import Action, TransitionPlan
from runtime.executor import Executor
from runtime.ray_runtime.resources import make_slots
from runtime.ray_runtime.slot_table import SERVING_STATES, SlotTable

TRAINER = TrainerPhase("waiting", 30.0)

# GPU ids: rollout0-0/0..3, training1-0/0..1, elastic2-0/0..3
R = [f"rollout0-0/{i}" for i in range(4)]
T = [f"training1-0/{i}" for i in range(2)]
E = [f"elastic2-0/{i}" for i in range(4)]


def base() -> ClusterState:
    return initial_state([(1, 4, "H800", "rollout"), (1, 2, "H800", "training"), (1, 4, "H800", "elastic")])


def table() -> SlotTable:
    b = base()
    return SlotTable(b, make_slots(b, cores=2))


def put(t: SlotTable, lead: str, role: str | None, status: str = "active", gpus: tuple[str, ...] | None = None, version: int = 0):
    r = t.rec[lead]
    r.role, r.status, r.gpus, r.version = role, status, gpus if gpus is not None else (lead,), version
    return r


def st(t: SlotTable, lent: set[str] | frozenset[str] = frozenset(), version: int = 3, unfinished: float = 0.5) -> ClusterState:
    return t.state(TRAINER, version, unfinished, set(lent))


def workers(s: ClusterState) -> dict[str, Worker]:
    return {w.id: w for w in s.workers}


# ----------------------------------------------------------------------------- construction
def test_table_from_cluster_spec_has_one_slot_per_gpu_and_counts_elastic() -> None:
    spec = SimpleNamespace(nodes=[SimpleNamespace(count=1, gpus_per_node=4, gpu="H800", pool="rollout"),
                                  SimpleNamespace(count=2, gpus_per_node=2, gpu="H800", pool="elastic")])
    b = state_from_cluster_spec(spec, TRAINER)
    slots = make_slots(b, cores=2)
    t = SlotTable(b, slots)
    assert list(t.rec) == [g.id for g in b.gpus]
    assert [t.rec[g.id].slot_no for g in b.gpus] == list(range(len(b.gpus)))
    assert t.elastic_total == t.elastic_available == 4
    assert all(r.status == "down" and r.role is None for r in t.rec.values())
    assert t.rec[b.gpus[0].id].worker_id == f"w:{b.gpus[0].id}"
    s = st(t)
    assert s.workers == () and all(g.available and not g.borrowed for g in s.gpus)
    assert (s.trainer, s.weight_version, s.unfinished_fraction) == (TRAINER, 3, 0.5)


# ----------------------------------------------------------------------------- state()
def test_tp2_lead_slot_is_one_worker_named_by_lead_gpu() -> None:
    t = table()
    put(t, R[2], "decode", gpus=(R[2], R[3]), version=7)
    s = st(t)
    assert workers(s) == {f"w:{R[2]}": Worker(f"w:{R[2]}", "decode", (R[2], R[3]), 2, 7, False)}
    assert s.owner_of() == {R[2]: f"w:{R[2]}", R[3]: f"w:{R[2]}"}


@pytest.mark.parametrize("status", SERVING_STATES)
def test_serving_statuses_appear_and_only_draining_is_draining(status: str) -> None:
    t = table()
    put(t, R[0], "colocated", status)
    (w,) = st(t).workers
    assert w.id == f"w:{R[0]}" and w.draining is (status == "draining")


@pytest.mark.parametrize("status", ["down", "parked"])
def test_down_or_parked_slot_is_not_a_worker(status: str) -> None:
    t = table()
    put(t, R[0], "colocated", status)
    put(t, T[0], "decode", status)  # a returned training slot keeps its role while parked
    assert st(t, lent={T[0]}).workers == ()


def test_slot_without_role_or_gpus_is_not_a_worker() -> None:
    t = table()
    put(t, R[0], None)
    put(t, R[1], "decode", gpus=())
    assert st(t).workers == ()


def test_training_slot_worker_appears_only_while_lent() -> None:
    t = table()
    put(t, T[0], "decode")
    s = st(t)
    assert s.workers == ()
    assert not any(g.borrowed for g in s.gpus)
    s = st(t, lent={T[0]})
    assert workers(s) == {f"w:{T[0]}": Worker(f"w:{T[0]}", "decode", (T[0],), 1, 0, False)}
    assert [g.id for g in s.gpus if g.borrowed] == [T[0]]


def test_lent_marks_only_training_gpus_borrowed() -> None:
    t = table()
    s = st(t, lent={T[1], R[0], E[0]})  # a non-training id in `lent` must not become borrowed
    assert [g.id for g in s.gpus if g.borrowed] == [T[1]]


def test_fewer_elastic_gpus_makes_the_tail_unavailable_and_drops_its_workers() -> None:
    t = table()
    put(t, E[0], "prefill")
    put(t, E[2], "decode", gpus=(E[2], E[3]))  # TP2 straddling the cut: its follower goes away
    put(t, R[0], "colocated")
    assert set(workers(st(t))) == {f"w:{E[0]}", f"w:{E[2]}", f"w:{R[0]}"}
    t.elastic_available = 3
    assert t.gone_elastic() == {E[3]}
    s = st(t)
    assert {g.id for g in s.gpus if not g.available} == {E[3]}
    assert set(workers(s)) == {f"w:{E[0]}", f"w:{R[0]}"}
    t.elastic_available = 0
    s = st(t)
    assert {g.id for g in s.gpus if not g.available} == set(E)
    assert set(workers(s)) == {f"w:{R[0]}"}
    t.elastic_available = t.elastic_total
    assert t.gone_elastic() == set() and len(st(t).workers) == 3


def test_dead_slots_are_excluded_from_state_and_serving() -> None:
    t = table()
    put(t, R[0], "decode")
    put(t, R[1], "decode")
    t.dead.add(R[0])
    assert set(workers(st(t))) == {f"w:{R[1]}"}
    assert [r.slot.gpu for r in t.serving("decode")] == [R[1]]
    assert st(t).gpu(R[0]).available  # a dead engine does not make its GPU unavailable


def test_unfinished_fraction_is_clamped() -> None:
    t = table()
    assert st(t, unfinished=-0.2).unfinished_fraction == 0.0
    assert st(t, unfinished=1.7).unfinished_fraction == 1.0


def test_training_tp2_lent_on_one_gpu_only_is_rejected_by_the_planner_state() -> None:
    # the table checks only the lead GPU against `lent`; the planner's invariant check catches the rest
    t = table()
    put(t, T[0], "decode", gpus=(T[0], T[1]))
    with pytest.raises(StateError):
        st(t, lent={T[0]})
    assert len(st(t, lent={T[0], T[1]}).workers) == 1


# ----------------------------------------------------------------------------- of()
def test_of_resolves_worker_actions_by_lead_gpu_and_gpu_actions_by_first_gpu() -> None:
    t = table()
    put(t, R[2], "decode", gpus=(R[2], R[3]))
    assert t.of(Action(0, "drain", f"w:{R[2]}", (R[2], R[3]))) is t.rec[R[2]]
    assert t.of(Action(1, "stop", f"w:{R[2]}")) is t.rec[R[2]]  # the worker name alone suffices
    assert t.of(Action(2, "start", f"w:{R[3]}", (R[2], R[3]), "decode")) is t.rec[R[3]]  # the name wins over gpus
    assert t.of(Action(3, "lend", None, (T[1], T[0]))) is t.rec[T[1]]
    assert t.of(Action(4, "start", "new-0", (E[1], E[2]), "prefill")) is t.rec[E[1]]  # non-canonical name: first GPU
    with pytest.raises(KeyError):
        t.of(Action(5, "return"))
    with pytest.raises(KeyError):
        t.of(Action(6, "stop", "w:nowhere/0"))


# ----------------------------------------------------------------------------- serving / mode / ratio
def test_serving_lists_only_active_slots_of_the_role() -> None:
    t = table()
    put(t, R[0], "decode")
    put(t, R[1], "decode", "draining")
    put(t, R[2], "decode", "starting")
    put(t, R[3], "prefill")
    put(t, E[0], "decode")
    put(t, E[1], "decode", "parked")
    assert [r.slot.gpu for r in t.serving("decode")] == [R[0], E[0]]
    assert [r.slot.gpu for r in t.serving("prefill")] == [R[3]]
    assert t.serving("colocated") == []


def test_mode_and_ratio_colocated() -> None:
    t = table()
    put(t, R[0], "colocated")
    put(t, R[1], "colocated")
    put(t, R[2], "colocated", "draining")  # only active slots count
    put(t, R[3], "prefill")  # prefill without decode is no P/D
    for wanted in ("colocated", "disaggregated"):
        assert t.mode(wanted) == "colocated"
    assert t.ratio("colocated") == "2C"


def test_mode_and_ratio_disaggregated() -> None:
    t = table()
    put(t, R[0], "prefill")
    put(t, R[1], "decode")
    put(t, R[2], "decode")
    put(t, R[3], "decode", "starting")
    for wanted in ("colocated", "disaggregated"):
        assert t.mode(wanted) == "disaggregated"
    assert t.ratio("disaggregated") == "1P2D"


def test_mixed_mode_follows_what_is_wanted() -> None:
    t = table()
    put(t, R[0], "prefill")
    put(t, R[1], "decode")
    put(t, R[2], "colocated")
    assert t.mode("disaggregated") == "disaggregated"
    assert t.mode("colocated") == "colocated"
    assert t.ratio("disaggregated") == "1P1D"
    assert t.ratio("colocated") == "1C"


def test_empty_table_is_colocated_zero() -> None:
    t = table()
    assert t.mode("disaggregated") == "colocated"
    assert t.ratio("colocated") == "0C" and t.ratio("disaggregated") == "0P0D"


# ----------------------------------------------------------------------------- with the executor
def test_executor_committed_applies_a_pending_stop_to_the_table_state() -> None:
    t = table()
    put(t, R[0], "decode")
    put(t, R[2], "prefill", gpus=(R[2], R[3]))
    # drain then stop the TP2 prefill worker (named freely: the executor canonicalises by lead GPU)
    plan = TransitionPlan((Action(0, "drain", "old", (R[2], R[3]), "prefill"),
                           Action(1, "stop", "old", (R[2], R[3]), "prefill", after=(0,))), 0, 1, 0, 0, 0)
    ex = Executor()
    rid, prog = ex.submit(plan)
    assert [a.id for _, a in prog.begin] == [0]
    assert t.of(prog.begin[0][1]) is t.rec[R[2]]
    t.rec[R[2]].status = "draining"  # what the runtime does when the drain begins
    s = st(t)
    assert workers(s)[f"w:{R[2]}"].draining
    c = ex.committed(s)
    assert set(workers(c)) == {f"w:{R[0]}"}  # the pending stop is already applied
    assert set(workers(s)) == {f"w:{R[0]}", f"w:{R[2]}"}  # the table's own state is unchanged
    prog = ex.complete(rid, 0, True)
    assert [a.id for _, a in prog.begin] == [1]
    assert set(workers(ex.committed(st(t)))) == {f"w:{R[0]}", f"w:{R[2]}"}  # a running stop is not yet done
    ex.complete(rid, 1, True)
    t.rec[R[2]].status = "down"
    assert not ex.busy and set(workers(ex.committed(st(t)))) == {f"w:{R[0]}"}


def mixed_table() -> tuple[SlotTable, list[str], list[str]]:
    """Elastic H20 (elastic2-0) and A100 (elastic3-0), four each, beside reserved H800."""
    b = initial_state([(1, 4, "H800", "rollout"), (1, 2, "H800", "training"), (1, 4, "H20", "elastic"), (1, 4, "A100", "elastic")])
    return SlotTable(b, make_slots(b, cores=2)), [f"elastic2-0/{i}" for i in range(4)], [f"elastic3-0/{i}" for i in range(4)]


def test_each_elastic_type_follows_its_own_availability() -> None:
    """`elastic_traces`: a change of one type's count moves only that type's GPUs; an untyped
    change (one trace for the pool) takes the pool back in slot order."""
    t, h20, a100 = mixed_table()
    assert t.set_elastic(2, "H20") and t.gone_elastic() == set(h20[2:])
    assert not t.set_elastic(2, "H20")  # the same count again: no change
    assert not t.set_elastic(4, "A100")  # the type's whole pool: what already exists
    assert t.set_elastic(1, "A100") and t.gone_elastic() == set(h20[2:]) | set(a100[1:])
    assert t.elastic_now() == {"H20": 2, "A100": 1}
    s = st(t)
    assert {g.id for g in s.gpus if not g.available} == set(h20[2:]) | set(a100[1:])
    assert t.set_elastic(6) and t.gone_elastic() == set(a100[2:]) and t.elastic_now() == 6


def test_a_tp_group_names_its_slots_kind_and_bindings() -> None:
    """A worker leading a TP group is one engine of (its GPUs' type, the group's size), whose
    process holds every slot of the group and binds each rank (vLLM CPU '0|1', CUDA '0,1')."""
    from runtime.ray_runtime.resources import group_env

    t, h20, _ = mixed_table()
    r = put(t, h20[0], "decode", gpus=(h20[0], h20[1]))
    group = t.group_slots(r)
    assert [s.gpu for s in group] == h20[:2] and t.kind_of(r) == ("H20", 2)
    assert t.kind_of(put(t, R[0], "colocated")) == ("H800", 1)
    cpu, cuda = group_env(group, "cpu"), group_env(group, "cuda")
    assert cpu["VLLM_CPU_OMP_THREADS_BIND"] == f"{group[0].binding}|{group[1].binding}"
    assert cuda["CUDA_VISIBLE_DEVICES"] == f"{group[0].binding},{group[1].binding}"
    assert group_env(group[:1], "cpu")["VLLM_CPU_OMP_THREADS_BIND"] == group[0].binding
