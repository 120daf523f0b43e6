"""Kafka's own semantics where a request's answer differs from the HTTP API's (issue 22,
item 8), spoken to the listener byte by byte on SQLite and on Postgres: DeleteRecords answers each
partition on its own; a manual replica assignment naming this one broker is taken."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from coordinator.kafka.server import KafkaListener
from coordinator.log import fetch as log_fetch
from coordinator.log import produce
from coordinator.log import topics as log_topics
from coordinator.log.topics import TopicSpec
from sdk import recordbatch
from tests.support.kafka_listener import connect, listener

__all__ = ["listener"]


async def test_delete_records_answers_each_partition_on_its_own(listener: KafkaListener) -> None:
    # Kafka's DeleteRecords: an offset above the high watermark (or below -1) is
    # OFFSET_OUT_OF_RANGE for that partition, and the others still move (issue 22, item 8).
    await log_topics.create_topic(listener.db, TopicSpec("trim", 3))
    connection = await connect(listener)
    batch = recordbatch.build([(1, b"k", b"v", [])], producer_id=-1, producer_epoch=-1)
    produce: Any = __import__("kio.schema.produce.v9.request", fromlist=["x"])
    for _ in range(2):
        await connection.call(
            0,
            9,
            transactional_id=None,
            acks=-1,
            timeout=datetime.timedelta(seconds=5),
            topic_data=(
                produce.TopicProduceData(
                    name="trim",
                    partition_data=(produce.PartitionProduceData(index=0, records=batch),),
                ),
            ),
        )
    module: Any = __import__("kio.schema.delete_records.v2.request", fromlist=["x"])
    answer = await connection.call(
        21,
        2,
        topics=(
            module.DeleteRecordsTopic(
                name="trim",
                partitions=(
                    module.DeleteRecordsPartition(partition_index=0, offset=1),
                    module.DeleteRecordsPartition(partition_index=1, offset=5),
                    module.DeleteRecordsPartition(partition_index=2, offset=-7),
                ),
            ),
        ),
        timeout=datetime.timedelta(seconds=5),
    )
    results = {p.partition_index: p for p in answer.topics[0].partitions}
    assert (results[0].error_code, results[0].low_watermark) == (ErrorCode.none, 1)
    assert results[1].error_code == ErrorCode.offset_out_of_range
    assert results[2].error_code == ErrorCode.offset_out_of_range
    described = await log_topics.describe_topic(listener.db, "trim")
    assert described.partitions[0].log_start_offset == 1


async def test_a_replica_assignment_naming_this_broker_is_taken(listener: KafkaListener) -> None:
    connection = await connect(listener)
    module: Any = __import__("kio.schema.create_topics.v7.request", fromlist=["x"])

    async def create(name: str, brokers: tuple[int, ...]) -> Any:
        answer = await connection.call(
            19,
            7,
            topics=(
                module.CreatableTopic(
                    name=name,
                    num_partitions=-1,
                    replication_factor=-1,
                    assignments=tuple(
                        module.CreatableReplicaAssignment(partition_index=i, broker_ids=brokers)
                        for i in range(2)
                    ),
                    configs=(),
                ),
            ),
            timeout=datetime.timedelta(seconds=5),
            validate_only=False,
        )
        return answer.topics[0]

    taken = await create("assigned", (0,))
    assert (taken.error_code, taken.num_partitions) == (ErrorCode.none, 2)
    assert len((await log_topics.describe_topic(listener.db, "assigned")).partitions) == 2
    refused = await create("elsewhere", (1,))
    assert refused.error_code == ErrorCode.invalid_replica_assignment


async def test_cleanup_policy_is_a_list_config_that_takes_append_and_subtract(
    listener: KafkaListener,
) -> None:
    await log_topics.create_topic(listener.db, TopicSpec("policy", 1))
    connection = await connect(listener)
    module: Any = __import__("kio.schema.incremental_alter_configs.v1.request", fromlist=["x"])

    async def alter(name: str, operation: int, value: str) -> ErrorCode:
        answer = await connection.call(
            44,
            1,
            resources=(
                module.AlterConfigsResource(
                    resource_type=2,
                    resource_name="policy",
                    configs=(
                        module.AlterableConfig(name=name, config_operation=operation, value=value),
                    ),
                ),
            ),
            validate_only=False,
        )
        code: ErrorCode = answer.responses[0].error_code
        return code

    async def policy() -> str:
        listed = await log_topics.describe_configs(listener.db, listener.settings, "policy")
        return {c.name: c.value for c in listed.configs}["cleanup.policy"]

    assert await alter("cleanup.policy", 2, "compact") == ErrorCode.none  # APPEND
    assert await policy() == "compact,delete"
    assert await alter("cleanup.policy", 3, "delete") == ErrorCode.none  # SUBTRACT
    assert await policy() == "compact"
    assert await alter("cleanup.policy", 3, "compact") == ErrorCode.invalid_config  # nothing left
    assert await alter("retention.ms", 2, "5") == ErrorCode.invalid_config  # not a list
    assert await policy() == "compact"


@pytest.mark.parametrize("max_bytes", [1_000_000, 100_000])
async def test_only_the_first_partition_with_data_may_exceed_the_fetch_budget(
    listener: KafkaListener, max_bytes: int
) -> None:
    import random

    topic = f"budget-{max_bytes}"
    await log_topics.create_topic(listener.db, TopicSpec(topic, 3))
    noise = random.Random(0).randbytes(600_000)  # one 600 KB batch a partition
    for partition in range(3):
        batch = recordbatch.build([(1, b"k", noise, [])], producer_id=-1, producer_epoch=-1)
        await produce.produce_batch(listener.db, listener.settings, topic, partition, batch, None)
    connection = await connect(listener)
    answer = await connection.fetch(topic, (0, 1, 2), max_bytes=max_bytes)
    sizes = [len(p.records or b"") for p in answer.responses[0].partitions]
    # The first partition's batch comes whatever the budget; the others would pass it.
    assert sizes[0] > 600_000
    assert sizes[1:] == [0, 0]
    assert all(p.high_watermark == 1 for p in answer.responses[0].partitions)


async def test_list_offsets_by_time_answers_the_exact_record(listener: KafkaListener) -> None:
    await log_topics.create_topic(listener.db, TopicSpec("times", 1))
    for records in ([(100, b"a"), (200, b"b"), (300, b"c")], [(400, b"d"), (350, b"e")]):
        batch = recordbatch.build(
            [(ts, b"k", v, []) for ts, v in records], producer_id=-1, producer_epoch=-1
        )
        await produce.produce_batch(listener.db, listener.settings, "times", 0, batch, None)

    async def at(timestamp: int) -> tuple[int, int]:
        return await log_fetch.list_offset(listener.db, "times", 0, timestamp, read_committed=False)

    assert await at(150) == (1, 200)  # the first record at least that old, not its batch
    assert await at(300) == (2, 300)
    assert await at(360) == (3, 400)
    assert await at(log_fetch.MAX_TIMESTAMP) == (3, 400)
    assert await at(1000) == (-1, -1)


async def test_offset_fetch_echoes_the_committed_leader_epoch_and_metadata(
    listener: KafkaListener,
) -> None:
    # librdkafka's transactional test compares what it committed with what it fetches: the
    # leader epoch, and metadata that may hold a NUL (issue 22, item 8).
    await log_topics.create_topic(listener.db, TopicSpec("echo", 2))
    connection = await connect(listener)
    commit: Any = __import__("kio.schema.offset_commit.v8.request", fromlist=["x"])
    committed = await connection.call(
        8,
        8,
        group_id="echo-g",
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=(
            commit.OffsetCommitRequestTopic(
                name="echo",
                partitions=(
                    commit.OffsetCommitRequestPartition(
                        partition_index=0,
                        committed_offset=0,
                        committed_leader_epoch=7,
                        committed_metadata="a\0b",
                    ),
                ),
            ),
        ),
    )
    assert committed.topics[0].partitions[0].error_code == ErrorCode.none
    # And through a transaction: TxnOffsetCommit v3, then EndTxn.
    init = await connection.call(
        22,
        3,
        transactional_id="echo-tx",
        transaction_timeout=datetime.timedelta(seconds=30),
        producer_id=-1,
        producer_epoch=-1,
    )
    caller = {"producer_id": init.producer_id, "producer_epoch": init.producer_epoch}
    assert (
        await connection.call(25, 3, transactional_id="echo-tx", group_id="echo-g", **caller)
    ).error_code == ErrorCode.none
    txn: Any = __import__("kio.schema.txn_offset_commit.v3.request", fromlist=["x"])
    await connection.call(
        28,
        3,
        transactional_id="echo-tx",
        group_id="echo-g",
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        topics=(
            txn.TxnOffsetCommitRequestTopic(
                name="echo",
                partitions=(
                    txn.TxnOffsetCommitRequestPartition(
                        partition_index=1,
                        committed_offset=0,
                        committed_leader_epoch=3,
                        committed_metadata="in a transaction",
                    ),
                ),
            ),
        ),
        **caller,
    )
    ended = await connection.call(26, 3, transactional_id="echo-tx", committed=True, **caller)
    assert ended.error_code == ErrorCode.none
    fetch: Any = __import__("kio.schema.offset_fetch.v7.request", fromlist=["x"])
    answer = await connection.call(
        9,
        7,
        group_id="echo-g",
        topics=(fetch.OffsetFetchRequestTopic(name="echo", partition_indexes=(0, 1)),),
        require_stable=True,
    )
    got = {
        p.partition_index: (p.committed_offset, p.committed_leader_epoch, p.metadata)
        for p in answer.topics[0].partitions
    }
    assert got == {0: (0, 7, "a\0b"), 1: (0, 3, "in a transaction")}


async def test_describe_transactions_gives_the_start_time_in_milliseconds(
    listener: KafkaListener,
) -> None:
    import time

    await log_topics.create_topic(listener.db, TopicSpec("described", 1))
    connection = await connect(listener)
    init = await connection.call(
        22,
        4,
        transactional_id="described-tx",
        transaction_timeout=datetime.timedelta(seconds=30),
        producer_id=-1,
        producer_epoch=-1,
    )
    before = int(time.time() * 1000)
    add: Any = __import__("kio.schema.add_partitions_to_txn.v3.request", fromlist=["x"])
    await connection.call(
        24,
        3,
        v3_and_below_transactional_id="described-tx",
        v3_and_below_producer_id=init.producer_id,
        v3_and_below_producer_epoch=init.producer_epoch,
        v3_and_below_topics=(add.AddPartitionsToTxnTopic(name="described", partitions=(0,)),),
    )
    answer = await connection.call(65, 0, transactional_ids=("described-tx",))
    (known,) = answer.transaction_states
    assert (known.error_code, known.transaction_state) == (ErrorCode.none, "Ongoing")
    started = int(known.transaction_start_time.timestamp() * 1000)
    assert before - 1000 <= started <= int(time.time() * 1000) + 1000
    assert [(t.topic, tuple(t.partitions)) for t in known.topics] == [("described", (0,))]


@pytest.mark.parametrize(
    ("version", "allow", "created"),
    [(4, True, True), (4, False, False), (1, True, True)],
)
async def test_metadata_creates_an_unknown_topic_as_auto_create_topics_enable_does(
    listener: KafkaListener, version: int, allow: bool, created: bool
) -> None:
    connection = await connect(listener)
    module: Any = __import__(f"kio.schema.metadata.v{version}.request", fromlist=["x"])
    fields: dict[str, Any] = {"topics": (module.MetadataRequestTopic(name="auto"),)}
    if version >= 4:
        fields["allow_auto_topic_creation"] = allow
    answer = await connection.call(3, version, **fields)
    (topic,) = answer.topics
    if created:
        assert (topic.error_code, len(topic.partitions)) == (ErrorCode.none, 1)
        assert len((await log_topics.describe_topic(listener.db, "auto")).partitions) == 1
    else:
        assert topic.error_code == ErrorCode.unknown_topic_or_partition
        assert "auto" not in [t.name for t in (await log_topics.list_topics(listener.db)).topics]


@pytest.mark.parametrize("listener", [{"auto_create_topics_enable": False}], indirect=True)
async def test_auto_creation_is_a_setting(listener: KafkaListener) -> None:
    connection = await connect(listener)
    module: Any = __import__("kio.schema.metadata.v12.request", fromlist=["x"])
    answer = await connection.call(
        3,
        12,
        topics=(module.MetadataRequestTopic(topic_id=None, name="not-made"),),
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    )
    assert answer.topics[0].error_code == ErrorCode.unknown_topic_or_partition


@pytest.mark.parametrize("listener", [True], indirect=True)
async def test_only_a_principal_that_may_create_topics_auto_creates_them(
    listener: KafkaListener,
) -> None:
    from tests.support.kafka_listener import authenticated

    module: Any = __import__("kio.schema.metadata.v12.request", fromlist=["x"])

    async def ask(user: str, token: str, name: str) -> ErrorCode:
        connection, answer = await authenticated(listener, user, token)
        assert answer.error_code == ErrorCode.none
        metadata = await connection.call(
            3,
            12,
            topics=(module.MetadataRequestTopic(topic_id=None, name=name),),
            allow_auto_topic_creation=True,
            include_topic_authorized_operations=False,
        )
        code: ErrorCode = metadata.topics[0].error_code
        return code

    # Kafka: a topic the principal may DESCRIBE but not CREATE is TOPIC_AUTHORIZATION_FAILED.
    assert await ask("reader", "reader-token-1", "pay-auto") == ErrorCode.topic_authorization_failed
    assert await ask("ops", "admin-token-1", "pay-auto") == ErrorCode.none
    assert [t.name for t in (await log_topics.list_topics(listener.db)).topics] == ["pay-auto"]


async def test_alter_configs_replaces_every_config_as_kafka_does(listener: KafkaListener) -> None:
    await log_topics.create_topic(
        listener.db,
        TopicSpec("replaced", 1, {"retention.ms": "1000"}),
    )
    connection = await connect(listener)
    module: Any = __import__("kio.schema.alter_configs.v2.request", fromlist=["x"])
    answer = await connection.call(
        33,
        2,
        resources=(
            module.AlterConfigsResource(
                resource_type=2,
                resource_name="replaced",
                configs=(module.AlterableConfig(name="cleanup.policy", value="compact"),),
            ),
        ),
        validate_only=False,
    )
    assert answer.responses[0].error_code == ErrorCode.none
    listed = await log_topics.describe_configs(listener.db, listener.settings, "replaced")
    by_name = {c.name: (c.value, c.source) for c in listed.configs}
    assert by_name["cleanup.policy"] == ("compact", "TOPIC")
    assert by_name["retention.ms"][1] == "DEFAULT"  # not given: back to its default


async def test_offset_delete_removes_offsets_but_of_subscribed_topics(
    listener: KafkaListener,
) -> None:
    from coordinator.groups import consumer
    from coordinator.groups import service as groups_service
    from coordinator.groups.inputs import Beat, CommittedOffset

    for name in ("kept", "gone"):
        await log_topics.create_topic(listener.db, TopicSpec(name, 1))
    offsets = [CommittedOffset(t, 0, 1) for t in ("kept", "gone")]
    await groups_service.commit(listener.db, "od-g", offsets)
    await consumer.heartbeat(
        listener.db,
        listener.settings,
        "od-g",
        Beat("m", 0, ["kept"]),
        "test",
        "127.0.0.1",
    )
    connection = await connect(listener)
    module: Any = __import__("kio.schema.offset_delete.v0.request", fromlist=["x"])
    answer = await connection.call(
        47,
        0,
        group_id="od-g",
        topics=tuple(
            module.OffsetDeleteRequestTopic(
                name=t, partitions=(module.OffsetDeleteRequestPartition(partition_index=0),)
            )
            for t in ("kept", "gone")
        ),
    )
    codes = {t.name: t.partitions[0].error_code for t in answer.topics}
    assert codes == {"kept": ErrorCode.group_subscribed_to_topic, "gone": ErrorCode.none}
    left = await groups_service.fetch(listener.db, "od-g", None, False)
    assert [(o.topic, o.offset) for o in left.offsets] == [("kept", 1)]
    unknown = await connection.call(47, 0, group_id="no-such-group", topics=())
    assert unknown.error_code == ErrorCode.group_id_not_found


async def test_acl_calls_say_security_is_off_without_a_tokens_file(listener: KafkaListener) -> None:
    connection = await connect(listener)
    answer = await connection.call(
        29,
        3,
        resource_type_filter=1,
        resource_name_filter=None,
        pattern_type_filter=1,
        principal_filter=None,
        host_filter=None,
        operation=1,
        permission_type=1,
    )
    assert answer.error_code == ErrorCode.security_disabled
    assert "COORDINATOR_AUTH_TOKENS_FILE" in answer.error_message


@pytest.mark.parametrize("listener", [True], indirect=True)
async def test_authorized_operations_follow_the_principal_s_rights(
    listener: KafkaListener,
) -> None:
    # KIP-430, for Metadata: the reader may READ, DESCRIBE and DESCRIBE_CONFIGS its topics.
    from tests.support.kafka_listener import authenticated

    await log_topics.create_topic(listener.db, TopicSpec("pay-ops", 1))
    module: Any = __import__("kio.schema.metadata.v12.request", fromlist=["x"])

    async def operations(user: str, token: str, asked: bool) -> int:
        connection, answer = await authenticated(listener, user, token)
        assert answer.error_code == ErrorCode.none
        metadata = await connection.call(
            3,
            12,
            topics=(module.MetadataRequestTopic(topic_id=None, name="pay-ops"),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=asked,
        )
        found: int = metadata.topics[0].topic_authorized_operations
        return found

    bits = lambda *ops: sum(1 << op for op in ops)  # noqa: E731
    assert await operations("reader", "reader-token-1", True) == bits(3, 8, 10)
    assert await operations("ops", "admin-token-1", True) == bits(3, 4, 5, 6, 7, 8, 10, 11)
    assert await operations("reader", "reader-token-1", False) == -(2**31)


async def test_a_topic_recreated_under_its_name_has_a_new_id_and_ids_name_topics(
    listener: KafkaListener,
) -> None:
    # KIP-516: Metadata v10+ answers each topic's id, v12 takes an id for a name, DeleteTopics
    # v6 deletes by id; a topic deleted and created again is a new topic to a client.
    connection = await connect(listener)
    metadata: Any = __import__("kio.schema.metadata.v12.request", fromlist=["x"])
    delete: Any = __import__("kio.schema.delete_topics.v6.request", fromlist=["x"])
    no_id = uuid.UUID(int=0)

    async def topic_id(name: str) -> uuid.UUID:
        answer = await connection.call(
            3,
            12,
            topics=(metadata.MetadataRequestTopic(topic_id=no_id, name=name),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        assert answer.topics[0].error_code == ErrorCode.none
        found: uuid.UUID = answer.topics[0].topic_id
        return found

    await log_topics.create_topic(listener.db, TopicSpec("again", 2))
    first = await topic_id("again")
    assert first != no_id
    by_id = await connection.call(
        3,
        12,
        topics=(metadata.MetadataRequestTopic(topic_id=first, name=None),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    assert [(t.name, len(t.partitions)) for t in by_id.topics] == [("again", 2)]
    deleted = await connection.call(
        20,
        6,
        topics=(delete.DeleteTopicState(name=None, topic_id=first),),
        timeout=datetime.timedelta(seconds=5),
    )
    assert [(r.name, r.error_code) for r in deleted.responses] == [("again", ErrorCode.none)]
    await log_topics.create_topic(listener.db, TopicSpec("again", 1))
    assert await topic_id("again") not in (first, no_id)
    gone = await connection.call(
        3,
        12,
        topics=(metadata.MetadataRequestTopic(topic_id=first, name=None),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    assert [(t.topic_id, t.error_code) for t in gone.topics] == [
        (first, ErrorCode.unknown_topic_id)
    ]
    # Fetch v13+ names topics by id: the recreated topic is read by its new id only.
    fetch: Any = __import__("kio.schema.fetch.v16.request", fromlist=["x"])

    async def fetched(topic_id: uuid.UUID) -> Any:
        answer = await connection.call(
            1,
            16,
            cluster_id=None,
            replica_state=fetch.ReplicaState(),
            max_wait=datetime.timedelta(0),
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=1,
            session_id=0,
            session_epoch=-1,
            topics=(
                fetch.FetchTopic(
                    topic_id=topic_id,
                    partitions=(
                        fetch.FetchPartition(
                            partition=0,
                            current_leader_epoch=-1,
                            fetch_offset=0,
                            last_fetched_epoch=-1,
                            log_start_offset=-1,
                            partition_max_bytes=1 << 20,
                        ),
                    ),
                ),
            ),
            forgotten_topics_data=(),
            rack_id="",
        )
        return answer.responses[0]

    stale = await fetched(first)
    assert (stale.topic_id, stale.partitions[0].error_code) == (first, ErrorCode.unknown_topic_id)
    current = await fetched(await topic_id("again"))
    assert current.partitions[0].error_code == ErrorCode.none


async def test_keyless_records_on_a_compacted_topic_are_named_in_record_errors(
    listener: KafkaListener,
) -> None:
    # KIP-467: INVALID_RECORD names the records by index, so a client fails only those
    # (librdkafka's 0011 test counts them) and nothing of the batch is written.
    await log_topics.create_topic(
        listener.db,
        TopicSpec("compacted", 1, {"cleanup.policy": "compact"}),
    )
    connection = await connect(listener)
    batch = recordbatch.build(
        [(1, b"k0", b"v", []), (1, None, b"v", []), (1, b"k2", b"v", []), (1, None, b"v", [])],
        producer_id=-1,
        producer_epoch=-1,
    )
    produce: Any = __import__("kio.schema.produce.v9.request", fromlist=["x"])
    answer = await connection.call(
        0,
        9,
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(
            produce.TopicProduceData(
                name="compacted",
                partition_data=(produce.PartitionProduceData(index=0, records=batch),),
            ),
        ),
    )
    result = answer.responses[0].partition_responses[0]
    assert result.error_code == ErrorCode.invalid_record
    assert [e.batch_index for e in result.record_errors] == [1, 3]
    described = await log_topics.describe_topic(listener.db, "compacted")
    assert described.partitions[0].high_watermark == 0


async def _create_with_factor(listener: KafkaListener, name: str, factor: int) -> Any:
    connection = await connect(listener)
    module: Any = __import__("kio.schema.create_topics.v7.request", fromlist=["x"])
    answer = await connection.call(
        19,
        7,
        topics=(
            module.CreatableTopic(
                name=name,
                num_partitions=2,
                replication_factor=factor,
                assignments=(),
                configs=(),
            ),
        ),
        timeout=datetime.timedelta(seconds=5),
        validate_only=False,
    )
    return answer.topics[0]


async def test_any_replication_factor_is_kept_and_listed_as_that_many_replicas(
    listener: KafkaListener,
) -> None:
    """Tools ask for 3 (Kafka Connect's internal topics, Schema Registry, librdkafka's tests):
    taken, kept as the topic's stated factor, and listed as that many replicas of this broker;
    a factor no cluster could have is refused and creates nothing."""
    three = await _create_with_factor(listener, "three", 3)
    assert (three.error_code, three.replication_factor) == (ErrorCode.none, 3)
    default = await _create_with_factor(listener, "default", -1)
    assert (default.error_code, default.replication_factor) == (ErrorCode.none, 1)
    for factor in (0, -2, 17):
        refused = await _create_with_factor(listener, f"refused{factor + 2}", factor)
        assert refused.error_code == ErrorCode.invalid_replication_factor, factor
    module: Any = __import__("kio.schema.metadata.v12.request", fromlist=["x"])
    connection = await connect(listener)
    answer = await connection.call(
        3,
        12,
        topics=tuple(
            module.MetadataRequestTopic(topic_id=None, name=name)
            for name in ("three", "default", "refused2")
        ),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    by_name = {t.name: t for t in answer.topics}
    assert [(p.replica_nodes, p.isr_nodes) for p in by_name["three"].partitions] == [
        ((0, 0, 0), (0, 0, 0))
    ] * 2
    assert [p.replica_nodes for p in by_name["default"].partitions] == [(0,), (0,)]
    assert by_name["refused2"].error_code == ErrorCode.unknown_topic_or_partition


@pytest.mark.parametrize("listener", [{"strict_replication_factor": True}], indirect=True)
async def test_the_strict_setting_takes_a_factor_of_one_only(listener: KafkaListener) -> None:
    refused = await _create_with_factor(listener, "three", 3)
    assert refused.error_code == ErrorCode.invalid_replication_factor
    one = await _create_with_factor(listener, "one", 1)
    assert (one.error_code, one.replication_factor) == (ErrorCode.none, 1)


async def test_a_classic_member_of_a_consumer_group_is_assigned_by_the_coordinator(
    listener: KafkaListener,
) -> None:
    """Kafka 4's upgrade path (`groups.classic_members`): a classic JoinGroup into a group whose
    members speak the consumer protocol gets its id first (KIP-394), then joins with no leader
    at its member epoch; SyncGroup hands it its share, a heartbeat at an old generation is told
    to rejoin, and it leaves."""
    from coordinator.groups import consumer, membership
    from coordinator.groups.consumer_protocol import encode_subscription, parse_assignment
    from coordinator.groups.inputs import Beat

    await log_topics.create_topic(listener.db, TopicSpec("mixed", 2))
    await consumer.heartbeat(
        listener.db,
        listener.settings,
        "mix-g",
        Beat("rest", 0, ["mixed"]),
        "test",
        "127.0.0.1",
    )
    connection = await connect(listener)
    join: Any = __import__("kio.schema.join_group.v7.request", fromlist=["x"])

    subscription = encode_subscription(["mixed"])

    async def joining(member_id: str) -> Any:
        return await connection.call(
            11,
            7,
            group_id="mix-g",
            session_timeout=datetime.timedelta(seconds=30),
            rebalance_timeout=datetime.timedelta(seconds=30),
            member_id=member_id,
            group_instance_id=None,
            protocol_type="consumer",
            protocols=(join.JoinGroupRequestProtocol(name="range", metadata=subscription),),
        )

    first = await joining("")
    assert first.error_code == ErrorCode.member_id_required and first.member_id
    joined = await joining(first.member_id)
    assert (joined.error_code, joined.leader, joined.member_id) == (
        ErrorCode.none,
        "",
        first.member_id,
    )
    assert joined.generation_id > 0
    synced = await connection.call(
        14,
        4,
        group_id="mix-g",
        generation_id=joined.generation_id,
        member_id=joined.member_id,
        group_instance_id=None,
        assignments=(),
    )
    assert synced.error_code == ErrorCode.none
    assert set(parse_assignment(bytes(synced.assignment))) <= {("mixed", 0), ("mixed", 1)}
    stale = await connection.call(
        14,
        4,
        group_id="mix-g",
        generation_id=joined.generation_id + 5,
        member_id=joined.member_id,
        group_instance_id=None,
        assignments=(),
    )
    assert stale.error_code == ErrorCode.illegal_generation
    beat = await connection.call(
        12,
        4,
        group_id="mix-g",
        generation_id=joined.generation_id,
        member_id=joined.member_id,
        group_instance_id=None,
    )
    assert beat.error_code in (ErrorCode.none, ErrorCode.rebalance_in_progress)
    unknown = await connection.call(
        14,
        4,
        group_id="mix-g",
        generation_id=1,
        member_id="nobody",
        group_instance_id=None,
        assignments=(),
    )
    assert unknown.error_code == ErrorCode.unknown_member_id
    leave: Any = __import__("kio.schema.leave_group.v4.request", fromlist=["x"])
    left = await connection.call(
        13,
        4,
        group_id="mix-g",
        members=(leave.MemberIdentity(member_id=joined.member_id, group_instance_id=None),),
    )
    assert (left.error_code, left.members[0].error_code) == (ErrorCode.none, ErrorCode.none)
    assert await membership.member_of(listener.db, "mix-g", joined.member_id) is None


async def test_describe_topic_partitions_pages_by_its_cursor(listener: KafkaListener) -> None:
    """KIP-966, as Kafka 4's AdminClient and `kafka-topics --describe` ask it: topics by name,
    at most the limit of partitions in all, a cursor at the first one left out."""
    module: Any = __import__("kio.schema.describe_topic_partitions.v0.request", fromlist=["x"])
    await log_topics.create_topic(listener.db, TopicSpec("dtp-a", 3, replication_factor=2))
    await log_topics.create_topic(listener.db, TopicSpec("dtp-b", 2))
    connection = await connect(listener)

    async def describe(names: tuple[str, ...], cursor: Any = None) -> Any:
        return await connection.call(
            75,
            0,
            topics=tuple(module.TopicRequest(name=n) for n in names),
            response_partition_limit=4,
            cursor=cursor,
        )

    first = await describe(("dtp-b", "dtp-a", "dtp-none"))
    shown = [(t.name, [p.partition_index for p in t.partitions]) for t in first.topics]
    assert shown == [("dtp-a", [0, 1, 2]), ("dtp-b", [0])]
    assert first.topics[0].partitions[0].replica_nodes == (0, 0)
    assert (first.next_cursor.topic_name, first.next_cursor.partition_index) == ("dtp-b", 1)
    rest = await describe(
        ("dtp-b", "dtp-a", "dtp-none"), module.Cursor(topic_name="dtp-b", partition_index=1)
    )
    assert [(t.name, t.error_code) for t in rest.topics] == [
        ("dtp-b", ErrorCode.none),
        ("dtp-none", ErrorCode.unknown_topic_or_partition),
    ]
    assert [p.partition_index for p in rest.topics[0].partitions] == [1]
    assert rest.next_cursor is None
    refused = await describe(("dtp-a",), module.Cursor(topic_name="dtp-b", partition_index=0))
    assert [(t.name, t.error_code) for t in refused.topics] == [
        ("dtp-a", ErrorCode.invalid_request)
    ]


async def test_replica_calls_answer_as_a_one_broker_cluster(listener: KafkaListener) -> None:
    """ElectLeaders: every leader is already the preferred one; ListPartitionReassignments: none
    in progress; DescribeLogDirs: one directory, the store, with each partition's bytes."""
    await log_topics.create_topic(listener.db, TopicSpec("dirs", 2))
    await produce.produce_batch(
        listener.db, listener.settings, "dirs", 1, recordbatch.build([(0, b"k", b"v", [])]), None
    )
    connection = await connect(listener)
    elect: Any = __import__("kio.schema.elect_leaders.v2.request", fromlist=["x"])
    elected = await connection.call(
        43,
        2,
        election_type=0,
        topic_partitions=(
            elect.TopicPartitions(topic="dirs", partitions=(0, 1, 5)),
            elect.TopicPartitions(topic="nowhere", partitions=(0,)),
        ),
        timeout=datetime.timedelta(seconds=5),
    )
    assert elected.error_code == ErrorCode.none
    assert [
        (r.topic, [(p.partition_id, p.error_code) for p in r.partition_result])
        for r in elected.replica_election_results
    ] == [
        (
            "dirs",
            [
                (0, ErrorCode.election_not_needed),
                (1, ErrorCode.election_not_needed),
                (5, ErrorCode.unknown_topic_or_partition),
            ],
        ),
        ("nowhere", [(0, ErrorCode.unknown_topic_or_partition)]),
    ]
    every = await connection.call(
        43, 2, election_type=1, topic_partitions=None, timeout=datetime.timedelta(seconds=5)
    )
    assert (every.error_code, every.replica_election_results) == (ErrorCode.none, ())
    odd = await connection.call(
        43, 2, election_type=7, topic_partitions=None, timeout=datetime.timedelta(seconds=5)
    )
    assert odd.error_code == ErrorCode.invalid_request
    reassigning = await connection.call(46, 0, timeout=datetime.timedelta(seconds=5), topics=None)
    assert (reassigning.error_code, reassigning.topics) == (ErrorCode.none, ())
    dirs: Any = __import__("kio.schema.describe_log_dirs.v4.request", fromlist=["x"])
    described = await connection.call(35, 4, topics=None)
    [result] = described.results
    assert (described.error_code, result.error_code, result.log_dir) == (
        ErrorCode.none,
        ErrorCode.none,
        "store",
    )
    sizes = {
        (t.name, p.partition_index): p.partition_size for t in result.topics for p in t.partitions
    }
    assert sizes[("dirs", 0)] == 0 and sizes[("dirs", 1)] > 0
    asked = await connection.call(
        35, 4, topics=(dirs.DescribableLogDirTopic(topic="dirs", partitions=(1, 9)),)
    )
    [only] = asked.results
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in only.topics] == [
        ("dirs", [1])
    ]


async def test_scram_credentials_set_over_the_protocol_verify_as_their_password(
    listener: KafkaListener,
) -> None:
    """AlterUserScramCredentials carries the salt and the salted password (never the password):
    the keys stored are the password's; Describe names mechanisms and iterations only."""
    import hashlib

    from coordinator.core import scram

    alter: Any = __import__("kio.schema.alter_user_scram_credentials.v0.request", fromlist=["x"])
    describe: Any = __import__(
        "kio.schema.describe_user_scram_credentials.v0.request", fromlist=["x"]
    )
    salt = b"0123456789abcdef"
    salted = hashlib.pbkdf2_hmac("sha256", b"alice-secret", salt, 8192)
    connection = await connect(listener)

    async def upsert(user: str, mechanism: int, iterations: int) -> Any:
        answer = await connection.call(
            51,
            0,
            deletions=(),
            upsertions=(
                alter.ScramCredentialUpsertion(
                    name=user,
                    mechanism=mechanism,
                    iterations=iterations,
                    salt=salt,
                    salted_password=salted,
                ),
            ),
        )
        return answer.results[0].error_code

    assert await upsert("alice", 1, 8192) == ErrorCode.none
    assert await scram.lookup(listener.db, "alice", "SCRAM-SHA-256") == (
        salt,
        *scram.derive("SCRAM-SHA-256", "alice-secret", salt, 8192),
        8192,
    )
    assert await upsert("bob", 1, 100) == ErrorCode.unacceptable_credential
    assert await upsert("bob", 9, 8192) == ErrorCode.unsupported_sasl_mechanism
    described = await connection.call(
        50, 0, users=(describe.UserName(name="alice"), describe.UserName(name="bob"))
    )
    by_user = {r.user: r for r in described.results}
    assert [(c.mechanism, c.iterations) for c in by_user["alice"].credential_infos] == [(1, 8192)]
    assert by_user["bob"].error_code == ErrorCode.resource_not_found
    deleted = await connection.call(
        51, 0, deletions=(alter.ScramCredentialDeletion(name="alice", mechanism=1),), upsertions=()
    )
    assert deleted.results[0].error_code == ErrorCode.none
    assert await scram.lookup(listener.db, "alice", "SCRAM-SHA-256") is None
    again = await connection.call(
        51, 0, deletions=(alter.ScramCredentialDeletion(name="alice", mechanism=1),), upsertions=()
    )
    assert again.results[0].error_code == ErrorCode.resource_not_found


async def test_client_quotas_show_the_mutation_rate_as_the_default_users(
    listener: KafkaListener,
) -> None:
    module: Any = __import__("kio.schema.describe_client_quotas.v1.request", fromlist=["x"])
    connection = await connect(listener)

    async def describe(strict: bool, *components: tuple[str, int, str | None]) -> Any:
        return await connection.call(
            48,
            1,
            components=tuple(
                module.ComponentData(entity_type=t, match_type=m, match=n) for t, m, n in components
            ),
            strict=strict,
        )

    every = await describe(False)
    [entry] = every.entries
    assert [(e.entity_type, e.entity_name) for e in entry.entity] == [("user", None)]
    assert [(v.key, v.value) for v in entry.values] == [
        ("controller_mutation_rate", listener.settings.controller_mutation_rate)
    ]
    assert len((await describe(True, ("user", 1, None))).entries) == 1
    assert (await describe(True, ("user", 0, "alice"))).entries == ()
    assert (await describe(False, ("client-id", 2, None))).entries == ()
    assert (await describe(False, ("nonsense", 0, "x"))).error_code == ErrorCode.invalid_request


async def _topic_id(connection: Any, name: str) -> uuid.UUID:
    """A topic's id, as Metadata 12 answers it (KIP-848's heartbeats name topics by id)."""
    metadata: Any = __import__("kio.schema.metadata.v12.request", fromlist=["x"])
    answer = await connection.call(
        3,
        12,
        topics=(metadata.MetadataRequestTopic(topic_id=uuid.UUID(int=0), name=name),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    found: uuid.UUID = answer.topics[0].topic_id
    return found


async def _consumer_heartbeat(
    connection: Any,
    group: str,
    topic: tuple[str, uuid.UUID],
    member: str,
    epoch: int,
    instance: str | None,
    timeout_ms: int,
    owned: list[int],
) -> Any:
    """ConsumerGroupHeartbeat 1 for a member of one topic (its name and id), owning `owned`; the
    subscription is sent to join only, as Kafka's clients send it."""
    beat: Any = __import__("kio.schema.consumer_group_heartbeat.v1.request", fromlist=["x"])
    name, topic_id = topic
    return await connection.call(
        68,
        1,
        group_id=group,
        member_id=member,
        member_epoch=epoch,
        instance_id=instance,
        rack_id=None,
        rebalance_timeout=datetime.timedelta(milliseconds=timeout_ms),
        subscribed_topic_names=(name,) if epoch == 0 else None,
        subscribed_topic_regex=None,
        server_assignor=None,
        topic_partitions=(beat.TopicPartitions(topic_id=topic_id, partitions=tuple(owned)),),
    )


async def test_a_consumer_group_member_keeps_its_rebalance_timeout_when_it_sends_minus_one(
    listener: KafkaListener,
) -> None:
    """KIP-848: a member sends its rebalance timeout to join and -1 ("unchanged") after, as
    Kafka's clients and franz-go do. A member that must give a partition up has that rebalance
    timeout to do so, not 1 ms; a join without one is INVALID_REQUEST, as Kafka answers it."""
    await log_topics.create_topic(listener.db, TopicSpec("rto", 2))
    connection = await connect(listener)
    topic_id = await _topic_id(connection, "rto")

    async def heartbeat(member: str, epoch: int, timeout_ms: int, owned: list[int]) -> Any:
        topic = ("rto", topic_id)
        return await _consumer_heartbeat(
            connection, "rto-g", topic, member, epoch, None, timeout_ms, owned
        )

    refused = await heartbeat("a", 0, -1, [])
    assert refused.error_code == ErrorCode.invalid_request
    first = await heartbeat("a", 0, 30_000, [])
    assert first.error_code == ErrorCode.none
    owned = await heartbeat("a", first.member_epoch, -1, [0, 1])
    assert owned.error_code == ErrorCode.none
    assert sorted(owned.assignment.topic_partitions[0].partitions) == [0, 1]
    second = await heartbeat("b", 0, 30_000, [])
    assert second.error_code == ErrorCode.none
    # "a" is told to give one partition up; it has not yet, twice, well within its 30 s.
    for _ in range(2):
        told = await heartbeat("a", owned.member_epoch, -1, [0, 1])
        assert told.error_code == ErrorCode.none, told.error_message
        assert len(told.assignment.topic_partitions[0].partitions) == 1


async def test_a_static_consumer_group_member_leaves_for_now_and_its_instance_takes_its_place(
    listener: KafkaListener,
) -> None:
    """KIP-848 static membership, as Kafka answers it: a member's instance id is unique while it
    has not left; a leave with epoch -2 keeps its place and partitions; its instance joining
    again under a new member id takes them with no rebalance; a -2 without an instance id is
    INVALID_REQUEST; a member gone for now is removed once its session runs out."""
    from coordinator.groups import membership

    await log_topics.create_topic(listener.db, TopicSpec("static", 2))
    connection = await connect(listener)
    topic_id = await _topic_id(connection, "static")

    async def heartbeat(member: str, epoch: int, instance: str | None, owned: list[int]) -> Any:
        topic = ("static", topic_id)
        return await _consumer_heartbeat(
            connection, "static-g", topic, member, epoch, instance, 30_000, owned
        )

    async def members() -> dict[str, tuple[str | None, int, tuple[int, ...]]]:
        found = await connection.call(
            69, 0, group_ids=("static-g",), include_authorized_operations=False
        )
        return {
            m.member_id: (
                m.instance_id,
                m.member_epoch,
                tuple(p for tp in m.assignment.topic_partitions for p in tp.partitions),
            )
            for m in found.groups[0].members
        }

    first = await heartbeat("a", 0, "i-1", [])
    owned = await heartbeat("a", first.member_epoch, "i-1", [0, 1])
    assert sorted(owned.assignment.topic_partitions[0].partitions) == [0, 1]
    taken = await heartbeat("b", 0, "i-1", [])
    assert taken.error_code == ErrorCode.unreleased_instance_id
    nameless = await heartbeat("a", -2, None, [0, 1])
    assert nameless.error_code == ErrorCode.invalid_request

    left = await heartbeat("a", -2, "i-1", [0, 1])
    assert (left.error_code, left.member_epoch) == (ErrorCode.none, -2)
    epoch = (await members())["a"][1]
    assert epoch == -2  # still in the group, its partitions its own
    described = await connection.call(
        69, 0, group_ids=("static-g",), include_authorized_operations=False
    )
    group_epoch = described.groups[0].group_epoch

    back = await heartbeat("a2", 0, "i-1", [])
    assert back.error_code == ErrorCode.none
    assert sorted(p for tp in back.assignment.topic_partitions for p in tp.partitions) == [0, 1]
    now = await members()
    assert "a" not in now and now["a2"][:1] == ("i-1",)
    described = await connection.call(
        69, 0, group_ids=("static-g",), include_authorized_operations=False
    )
    assert described.groups[0].group_epoch == group_epoch  # no rebalance

    # Gone for now, then for good once its session runs out.
    again = await heartbeat("a2", -2, "i-1", [0, 1])
    assert again.member_epoch == -2
    removed = await membership.expire_members(listener.db, now=2**62)
    assert ("static-g", "a2") in removed


async def test_the_log_s_one_leader_epoch_is_stamped_reported_and_answered(
    listener: KafkaListener,
) -> None:
    # KIP-320 (log.epochs): epoch 0 in Metadata and in every batch a fetch answers (the log
    # keeps the producer's -1); OffsetForLeaderEpoch ends epoch 0 at the log end, later or
    # undefined epochs at (-1, -1), as Kafka's leader epoch cache does; a current epoch other
    # than 0 is refused.
    await log_topics.create_topic(listener.db, TopicSpec("epochs", 1))
    connection = await connect(listener)
    batch = recordbatch.build([(1, b"k", b"v", [])], producer_id=-1, producer_epoch=-1)
    await produce.produce_batch(listener.db, listener.settings, "epochs", 0, batch, None)
    await produce.produce_batch(listener.db, listener.settings, "epochs", 0, batch, None)
    stored = await log_fetch.fetch_batches(
        listener.db, "epochs", 0, 0, max_bytes=1 << 20, read_committed=False
    )
    assert [recordbatch.check(b).header.partition_leader_epoch for b in stored.batches] == [-1, -1]

    metadata: Any = __import__("kio.schema.metadata.v12.request", fromlist=["x"])
    described = await connection.call(
        3,
        12,
        topics=(metadata.MetadataRequestTopic(topic_id=None, name="epochs"),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    assert [p.leader_epoch for p in described.topics[0].partitions] == [0]

    module: Any = __import__("kio.schema.offset_for_leader_epoch.v4.request", fromlist=["x"])

    async def end_of(
        epoch: int, current: int = -1, topic: str = "epochs", partition: int = 0
    ) -> tuple[Any, int, int]:
        answer = await connection.call(
            23,
            4,
            replica_id=-1,
            topics=(
                module.OffsetForLeaderTopic(
                    topic=topic,
                    partitions=(
                        module.OffsetForLeaderPartition(
                            partition=partition, current_leader_epoch=current, leader_epoch=epoch
                        ),
                    ),
                ),
            ),
        )
        (found,) = answer.topics[0].partitions
        return found.error_code, found.leader_epoch, found.end_offset

    assert await end_of(0) == (ErrorCode.none, 0, 2)
    assert await end_of(0, current=0) == (ErrorCode.none, 0, 2)
    assert await end_of(3) == (ErrorCode.none, -1, -1)
    assert await end_of(-1) == (ErrorCode.none, -1, -1)
    assert await end_of(0, current=1) == (ErrorCode.unknown_leader_epoch, -1, -1)
    assert await end_of(0, current=-2) == (ErrorCode.fenced_leader_epoch, -1, -1)
    assert (await end_of(0, partition=4))[0] == ErrorCode.unknown_topic_or_partition
    assert (await end_of(0, topic="no-such-topic"))[0] == ErrorCode.unknown_topic_or_partition

    async def fetch_at(current: int) -> Any:
        answer = await connection.fetch("epochs", current_leader_epoch=current)
        return answer.responses[0].partitions[0]

    answered = (await fetch_at(0)).records
    assert [h.partition_leader_epoch for _, h in recordbatch.iter_batches(answered, True)] == [0, 0]
    refused = await fetch_at(5)
    assert (refused.error_code, refused.records) == (ErrorCode.unknown_leader_epoch, b"")
