"""Kafka's own clients, unchanged, against `coordinator serve` with its Kafka listener, on SQLite
and on Postgres (docs/pages/http-api.md, "Kafka protocol"): kcat (Debian's), kafka-python and
confluent-kafka (librdkafka) produce, consume, rebalance and run exactly-once transactions; records
written through either door are read through the other."""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import confluent_kafka as ck
import confluent_kafka.admin as cka
import kafka
import pytest
from kafka.coordinator.assignors.abstract import (
    AbstractPartitionAssignor,
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)

from tests.support.kafka_broker import Broker, broker, create_topic, http_produce, http_values

__all__ = ["broker"]

pytestmark = pytest.mark.slow

# Short enough for a test, long enough for a loaded machine.
DEADLINE_S = 30.0


def until(condition: Callable[[], bool], what: str | Callable[[], str]) -> None:
    """Poll `condition` until it holds; `what` (or what it answers, once the time is up) names
    what was awaited in the failure."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out waiting for {what if isinstance(what, str) else what()}"
            )
        time.sleep(0.05)


@contextmanager
def closing(*consumers: ck.Consumer) -> Iterator[None]:
    """Close the consumers however the block ends, while the broker still runs. A consumer left
    to the garbage collector (a failed test's traceback holds it) is destroyed after the module's
    broker stopped, and librdkafka's destroy of a KIP-848 member then waits forever: one failure
    became a suite that never ended."""
    try:
        yield
    finally:
        for consumer in consumers:
            with contextlib.suppress(RuntimeError):  # closed already by the test
                consumer.close()


def consume(consumer: ck.Consumer, count: int) -> list[ck.Message]:
    got: list[ck.Message] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < count:
        assert time.monotonic() < deadline, f"consumed {len(got)} of {count}"
        message = consumer.poll(0.2)
        if message is None:
            continue
        assert message.error() is None, message.error()
        got.append(message)
    return got


def confluent_config(broker: Broker, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": broker.bootstrap, "log_level": 3, **extra}


# -- kcat ----------------------------------------------------------------------------------------


def kcat(broker: Broker, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["kcat", "-b", broker.bootstrap, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kcat_produces_and_consumes_across_both_doors(broker: Broker) -> None:
    topic = create_topic(broker, partitions=2)
    kcat(broker, "-P", "-t", topic, "-p", "1", "-K", ":", stdin="a:1\nb:2\nc:3\n")
    assert http_values(broker, topic, 1) == ["1", "2", "3"]
    http_produce(broker, topic, 0, ["x", "y"])
    out = kcat(broker, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-f", "%k=%s@%o\n")
    assert out.splitlines() == ["x=x@0", "y=y@1"]
    listing = kcat(broker, "-L", "-t", topic)
    assert f'topic "{topic}" with 2 partitions' in listing


# -- confluent-kafka (librdkafka) -------------------------------------------------------------


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_idempotent_producer_every_codec_read_over_http(broker: Broker, codec: str) -> None:
    topic = create_topic(broker)
    producer = ck.Producer(
        confluent_config(
            broker, **{"enable.idempotence": True, "acks": "all", "compression.type": codec}
        )
    )
    errors: list[Any] = []
    for i in range(200):
        producer.produce(
            topic, key=f"k{i}", value=f"v{i}", on_delivery=lambda e, _: errors.append(e)
        )
    assert producer.flush(DEADLINE_S) == 0
    assert [e for e in errors if e is not None] == []
    assert http_values(broker, topic, 0) == [f"v{i}" for i in range(200)]


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_plain_producer_with_every_acks_setting(broker: Broker, acks: str) -> None:
    topic = create_topic(broker)
    producer = ck.Producer(confluent_config(broker, **{"acks": acks, "enable.idempotence": False}))
    for i in range(20):
        producer.produce(topic, value=f"a{i}", partition=0)
    assert producer.flush(DEADLINE_S) == 0
    # acks=0 gets no answer: the records are there once the listener has stored them.
    until(lambda: len(http_values(broker, topic, 0)) == 20, "the records to be stored")
    assert http_values(broker, topic, 0) == [f"a{i}" for i in range(20)]


def test_read_committed_consumer_never_sees_aborted_records(broker: Broker) -> None:
    topic = create_topic(broker)
    producer = ck.Producer(confluent_config(broker, **{"transactional.id": f"rc-{topic}"}))
    producer.init_transactions(DEADLINE_S)
    for i, commit in enumerate([True, False, True, False, True]):
        producer.begin_transaction()
        for j in range(3):
            producer.produce(topic, value=f"{i}-{j}", partition=0)
        # Sent before the abort (librdkafka drops what is still queued when it aborts).
        assert producer.flush(DEADLINE_S) == 0
        if commit:
            producer.commit_transaction(DEADLINE_S)
        else:
            producer.abort_transaction(DEADLINE_S)
    committed = [f"{i}-{j}" for i in (0, 2, 4) for j in range(3)]
    reader = ck.Consumer(
        confluent_config(broker, **{"group.id": f"g-{topic}", "isolation.level": "read_committed"})
    )
    reader.assign([ck.TopicPartition(topic, 0, 0)])
    got = [m.value().decode() for m in consume(reader, len(committed))]
    # Nothing more arrives: the aborted records are filtered, not just late.
    assert reader.poll(1.0) is None
    reader.close()
    assert got == committed
    assert http_values(broker, topic, 0) == committed
    uncommitted = ck.Consumer(
        confluent_config(
            broker, **{"group.id": f"u-{topic}", "isolation.level": "read_uncommitted"}
        )
    )
    uncommitted.assign([ck.TopicPartition(topic, 0, 0)])
    assert len(consume(uncommitted, 15)) == 15
    uncommitted.close()


def test_zombie_is_fenced_by_a_second_instance(broker: Broker) -> None:
    topic = create_topic(broker)
    tid = f"zombie-{topic}"
    zombie = ck.Producer(confluent_config(broker, **{"transactional.id": tid}))
    zombie.init_transactions(DEADLINE_S)
    zombie.begin_transaction()
    zombie.produce(topic, value="from the zombie", partition=0)
    assert zombie.flush(DEADLINE_S) == 0
    successor = ck.Producer(confluent_config(broker, **{"transactional.id": tid}))
    successor.init_transactions(DEADLINE_S)
    successor.begin_transaction()
    successor.produce(topic, value="from the successor", partition=0)
    successor.commit_transaction(DEADLINE_S)
    with pytest.raises(ck.KafkaException) as raised:
        zombie.commit_transaction(DEADLINE_S)
    error = raised.value.args[0]
    assert error.fatal() or error.txn_requires_abort(), error
    assert http_values(broker, topic, 0) == ["from the successor"]


def group_protocol(protocol: str) -> dict[str, Any]:
    """A confluent-kafka consumer's group settings: Kafka's classic protocol (the client's
    leader assigns) or KIP-848's (`consumer`: the coordinator assigns; its timeouts are the
    coordinator's, so the client may not set them)."""
    if protocol == "consumer":
        return {"group.protocol": "consumer"}
    return {"heartbeat.interval.ms": 100, "session.timeout.ms": 6000}


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_consume_transform_produce_with_subscribe_is_exactly_once(
    broker: Broker, protocol: str
) -> None:
    source = create_topic(broker, partitions=2)
    sink = create_topic(broker, partitions=2)
    for p in (0, 1):
        http_produce(broker, source, p, [f"{p}-{i}" for i in range(30)])
    group = f"eos-{source}"
    consumer = ck.Consumer(
        confluent_config(
            broker,
            **{
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                **group_protocol(protocol),
            },
        )
    )
    consumer.subscribe([source])
    with closing(consumer):
        producer = ck.Producer(confluent_config(broker, **{"transactional.id": f"eos-{source}"}))
        producer.init_transactions(DEADLINE_S)
        done = 0
        deadline = time.monotonic() + DEADLINE_S
        aborted_once = False
        while done < 60:
            assert time.monotonic() < deadline, f"processed {done} of 60"
            batch = [m for m in consumer.consume(10, 0.2) if m.error() is None]
            if not batch:
                continue
            producer.begin_transaction()
            for m in batch:
                producer.produce(sink, value=m.value() + b"!", partition=m.partition())
            positions = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 10)
            if not aborted_once:
                # One aborted round: its output never shows, and its input is read again.
                aborted_once = True
                producer.abort_transaction(DEADLINE_S)
                first: dict[int, int] = {}
                for m in batch:
                    first.setdefault(m.partition(), m.offset())
                for partition, offset in first.items():
                    consumer.seek(ck.TopicPartition(source, partition, offset))
                continue
            producer.commit_transaction(DEADLINE_S)
            done += len(batch)
    outputs = sorted(http_values(broker, sink, 0) + http_values(broker, sink, 1))
    assert outputs == sorted(f"{p}-{i}!" for p in (0, 1) for i in range(30))
    offsets = broker.http.get(f"/v1/groups/{group}/offsets").json()["offsets"]
    assert {(o["partition"], o["offset"]) for o in offsets} == {(0, 30), (1, 30)}


def test_admin_client_creates_deletes_and_describes_topics(broker: Broker) -> None:
    admin = cka.AdminClient(confluent_config(broker))
    name = f"adm{uuid.uuid4().hex[:8]}"
    futures = admin.create_topics(
        [cka.NewTopic(name, 3, 1, config={"cleanup.policy": "compact", "retention.ms": "60000"})]
    )
    futures[name].result(DEADLINE_S)
    assert broker.http.get(f"/v1/topics/{name}").json()["partitions"].__len__() == 3
    duplicate = admin.create_topics([cka.NewTopic(name, 1, 1)])[name]
    with pytest.raises(ck.KafkaException) as raised:
        duplicate.result(DEADLINE_S)
    assert raised.value.args[0].code() == ck.KafkaError.TOPIC_ALREADY_EXISTS
    resource = cka.ConfigResource(cka.ResourceType.TOPIC, name)
    described = admin.describe_configs([resource])[resource].result(DEADLINE_S)
    assert described["cleanup.policy"].value == "compact"
    assert described["retention.ms"].value == "60000"
    assert not described["retention.ms"].is_default
    change = cka.ConfigResource(
        cka.ResourceType.TOPIC,
        name,
        incremental_configs=[
            cka.ConfigEntry(
                "retention.ms", "120000", incremental_operation=cka.AlterConfigOpType.SET
            )
        ],
    )
    admin.incremental_alter_configs([change])[change].result(DEADLINE_S)
    configs = broker.http.get(f"/v1/topics/{name}/configs").json()["configs"]
    assert {c["name"]: c["value"] for c in configs}["retention.ms"] == "120000"
    admin.delete_topics([name])[name].result(DEADLINE_S)
    assert broker.http.get(f"/v1/topics/{name}").status_code == 404


# -- kafka-python ------------------------------------------------------------------------------


def test_kafka_python_idempotent_producer(broker: Broker) -> None:
    topic = create_topic(broker, partitions=2)
    producer = kafka.KafkaProducer(
        bootstrap_servers=broker.bootstrap, enable_idempotence=True, acks="all"
    )
    for i in range(50):
        producer.send(topic, value=f"v{i}".encode(), partition=i % 2)
    producer.flush(DEADLINE_S)
    producer.close()
    assert http_values(broker, topic, 0) == [f"v{i}" for i in range(0, 50, 2)]
    assert http_values(broker, topic, 1) == [f"v{i}" for i in range(1, 50, 2)]


def test_kafka_python_transactional_producer(broker: Broker) -> None:
    topic = create_topic(broker)
    producer = kafka.KafkaProducer(
        bootstrap_servers=broker.bootstrap, transactional_id=f"kp-{topic}"
    )
    producer.init_transactions()
    for value, commit in [(b"t1", True), (b"t2", False), (b"t3", True)]:
        producer.begin_transaction()
        producer.send(topic, value=value, partition=0)
        producer.flush(DEADLINE_S)
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
    producer.close()
    assert http_values(broker, topic, 0) == ["t1", "t3"]
    assert http_values(broker, topic, 0, committed=False) == ["t1", "t2", "t3"]


def test_kafka_python_group_of_two_shares_the_partitions(broker: Broker) -> None:
    topic = create_topic(broker, partitions=4)
    group = f"kpg-{topic}"
    stop = threading.Event()
    assignments: dict[str, set[int]] = {}
    errors: list[BaseException] = []

    def member(name: str) -> None:
        try:
            consumer = kafka.KafkaConsumer(
                topic,
                bootstrap_servers=broker.bootstrap,
                group_id=group,
                heartbeat_interval_ms=100,
                session_timeout_ms=6000,
                auto_offset_reset="earliest",
            )
            while not stop.is_set():
                consumer.poll(100)
                assignments[name] = {tp.partition for tp in consumer.assignment()}
            consumer.close()
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(n,)) for n in ("a", "b")]
    threads[0].start()
    until(lambda: assignments.get("a") == {0, 1, 2, 3}, "the first member to own everything")
    threads[1].start()

    def shared() -> bool:
        a, b = assignments.get("a", set()), assignments.get("b", set())
        return len(a) == 2 and len(b) == 2 and not a & b

    until(shared, "the two members to own two partitions each")
    # kafka-python's default assignor is range, run by the group's leader: the member ids
    # sorted, the first takes the first half.
    assert sorted(sorted(a) for a in assignments.values()) == [[0, 1], [2, 3]]
    description = broker.http.get(f"/v1/groups/{group}").json()
    assert {m["protocol"] for m in description["members"]} == {"classic"}
    stop.set()
    for thread in threads:
        thread.join(DEADLINE_S)
    assert errors == []


class _ToTheNamed(AbstractPartitionAssignor):
    """A client-side assignor with its own data, as Kafka Streams and Faust have: each member
    names itself in its subscription's user data, and the leader gives every partition to the
    member named b (to the first member while there is none)."""

    name = "to-the-named"
    version = 0
    user_data = b""

    @classmethod
    def assign(cls, cluster: Any, members: Any) -> dict[str, Any]:
        named = {m.metadata.user_data: m.member_id for m in members}
        chosen = named.get(b"b", min(m.member_id for m in members))
        topics = sorted({t for m in members for t in m.metadata.topics})
        everything = [(t, sorted(cluster.partitions_for_topic(t))) for t in topics]
        return {
            m.member_id: ConsumerProtocolAssignment(
                cls.version, everything if m.member_id == chosen else [], b""
            )
            for m in members
        }

    @classmethod
    def metadata(cls, topics: Any) -> Any:
        return ConsumerProtocolSubscription(cls.version, list(topics), cls.user_data)

    @classmethod
    def on_assignment(cls, assignment: Any, generation: Any = None) -> None:
        pass


class _NamedA(_ToTheNamed):
    user_data = b"a"


class _NamedB(_ToTheNamed):
    user_data = b"b"


def test_kafka_python_custom_assignor_gets_every_members_user_data(broker: Broker) -> None:
    topic = create_topic(broker, partitions=4)
    group = f"named-{topic}"
    consumers = {
        name: kafka.KafkaConsumer(
            topic,
            bootstrap_servers=broker.bootstrap,
            group_id=group,
            heartbeat_interval_ms=100,
            session_timeout_ms=6000,
            partition_assignment_strategy=[assignor],
        )
        for name, assignor in (("a", _NamedA), ("b", _NamedB))
    }

    def owned() -> dict[str, set[int]]:
        for consumer in consumers.values():
            consumer.poll(50)
        return {n: {tp.partition for tp in c.assignment()} for n, c in consumers.items()}

    until(lambda: owned() == {"a": set(), "b": {0, 1, 2, 3}}, "b to own everything")
    description = broker.http.get(f"/v1/groups/{group}").json()
    assert description["type"] == "classic"
    assert {m["assignor"] for m in description["members"]} == {"to-the-named"}
    for consumer in consumers.values():
        consumer.close()


def _static(broker: Broker, group: str, instance: str) -> ck.Consumer:
    return ck.Consumer(
        confluent_config(
            broker,
            **{
                "group.id": group,
                "group.instance.id": instance,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 100,
            },
        )
    )


def _owned(*consumers: ck.Consumer) -> list[set[int]]:
    for consumer in consumers:
        consumer.poll(0.05)
    return [{tp.partition for tp in c.assignment()} for c in consumers]


def test_a_static_member_restarted_within_its_session_keeps_its_partitions(
    broker: Broker,
) -> None:
    topic = create_topic(broker, partitions=4)
    group = f"static-{topic}"
    a, b = _static(broker, group, "a"), _static(broker, group, "b")
    a.subscribe([topic])
    b.subscribe([topic])
    until(lambda: sorted(map(sorted, _owned(a, b))) == [[0, 1], [2, 3]], "a split")
    before = broker.http.get(f"/v1/groups/{group}").json()
    _, kept = _owned(a, b)
    b.close()  # a static member leaves no LeaveGroup behind: its partitions wait for it
    again = _static(broker, group, "b")
    again.subscribe([topic])
    until(lambda: _owned(a, again)[1] == kept, "b's partitions back")
    after = broker.http.get(f"/v1/groups/{group}").json()
    assert after["group_epoch"] == before["group_epoch"]  # no rebalance
    assert _owned(a)[0] == {0, 1, 2, 3} - kept
    a.close()
    again.close()


def test_a_second_member_with_the_same_instance_id_fences_the_first(broker: Broker) -> None:
    topic = create_topic(broker, partitions=2)
    group = f"fence-{topic}"
    first = _static(broker, group, "one")
    first.subscribe([topic])
    until(lambda: _owned(first)[0] == {0, 1}, "the first to own both partitions")
    second = _static(broker, group, "one")
    second.subscribe([topic])
    until(lambda: _owned(second)[0] == {0, 1}, "the second to take them over")
    seen: list[ck.KafkaError] = []

    def fenced() -> bool:
        message = first.poll(0.05)
        if message is not None and message.error() is not None:
            seen.append(message.error())
        return any(e.code() == ck.KafkaError._FATAL for e in seen)

    # The first's next heartbeat is FENCED_INSTANCE_ID, fatal to a librdkafka consumer.
    until(fenced, "the first to learn it is fenced")
    assert "fenced" in seen[-1].str()
    members = broker.http.get(f"/v1/groups/{group}").json()["members"]
    assert len(members) == 1
    first.close()
    second.close()


def test_kip_848_consumers_split_the_partitions_and_one_leaves(broker: Broker) -> None:
    topic = create_topic(broker, partitions=4)
    group = f"k848-{topic}"

    def member() -> ck.Consumer:
        consumer = ck.Consumer(
            confluent_config(broker, **{"group.id": group, "group.protocol": "consumer"})
        )
        consumer.subscribe([topic])
        return consumer

    a, b = member(), member()
    owned: list[set[int]] = []

    def split() -> bool:
        owned[:] = _owned(a, b)
        mine, theirs = owned
        return len(mine) == len(theirs) == 2 and not mine & theirs

    def state() -> str:
        return f"{owned}; the group: {broker.http.get(f'/v1/groups/{group}').text}"

    with closing(a, b):
        until(split, lambda: f"the two to split four partitions: {state()}")
        description = broker.http.get(f"/v1/groups/{group}").json()
        assert description["type"] == "consumer"
        assert {m["protocol"] for m in description["members"]} == {"consumer"}
        admin = cka.AdminClient(confluent_config(broker))  # held: its futures need it alive
        described = admin.describe_consumer_groups([group])[group].result(DEADLINE_S)
        assert described.type == ck.ConsumerGroupType.CONSUMER
        assert sorted(len(m.assignment.topic_partitions) for m in described.members) == [2, 2]
        b.close()

        def alone() -> bool:
            owned[:] = _owned(a)
            return owned[0] == {0, 1, 2, 3}

        until(alone, lambda: f"the one left to own everything: {state()}")


def test_admin_client_describes_the_cluster_and_lists_and_deletes_groups(broker: Broker) -> None:
    admin = cka.AdminClient(confluent_config(broker))
    cluster = admin.describe_cluster().result(DEADLINE_S)
    assert [node.id for node in cluster.nodes] == [0]
    assert cluster.controller.id == 0
    topic = create_topic(broker)
    group = f"dg-{topic}"
    committed = broker.http.post(
        f"/v1/groups/{group}/offsets",
        json={"offsets": [{"topic": topic, "partition": 0, "offset": 1}]},
    )
    assert committed.status_code == 200
    listed = admin.list_consumer_groups(types={ck.ConsumerGroupType.CONSUMER}).result(DEADLINE_S)
    assert group in [g.group_id for g in listed.valid]
    classic = admin.list_consumer_groups(types={ck.ConsumerGroupType.CLASSIC}).result(DEADLINE_S)
    assert group not in [g.group_id for g in classic.valid]
    deleted = admin.delete_consumer_groups([group, f"none-{topic}"])
    deleted[group].result(DEADLINE_S)
    with pytest.raises(ck.KafkaException) as refused:
        deleted[f"none-{topic}"].result(DEADLINE_S)
    assert refused.value.args[0].code() == ck.KafkaError.GROUP_ID_NOT_FOUND
    assert broker.http.get(f"/v1/groups/{group}").status_code == 404


def test_admin_client_grows_a_topic_and_a_group_takes_the_new_partitions(broker: Broker) -> None:
    admin = cka.AdminClient(confluent_config(broker))
    topic = create_topic(broker, partitions=2)
    group = f"grow-{topic}"
    consumer = ck.Consumer(
        confluent_config(
            broker,
            **{
                "group.id": group,
                "heartbeat.interval.ms": 100,
                "session.timeout.ms": 6000,
                "topic.metadata.refresh.interval.ms": 500,
            },
        )
    )
    consumer.subscribe([topic])
    until(lambda: consumer.poll(0.1) is None and len(consumer.assignment()) == 2, "2 partitions")
    admin.create_partitions([cka.NewPartitions(topic, 4)])[topic].result(DEADLINE_S)
    assert len(broker.http.get(f"/v1/topics/{topic}").json()["partitions"]) == 4
    until(lambda: consumer.poll(0.1) is None and len(consumer.assignment()) == 4, "4 partitions")
    consumer.close()
    shrink = admin.create_partitions([cka.NewPartitions(topic, 3)])[topic]
    with pytest.raises(ck.KafkaException) as refused:
        shrink.result(DEADLINE_S)
    assert refused.value.args[0].code() == ck.KafkaError.INVALID_PARTITIONS
    # New partitions placed by hand: on this one broker (node 0) they are taken, elsewhere not.
    admin.create_partitions([cka.NewPartitions(topic, 5, [[0]])])[topic].result(DEADLINE_S)
    elsewhere = admin.create_partitions([cka.NewPartitions(topic, 7, [[0], [1]])])[topic]
    with pytest.raises(ck.KafkaException) as refused:
        elsewhere.result(DEADLINE_S)
    assert refused.value.args[0].code() == ck.KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert len(broker.http.get(f"/v1/topics/{topic}").json()["partitions"]) == 5
