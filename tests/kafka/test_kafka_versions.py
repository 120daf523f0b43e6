"""Error codes a request's version does not know are answered as Kafka's broker answers them
(issue 22, item 3; coordinator.kafka.versions): every served API and version against every
error the domain can raise, and a fenced producer seen through old and new versions."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from coordinator.core.errors import CoordinatorError
from coordinator.kafka import versions
from coordinator.kafka.errors import error_code
from coordinator.kafka.server import KafkaListener
from coordinator.kafka.wire import SUPPORTED
from coordinator.log import topics as log_topics
from coordinator.log.topics import TopicSpec
from sdk import recordbatch
from tests.support.kafka_listener import Connection, connect, listener

__all__ = ["listener"]

# From Kafka's protocol: the first version of each API whose clients know these codes (codes
# added after the API's versions we serve). None: no version we serve knows it.
KNOWN_SINCE: dict[ErrorCode, dict[int, int | None]] = {
    # PRODUCER_FENCED (Kafka 2.7): InitProducerId 4, EndTxn/AddPartitions/AddOffsets 2;
    # a produce or TxnOffsetCommit with a stale epoch is INVALID_PRODUCER_EPOCH.
    ErrorCode.producer_fenced: {0: None, 22: 4, 24: 2, 25: 2, 26: 2, 28: None},
    # KIP-848's FENCED_MEMBER_EPOCH: OffsetCommit 9+ and ConsumerGroupHeartbeat only.
    ErrorCode.fenced_member_epoch: {
        8: 9,
        9: None,
        11: None,
        12: None,
        13: None,
        14: None,
        28: None,
    },
    # KIP-599's THROTTLING_QUOTA_EXCEEDED: CreateTopics 6+.
    ErrorCode.throttling_quota_exceeded: {19: 6, 37: 3},
}


def _domain_errors() -> list[type[CoordinatorError]]:
    import coordinator.models  # noqa: F401  (every domain's errors imported)
    from coordinator.core import quotas  # noqa: F401
    from coordinator.effects import errors as e1  # noqa: F401
    from coordinator.groups import errors as e2  # noqa: F401
    from coordinator.log import errors as e3  # noqa: F401
    from coordinator.producers import errors as e4  # noqa: F401
    from coordinator.transactions import errors as e5  # noqa: F401

    found: list[type[CoordinatorError]] = []
    pending = [CoordinatorError]
    while pending:
        for sub in pending.pop().__subclasses__():
            found.append(sub)
            pending.append(sub)
    return found


def test_no_served_version_is_answered_a_code_it_does_not_know() -> None:
    errors = _domain_errors()
    assert len(errors) > 30
    codes = {error_code(cls("x")) for cls in errors}
    assert {ErrorCode.producer_fenced, ErrorCode.fenced_member_epoch} <= codes
    for api_key, (low, high) in SUPPORTED.items():
        for version in range(low, high + 1):
            for code in codes:
                answered = versions.code_for(api_key, version, code)
                since = KNOWN_SINCE.get(answered, {})
                if api_key in since:
                    first = since[api_key]
                    assert first is not None and version >= first, (api_key, version, answered)


@pytest.mark.parametrize(
    ("api_key", "version", "code", "expected"),
    [
        (26, 1, ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch),
        (26, 2, ErrorCode.producer_fenced, ErrorCode.producer_fenced),
        (22, 3, ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch),
        (22, 4, ErrorCode.producer_fenced, ErrorCode.producer_fenced),
        (0, 9, ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch),
        (8, 8, ErrorCode.fenced_member_epoch, ErrorCode.illegal_generation),
        (19, 5, ErrorCode.throttling_quota_exceeded, ErrorCode.policy_violation),
        (19, 7, ErrorCode.throttling_quota_exceeded, ErrorCode.throttling_quota_exceeded),
        (26, 0, ErrorCode.invalid_txn_state, ErrorCode.invalid_txn_state),
    ],
)
def test_the_table_follows_kafka(
    api_key: int, version: int, code: ErrorCode, expected: ErrorCode
) -> None:
    assert versions.code_for(api_key, version, code) == expected


async def _fenced_producer(connection: Connection) -> int:
    """A transactional id whose first producer epoch (0) a second instance fenced."""
    first = await connection.call(
        22,
        4,
        transactional_id="fenced",
        transaction_timeout=datetime.timedelta(seconds=30),
        producer_id=-1,
        producer_epoch=-1,
    )
    second = await connection.call(
        22,
        4,
        transactional_id="fenced",
        transaction_timeout=datetime.timedelta(seconds=30),
        producer_id=-1,
        producer_epoch=-1,
    )
    assert second.producer_epoch > first.producer_epoch
    producer_id: int = first.producer_id
    return producer_id


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (0, ErrorCode.invalid_producer_epoch),
        (1, ErrorCode.invalid_producer_epoch),
        (2, ErrorCode.producer_fenced),
        (3, ErrorCode.producer_fenced),
    ],
)
async def test_a_fenced_producer_ending_its_transaction_gets_the_code_its_version_knows(
    listener: KafkaListener, version: int, expected: ErrorCode
) -> None:
    connection = await connect(listener)
    producer_id = await _fenced_producer(connection)
    answer = await connection.call(
        26,
        version,
        transactional_id="fenced",
        producer_id=producer_id,
        producer_epoch=0,
        committed=True,
    )
    assert answer.error_code == expected


async def test_a_fenced_producer_producing_gets_invalid_producer_epoch(
    listener: KafkaListener,
) -> None:
    await log_topics.create_topic(listener.db, TopicSpec("fenced-t", 1))
    connection = await connect(listener)
    producer_id = await _fenced_producer(connection)
    batch = recordbatch.build(
        [(1, b"k", b"v", [])],
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=0,
        transactional=True,
    )
    module: Any = __import__("kio.schema.produce.v9.request", fromlist=["x"])
    answer = await connection.call(
        0,
        9,
        transactional_id="fenced",
        acks=-1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(
            module.TopicProduceData(
                name="fenced-t",
                partition_data=(module.PartitionProduceData(index=0, records=batch),),
            ),
        ),
    )
    code = answer.responses[0].partition_responses[0].error_code
    assert code == ErrorCode.invalid_producer_epoch


async def test_txn_offset_commit_without_member_identity_is_fenced_by_the_epoch_alone(
    listener: KafkaListener,
) -> None:
    # KafkaJS and aiokafka send TxnOffsetCommit v0-v2, which carry no member id: Kafka checks
    # no generation there, so a group with members takes it (issue 22, item 2).
    from coordinator.groups.consumer_protocol import encode_subscription

    await log_topics.create_topic(listener.db, TopicSpec("eos-in", 1))
    connection = await connect(listener)
    join: Any = __import__("kio.schema.join_group.v7.request", fromlist=["x"])
    joined = await connection.call(
        11,
        7,
        group_id="eos-g",
        session_timeout=datetime.timedelta(seconds=30),
        rebalance_timeout=datetime.timedelta(seconds=30),
        member_id="m-1",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(
            join.JoinGroupRequestProtocol(name="range", metadata=encode_subscription(["eos-in"])),
        ),
    )
    assert joined.error_code == ErrorCode.none
    init = await connection.call(
        22,
        3,
        transactional_id="eos-tx",
        transaction_timeout=datetime.timedelta(seconds=30),
        producer_id=-1,
        producer_epoch=-1,
    )
    caller = {"producer_id": init.producer_id, "producer_epoch": init.producer_epoch}
    added = await connection.call(25, 2, transactional_id="eos-tx", group_id="eos-g", **caller)
    assert added.error_code == ErrorCode.none
    commit: Any = __import__("kio.schema.txn_offset_commit.v2.request", fromlist=["x"])
    answer = await connection.call(
        28,
        2,
        transactional_id="eos-tx",
        group_id="eos-g",
        topics=(
            commit.TxnOffsetCommitRequestTopic(
                name="eos-in",
                partitions=(
                    commit.TxnOffsetCommitRequestPartition(
                        partition_index=0,
                        committed_offset=5,
                        committed_leader_epoch=-1,
                        committed_metadata=None,
                    ),
                ),
            ),
        ),
        **caller,
    )
    assert answer.topics[0].partitions[0].error_code == ErrorCode.none
