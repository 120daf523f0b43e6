"""The coordinator's assignor on its own: every subscribed partition goes to a member subscribed to
its topic, the result is even (no partition could move to an eligible member with two fewer) and
sticky (with identical subscriptions, a member joining or leaving moves only what must move)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.groups.assignor import assign

TOPICS = ["a", "b", "c"]

subscriptions = st.dictionaries(
    st.sampled_from([f"m{i}" for i in range(8)]),
    st.lists(st.sampled_from(TOPICS), min_size=0, max_size=3, unique=True),
    min_size=0,
    max_size=8,
)
counts = st.fixed_dictionaries({t: st.integers(0, 12) for t in TOPICS})


def assert_complete_and_even(
    subs: dict[str, list[str]], parts: dict[str, int], target: dict[tuple[str, int], str]
) -> None:
    wanted = {(t, p) for m in subs.values() for t in m for p in range(parts[t])}
    assert set(target) == wanted
    load = {m: 0 for m in subs}
    for (topic, _), member in target.items():
        assert topic in subs[member]
        load[member] += 1
    for (topic, _), member in target.items():
        for other in subs:
            if topic in subs[other]:
                assert load[member] - load[other] < 2, (subs, parts, target)


@settings(max_examples=200, deadline=None)
@given(subs=subscriptions, parts=counts, previous=subscriptions)
def test_every_partition_goes_to_a_subscriber_and_the_result_is_even(
    subs: dict[str, list[str]], parts: dict[str, int], previous: dict[str, list[str]]
) -> None:
    before = assign(previous, parts, {})
    target = assign(subs, parts, before)
    assert_complete_and_even(subs, parts, target)
    assert assign(subs, parts, before) == target  # deterministic


@settings(max_examples=100, deadline=None)
@given(members=st.integers(1, 7), partitions=st.integers(0, 30))
def test_with_identical_subscriptions_loads_differ_by_at_most_one_and_joins_move_little(
    members: int, partitions: int
) -> None:
    subs = {f"m{i}": ["a"] for i in range(members)}
    parts = {"a": partitions}
    before = assign(subs, parts, {})
    loads = sorted(list(before.values()).count(m) for m in subs)
    assert loads[-1] - loads[0] <= 1
    joined = assign({**subs, "new": ["a"]}, parts, before)
    moved = {tp for tp in before if joined[tp] != before[tp]}
    # Only what the newcomer takes moves; nothing moves between the members already there.
    assert all(joined[tp] == "new" for tp in moved)
    assert len(moved) == partitions // (members + 1)
    # A member leaving: only its partitions move.
    left = assign({m: ["a"] for m in subs if m != "m0"}, parts, before)
    assert {tp for tp in before if left.get(tp) != before[tp]} == {
        tp for tp, m in before.items() if m == "m0"
    }
