"""Exactly once under faults: a transport that loses answers after the service handled the
request, delays, duplicates and reorders requests. No record is lost or duplicated and each
partition keeps produce order, on SQLite and on Postgres. Seeds make a failing run replayable."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future

import orjson
import pytest

from sdk import KafkaError, Producer, ProducerFenced
from tests.support.sdk_support import (
    Coordinator,
    Faults,
    FaultyTransport,
    Reports,
    is_end_txn,
    is_produce,
    once,
)

PARTITIONS = 3
KEYS = 10

# Quick retries so a run takes seconds; bounded so a bug fails rather than hangs.
FAST_RETRIES = {
    "linger_ms": 2,
    "batch_size": 400,
    "retry_backoff_ms": 5,
    "retry_backoff_max_ms": 50,
    "request_timeout_ms": 5_000,
    "delivery_timeout_ms": 60_000,
}

# The first produce request surely suffers the faults the tests assert happened; the rest are
# random (how many requests there are depends on timing, through batching).
MIXED = Faults(
    drop_response=0.15,
    delay=0.2,
    duplicate=0.15,
    reorder=0.25,
    certain=("drop_response", "duplicate", "reorder"),
    certain_on=is_produce,
)


def record(i: int) -> tuple[str, str]:
    key = f"k{i % KEYS}"
    return key, f"{key}:{i}"


def assert_exactly_once_in_order(service: Coordinator, count: int, **read: str) -> None:
    """Every record 0..count-1 is in the log once, and each partition holds its records in the
    order they were produced."""
    logs = service.values("t", PARTITIONS, **read)
    seen: list[int] = []
    for partition, values in logs.items():
        indices = [int(v.split(":")[1]) for v in values]
        assert indices == sorted(indices), f"partition {partition} out of order: {indices}"
        seen.extend(indices)
    assert sorted(seen) == list(range(count)), "lost or duplicated records"


@pytest.mark.parametrize("seed", [1, 2])
def test_lost_answers_delays_duplicates_and_reordering_lose_and_duplicate_nothing(
    service: Coordinator, seed: int
) -> None:
    service.create_topic("t", PARTITIONS)
    transport = FaultyTransport(MIXED, seed)
    reports = Reports()
    count = 300
    with Producer(coordinator_url=service.url, transport=transport, **FAST_RETRIES) as producer:
        for i in range(count):
            key, value = record(i)
            producer.produce("t", value, key=key, on_delivery=reports)
        assert producer.flush(60) == 0
    assert reports.errors() == []
    assert_exactly_once_in_order(service, count)
    # Every report names the offset the record really has.
    logs = service.values("t", PARTITIONS)
    for _, msg in reports.items:
        assert logs[msg.partition()][msg.offset()] == msg.value().decode()
    assert all(transport.injected[f] > 0 for f in ("drop_response", "duplicate", "reorder"))


def test_a_retried_batch_is_answered_as_a_duplicate_with_its_original_offsets(
    service: Coordinator,
) -> None:
    service.create_topic("t", PARTITIONS)
    transport = FaultyTransport(
        Faults(drop_response=0.5, only=is_produce, certain=("drop_response",)), seed=3
    )
    reports = Reports()
    with Producer(coordinator_url=service.url, transport=transport, **FAST_RETRIES) as producer:
        for i in range(60):
            key, value = record(i)
            producer.produce("t", value, key=key, on_delivery=reports)
        producer.flush(60)
    assert reports.errors() == []
    assert transport.injected["drop_response"] > 0
    assert_exactly_once_in_order(service, 60)
    bodies = [r.read() for r in transport.sent if is_produce(r)]
    assert len(bodies) > len(set(bodies)), "no batch was sent twice"


def test_unknown_producer_id_is_recovered_with_a_new_producer_id(service: Coordinator) -> None:
    """KIP-360: the service lost the producer's state on the partition (here: removed behind its
    back, as expiry would). The producer takes a new id and renumbers, losing nothing."""
    service.create_topic("t", PARTITIONS)
    transport = FaultyTransport(Faults(), seed=0)
    reports = Reports()
    with Producer(coordinator_url=service.url, transport=transport, **FAST_RETRIES) as producer:
        for i in range(60):
            key, value = record(i)
            producer.produce("t", value, key=key, on_delivery=reports)
        producer.flush(30)
        service.live.execute("DELETE FROM producer_states")
        for i in range(60, 120):
            key, value = record(i)
            producer.produce("t", value, key=key, on_delivery=reports)
        producer.flush(30)
    assert reports.errors() == []
    assert_exactly_once_in_order(service, 120)
    init_pids = [r for r in transport.sent if r.url.path == "/v1/init-pid"]
    assert len(init_pids) == 2


def test_a_producer_carries_on_across_a_real_producer_state_expiry(
    service: Coordinator, start_service: Callable[..., Coordinator]
) -> None:
    """The service's own expiry (COORDINATOR_PRODUCER_ID_EXPIRATION_MS) removes the idle
    producer's state; its next batches get UNKNOWN_PRODUCER_ID and KIP-360's recovery takes a
    new id, losing and duplicating nothing."""
    # Long enough that a producer sending never idles that long between its own batches, even
    # on a loaded machine; the test waits this long once.
    expiring = start_service(producer_id_expiration_ms=1000, log_retention_check_interval_ms=20)
    expiring.create_topic("t", PARTITIONS)
    transport = FaultyTransport(Faults(), seed=0)
    reports = Reports()
    with Producer(coordinator_url=expiring.url, transport=transport, **FAST_RETRIES) as producer:
        for i in range(30):
            key, value = record(i)
            producer.produce("t", value, key=key, on_delivery=reports)
        producer.flush(30)
        deadline = time.monotonic() + 30
        while expiring.http.get(
            "/v1/admin/producers", params={"topic": "t", "partition": 0}
        ).json()["producers"]:
            assert time.monotonic() < deadline, "the producer's state never expired"
            time.sleep(0.05)
        for i in range(30, 60):
            key, value = record(i)
            producer.produce("t", value, key=key, on_delivery=reports)
        producer.flush(30)
    assert reports.errors() == []
    assert_exactly_once_in_order(expiring, 60)
    assert len([r for r in transport.sent if r.url.path == "/v1/init-pid"]) >= 2


def test_a_commit_whose_answer_was_lost_is_retried_and_answered_by_the_idempotent_end_txn(
    service: Coordinator,
) -> None:
    service.create_topic("t", PARTITIONS)
    transport = FaultyTransport(Faults(drop_response=1.0, only=once(is_end_txn)), seed=0)
    conf = {"coordinator.url": service.url, "transactional.id": "etl-0"}
    with Producer(conf, transport=transport, **FAST_RETRIES) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(30):
            key, value = record(i)
            producer.produce("t", value, key=key)
        producer.commit_transaction()
        ends = [orjson.loads(r.read()) for r in transport.sent if is_end_txn(r)]
        assert len(ends) == 2 and ends[0] == ends[1], "the retry must carry the same epoch"
        # The next transaction runs at the epoch the retried EndTxn returned.
        producer.begin_transaction()
        for i in range(30, 40):
            key, value = record(i)
            producer.produce("t", value, key=key)
        producer.commit_transaction()
    assert transport.injected["drop_response"] == 1
    assert_exactly_once_in_order(service, 40)


@pytest.mark.parametrize("background", [False, True], ids=["commit", "commit_async"])
def test_transactions_under_faults_commit_each_record_exactly_once(
    service: Coordinator, background: bool
) -> None:
    """With commit_transaction_async() each transaction fills while the one before commits, its
    batches held back for the new epoch while the earlier ones are retried under faults."""
    service.create_topic("t", PARTITIONS)
    transport = FaultyTransport(MIXED, seed=5)
    conf = {"coordinator.url": service.url, "transactional.id": "etl-1"}
    commits: list[Future[None]] = []
    with Producer(conf, transport=transport, **FAST_RETRIES) as producer:
        producer.init_transactions()
        for txn in range(4):
            producer.begin_transaction()
            for i in range(txn * 50, txn * 50 + 50):
                key, value = record(i)
                producer.produce("t", value, key=key)
            if background:
                commits.append(producer.commit_transaction_async())
            else:
                producer.commit_transaction()
        assert [commit.result(60) for commit in commits] == [None] * len(commits)
    assert_exactly_once_in_order(service, 200)
    assert transport.injected["drop_response"] > 0


def test_a_zombie_producer_is_fenced_and_its_records_never_become_visible(
    service: Coordinator,
) -> None:
    service.create_topic("t", PARTITIONS)
    conf = {"coordinator.url": service.url, "transactional.id": "task-7"}
    zombie = Producer(conf, **FAST_RETRIES)
    zombie.init_transactions()
    zombie.begin_transaction()
    for i in range(20):
        zombie.produce("t", f"zombie:{i}", key=f"k{i}")
    zombie.flush(30)  # written, in its open transaction

    successor = Producer(conf, **FAST_RETRIES)
    successor.init_transactions()  # fences the zombie and aborts its transaction
    successor.begin_transaction()
    for i in range(10):
        key, value = record(i)
        successor.produce("t", value, key=key)

    reports = Reports()
    zombie.produce("t", "zombie:late", key="k0", on_delivery=reports)
    with pytest.raises(ProducerFenced) as fenced:
        zombie.commit_transaction()
    assert fenced.value.fatal and not fenced.value.retriable
    assert [err.code() for err in reports.errors()] == [KafkaError.PRODUCER_FENCED]
    with pytest.raises(ProducerFenced):  # fatal: every later call says so
        zombie.begin_transaction()
    zombie.close()

    successor.commit_transaction()
    successor.close()
    committed = service.all_values("t", PARTITIONS)
    assert sorted(committed) == sorted(record(i)[1] for i in range(10))
    everything = service.all_values("t", PARTITIONS, isolation_level="read_uncommitted")
    assert "zombie:late" not in everything
