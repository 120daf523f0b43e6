"""What a one-broker cluster answers about replicas and log directories: ElectLeaders (every
leader is already the preferred one), ListPartitionReassignments (none is ever in progress) and
DescribeLogDirs (one directory, the store, with each partition's bytes), as Kafka's tools ask
them (`kafka-leader-election`, `kafka-reassign-partitions --list`, `kafka-log-dirs`). All three
need the cluster's rights, as on Kafka."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core.acls import Operation
from coordinator.kafka.connection import Client
from coordinator.kafka.errors import FAILURES, error_code
from coordinator.kafka.wire import Request
from coordinator.log import topics as log_topics

# The one log directory DescribeLogDirs names: the partitions live in the store.
LOG_DIR = "store"
_PREFERRED, _UNCLEAN = 0, 1


async def elect_leaders(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    asked = body.topic_partitions or ()  # null: all partitions, of which none needs an election
    refusal: ErrorCode | None = None
    counts: dict[str, int] = {}
    try:
        client.access.cluster()
        if getattr(body, "election_type", _PREFERRED) not in (_PREFERRED, _UNCLEAN):
            refusal = ErrorCode.invalid_request
        else:
            topics = (await log_topics.list_topics(client.db)).topics
            counts = {t.name: t.partitions for t in topics}
    except FAILURES as failure:
        refusal = error_code(failure)

    def result(topic: str, partition: int) -> Any:
        if refusal is not None:
            code, message = refusal, None
        elif topic in counts and 0 <= partition < counts[topic]:
            code, message = ErrorCode.election_not_needed, "this broker leads its only replica"
        else:
            code, message = ErrorCode.unknown_topic_or_partition, "no such partition"
        return reply(
            "PartitionResult", partition_id=partition, error_code=code, error_message=message
        )

    # Version 0 has no top-level code: a refusal is each partition's.
    top = {"error_code": refusal or ErrorCode.none} if request.version >= 1 else {}
    return reply.body(
        **top,
        replica_election_results=tuple(
            reply(
                "ReplicaElectionResult",
                topic=t.topic,
                partition_result=tuple(result(t.topic, p) for p in t.partitions),
            )
            for t in asked
        ),
    )


async def list_partition_reassignments(client: Client, request: Request) -> Any:
    reply = request.reply
    assert client.access is not None
    try:
        client.access.cluster(Operation.DESCRIBE)
    except FAILURES as failure:
        return reply.body(error_code=error_code(failure), error_message=str(failure), topics=())
    return reply.body(error_code=ErrorCode.none, error_message=None, topics=())


async def describe_log_dirs(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    top = {"error_code": ErrorCode.none} if request.version >= 3 else {}
    try:
        client.access.cluster(Operation.DESCRIBE)
        counts = {t.name: t.partitions for t in (await log_topics.list_topics(client.db)).topics}
        sizes = await log_topics.partition_sizes(client.db)
    except FAILURES as failure:
        if not top:
            return reply.body(results=())  # before version 3, Kafka answers nothing
        return reply.body(error_code=error_code(failure), results=())
    if body.topics is None:
        wanted = {name: list(range(count)) for name, count in counts.items()}
    else:
        wanted = {
            t.topic: [p for p in t.partitions if 0 <= p < counts[t.topic]]
            for t in body.topics
            if t.topic in counts
        }
    volume = {"total_bytes": -1, "usable_bytes": -1} if request.version >= 4 else {}
    result = reply(
        "DescribeLogDirsResult",
        error_code=ErrorCode.none,
        log_dir=LOG_DIR,
        topics=tuple(
            reply(
                "DescribeLogDirsTopic",
                name=name,
                partitions=tuple(
                    reply(
                        "DescribeLogDirsPartition",
                        partition_index=p,
                        partition_size=sizes.get((name, p), 0),
                        offset_lag=0,
                        is_future_key=False,
                    )
                    for p in partitions
                ),
            )
            for name, partitions in sorted(wanted.items())
        ),
        **volume,
    )
    return reply.body(**top, results=(result,))
