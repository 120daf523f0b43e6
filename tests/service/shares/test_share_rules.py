"""A share partition's rules without I/O (`coordinator.shares.inflight`), as Kafka's
SharePartition keeps them: acquisition and redelivery, ACCEPT / RELEASE / REJECT / GAP / RENEW,
the delivery-count limit, lock expiry, a member's release, acknowledgements held by a
transaction, the start offset's advance, the in-flight limit; and, drawn by hypothesis, the
invariants every sequence of calls keeps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.shares.errors import InvalidRecordState
from coordinator.shares.inflight import (
    ACCEPT,
    ACKNOWLEDGED,
    ACQUIRED,
    ARCHIVED,
    AVAILABLE,
    GAP,
    REJECT,
    RELEASE,
    RENEW,
    Acquired,
    Limits,
    LogBatch,
    ShareState,
)

LIMITS = Limits(delivery_limit=3, lock_ms=1000, max_in_flight=100)


def batches(*ranges: tuple[int, int], undeliverable: tuple[int, ...] = ()) -> list[LogBatch]:
    return [LogBatch(a, b, a not in undeliverable) for a, b in ranges]


def states(state: ShareState) -> dict[int, int]:
    return {o: s.state for s in state.spans for o in range(s.first, s.last + 1)}


def test_new_records_are_acquired_a_whole_batch_at_a_time() -> None:
    state = ShareState(0, 0)
    got = state.acquire("a", batches((0, 4), (5, 9), (10, 14)), 7, now=0, limits=LIMITS)
    # 7 records asked: the second batch is taken whole (Kafka's batch-optimized mode).
    assert got == [Acquired(0, 9, 1)]
    assert state.end == 10 and state.start == 0


def test_record_limit_mode_takes_exactly_max_records() -> None:
    state = ShareState(0, 0)
    got = state.acquire("a", batches((0, 9)), 3, 0, LIMITS, whole_batches=False)
    assert got == [Acquired(0, 2, 1)]
    assert state.end == 3
    # The rest of the batch comes next time, from the end offset.
    assert state.acquire("b", batches((0, 9)), 3, 0, LIMITS, whole_batches=False) == [
        Acquired(3, 5, 1)
    ]


def test_accept_moves_the_start_offset_past_what_is_done() -> None:
    state = ShareState(0, 0)
    state.acquire("a", batches((0, 9)), 10, 0, LIMITS)
    state.acknowledge("a", 0, 3, [ACCEPT], 0, LIMITS)
    assert state.start == 4
    state.acknowledge("a", 6, 9, [ACCEPT], 0, LIMITS)
    assert state.start == 4  # 4 and 5 are still acquired
    state.acknowledge("a", 4, 5, [REJECT], 0, LIMITS)
    assert state.start == state.end == 10 and state.spans == []


def test_release_redelivers_with_a_higher_delivery_count() -> None:
    state = ShareState(0, 0)
    state.acquire("a", batches((0, 4)), 10, 0, LIMITS)
    state.acknowledge("a", 0, 4, [ACCEPT, RELEASE, ACCEPT, RELEASE, ACCEPT], 0, LIMITS)
    assert state.start == 1 and states(state) == {
        1: AVAILABLE,
        2: ACKNOWLEDGED,
        3: AVAILABLE,
        4: ACKNOWLEDGED,
    }
    assert state.acquire("b", [], 10, 0, LIMITS) == [Acquired(1, 1, 2), Acquired(3, 3, 2)]


def test_redelivery_comes_before_new_records_and_counts_against_max_records() -> None:
    state = ShareState(0, 0)
    state.acquire("a", batches((0, 4)), 10, 0, LIMITS)
    state.acknowledge("a", 0, 4, [RELEASE], 0, LIMITS)
    got = state.acquire("b", batches((0, 4), (5, 9)), 3, 0, LIMITS)
    assert got == [Acquired(0, 2, 2)]
    got = state.acquire("b", batches((0, 4), (5, 9)), 10, 0, LIMITS)
    assert got == [Acquired(3, 4, 2), Acquired(5, 9, 1)]


def test_records_are_archived_at_the_delivery_limit() -> None:
    state = ShareState(0, 0)
    state.acquire("a", batches((0, 0)), 1, 0, LIMITS)
    for _ in range(LIMITS.delivery_limit - 1):
        state.acknowledge("a", 0, 0, [RELEASE], 0, LIMITS)
        assert state.acquire("a", [], 1, 0, LIMITS) != []
    state.acknowledge("a", 0, 0, [RELEASE], 0, LIMITS)
    assert state.start == 1 and state.acquire("a", [], 1, 0, LIMITS) == []


def test_an_expired_lock_releases_and_is_no_longer_the_members() -> None:
    state = ShareState(0, 0)
    state.acquire("a", batches((0, 4)), 10, now=100, limits=LIMITS)
    assert not state.expire(100 + LIMITS.lock_ms, LIMITS)  # the deadline itself still holds
    assert state.expire(101 + LIMITS.lock_ms, LIMITS)
    with pytest.raises(InvalidRecordState):
        state.acknowledge("a", 0, 0, [ACCEPT], 2000, LIMITS)
    assert state.acquire("b", [], 10, 2000, LIMITS) == [Acquired(0, 4, 2)]


def test_renew_extends_the_lock() -> None:
    state = ShareState(0, 0)
    state.acquire("a", batches((0, 1)), 10, now=0, limits=LIMITS)
    state.acknowledge("a", 1, 1, [RENEW], 900, LIMITS)
    state.expire(1500, LIMITS)
    assert states(state) == {0: AVAILABLE, 1: ACQUIRED}


def test_only_the_acquiring_member_may_acknowledge_and_a_refusal_changes_nothing() -> None:
    state = ShareState(0, 0)
    state.acquire("a", batches((0, 4)), 10, 0, LIMITS)
    before = state.rows()
    with pytest.raises(InvalidRecordState, match="not acquired by member 'b'"):
        state.acknowledge("b", 0, 0, [ACCEPT], 0, LIMITS)
    with pytest.raises(InvalidRecordState, match="not in flight"):
        state.acknowledge("a", 3, 7, [ACCEPT], 0, LIMITS)
    with pytest.raises(InvalidRecordState, match="acknowledgement types"):
        state.acknowledge("a", 0, 4, [ACCEPT, ACCEPT], 0, LIMITS)
    with pytest.raises(InvalidRecordState, match="unknown acknowledgement type"):
        state.acknowledge("a", 0, 0, [9], 0, LIMITS)
    assert state.rows() == before
    state.acknowledge("a", 1, 1, [ACCEPT], 0, LIMITS)
    with pytest.raises(InvalidRecordState, match="Acknowledged, not acquired"):
        state.acknowledge("a", 1, 1, [ACCEPT], 0, LIMITS)  # twice
    state.acknowledge("a", 0, 0, [ACCEPT], 0, LIMITS)
    assert state.start == 2
    # Below the start offset all is done: acknowledging it again changes nothing (as Kafka).
    before = state.rows()
    state.acknowledge("a", 0, 1, [ACCEPT], 0, LIMITS)
    assert state.rows() == before and state.start == 2


def test_markers_aborted_batches_and_gaps_are_archived_never_delivered() -> None:
    state = ShareState(0, 0)
    got = state.acquire(
        "a", batches((0, 2), (3, 3), (6, 8), (9, 9), undeliverable=(3, 9)), 100, 0, LIMITS
    )
    assert got == [Acquired(0, 2, 1), Acquired(6, 8, 1)]
    assert states(state) == {
        **dict.fromkeys(range(3), ACQUIRED), 3: ARCHIVED, 4: ARCHIVED, 5: ARCHIVED,
        **dict.fromkeys(range(6, 9), ACQUIRED), 9: ARCHIVED,
    }  # fmt: skip
    state.acknowledge("a", 0, 2, [ACCEPT], 0, LIMITS)
    assert state.start == 6
    state.acknowledge("a", 6, 8, [ACCEPT, GAP, ACCEPT], 0, LIMITS)  # 7: compacted away
    assert state.start == state.end == 10


def test_the_in_flight_limit_stops_new_acquisitions() -> None:
    limits = Limits(3, 1000, max_in_flight=5)
    state = ShareState(0, 0)
    assert state.acquire("a", batches((0, 3), (4, 7), (8, 9)), 100, 0, limits) == [
        Acquired(0, 7, 1)
    ]
    assert state.acquire("b", batches((8, 9)), 100, 0, limits) == []
    state.acknowledge("a", 0, 3, [ACCEPT], 0, limits)
    assert state.acquire("b", batches((8, 9)), 100, 0, limits) == [Acquired(8, 9, 1)]


def test_a_member_leaving_releases_only_its_own_records() -> None:
    state = ShareState(0, 0)
    state.acquire("a", batches((0, 1)), 2, 0, LIMITS)
    state.acquire("b", batches((2, 3)), 2, 0, LIMITS)
    assert state.release_member("a", LIMITS)
    assert states(state) == {0: AVAILABLE, 1: AVAILABLE, 2: ACQUIRED, 3: ACQUIRED}
    assert not state.release_member("a", LIMITS)


def test_a_transaction_holds_acknowledgements_until_it_ends() -> None:
    state = ShareState(0, 0)
    state.acquire("a", batches((0, 3)), 10, now=0, limits=LIMITS)
    state.hold("t1", "a", 0, 3, [ACCEPT, ACCEPT, REJECT, RELEASE])
    # Held: no lock runs out, the member cannot acknowledge them, leaving does not release them.
    assert not state.expire(10**9, LIMITS)
    assert not state.release_member("a", LIMITS)
    with pytest.raises(InvalidRecordState, match="held by transaction 't1'"):
        state.acknowledge("a", 0, 0, [ACCEPT], 0, LIMITS)
    with pytest.raises(InvalidRecordState):
        state.hold("t2", "a", 1, 1, [ACCEPT])
    assert state.held_by("t1") and not state.held_by("t2")
    assert state.settle_transaction("t1", commit=True, limits=LIMITS)
    # 0 and 1 accepted, 2 rejected: done; 3 released for delivery again.
    assert state.start == 3 and states(state) == {3: AVAILABLE}


def test_an_aborted_transaction_releases_what_it_held() -> None:
    state = ShareState(0, 0)
    state.acquire("a", batches((0, 1)), 10, 0, LIMITS)
    state.hold("t1", "a", 0, 1, [ACCEPT])
    state.settle_transaction("t1", commit=False, limits=LIMITS)
    assert states(state) == {0: AVAILABLE, 1: AVAILABLE}
    assert state.acquire("b", [], 10, 0, LIMITS) == [Acquired(0, 1, 2)]


def test_the_log_losing_records_moves_the_start_offset() -> None:
    state = ShareState(0, 0)
    state.acquire("a", batches((0, 9)), 10, 0, LIMITS)
    assert state.trim(4)
    assert state.start == 4 and min(states(state)) == 4
    assert state.trim(20) and state.start == state.end == 20 and state.spans == []


def test_a_reset_starts_anew() -> None:
    state = ShareState(0, 0)
    state.acquire("a", batches((0, 9)), 10, 0, LIMITS)
    state.reset(3)
    assert (state.start, state.end, state.spans) == (3, 3, [])
    # A batch that began before the reset is acquired from the reset on.
    assert state.acquire("a", batches((0, 9)), 10, 0, LIMITS) == [Acquired(3, 9, 1)]


def test_lag_counts_what_is_left_to_process() -> None:
    state = ShareState(0, 0)
    state.acquire("a", batches((0, 9)), 10, 0, LIMITS)
    state.acknowledge("a", 2, 3, [ACCEPT], 0, LIMITS)
    assert state.lag(upper=15) == 13  # 0-1 and 4-9 in flight, 10-14 not yet fetched
    state.acknowledge("a", 0, 1, [ACCEPT], 0, LIMITS)
    assert state.lag(upper=15) == 11


# -- invariants over any sequence of calls ----------------------------------------------------

MEMBERS = ("a", "b")
Call = tuple[str, str, int, int, int]  # (kind, member, first or count, width, type or flag)
call: st.SearchStrategy[Call] = st.tuples(
    st.sampled_from(["acquire", "acquire", "ack", "ack", "hold", "settle", "expire", "leave"]),
    st.sampled_from(MEMBERS),
    st.integers(0, 40),
    st.integers(0, 6),
    st.sampled_from([ACCEPT, RELEASE, REJECT, GAP, RENEW]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(call, max_size=40))
def test_any_sequence_keeps_the_invariants(calls: list[Call]) -> None:
    """Spans cover [start, end) without gap or overlap, in order, none done at the start; an
    offset is acquired only while available (or new), never over the delivery limit, and
    never again once accepted; a refused acknowledgement changes nothing."""
    log = batches(*[(i, i + 2) for i in range(0, 45, 3)])
    state = ShareState(0, 0)
    now = 0
    accepted: set[int] = set()
    for kind, member, number, width, type_ in calls:
        now += 50
        last = number + width
        if kind == "acquire":
            before, end = states(state), state.end
            whole = type_ % 2 == 0
            for a in state.acquire(member, log, max(1, width), now, LIMITS, whole_batches=whole):
                for o in range(a.first, a.last + 1):
                    assert o not in accepted, f"{o} delivered again after it was accepted"
                    assert o >= end or before[o] == AVAILABLE, f"{o} acquired while held"
                    assert a.deliveries <= LIMITS.delivery_limit
        elif kind == "ack":
            rows = state.rows()
            try:
                state.acknowledge(member, number, last, [type_], now, LIMITS)
            except InvalidRecordState:
                assert state.rows() == rows
            else:
                if type_ == ACCEPT:
                    accepted.update(range(number, last + 1))
        elif kind == "hold":
            rows = state.rows()
            try:
                state.hold("t", member, number, last, [ACCEPT])
            except InvalidRecordState:
                assert state.rows() == rows
        elif kind == "settle":
            commit = type_ % 2 == 0
            held = {o for sp in state.spans if sp.txn == "t" for o in range(sp.first, sp.last + 1)}
            state.settle_transaction("t", commit, LIMITS)
            if commit:
                accepted |= held
        elif kind == "expire":
            state.expire(now + number * 100, LIMITS)
        else:
            state.release_member(member, LIMITS)
        expected = state.start
        for span in state.spans:
            assert span.first == expected and span.last >= span.first
            expected = span.last + 1
            assert (span.state == ACQUIRED) == (span.member is not None)
            assert span.txn is None or span.state == ACQUIRED
        assert expected == state.end
        assert not state.spans or state.spans[0].state not in (ACKNOWLEDGED, ARCHIVED)
