"""The transactional Producer against the real service, on SQLite and on Postgres."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sdk import (
    Consumer,
    IllegalStateError,
    KafkaError,
    Producer,
    ProducerFenced,
    RecordListTooLarge,
    TopicPartition,
    TransactionTimedOut,
)
from tests.support.sdk_support import (
    Coordinator,
    Faults,
    FaultyTransport,
    Reports,
    describe,
    transactional,
    wait_for,
)


def group_offsets(service: Coordinator, group: str) -> dict[tuple[str, int], int]:
    response = service.http.get(f"/v1/groups/{group}/offsets")
    assert response.status_code == 200, response.text
    return {(o["topic"], o["partition"]): o["offset"] for o in response.json()["offsets"]}


def test_a_committed_transaction_becomes_visible_all_at_once(service: Coordinator) -> None:
    service.create_topic("t", 2)
    with transactional(service) as producer:
        producer.begin_transaction()
        for i in range(10):
            producer.produce("t", f"v{i}", partition=i % 2)
        producer.flush(30)
        assert service.values("t", 2) == {0: [], 1: []}
        uncommitted = service.values("t", 2, isolation_level="read_uncommitted")
        assert sum(len(v) for v in uncommitted.values()) == 10
        producer.commit_transaction()
    assert service.values("t", 2) == {
        0: [f"v{i}" for i in range(0, 10, 2)],
        1: [f"v{i}" for i in range(1, 10, 2)],
    }


def test_an_aborted_transaction_is_never_visible_and_its_unsent_records_are_purged(
    service: Coordinator,
) -> None:
    service.create_topic("t")
    reports = Reports()
    with transactional(service, linger_ms=60_000) as producer:
        producer.begin_transaction()
        producer.produce("t", "written", on_delivery=reports)
        producer.flush(30)
        producer.produce("t", "unsent", on_delivery=reports)  # waits out linger.ms
        producer.abort_transaction()
        (written_err, written), (err, purged) = reports.items
        assert (written_err, written.value()) == (None, b"written")
        assert err is not None and err.code() == KafkaError._PURGE_QUEUE
        assert purged.value() == b"unsent"
        producer.begin_transaction()
        producer.produce("t", "next")
        producer.commit_transaction()
    assert service.values("t")[0] == ["next"]
    assert service.values("t", isolation_level="read_uncommitted")[0] == ["written", "next"]


def test_a_record_delivered_late_in_a_long_linger_is_flushed_by_commit(
    service: Coordinator,
) -> None:
    service.create_topic("t")
    with transactional(service, linger_ms=60_000) as producer:
        producer.begin_transaction()
        producer.produce("t", "lingering")
        producer.commit_transaction()
    assert service.values("t")[0] == ["lingering"]


def test_offsets_sent_to_a_transaction_are_committed_only_with_it(service: Coordinator) -> None:
    service.create_topic("in")
    service.create_topic("out")
    with transactional(service) as producer:
        producer.begin_transaction()
        producer.produce("out", "x")
        producer.send_offsets_to_transaction([TopicPartition("in", 0, 5)], "group-a")
        producer.abort_transaction()
        assert group_offsets(service, "group-a") == {}

        producer.begin_transaction()
        producer.produce("out", "y")
        producer.send_offsets_to_transaction(
            [TopicPartition("in", 0, 7), TopicPartition("in", 1, -1001)], "group-a"
        )
        assert group_offsets(service, "group-a") == {}
        producer.commit_transaction()
    assert group_offsets(service, "group-a") == {("in", 0): 7}


def test_a_transaction_of_offsets_only_commits(service: Coordinator) -> None:
    service.create_topic("in")
    with transactional(service) as producer:
        producer.begin_transaction()
        producer.send_offsets_to_transaction([TopicPartition("in", 0, 3)], "g")
        producer.commit_transaction()
    assert group_offsets(service, "g") == {("in", 0): 3}


def test_each_commit_raises_the_epoch_and_sequences_start_again(service: Coordinator) -> None:
    service.create_topic("t")
    with transactional(service) as producer:
        epochs = [describe(service, "etl-0")["producer_epoch"]]
        for txn in range(3):
            producer.begin_transaction()
            for i in range(5):
                producer.produce("t", f"{txn}-{i}")
            producer.commit_transaction()
            epochs.append(describe(service, "etl-0")["producer_epoch"])
    assert epochs == [epochs[0] + n for n in range(4)]
    assert service.values("t")[0] == [f"{t}-{i}" for t in range(3) for i in range(5)]


def test_ending_a_transaction_the_coordinator_never_heard_of_is_local(
    service: Coordinator,
) -> None:
    transport = FaultyTransport(Faults(), seed=0)
    with transactional(service, transport=transport) as producer:
        producer.begin_transaction()
        producer.commit_transaction()
        producer.begin_transaction()
        producer.abort_transaction()
    assert [r.url.path for r in transport.sent] == ["/v1/init-pid"]


def test_a_prepared_transaction_is_finished_by_a_new_instance_with_keep_prepared(
    service: Coordinator,
) -> None:
    service.create_topic("t")
    first = transactional(service, "task-1")
    first.begin_transaction()
    first.produce("t", "prepared")
    first.prepare_transaction()
    assert describe(service, "task-1")["state"] == "Prepared"
    with pytest.raises(IllegalStateError):
        first.produce("t", "after prepare")

    second = Producer({"coordinator.url": service.url, "transactional.id": "task-1"})
    second.init_transactions(keep_prepared=True)
    second.commit_transaction()
    assert service.values("t")[0] == ["prepared"]
    with pytest.raises(ProducerFenced):
        first.commit_transaction()
    first.close()
    second.close()


def test_init_without_keep_prepared_aborts_the_prepared_transaction(
    service: Coordinator,
) -> None:
    service.create_topic("t")
    first = transactional(service, "task-2")
    first.begin_transaction()
    first.produce("t", "prepared")
    first.prepare_transaction()
    second = transactional(service, "task-2")
    with pytest.raises(IllegalStateError):
        second.commit_transaction()  # nothing of its own is open
    first.close()
    second.close()
    assert service.values("t")[0] == []


def test_a_timed_out_transaction_is_reported_as_such_and_init_transactions_recovers(
    start_service: Callable[..., Coordinator],
) -> None:
    service = start_service(timeout_check_interval_ms=50)
    service.create_topic("t")
    with transactional(service, "slow", transaction_timeout_ms=300) as producer:
        producer.begin_transaction()
        producer.produce("t", "too slow")
        producer.flush(30)
        wait_for(lambda: describe(service, "slow")["state"] == "CompleteAbort", what="timeout")
        with pytest.raises(TransactionTimedOut) as raised:
            producer.commit_transaction()
        error = raised.value
        assert not (error.fatal or error.retriable or error.txn_requires_abort)
        with pytest.raises(TransactionTimedOut):
            producer.produce("t", "x")
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce("t", "in time")
        producer.commit_transaction()
    assert service.values("t")[0] == ["in time"]


def test_a_failed_record_makes_commit_raise_an_error_that_requires_abort(
    start_service: Callable[..., Coordinator],
) -> None:
    service = start_service(max_request_bytes=2048)
    service.create_topic("t")
    reports = Reports()
    with transactional(service) as producer:
        producer.begin_transaction()
        producer.produce("t", "fits")
        producer.produce("t", "x" * 4000, on_delivery=reports)
        with pytest.raises(RecordListTooLarge) as raised:
            producer.commit_transaction()
        assert raised.value.txn_requires_abort and not raised.value.fatal
        assert raised.value.args[0].txn_requires_abort()  # as confluent-kafka code checks it
        with pytest.raises(RecordListTooLarge):
            producer.produce("t", "more")  # the transaction is lost: abort it first
        producer.abort_transaction()
        producer.begin_transaction()
        producer.produce("t", "retried")
        producer.commit_transaction()
    assert [e.code() for e in reports.errors()] == [KafkaError.RECORD_LIST_TOO_LARGE]
    assert service.values("t")[0] == ["retried"]


def test_calls_out_of_order_are_refused_with_illegal_state(service: Coordinator) -> None:
    service.create_topic("t")
    producer = Producer({"coordinator.url": service.url, "transactional.id": "t-1"})
    with pytest.raises(IllegalStateError):
        producer.begin_transaction()  # before init_transactions()
    producer.init_transactions()
    with pytest.raises(IllegalStateError):
        producer.produce("t", "outside a transaction")
    with pytest.raises(IllegalStateError):
        producer.commit_transaction()
    producer.begin_transaction()
    with pytest.raises(IllegalStateError):
        producer.begin_transaction()
    producer.close()  # aborts the open transaction
    assert describe(service, "t-1")["state"] in ("Empty", "CompleteAbort")
    idempotent = Producer(coordinator_url=service.url)
    with pytest.raises(IllegalStateError):
        idempotent.begin_transaction()
    idempotent.close()


def test_transactional_ids_with_any_printable_character_work(service: Coordinator) -> None:
    service.create_topic("t")
    for tid in ["job 7?attempt=1#x", "50%", "ünïcode"]:
        with transactional(service, tid) as producer:
            producer.begin_transaction()
            producer.produce("t", tid)
            producer.commit_transaction()
    assert service.values("t")[0] == ["job 7?attempt=1#x", "50%", "ünïcode"]


def test_a_consumer_resumes_from_offsets_committed_by_a_transaction(
    service: Coordinator,
) -> None:
    service.create_topic("in")
    service.create_topic("out")
    with Producer(coordinator_url=service.url) as seed:
        for i in range(6):
            seed.produce("in", str(i))
    conf = {"coordinator.url": service.url, "group.id": "doubler", "enable.auto.commit": False}
    for expected in (["0", "2", "4"], ["6", "8", "10"]):
        consumer = Consumer({**conf, "auto.offset.reset": "earliest"})
        consumer.assign([TopicPartition("in", 0)])
        with transactional(service, "doubler-0") as producer:
            producer.begin_transaction()
            for msg in consumer.consume(3, timeout=10):
                producer.produce("out", str(int(msg.value() or b"0") * 2))
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata()
            )
            producer.commit_transaction()
        consumer.close()
        assert service.values("out")[0][-3:] == expected
