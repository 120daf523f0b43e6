"""Fetches served by a Postgres hot standby (issue 37, item 2; Kafka's follower fetching,
KIP-392): a service whose store is a primary with a synchronous standby, the standby listed in
COORDINATOR_READ_REPLICA_URLS. Through both doors a fetch read from the standby is exact under
read_committed (no aborted, no open record; the LSO and high watermark of its snapshot), and
when the standby falls behind past the bound (its replay paused) the reads go to the primary and
still see everything committed. Which server answered is told by `coordinator_fetches_total`.

Postgres only: replicas are Postgres standbys."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator

import confluent_kafka as ck
import httpx
import psycopg
import pytest

from tests.fault.postgres_pair import DATABASE, PostgresPair
from tests.support.kafka_transactions import transaction, transactional
from tests.support.services import ServiceProcess, free_port

pytestmark = pytest.mark.slow

MAX_LAG_MS = 300
DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def pair() -> Iterator[PostgresPair]:
    running = PostgresPair(synchronous=True).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def service(
    pair: PostgresPair, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    running = ServiceProcess(
        pair.primary.dsn(DATABASE),
        tmp_path_factory.mktemp("replicas"),
        COORDINATOR_READ_REPLICA_URLS=json.dumps([pair.standby.dsn(DATABASE)]),
        COORDINATOR_REPLICA_MAX_LAG_MS=str(MAX_LAG_MS),
        COORDINATOR_REPLICA_CHECK_INTERVAL_MS="50",
        COORDINATOR_KAFKA_LISTENER=f"127.0.0.1:{free_port()}",
    )
    yield running.start()
    running.stop()
    assert "Traceback" not in running.log.read_text(errors="replace")


def fetches(service: ServiceProcess, source: str) -> float:
    for line in httpx.get(f"{service.url}/metrics").text.splitlines():
        if line.startswith(f'coordinator_fetches_total{{source="{source}"}}'):
            return float(line.split()[-1])
    return 0.0


def values(service: ServiceProcess, topic: str, isolation: str) -> list[tuple[int, str]]:
    answer = httpx.get(
        f"{service.url}/v1/topics/{topic}/partitions/0/records",
        params={"offset": 0, "isolation_level": isolation},
    )
    assert answer.status_code == 200, answer.text
    return [(r["offset"], r["value"]) for r in answer.json()["records"]]


def served_by(
    service: ServiceProcess, source: str, read: Callable[[], list[tuple[int, str]]]
) -> list[tuple[int, str]]:
    """`read` again until the server named `source` answered it (the replica is used once a
    check found it caught up; the primary once one found it behind); that answer."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        before = fetches(service, source)
        got = read()
        if fetches(service, source) > before:
            return got
        assert time.monotonic() < deadline, f"no fetch was served by the {source}"
        time.sleep(0.05)


def test_a_replica_fetch_is_exact_under_read_committed_through_both_doors(
    service: ServiceProcess,
) -> None:
    """Offsets 0-1 committed, 2 the marker, 3-4 aborted, 5 the marker, 6 committed, 7 the
    marker, 8 a transaction still open."""
    topic = f"r{uuid.uuid4().hex[:8]}"
    assert httpx.post(f"{service.url}/v1/topics", json={"name": topic}).status_code == 201
    producer = transactional(service.env["COORDINATOR_KAFKA_LISTENER"])
    transaction(producer, topic, ["c0", "c1"], commit=True)
    transaction(producer, topic, ["a0", "a1"], commit=False)
    transaction(producer, topic, ["c2"], commit=True)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=0)
    producer.flush(30)
    try:
        committed = [(0, "c0"), (1, "c1"), (6, "c2")]

        def read_committed() -> list[tuple[int, str]]:
            return values(service, topic, "read_committed")

        def read_uncommitted() -> list[tuple[int, str]]:
            return values(service, topic, "read_uncommitted")

        # Until the standby holds all of it, it answers less; the first complete answer from it:
        everything = [*committed[:2], (3, "a0"), (4, "a1"), (6, "c2"), (8, "open")]
        deadline = time.monotonic() + DEADLINE_S
        while (got := served_by(service, "replica", read_uncommitted)) != everything:
            assert time.monotonic() < deadline, got
        assert served_by(service, "replica", read_committed) == committed

        # The Kafka door: a read_committed consumer, its fetches served by the standby.
        before = fetches(service, "replica")
        consumer = ck.Consumer(
            {
                "bootstrap.servers": service.env["COORDINATOR_KAFKA_LISTENER"],
                "group.id": f"g{uuid.uuid4().hex[:6]}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        try:
            consumer.assign([ck.TopicPartition(topic, 0, 0)])
            seen: list[tuple[int, str]] = []
            while len(seen) < len(committed):
                assert time.monotonic() < deadline, seen
                message = consumer.poll(0.2)
                if message is not None and message.error() is None:
                    seen.append((message.offset(), message.value().decode()))
        finally:
            consumer.close()
        assert seen == committed
        assert fetches(service, "replica") > before
    finally:
        producer.abort_transaction(30)


def test_a_replica_behind_the_bound_sends_reads_to_the_primary(
    service: ServiceProcess, pair: PostgresPair
) -> None:
    topic = f"r{uuid.uuid4().hex[:8]}"
    assert httpx.post(f"{service.url}/v1/topics", json={"name": topic}).status_code == 201

    def produce(value: str) -> None:
        answer = httpx.post(
            f"{service.url}/v1/topics/{topic}/partitions/0/records",
            json={"records": [{"value": value}]},
        )
        assert answer.status_code == 200, answer.text

    def read() -> list[tuple[int, str]]:
        return values(service, topic, "read_committed")

    produce("before")
    deadline = time.monotonic() + DEADLINE_S
    while served_by(service, "replica", read) != [(0, "before")]:
        assert time.monotonic() < deadline
    with psycopg.connect(pair.standby.dsn(DATABASE), autocommit=True) as standby:
        standby.execute("SELECT pg_wal_replay_pause()")
        try:
            produce("while paused")  # committed: the standby has it on disk, not replayed
            # Past the bound the standby is left alone: the primary answers, with everything.
            assert served_by(service, "primary", read) == [(0, "before"), (1, "while paused")]
            assert read() == [(0, "before"), (1, "while paused")]
        finally:
            standby.execute("SELECT pg_wal_replay_resume()")
    while served_by(service, "replica", read) != [(0, "before"), (1, "while paused")]:
        assert time.monotonic() < deadline
