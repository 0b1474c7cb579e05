"""ClusterState invariants and the aggregation of interchangeable GPUs."""

from __future__ import annotations

import pytest

from planner.state import GPU, ClusterState, StateError, TrainerPhase, Worker, initial_state


def gpus() -> tuple[GPU, ...]:
    return (
        GPU("a/0", "a", "H800", "rollout"), GPU("a/1", "a", "H800", "rollout"),
        GPU("b/0", "b", "H800", "rollout"), GPU("b/1", "b", "H800", "rollout", available=False),
        GPU("t/0", "t", "H800", "training"), GPU("t/1", "t", "H800", "training", borrowed=True),
    )


@pytest.mark.parametrize(
    "workers, message",
    [
        ((Worker("x", "decode", ("a/0",), 1), Worker("y", "prefill", ("a/0",), 1)), "belongs to workers"),
        ((Worker("x", "decode", ("a/1", "b/0"), 2),), "spans nodes"),
        ((Worker("x", "decode", ("b/1",), 1),), "unavailable GPU"),
        ((Worker("x", "decode", ("t/0",), 1),), "not lent"),
        ((Worker("x", "decode", ("a/0",), 2),), "TP 2 but 1 GPUs"),
        ((Worker("x", "decode", ("zz",), 1),), "unknown GPU"),
        ((Worker("x", "decode", ("a/0",), 1), Worker("x", "decode", ("a/1",), 1)), "appears twice"),
    ],
)
def test_invariants_are_checked_on_construction(workers, message) -> None:
    with pytest.raises(StateError, match=message):
        ClusterState(gpus(), workers)


def test_valid_state_and_groups() -> None:
    s = ClusterState(gpus(), (Worker("x", "decode", ("a/0", "a/1"), 2), Worker("y", "colocated", ("t/1",), 1)), TrainerPhase("waiting", 10.0))
    groups = {g.key: g for g in s.groups()}
    assert groups[("a", "rollout", "H800")].usable == 2
    assert groups[("b", "rollout", "H800")].usable == 1  # b/1 is gone
    assert groups[("t", "training", "H800")].usable == 2
    assert s.usable_count("rollout") == 3 and len(s.borrowed_gpus()) == 1
    with pytest.raises(StateError, match="only training GPUs are lent"):
        ClusterState((GPU("e/0", "e", "H800", "elastic", borrowed=True),))


def test_with_availability_keeps_busy_gpus_and_drops_lost_workers() -> None:
    s = initial_state([(2, 2, "H800", "elastic")])
    s = ClusterState(s.gpus, (Worker("w", "decode", ("elastic0-1/0", "elastic0-1/1"), 2),))
    shrunk = s.with_availability("elastic", 2)
    assert shrunk.usable_count("elastic") == 2 and [w.id for w in shrunk.workers] == ["w"]  # idle node went first
    gone = s.with_availability("elastic", 0)
    assert gone.workers == () and gone.usable_count() == 0
