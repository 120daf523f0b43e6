"""The client matrix beyond librdkafka and kafka-python (issue 22, item 9): aiokafka and KafkaJS,
unchanged, against `coordinator serve`'s Kafka listener on SQLite and on Postgres, one test per
(client, scenario), so a gap shows as a failing cell: an idempotent producer with every codec
the client has; commit, abort and read_committed; consume-transform-produce with its offsets in
the transaction and one aborted round, exactly once, the group's offsets at the input's end;
zombie fencing, seen by the zombie as its own fencing error; a group of two splitting four
partitions with the client's own assignor (its leader assigns; the coordinator carries the
answer), one leaving; admin create, list, describe and delete.

KafkaJS runs `tests/clients/js/scenario.js` (installed by the README's test command with npm).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

# The same brokers (a service per store, its Kafka listener) and helpers as the other clients'.
from tests.support.kafka_broker import Broker, broker, create_topic, http_produce, http_values

__all__ = ["broker"]

pytestmark = pytest.mark.slow

DEADLINE_S = 30.0
JS = Path(__file__).resolve().parents[1] / "clients" / "js"


def committed_offsets(broker: Broker, group: str) -> set[tuple[int, int]]:
    offsets = broker.http.get(f"/v1/groups/{group}/offsets").json()["offsets"]
    return {(o["partition"], o["offset"]) for o in offsets}


# -- aiokafka ------------------------------------------------------------------------------------


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, DEADLINE_S * 2))


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_aiokafka_idempotent_producer_every_codec(broker: Broker, codec: str | None) -> None:
    topic = create_topic(broker)

    async def scenario() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap, enable_idempotence=True, compression_type=codec
        )
        await producer.start()
        try:
            for i in range(5):
                await producer.send_and_wait(topic, f"v{i}".encode(), partition=0)
        finally:
            await producer.stop()

    run(scenario())
    assert http_values(broker, topic, 0) == [f"v{i}" for i in range(5)]


def test_aiokafka_commit_abort_and_read_committed(broker: Broker) -> None:
    topic = create_topic(broker)

    async def scenario() -> tuple[list[str], list[str]]:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=topic)
        await producer.start()
        try:
            for i, commit in enumerate([True, False, True]):
                await producer.begin_transaction()
                for j in range(2):
                    await producer.send_and_wait(topic, f"{i}-{j}".encode(), partition=0)
                if commit:
                    await producer.commit_transaction()
                else:
                    await producer.abort_transaction()
        finally:
            await producer.stop()
        return await read(broker, topic, "read_committed", 4), await read(
            broker, topic, "read_uncommitted", 6
        )

    committed, everything = run(scenario())
    assert committed == ["0-0", "0-1", "2-0", "2-1"]
    assert sorted(everything) == ["0-0", "0-1", "1-0", "1-1", "2-0", "2-1"]
    assert http_values(broker, topic, 0) == committed


async def read(broker: Broker, topic: str, isolation: str, count: int) -> list[str]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        isolation_level=isolation,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    consumer.assign([TopicPartition(topic, 0)])
    got: list[str] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(got) < count:
            assert time.monotonic() < deadline, f"read {got}"
            for messages in (await consumer.getmany(timeout_ms=200)).values():
                got += [m.value.decode() for m in messages]
    finally:
        await consumer.stop()
    return got


def test_aiokafka_consume_transform_produce_is_exactly_once(broker: Broker) -> None:
    source, sink = create_topic(broker, 2), create_topic(broker, 2)
    for p in (0, 1):
        http_produce(broker, source, p, [f"{p}-{i}" for i in range(30)])
    group = f"eos-{source}"

    async def scenario() -> None:
        consumer = AIOKafkaConsumer(
            source,
            bootstrap_servers=broker.bootstrap,
            group_id=group,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=200,
        )
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=group)
        await consumer.start()
        await producer.start()
        done, aborted_once = 0, False
        deadline = time.monotonic() + DEADLINE_S
        try:
            while done < 60:
                assert time.monotonic() < deadline, f"processed {done} of 60"
                fetched = await consumer.getmany(timeout_ms=200, max_records=10)
                if not any(fetched.values()):
                    continue
                await producer.begin_transaction()
                for tp, messages in fetched.items():
                    for m in messages:
                        await producer.send(sink, m.value + b"!", partition=tp.partition)
                offsets = {tp: messages[-1].offset + 1 for tp, messages in fetched.items()}
                # TxnOffsetCommit v0-2, without member identity: fenced by the epoch alone.
                await producer.send_offsets_to_transaction(offsets, group)
                if not aborted_once:
                    # One aborted round: its output never shows, its input is read again.
                    aborted_once = True
                    await producer.abort_transaction()
                    for tp, messages in fetched.items():
                        consumer.seek(tp, messages[0].offset)
                    continue
                await producer.commit_transaction()
                done += sum(len(m) for m in fetched.values())
        finally:
            await consumer.stop()
            await producer.stop()

    run(scenario())
    outputs = sorted(http_values(broker, sink, 0) + http_values(broker, sink, 1))
    assert outputs == sorted(f"{p}-{i}!" for p in (0, 1) for i in range(30))
    assert committed_offsets(broker, group) == {(0, 30), (1, 30)}


def test_aiokafka_zombie_sees_its_own_fencing(broker: Broker) -> None:
    topic = create_topic(broker)

    async def scenario() -> KafkaError:
        zombie = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=topic)
        successor = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=topic)
        await zombie.start()
        await zombie.begin_transaction()
        await zombie.send_and_wait(topic, b"from the zombie", partition=0)
        await successor.start()
        await successor.begin_transaction()
        await successor.send_and_wait(topic, b"from the successor", partition=0)
        await successor.commit_transaction()
        await successor.stop()
        try:
            await zombie.commit_transaction()
        except KafkaError as fenced:
            return fenced
        finally:
            await zombie.stop()
        raise AssertionError("the zombie committed")

    fenced = run(scenario())
    assert type(fenced).__name__ == "ProducerFenced", fenced
    assert http_values(broker, topic, 0) == ["from the successor"]


def test_aiokafka_group_of_two_splits_four_partitions_and_one_leaves(broker: Broker) -> None:
    topic = create_topic(broker, 4)
    group = f"g-{topic}"

    async def scenario() -> tuple[set[int], set[int], set[int]]:
        def member() -> AIOKafkaConsumer:
            return AIOKafkaConsumer(
                topic,
                bootstrap_servers=broker.bootstrap,
                group_id=group,
                session_timeout_ms=6000,
                heartbeat_interval_ms=200,
            )

        a, b = member(), member()
        await a.start()
        await b.start()
        deadline = time.monotonic() + DEADLINE_S
        try:
            while True:
                await a.getmany(timeout_ms=100)
                await b.getmany(timeout_ms=100)
                mine = {tp.partition for tp in a.assignment()}
                theirs = {tp.partition for tp in b.assignment()}
                if len(mine) == len(theirs) == 2 and not mine & theirs:
                    break
                assert time.monotonic() < deadline, (mine, theirs)
        finally:
            await b.stop()
        try:
            while len(a.assignment()) != 4:
                assert time.monotonic() < deadline, a.assignment()
                await a.getmany(timeout_ms=100)
            alone = {tp.partition for tp in a.assignment()}
        finally:
            await a.stop()
        return mine, theirs, alone

    mine, theirs, alone = run(scenario())
    # aiokafka's default assignor is round robin, run by the group's leader.
    assert sorted([sorted(mine), sorted(theirs)]) == [[0, 2], [1, 3]]
    assert alone == {0, 1, 2, 3}


def test_aiokafka_admin_creates_lists_describes_and_deletes(broker: Broker) -> None:
    name = f"adm{uuid.uuid4().hex[:8]}"

    async def scenario() -> dict[str, Any]:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            created = await admin.create_topics(
                [NewTopic(name, 3, 1, topic_configs={"cleanup.policy": "compact"})]
            )
            listed = name in await admin.list_topics()
            described = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, name)]
            )
            entries = {
                entry[0]: entry[1] for entry in described[0].resources[0][4]
            }  # (name, value, read_only, source, sensitive, synonyms)
            await admin.delete_topics([name])
            after = name in await admin.list_topics()
        finally:
            await admin.close()
        return {
            "errors": [e[1] for e in created.topic_errors],
            "listed": listed,
            "policy": entries["cleanup.policy"],
            "after": after,
        }

    result = run(scenario())
    assert result == {"errors": [0], "listed": True, "policy": "compact", "after": False}


# -- KafkaJS -------------------------------------------------------------------------------------


def kafkajs(broker: Broker, scenario: str, *args: str) -> dict[str, Any]:
    node = shutil.which("node")
    assert node, "node is required (the README's test command installs KafkaJS with npm)"
    assert (JS / "node_modules" / "kafkajs").is_dir(), "run: npm ci --prefix tests/clients/js"
    done = subprocess.run(
        [node, str(JS / "scenario.js"), scenario, broker.bootstrap, *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S * 3,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("codec", ["none", "gzip"])
def test_kafkajs_idempotent_producer_every_codec(broker: Broker, codec: str) -> None:
    topic = create_topic(broker)
    kafkajs(broker, "idempotent", topic, codec)
    assert http_values(broker, topic, 0) == [f"v{i}" for i in range(5)]


def test_kafkajs_commit_abort_and_read_committed(broker: Broker) -> None:
    topic = create_topic(broker)
    result = kafkajs(broker, "transactions", topic)
    assert result["committed"] == ["0-0", "0-1", "2-0", "2-1"]
    assert sorted(result["all"]) == ["0-0", "0-1", "1-0", "1-1", "2-0", "2-1"]
    assert http_values(broker, topic, 0) == result["committed"]


def test_kafkajs_consume_transform_produce_is_exactly_once(broker: Broker) -> None:
    source, sink = create_topic(broker, 2), create_topic(broker, 2)
    for p in (0, 1):
        http_produce(broker, source, p, [f"{p}-{i}" for i in range(30)])
    group = f"eos-{source}"
    assert kafkajs(broker, "eos", source, sink, group, "60")["processed"] == 60
    outputs = sorted(http_values(broker, sink, 0) + http_values(broker, sink, 1))
    assert outputs == sorted(f"{p}-{i}!" for p in (0, 1) for i in range(30))
    assert committed_offsets(broker, group) == {(0, 30), (1, 30)}


def test_kafkajs_zombie_sees_its_own_fencing(broker: Broker) -> None:
    topic = create_topic(broker)
    # KafkaJS speaks EndTxn 0-1, which knows no PRODUCER_FENCED: Kafka's answer is
    # INVALID_PRODUCER_EPOCH, which KafkaJS knows (it reported "unknown error 90" before).
    assert kafkajs(broker, "zombie", topic) == {"error": "INVALID_PRODUCER_EPOCH"}
    assert http_values(broker, topic, 0) == ["from the successor"]


def test_kafkajs_group_of_two_gets_its_round_robin_assignors_split_and_one_leaves(
    broker: Broker,
) -> None:
    # KafkaJS's default assignor is its own round robin, run by the group's leader: the member
    # ids sorted, partition p to member p % 2. The coordinator only carries its answer.
    topic = create_topic(broker, 4)
    result = kafkajs(broker, "group", topic, f"g-{topic}")
    assert sorted(result["both"]) == [[0, 2], [1, 3]]
    assert result["alone"] == [0, 1, 2, 3]


def test_kafkajs_admin_creates_lists_describes_and_deletes(broker: Broker) -> None:
    name = f"adm{uuid.uuid4().hex[:8]}"
    assert kafkajs(broker, "admin", name) == {
        "created": True,
        "listed": True,
        "policy": "compact",
        "partitions": 3,
        "after": False,
    }
