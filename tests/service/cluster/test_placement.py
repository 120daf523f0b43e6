"""The cluster's pure rules (coordinator.cluster.placement): partition leadership spread evenly
over the live brokers and moved no more than that takes; coordinators by rendezvous hashing."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from coordinator.cluster.placement import coordinator_of, moves


def _applied(leaders: dict[tuple[str, int], int | None], live: list[int]) -> dict:
    return {**leaders, **moves(leaders, live)}


def test_unled_partitions_are_spread_evenly_topic_by_topic() -> None:
    leaders = {(t, p): None for t in ("a", "b") for p in range(6)}
    placed = _applied(leaders, [0, 1, 2])
    for topic in ("a", "b"):
        assert Counter(b for (t, _), b in placed.items() if t == topic) == {0: 2, 1: 2, 2: 2}


def test_a_dead_brokers_partitions_move_and_no_other() -> None:
    placed = _applied({("t", p): None for p in range(9)}, [0, 1, 2])
    moved = moves(placed, [0, 2])
    assert set(moved) == {k for k, b in placed.items() if b == 1}
    after = {**placed, **moved}
    assert Counter(after.values()) in ({0: 5, 2: 4}, {0: 4, 2: 5})


def test_a_broker_that_joins_takes_its_share_and_nothing_else_moves() -> None:
    placed = _applied({("t", p): None for p in range(8)}, [0, 1])
    moved = moves(placed, [0, 1, 2])
    assert set(moved.values()) == {2}
    assert len(moved) == 2  # 8 over 3: 3, 3, 2
    assert moves({**placed, **moved}, [0, 1, 2]) == {}  # stable once placed


def test_single_partition_topics_balance_over_the_whole_cluster() -> None:
    placed = _applied({(f"t{i}", 0): 0 for i in range(6)}, [0, 1, 2])
    assert Counter(placed.values()) == {0: 2, 1: 2, 2: 2}


def test_nothing_moves_without_a_live_broker() -> None:
    assert moves({("t", 0): 1}, []) == {}


@given(
    st.dictionaries(
        st.tuples(st.sampled_from("abc"), st.integers(0, 7)), st.none() | st.integers(0, 4)
    ),
    st.sets(st.integers(0, 4), min_size=1),
)
def test_placement_is_even_and_settled(leaders: dict, live: set[int]) -> None:
    placed = _applied(leaders, sorted(live))
    assert all(b in live for b in placed.values())
    assert moves(placed, sorted(live)) == {}
    for topic in "abc":
        counts = Counter(b for (t, _), b in placed.items() if t == topic)
        per = [counts.get(b, 0) for b in live]
        assert max(per) - min(per) <= 1
    total = [Counter(placed.values()).get(b, 0) for b in live]
    assert max(total) - min(total) <= 1
    # A partition whose leader was live moved only for balance: never more than needed.
    kept = [k for k, b in leaders.items() if b in live]
    assert sum(placed[k] != leaders[k] for k in kept) <= len(leaders)


def test_coordinators_spread_and_move_only_from_a_dead_broker() -> None:
    keys = [f"group-{i}" for i in range(300)]
    before = {k: coordinator_of(k, [0, 1, 2]) for k in keys}
    assert min(Counter(before.values()).values()) > 60
    after = {k: coordinator_of(k, [0, 2]) for k in keys}
    assert {k for k in keys if before[k] != after[k]} == {k for k in keys if before[k] == 1}
