"""Three `coordinator serve` processes on one store as one Kafka cluster (docs/pages/cluster.md),
on SQLite and on Postgres: every process lists the live brokers, leadership and coordinators are
spread over them, a request sent to the wrong broker is told so, and Kafka's clients follow
the partitions of a process that is SIGKILLed or SIGSTOPped past its lease, losing nothing
acknowledged, reading nothing twice, reusing no offset."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import confluent_kafka as ck
import pytest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as metadata_v12

from sdk import recordbatch
from tests.support.cluster import SESSION_TIMEOUT_MS, Cluster, cluster_on
from tests.support.kafka_wire import Connection, produce_request

pytestmark = pytest.mark.slow

DEADLINE_S = 30.0


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with cluster_on(request.param, tmp_path_factory.mktemp(f"cluster-{request.param}")) as running:
        yield running


def until(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while not (found := condition()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return found


async def _connect(port: int) -> Connection:
    return Connection(*await asyncio.open_connection("127.0.0.1", port))


async def _metadata(port: int, topic: str | None = None) -> Any:
    connection = await _connect(port)
    try:
        topics = (
            None
            if topic is None
            else (metadata_v12.MetadataRequestTopic(topic_id=None, name=topic),)
        )
        return await connection.call(
            3,
            12,
            topics=topics,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
    finally:
        connection.writer.close()


def metadata(port: int, topic: str | None = None) -> Any:
    return asyncio.run(_metadata(port, topic))


def leaders(cluster: Cluster, topic: str) -> dict[int, tuple[int, int]] | None:
    """Each partition's (leader, epoch), once every live process agrees on all of them."""
    seen = []
    for broker, port in zip(cluster.brokers, cluster.kafka_ports, strict=True):
        if broker.process is None or broker.process.poll() is not None:
            continue
        answer = metadata(port, topic)
        (described,) = answer.topics
        if described.error_code != ErrorCode.none or any(
            p.error_code != ErrorCode.none for p in described.partitions
        ):
            return None
        seen.append(
            {p.partition_index: (p.leader_id, p.leader_epoch) for p in described.partitions}
        )
    return seen[0] if seen and all(s == seen[0] for s in seen) else None


def create_topic(cluster: Cluster, name: str, partitions: int) -> None:
    with cluster.brokers[0].client() as http:
        answer = http.post("/v1/topics", json={"name": name, "partitions": partitions})
        assert answer.status_code == 201, answer.text


def test_every_process_lists_the_live_brokers_and_spreads_the_leaders(cluster: Cluster) -> None:
    ports = sorted(cluster.kafka_ports)
    for port in cluster.kafka_ports:
        until(
            lambda port=port: sorted(b.port for b in metadata(port).brokers) == ports,
            f"the three brokers in {port}'s Metadata",
        )
    create_topic(cluster, "spread", 6)
    placed = until(lambda: leaders(cluster, "spread"), "the partitions placed")
    assert sorted(Counter(leader for leader, _ in placed.values()).values()) == [2, 2, 2]
    assert {epoch for _, epoch in placed.values()} == {0}  # first leaders, as Kafka's


async def _produce_to(port: int, topic: str, partition: int) -> ErrorCode:
    connection = await _connect(port)
    try:
        batch = recordbatch.build([(1, None, b"v", [])])
        answer = await connection.request(produce_request(topic, batch, partition))
        return answer.responses[0].partition_responses[0].error_code
    finally:
        connection.writer.close()


async def _coordinator_of(port: int, key: str) -> int:
    connection = await _connect(port)
    try:
        answer = await connection.call(10, 4, key_type=0, coordinator_keys=(key,))
        return answer.coordinators[0].node_id
    finally:
        connection.writer.close()


async def _heartbeat(port: int, group: str) -> ErrorCode:
    connection = await _connect(port)
    try:
        answer = await connection.call(
            12, 4, group_id=group, generation_id=1, member_id="m", group_instance_id=None
        )
        return answer.error_code
    finally:
        connection.writer.close()


def test_a_request_sent_to_the_wrong_broker_is_told_so(cluster: Cluster) -> None:
    create_topic(cluster, "wrong", 3)
    placed = until(lambda: leaders(cluster, "wrong"), "the partitions placed")
    node_port = {b.node_id: b.port for b in metadata(cluster.kafka_ports[0]).brokers}
    for partition, (leader, _) in placed.items():
        other = next(n for n in node_port if n != leader)
        assert asyncio.run(_produce_to(node_port[other], "wrong", partition)) == (
            ErrorCode.not_leader_or_follower
        )
        assert asyncio.run(_produce_to(node_port[leader], "wrong", partition)) == ErrorCode.none
    keys = [f"group-{i}" for i in range(30)]
    chosen = {k: asyncio.run(_coordinator_of(cluster.kafka_ports[0], k)) for k in keys}
    assert set(chosen.values()) == set(node_port)  # spread over all three
    key = keys[0]
    other = next(n for n in node_port if n != chosen[key])
    assert asyncio.run(_heartbeat(node_port[other], key)) == ErrorCode.not_coordinator
    assert asyncio.run(_heartbeat(node_port[chosen[key]], key)) != ErrorCode.not_coordinator


def test_clients_follow_the_partitions_of_a_killed_and_a_paused_process(
    cluster: Cluster,
) -> None:
    """An idempotent librdkafka producer writes through a SIGKILL of one process and a SIGSTOP
    of another past its lease; a read_committed consumer then reads every acknowledged record
    once, at the offset it was acknowledged at, with no offset skipped or reused."""
    topic, total = "through-faults", 3000
    create_topic(cluster, topic, 6)
    until(lambda: leaders(cluster, topic), "the partitions placed")
    acknowledged: dict[str, tuple[int, int]] = {}
    failed: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failed.append(str(error))
        else:
            acknowledged[message.value().decode()] = (message.partition(), message.offset())

    producer = ck.Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "request.timeout.ms": 3000,
            "topic.metadata.refresh.interval.ms": 1000,
            "retry.backoff.ms": 50,
        }
    )
    stop = threading.Event()

    def produce() -> None:
        for i in range(total):
            while True:
                try:
                    producer.produce(
                        topic, str(i).encode(), key=str(i).encode(), on_delivery=delivered
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
            time.sleep(0.001)
        producer.flush(60)
        stop.set()

    writer = threading.Thread(target=produce)
    writer.start()
    until(lambda: len(acknowledged) >= 500, "500 records acknowledged")
    cluster.kill(1)
    until(lambda: len(acknowledged) >= 1200, "1,200 records acknowledged after the kill")
    cluster.pause(2)
    time.sleep(SESSION_TIMEOUT_MS / 1000 * 2)  # its lease lapses; its partitions move
    until(lambda: len(acknowledged) >= 1800, "1,800 records acknowledged while paused")
    cluster.resume(2)
    writer.join(120)
    assert stop.is_set() and not failed, failed
    assert len(acknowledged) == total
    moved = until(lambda: leaders(cluster, topic), "the live processes agreeing on the leaders")
    assert max(epoch for _, epoch in moved.values()) >= 1  # partitions moved

    consumer = ck.Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "through-faults-reader",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    read: list[tuple[str, int, int]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + DEADLINE_S
        while len(read) < total and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                read.append((message.value().decode(), message.partition(), message.offset()))
    finally:
        consumer.close()
    values = Counter(value for value, _, _ in read)
    assert len(values) == total and max(values.values()) == 1  # all of them, once each
    assert {v: (p, o) for v, p, o in read} == acknowledged  # where each was acknowledged
    for partition in range(6):
        offsets = sorted(o for _, p, o in read if p == partition)
        assert offsets == list(range(len(offsets)))  # none skipped, none reused
    cluster.restart(1)  # the next test of the module finds three processes again
