"""Three `coordinator serve` processes on one store as one Kafka cluster (docs/pages/cluster.md),
on SQLite and on Postgres: every process lists the live brokers, leadership and coordinators are
spread over them, a request sent to the wrong broker is told so, and Kafka's clients follow
the partitions of processes SIGKILLed and SIGSTOPped past their lease, in turn and twice over,
losing nothing acknowledged, writing nothing twice, reusing no offset. Kafka's Java clients and
Kafka Streams meet those faults on Postgres, the store a cluster runs on in production (on
SQLite, a paused writer holds the one write lock: docs/pages/cluster.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as metadata_v12
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from coordinator.core.settings import Settings
from sdk import recordbatch
from tests.support.cluster import Cluster, cluster_on
from tests.support.java import java_command
from tests.support.kafka_broker import Broker, http_produce
from tests.support.kafka_wire import Connection, produce_request
from tests.support.streams import App, amount, assert_totals, committed_output

pytestmark = pytest.mark.slow

DEADLINE_S = 30.0


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with cluster_on(
        request.param,
        tmp_path_factory.mktemp(f"cluster-{request.param}"),
        # As the suite's one broker (tests.support.kafka_broker): Streams' 3 s sessions, a
        # classic group's first rebalance soon, timed-out transactions aborted within 0.2 s.
        COORDINATOR_GROUP_MIN_SESSION_TIMEOUT_MS="1000",
        COORDINATOR_GROUP_INITIAL_REBALANCE_DELAY_MS="200",
        COORDINATOR_TIMEOUT_CHECK_INTERVAL_MS="200",
    ) as running:
        yield running


def until(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while not (found := condition()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return found


@contextlib.asynccontextmanager
async def _connected(port: int) -> AsyncIterator[Connection]:
    connection = Connection(*await asyncio.open_connection("127.0.0.1", port))
    try:
        yield connection
    finally:
        connection.writer.close()
        with contextlib.suppress(ConnectionError):
            await connection.writer.wait_closed()


async def _metadata(port: int, topic: str | None = None) -> Any:
    async with _connected(port) as connection:
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
    async with _connected(port) as connection:
        batch = recordbatch.build([(1, None, b"v", [])])
        answer = await connection.request(produce_request(topic, batch, partition))
        return answer.responses[0].partition_responses[0].error_code


async def _coordinator_of(port: int, key: str) -> int:
    async with _connected(port) as connection:
        answer = await connection.call(10, 4, key_type=0, coordinator_keys=(key,))
        return answer.coordinators[0].node_id


async def _heartbeat(port: int, group: str) -> ErrorCode:
    async with _connected(port) as connection:
        answer = await connection.call(
            12, 4, group_id=group, generation_id=1, member_id="m", group_instance_id=None
        )
        return answer.error_code


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


@pytest.mark.parametrize("cluster", ["postgres"], indirect=True)
def test_a_process_paused_past_its_lease_writes_nothing_when_it_wakes(cluster: Cluster) -> None:
    """A produce that reaches a leader just as it is SIGSTOPped waits in its socket while its
    lease runs out and its partition moves; when it is SIGCONTed it answers
    NOT_LEADER_OR_FOLLOWER, and the record is not in the log (the store fences the append, or
    the process's view, read again, refuses it first).

    On Postgres, the production store. On SQLite a process paused inside a write holds the
    store's one write lock, and every other process's writes (its lease, the move) wait until
    it wakes: safe, but the move this test waits for cannot happen meanwhile
    (docs/pages/cluster.md)."""
    create_topic(cluster, "paused", 3)
    placed = until(lambda: leaders(cluster, "paused"), "the partitions placed")
    node_port = {b.node_id: b.port for b in metadata(cluster.kafka_ports[0]).brokers}
    index = next(i for i, port in enumerate(cluster.kafka_ports) if port != cluster.kafka_ports[0])
    victim = next(n for n, port in node_port.items() if port == cluster.kafka_ports[index])
    partition = next(p for p, (leader, _) in placed.items() if leader == victim)
    batch = recordbatch.build([(1, None, b"written-by-a-zombie", [])])  # no producer id

    async def produce_while_paused() -> ErrorCode:
        async with _connected(node_port[victim]) as connection:
            cluster.pause(index)
            try:
                correlation = await connection.send_request(
                    produce_request("paused", batch, partition)
                )

                def moved() -> bool:
                    (topic,) = metadata(cluster.kafka_ports[0], "paused").topics
                    return topic.partitions[partition].leader_id not in (victim, -1)

                await asyncio.to_thread(until, moved, "the partition moved off the paused leader")
            finally:
                cluster.resume(index)
            answer = await connection.receive(0, 9, correlation)
            return answer.responses[0].partition_responses[0].error_code

    assert asyncio.run(produce_while_paused()) == ErrorCode.not_leader_or_follower
    with cluster.brokers[0].client() as http:
        answer = http.get(f"/v1/topics/paused/partitions/{partition}/records", params={"offset": 0})
        assert answer.status_code == 200, answer.text
        assert answer.json()["records"] == []


async def _listed_groups(port: int) -> list[str]:
    async with _connected(port) as connection:
        answer = await connection.call(16, 4, states_filter=())
        assert answer.error_code == ErrorCode.none
        return [g.group_id for g in answer.groups]


def test_each_broker_lists_the_groups_it_coordinates(cluster: Cluster) -> None:
    """As Kafka's brokers do, so the admin client, which asks them all, lists each group once."""
    create_topic(cluster, "listed", 1)
    groups = {f"listed-{i}" for i in range(12)}
    with cluster.brokers[0].client() as http:
        for group in groups:
            offsets = [{"topic": "listed", "partition": 0, "offset": 0}]
            answer = http.post(f"/v1/groups/{group}/offsets", json={"offsets": offsets})
            assert answer.status_code == 200, answer.text

    def each_once() -> list[set[str]] | None:
        """Each broker's groups, once every group is listed by exactly one: after a broker
        comes back (the module's earlier tests pause and kill them), the others see it live
        at their next beat, and until then two may both take some of its groups."""
        listed = [asyncio.run(_listed_groups(port)) for port in cluster.kafka_ports]
        mine = [{g for g in found if g in groups} for found in listed]
        return mine if sum(len(m) for m in mine) == len(groups) else None

    mine = until(each_once, "every group listed by one broker")
    assert set().union(*mine) == groups
    assert all(mine)  # spread: every broker coordinates some


def test_clients_follow_the_partitions_of_a_killed_and_a_paused_process(
    cluster: Cluster,
) -> None:
    """An idempotent librdkafka producer writes through a SIGKILL of one process and a SIGSTOP
    of another past its lease, twice in turn (`Cluster.kill_then_pause`); a read_committed
    consumer then reads the whole log: every acknowledged record at the offset it was
    acknowledged at, with no offset skipped or reused, and none written twice by the store.

    librdkafka alone may send a record twice. After a request refused with a retriable error,
    it answers the OUT_OF_ORDER_SEQUENCE_NUMBER of the request that followed by bumping its
    epoch on every partition, and resends under the new epoch, from sequence 0, what it had not
    seen acknowledged, a batch that was written before its answer was lost included
    (confluentinc/librdkafka#4953, open; Kafka's broker takes it as new, as the store does).
    So a record read twice must be two batches of different epochs, after the client logged
    its bump; a batch written twice under one epoch would be the store's."""
    topic = "through-faults"
    create_topic(cluster, topic, 6)
    until(lambda: leaders(cluster, topic), "the partitions placed")
    acknowledged: dict[str, tuple[int, int]] = {}
    failed: list[str] = []
    client_log = _Lines(f"{topic}-producer")

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
            "debug": "eos",  # its epoch bumps, which may resend written records
            "logger": client_log,
        }
    )
    faults_over, flushed = threading.Event(), threading.Event()
    sent = [0]

    def produce() -> None:  # until the faults are over, so every one of them meets the writes
        while not faults_over.is_set():
            i = sent[0]
            while True:
                try:
                    producer.produce(
                        topic, str(i).encode(), key=str(i).encode(), on_delivery=delivered
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            sent[0] += 1
            producer.poll(0)
            time.sleep(0.004)
        if producer.flush(60) == 0:
            flushed.set()

    writer = threading.Thread(target=produce)
    writer.start()
    until(lambda: len(acknowledged) >= 500, "500 records acknowledged")
    try:
        cluster.kill_then_pause(lambda: None)
    finally:
        faults_over.set()
        writer.join(120)
    total = sent[0]
    assert flushed.is_set() and not failed, failed
    assert len(acknowledged) == total
    moved = until(lambda: leaders(cluster, topic), "the live processes agreeing on the leaders")
    assert max(epoch for _, epoch in moved.values()) >= 1  # partitions moved
    read = read_committed(cluster, topic, 6)
    where: dict[str, list[tuple[int, int]]] = {}
    for value, partition, offset in read:
        where.setdefault(value, []).append((partition, offset))
    missing = [(v, at) for v, at in acknowledged.items() if at not in where.get(v, ())]
    assert set(where) == set(acknowledged) and not missing, missing  # each where acknowledged
    for partition in range(6):
        offsets = sorted(o for _, p, o in read if p == partition)
        assert offsets == list(range(len(offsets)))  # none skipped, none reused
    epochs_at = asyncio.run(_producer_epochs(cluster, topic))
    assert {(p, o) for _, p, o in read} == set(epochs_at)  # the log, as the store holds it
    twice = {v: at for v, at in where.items() if len(at) > 1}
    if twice:
        bumps = [line for line in client_log.lines if "bumped epoch" in line]
        written = {v: [epochs_at[at] for at in places] for v, places in twice.items()}
        assert bumps and all(len(set(e)) == len(e) for e in written.values()), written


def read_committed(cluster: Cluster, topic: str, partitions: int) -> list[tuple[str, int, int]]:
    """(value, partition, offset) of every record a read_committed consumer reads from the start
    to the end of each of the topic's `partitions` (librdkafka), with nothing written meanwhile."""
    consumer = ck.Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"{topic}-checker",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    read: list[tuple[str, int, int]] = []
    ended: set[int] = set()
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + DEADLINE_S
        while len(ended) < partitions and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is None:
                read.append((message.value().decode(), message.partition(), message.offset()))
            elif message.error().code() == ck.KafkaError._PARTITION_EOF:
                ended.add(message.partition())
    finally:
        consumer.close()
    assert len(ended) == partitions, f"read to the end of {sorted(ended)} only"
    return read


class _Lines(logging.Logger):
    """A client's log (confluent-kafka's `logger`), kept as lines."""

    def __init__(self, name: str) -> None:
        super().__init__(name, logging.DEBUG)
        self.lines: list[str] = []

    def handle(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def _producer_epochs(cluster: Cluster, topic: str) -> dict[tuple[int, int], int]:
    """The producer epoch of the batch holding each (partition, offset) of `topic`'s log, as
    the store holds it."""
    engine = create_async_engine(Settings(database_url=cluster.url).database_url)
    try:
        async with engine.connect() as connection:
            batches = await connection.execute(
                text(
                    'SELECT "partition", base_offset, last_offset, producer_epoch FROM batches '
                    "WHERE topic = :topic AND control IS NULL"
                ),
                {"topic": topic},
            )
            return {
                (partition, offset): epoch
                for partition, first, last, epoch in batches
                for offset in range(first, last + 1)
            }
    finally:
        await engine.dispose()


# What KafkaProducer.send throws once close() has begun, before the record reaches a batch.
_REFUSED_BY_A_CLOSED_PRODUCER = (
    "Cannot perform operation after producer has been closed",
    "Producer closed while send in progress",
)


def _events(path: Path, name: str) -> list[dict[str, Any]]:
    lines = (json.loads(line) for line in path.read_text().splitlines() if line.startswith("{"))
    return [event for event in lines if event.get("name") == name]


@pytest.mark.parametrize("cluster", ["postgres"], indirect=True)  # the production store
def test_kafkas_java_producer_and_consumer_through_a_killed_and_a_paused_process(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Kafka's VerifiableProducer (idempotent, acks=all) writes while a process is SIGKILLed and
    another SIGSTOPped past its lease, twice in turn; a VerifiableConsumer in a group reads
    meanwhile. Every acknowledged record is in the log once, where it was acknowledged, with no
    offset skipped or reused; the Java consumer followed the moves to the end of every
    partition."""
    topic = "java-through-faults"
    create_topic(cluster, topic, 6)
    until(lambda: leaders(cluster, topic), "the partitions placed")
    config = tmp_path / "client.properties"
    config.write_text(
        # VerifiableProducer sets retries=0 (Kafka's system tests count failed sends): the
        # producer's own default, as an application runs it.
        "enable.idempotence=true\nretries=2147483647\nrequest.timeout.ms=3000\n"
        "metadata.max.age.ms=1000\nretry.backoff.ms=50\n"
    )
    common = ["--bootstrap-server", cluster.bootstrap, "--topic", topic]
    produced, consumed = tmp_path / "producer.out", tmp_path / "consumer.out"
    with produced.open("w") as out:
        producer = subprocess.Popen(
            java_command(
                *common, "--max-messages", "-1", "--throughput", "400", "--acks", "-1",
                "--command-config", str(config),
                main="org.apache.kafka.tools.VerifiableProducer",
            ),
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    with consumed.open("w") as out:
        consumer = subprocess.Popen(
            java_command(
                *common, "--group-id", "java-reader", "--reset-policy", "earliest",
                "--session-timeout", "6000", "--verbose", "--command-config", str(config),
                main="org.apache.kafka.tools.VerifiableConsumer",
            ),
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        until(lambda: len(_events(produced, "producer_send_success")) >= 400, "400 acks")

        def alive() -> None:
            assert producer.poll() is None, produced.read_text()[-3000:]

        cluster.kill_then_pause(alive)
        producer.terminate()  # it flushes what it sent, then says what was acknowledged
        assert producer.wait(120) in (0, 143), produced.read_text()[-3000:]
        (summary,) = _events(produced, "tool_data")
        acknowledged = {
            e["value"]: (e["partition"], e["offset"])
            for e in _events(produced, "producer_send_success")
        }
        # The tool's shutdown hook closes the producer while its main thread may still be
        # sending (VerifiableProducer.stopProducing is not volatile): a send the closed producer
        # refuses never left the client, and came after every send it took. Any other failed
        # send is the cluster's.
        failed = _events(produced, "producer_send_error")
        refused = [e for e in failed if e["message"] in _REFUSED_BY_A_CLOSED_PRODUCER]
        assert failed == refused, failed
        last = max(map(int, acknowledged))
        assert all(int(e["value"]) > last for e in refused), refused
        assert summary["acked"] == len(acknowledged) == summary["sent"] - len(refused), summary
        read = read_committed(cluster, topic, 6)
        assert Counter(v for v, _, _ in read) == Counter(list(acknowledged))  # all, once each
        assert {v: (p, o) for v, p, o in read} == acknowledged
        for partition in range(6):
            offsets = sorted(o for _, p, o in read if p == partition)
            assert offsets == list(range(len(offsets)))
        ends = Counter(p for _, p, _ in read)

        def consumed_to_the_end() -> bool:
            seen: dict[int, int] = {}
            for event in _events(consumed, "record_data"):
                seen[event["partition"]] = max(seen.get(event["partition"], -1), event["offset"])
            return all(seen.get(p, -1) == ends[p] - 1 for p in range(6))

        until(consumed_to_the_end, "the Java consumer reading every partition to its end")
        for event in _events(consumed, "record_data"):  # re-reads after a move read the same
            assert acknowledged[event["value"]] == (event["partition"], event["offset"])
    finally:
        for process in (producer, consumer):
            process.kill()
            process.wait(30)
        if cluster.brokers[1].process is None or cluster.brokers[1].process.poll() is not None:
            cluster.brokers[1].start()  # the next test finds three processes


@pytest.mark.parametrize("cluster", ["postgres"], indirect=True)  # the production store
def test_kafka_streams_exactly_once_v2_through_a_killed_and_a_paused_process(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Kafka Streams (exactly_once_v2, the suite's running totals) counts every input once while
    a process is SIGKILLed and another SIGSTOPped past its lease, twice in turn."""
    broker = Broker(cluster.brokers[0], cluster.bootstrap)
    source, output = "streams-in", "streams-out"
    for topic in (source, output):
        create_topic(cluster, topic, 2)
    faults_over = threading.Event()
    fed = [0]

    def feed() -> None:
        """Inputs, input i to partition i % 2, about 25 a second until the faults are over:
        every fault meets the app at work (it counts some 100 a second)."""
        while not faults_over.is_set() or fed[0] == 0:
            first = fed[0]
            chunk = [f"{i}:{amount(i)}:g{i % 5}" for i in range(first, first + 10)]
            for p in range(2):
                http_produce(broker, source, p, chunk[p::2])
            fed[0] += len(chunk)
            time.sleep(0.4)

    feeder = threading.Thread(target=feed)
    feeder.start()
    app = App(
        broker, "cluster-totals", tmp_path / "state", (source, output), "classic",
        "request.timeout.ms=3000", "metadata.max.age.ms=1000", "retry.backoff.ms=50",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(committed_output(broker, output)) < 50:
            app.alive()
            assert time.monotonic() < deadline, app.lines()
            time.sleep(0.2)
        try:
            cluster.kill_then_pause(app.alive)
        finally:
            faults_over.set()
            feeder.join(60)
        deadline = time.monotonic() + 3 * DEADLINE_S
        while len(committed_output(broker, output)) < fed[0]:
            app.alive()
            assert time.monotonic() < deadline, app.lines()
            time.sleep(0.2)
        assert_totals(broker, output, fed[0])
    finally:
        app.stop()
        broker.http.close()
