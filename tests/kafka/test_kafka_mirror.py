"""MirrorMaker 2 (4.3.1, dedicated mode, exactly-once) from Apache Kafka itself (the reference
broker, Kafka 4.4.0) into `coordinator serve`, over SQLite and over Postgres: the migration path
from an existing Kafka cluster (docs/pages/kafka.md, Migrating from Kafka).

The source holds a topic of two partitions with a config of its own, written by a transactional
producer that commits some transactions and aborts others, and a consumer group that committed
offsets in it. MirrorMaker 2 copies it into the listener, is SIGKILLed, more is written to the
source meanwhile, and it starts again. Then, on the listener:

- the topic (`src.<name>`, MirrorMaker's default replication policy) has the source's partitions
  and its config;
- a read_committed reader finds every committed record of the source once, in its partition and
  order, and none of the aborted ones;
- the group's offsets are translated (MirrorCheckpointConnector): read from them, the listener
  gives what the source gives from the group's offsets.
"""

from __future__ import annotations

import importlib.util
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from tests.support.connect import JvmProcess, committed, read_committed
from tests.support.services import ServiceProcess, free_port, serve_on_fresh_store

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench"
PARTITIONS = 2


def _reference_broker_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference_broker", BENCH / "reference_broker.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["reference_broker"] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class Clusters:
    source: str  # the reference broker's bootstrap
    target: str  # the listener's
    service: ServiceProcess
    root: Path


@pytest.fixture(scope="module")
def reference() -> Iterator[Any]:
    """Apache Kafka itself (bench/reference_broker.py), from the jars the README's test command
    resolved: it says what it is, and leaves nothing behind when it stops."""
    broker = _reference_broker_module().ReferenceBroker()
    with broker:
        described = broker.describe()
        assert described["kafka"] == "4.4.0"  # the Java client's version (tests/clients/java)
        assert described["settings"]["process.roles"] == "broker,controller"
        yield broker
    assert broker.process is None and not broker.root.exists()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def clusters(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, reference: Any
) -> Iterator[Clusters]:
    root = tmp_path_factory.mktemp("mirror")
    port = free_port()
    for service in serve_on_fresh_store(
        request.param,
        root,
        "mirror",
        COORDINATOR_KAFKA_LISTENER=f"127.0.0.1:{port}",
        COORDINATOR_GROUP_MIN_SESSION_TIMEOUT_MS="1000",
        COORDINATOR_GROUP_INITIAL_REBALANCE_DELAY_MS="0",
        COORDINATOR_TIMEOUT_CHECK_INTERVAL_MS="500",
    ):
        yield Clusters(reference.bootstrap, f"127.0.0.1:{port}", service, root)


class MirrorMaker(JvmProcess):
    """One dedicated MirrorMaker 2 node replicating `topic` and `group` from src to dst."""

    def __init__(self, clusters: Clusters, topic: str, group: str) -> None:
        config = clusters.root / f"mm2-{topic}.properties"
        config.write_text(
            "\n".join(
                [
                    "clusters = src, dst",
                    f"src.bootstrap.servers = {clusters.source}",
                    f"dst.bootstrap.servers = {clusters.target}",
                    "src->dst.enabled = true",
                    "dst->src.enabled = false",
                    f"src->dst.topics = {topic}",
                    f"src->dst.groups = {group}",
                    # Exactly once into the listener (KIP-618 under MirrorMaker, Kafka's docs:
                    # "Exactly once" in geo-replication), reading only committed records.
                    "dst.exactly.once.source.support = enabled",
                    "dedicated.mode.enable.internal.rest = true",
                    f"listeners = http://127.0.0.1:{free_port()}",
                    "src.consumer.isolation.level = read_committed",
                    # After a kill, the node started again waits for the killed task's open
                    # transaction to time out (Connect reads its offsets topic to the end, open
                    # transactions included): seconds, not Connect's minute.
                    "dst.producer.transaction.timeout.ms = 2000",
                    "replication.factor = 1",
                    "checkpoints.topic.replication.factor = 1",
                    "heartbeats.topic.replication.factor = 1",
                    "offset-syncs.topic.replication.factor = 1",
                    "offset.storage.replication.factor = 1",
                    "status.storage.replication.factor = 1",
                    "config.storage.replication.factor = 1",
                    "emit.heartbeats.enabled = false",
                    "emit.checkpoints.interval.seconds = 1",
                    "sync.group.offsets.enabled = true",
                    "sync.group.offsets.interval.seconds = 1",
                    "refresh.topics.interval.seconds = 1",
                    "refresh.groups.interval.seconds = 1",
                    "sync.topic.configs.interval.seconds = 1",
                    # An offset sync for every record: the group's offsets translate exactly.
                    "offset.lag.max = 0",
                    "scheduled.rebalance.max.delay.ms = 0",
                    "",
                ]
            )
        )
        super().__init__(
            "org.apache.kafka.connect.mirror.MirrorMaker",
            [str(config), "--clusters", "dst"],
            clusters.root / f"mm2-{topic}.log",
            "MirrorMaker",
        )

    def start(self) -> MirrorMaker:
        self.spawn()
        return self


def _write(
    bootstrap: str, topic: str, producer: ck.Producer, batch: int, aborted: bool
) -> list[tuple[int, str]]:
    """One transaction of `batch` records spread over the partitions; what it wrote."""
    producer.begin_transaction()
    written = []
    for i in range(batch):
        value = f"{'aborted' if aborted else 'kept'} {uuid.uuid4().hex[:12]}"
        partition = i % PARTITIONS
        producer.produce(topic, value=value.encode(), partition=partition)
        written.append((partition, value))
    producer.flush(30)
    (producer.abort_transaction if aborted else producer.commit_transaction)(30)
    return [] if aborted else written


def _commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """The group's offsets, committed by a member of it (once the group has assigned it the
    partitions, so its coordinator is ready)."""
    member = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 3,
        }
    )
    try:
        member.subscribe([topic])
        deadline = time.monotonic() + 60
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.2)
        member.commit(
            offsets=[ck.TopicPartition(topic, p, o) for p, o in offsets.items()],
            asynchronous=False,
        )
    finally:
        member.close()


def test_mirror_maker_copies_a_kafka_cluster_once_through_a_kill(clusters: Clusters) -> None:
    tag = uuid.uuid4().hex[:8]
    topic, group = f"orders-{tag}", f"billing-{tag}"
    mirrored = f"src.{topic}"
    source_admin = AdminClient({"bootstrap.servers": clusters.source, "log_level": 3})
    created = source_admin.create_topics(
        [NewTopic(topic, PARTITIONS, 1, config={"retention.ms": "3600000"})]
    )
    created[topic].result(30)
    producer = ck.Producer(
        {"bootstrap.servers": clusters.source, "transactional.id": f"w-{tag}", "log_level": 3}
    )
    producer.init_transactions(60)
    kept: list[tuple[int, str]] = []
    for n in range(6):
        kept += _write(clusters.source, topic, producer, 40, aborted=n % 3 == 1)
    mirror = MirrorMaker(clusters, topic, group).start()
    try:
        mirror.wait(
            lambda: any(committed(clusters.target, mirrored, p) for p in range(PARTITIONS)),
            "a record mirrored",
            every_s=0.5,
        )
        mirror.kill()
        for n in range(6):
            kept += _write(clusters.source, topic, producer, 40, aborted=n % 3 == 2)
        mirror = MirrorMaker(clusters, topic, group).start()
        expected = {p: [v for q, v in kept if q == p] for p in range(PARTITIONS)}
        mirror.wait(
            lambda: all(
                len(committed(clusters.target, mirrored, p)) >= len(expected[p])
                for p in range(PARTITIONS)
            ),
            "every committed record mirrored",
        )
        # Every committed record once, in its partition and order; no aborted one.
        for p in range(PARTITIONS):
            assert committed(clusters.target, mirrored, p) == expected[p]
        # The topic's shape and config.
        target_admin = AdminClient({"bootstrap.servers": clusters.target, "log_level": 3})
        described = target_admin.list_topics(mirrored, timeout=10).topics[mirrored]
        assert len(described.partitions) == PARTITIONS
        resource = ConfigResource(ResourceType.TOPIC, mirrored)
        configs = target_admin.describe_configs([resource])[resource].result(30)
        mirror.wait(
            lambda: (
                target_admin.describe_configs([resource])[resource].result(30)["retention.ms"].value
                == "3600000"
            ),
            "the topic's config synced",
        )
        assert configs  # described

        # A group of the source that has read the topic to its end commits there, while
        # MirrorMaker runs (as a migration finds it): its offsets are translated onto the
        # listener (MirrorCheckpointConnector, syncing the group's offsets there), so the
        # group, moved to the listener, goes on where it was instead of from the start.
        upstream = {
            p: read_committed(clusters.source, topic, p)[-1][0] + 1 for p in range(PARTITIONS)
        }
        _commit(clusters.source, group, topic, upstream)

        def translated() -> list[ck.TopicPartition]:
            found = target_admin.list_consumer_group_offsets(
                [ck.ConsumerGroupTopicPartitions(group)]
            )[group].result(30)
            return [tp for tp in found.topic_partitions if tp.topic == mirrored and tp.offset > 0]

        mirror.wait(lambda: len(translated()) == PARTITIONS, "the group's offsets translated")
        for tp in translated():
            assert committed(clusters.source, topic, tp.partition, upstream[tp.partition]) == []
            # MirrorMaker translates conservatively (never past what the group read: from the
            # last offset sync before it), so a few records the group read may come again.
            again = committed(clusters.target, mirrored, tp.partition, tp.offset)
            assert again == expected[tp.partition][len(expected[tp.partition]) - len(again) :]
            assert len(again) <= 5
        producer.flush(10)
    finally:
        mirror.stop()
