"""`Producer.commit_transaction_async()` against the real service, on SQLite and on Postgres: the
next transaction fills while the previous one commits, its records wait for the epoch the commit
gives, and a failed commit fails the transaction begun after it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from sdk import (
    IllegalStateError,
    KafkaError,
    KafkaTimeoutError,
    MessagePurged,
    Producer,
    ProducerFenced,
    RecordListTooLarge,
)
from tests.support.sdk_support import (
    Coordinator,
    Faults,
    FaultyTransport,
    GatedTransport,
    Reports,
    describe,
    is_end_txn,
    is_produce,
    once,
    transactional,
    wait_for,
)


def commit_at_the_gate(
    producer: Producer, gate: GatedTransport, value: str, then: str
) -> Future[None]:
    """Produce `value` in a transaction and commit it in the background until its EndTxn waits
    at `gate`; then begin the next transaction with `then` in it. Returns the commit."""
    producer.begin_transaction()
    producer.produce("t", value)
    committed = producer.commit_transaction_async()
    assert gate.arrived.wait(10)
    producer.begin_transaction()
    producer.produce("t", then)
    return committed


def test_the_next_transaction_fills_while_the_commit_runs_and_is_sent_after_it(
    service: Coordinator,
) -> None:
    service.create_topic("t")
    gate = GatedTransport(is_end_txn)
    reports = Reports()
    with transactional(service, transport=gate) as producer:
        epoch = describe(service, "etl-0")["producer_epoch"]
        producer.begin_transaction()
        producer.produce("t", "a0")
        producer.produce("t", "a1")
        committed = producer.commit_transaction_async()
        assert gate.arrived.wait(10)  # its records are written; its EndTxn waits at the gate
        assert service.values("t", isolation_level="read_uncommitted")[0] == ["a0", "a1"]
        producer.begin_transaction()
        producer.produce("t", "b0", on_delivery=reports)
        producer.produce("t", "b1", on_delivery=reports)
        # They need the epoch the commit's answer gives: none is sent before it.
        assert producer.flush(0.3) == 2
        assert service.values("t", isolation_level="read_uncommitted")[0] == ["a0", "a1"]
        assert not committed.done()
        gate.release()
        assert committed.result(10) is None
        producer.produce("t", "b2")
        # A second background commit while none is under way; then the epoch is the third.
        producer.commit_transaction_async().result(10)
        assert describe(service, "etl-0")["producer_epoch"] == epoch + 2
    assert service.values("t")[0] == ["a0", "a1", "b0", "b1", "b2"]
    assert [(err, msg.offset()) for err, msg in reports.items] == [(None, 3), (None, 4)]


def test_a_commit_waits_for_the_background_commit_before_it(service: Coordinator) -> None:
    service.create_topic("t")
    gate = GatedTransport(once(is_end_txn))
    with transactional(service, transport=gate) as producer:
        first = commit_at_the_gate(producer, gate, "first", then="second")
        with pytest.raises(KafkaTimeoutError):
            producer.commit_transaction(timeout=0.05)  # the first is still under way
        gate.release()
        producer.commit_transaction()
        assert first.done() and first.result() is None
        # Nothing is open now, and nothing commits in the background.
        with pytest.raises(IllegalStateError):
            producer.commit_transaction_async()
    assert service.values("t")[0] == ["first", "second"]


def test_close_waits_for_the_background_commit(service: Coordinator) -> None:
    service.create_topic("t")
    producer = transactional(service, linger_ms=60_000)
    producer.begin_transaction()
    producer.produce("t", "lingering")
    committed = producer.commit_transaction_async()  # its batch goes without lingering
    producer.close()
    assert committed.result(0) is None
    assert service.values("t")[0] == ["lingering"]


def test_a_close_that_stops_waiting_for_the_background_commit_commits_nothing(
    service: Coordinator,
) -> None:
    service.create_topic("t")
    # One request in flight, and a batch a record (30 bytes hold one): the first waits at the gate,
    # the second in the queue, until close() has given up waiting and purged it.
    gate = GatedTransport(once(is_produce))
    producer = transactional(
        service, transport=gate, batch_size=30, max_in_flight_requests_per_connection=1
    )
    producer.begin_transaction()
    producer.produce("t", "written")
    producer.produce("t", "purged")
    committed = producer.commit_transaction_async()
    assert gate.arrived.wait(10)
    releaser = threading.Thread(
        target=lambda: (wait_for(lambda: producer._sender.stopping), gate.release())
    )
    releaser.start()
    producer.close(timeout=0.05)
    releaser.join()
    with pytest.raises(MessagePurged):
        committed.result(10)
    assert service.values("t")[0] == []
    assert service.values("t", isolation_level="read_uncommitted")[0] == ["written"]


def test_a_record_that_fails_the_background_commit_fails_the_transaction_begun_after_it(
    start_service: Callable[..., Coordinator],
) -> None:
    service = start_service(max_request_bytes=2048)
    service.create_topic("t")
    # The oversized batch's answer waits until the next transaction has begun and filled.
    gate = GatedTransport(lambda request: is_produce(request) and len(request.content) > 2048)
    reports = Reports()
    with transactional(service, transport=gate) as producer:
        producer.begin_transaction()
        producer.produce("t", "fits", partition=0)
        producer.produce("t", "x" * 4000, partition=0)
        committed = producer.commit_transaction_async()
        assert gate.arrived.wait(10)
        producer.begin_transaction()
        producer.produce("t", "next", on_delivery=reports)
        gate.release()
        with pytest.raises(RecordListTooLarge) as raised:
            committed.result(10)
        assert raised.value.txn_requires_abort and not raised.value.fatal
        with pytest.raises(RecordListTooLarge):
            producer.produce("t", "more")  # the transaction begun after it failed with it
        with pytest.raises(RecordListTooLarge):
            producer.begin_transaction()
        producer.abort_transaction()
        producer.poll(0)  # dropped unsent, with the error that failed the commit
        assert [err.code() for err, _ in reports.items] == [KafkaError.RECORD_LIST_TOO_LARGE]
        producer.begin_transaction()
        producer.produce("t", "retried")
        producer.commit_transaction_async().result(10)
    assert service.values("t")[0] == ["retried"]


def test_a_background_commit_whose_answer_is_lost_is_finished_by_commit_transaction(
    service: Coordinator,
) -> None:
    service.create_topic("t")
    faults = Faults(drop_response=1.0, only=is_end_txn)
    transport = FaultyTransport(faults, seed=0)
    reports = Reports()
    with transactional(service, transport=transport, retry_backoff_ms=5) as producer:
        producer.begin_transaction()
        producer.produce("t", "committed once")
        committed = producer.commit_transaction_async(timeout=0.2)
        producer.begin_transaction()
        producer.produce("t", "lost with it", on_delivery=reports)
        with pytest.raises(KafkaTimeoutError) as raised:
            committed.result(10)
        assert raised.value.retriable
        producer.poll(0)
        assert [err.code() for err, _ in reports.items] == [KafkaError._PURGE_QUEUE]
        with pytest.raises(IllegalStateError):
            producer.produce("t", "x")  # committing: only commit_transaction() goes on
        faults.drop_response = 0.0
        producer.commit_transaction()  # the same epoch: the idempotent EndTxn answers
        assert transport.injected["drop_response"] >= 1
    assert service.values("t")[0] == ["committed once"]


def test_a_producer_fenced_while_its_commit_runs_in_the_background_commits_nothing(
    service: Coordinator,
) -> None:
    service.create_topic("t")
    gate = GatedTransport(is_end_txn)
    producer = transactional(service, transport=gate)
    committed = commit_at_the_gate(producer, gate, "fenced", then="never sent")
    with transactional(service) as newer:  # fences the first, aborting its transaction
        gate.release()
        with pytest.raises(ProducerFenced) as raised:
            committed.result(10)
        assert raised.value.fatal
        with pytest.raises(ProducerFenced):
            producer.produce("t", "x")
        producer.close()
        newer.begin_transaction()
        newer.produce("t", "newer")
        newer.commit_transaction()
    assert service.values("t")[0] == ["newer"]
    assert service.values("t", isolation_level="read_uncommitted")[0] == ["fenced", "newer"]


def test_an_idle_producer_refuses_commit_transaction_async(service: Coordinator) -> None:
    with Producer(coordinator_url=service.url) as idempotent, pytest.raises(IllegalStateError):
        idempotent.commit_transaction_async()
