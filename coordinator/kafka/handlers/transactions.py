"""InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn and the
transaction tools' calls (DescribeProducers, DescribeTransactions, ListTransactions).

Both transaction versions, by the version of each request: a client of transaction version 2
(KIP-890 part 2, which ApiVersions finalizes) sends EndTxn 5, and its end raises the epoch, which
the answer carries (`transactions.service.end(version=2)`, the HTTP door's); an older EndTxn keeps
the epoch (version 1: librdkafka, KafkaJS, aiokafka, kafka-python). Partitions join a transaction
by AddPartitionsToTxn or, in either version, by the produce itself; the rules are the domain's."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core.acls import Operation
from coordinator.kafka.connection import Client
from coordinator.kafka.errors import FAILURES, error_code
from coordinator.kafka.handlers.groups import committed_offsets, member_identity
from coordinator.kafka.wire import Request, milliseconds
from coordinator.log import topics as log_topics
from coordinator.log.producer_states import describe_producers as describe_producer_states
from coordinator.transactions import aborts, listing, producer_ids
from coordinator.transactions import service as transactions
from coordinator.transactions.inputs import AddOffsets, Caller, InitPid
from coordinator.transactions.states import State

# EndTxn from this version on is transaction version 2's.
END_TXN_RAISING_EPOCH = 5


async def init_producer_id(client: Client, request: Request) -> Any:
    body = request.body
    assert client.access is not None
    tid = body.transactional_id
    try:
        client.access.init_pid(tid)
        if tid is not None:
            client.cluster.coordinate(tid)
        # An idempotent producer has no transaction, and Kafka checks no timeout for it: it
        # gets the largest allowed, which no check can refuse.
        timeout = (
            client.settings.transaction_max_timeout_ms
            if tid is None
            else milliseconds(body.transaction_timeout)
        )
        # Version 3 on: a running producer gives its id and epoch to bump them (KIP-360).
        given = (getattr(body, "producer_id", -1), getattr(body, "producer_epoch", -1))
        answer = await producer_ids.init_pid(
            client.db,
            client.settings,
            InitPid(tid, timeout),
            recovering=None if given[0] == -1 else given,
        )
        return request.reply.body(
            error_code=ErrorCode.none,
            producer_id=answer.producer_id,
            producer_epoch=answer.producer_epoch,
        )
    except FAILURES as failure:
        return request.reply.body(error_code=error_code(failure), producer_id=-1, producer_epoch=-1)


async def add_partitions_to_txn(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    if request.version >= 4:
        results = [await _add_partitions(client, reply, txn) for txn in body.transactions]
        return reply.body(error_code=ErrorCode.none, results_by_transaction=tuple(results))
    wanted = [(t.name, p) for t in body.v3_and_below_topics for p in t.partitions]
    code = await _added(
        client,
        body.v3_and_below_transactional_id,
        body.v3_and_below_producer_id,
        body.v3_and_below_producer_epoch,
        wanted,
    )
    return reply.body(
        results_by_topic_v3_and_below=reply.same_code(
            ((t.name, t.partitions) for t in body.v3_and_below_topics),
            code,
            "AddPartitionsToTxnTopicResult",
            "AddPartitionsToTxnPartitionResult",
            partitions_field="results_by_partition",
            code_field="partition_error_code",
        )
    )


async def _add_partitions(client: Client, reply: Any, txn: Any) -> Any:
    """One transaction of a batched AddPartitionsToTxn (version 4 on, Kafka's brokers' form):
    added, or with `verify_only` only checked, each partition not included answered
    INVALID_TXN_STATE as Kafka's coordinator answers it."""
    wanted = [(t.name, p) for t in txn.topics for p in t.partitions]
    missing: set[tuple[str, int]] = set()
    if txn.verify_only:
        assert client.access is not None
        try:
            client.access.add_partitions(txn.transactional_id, (topic for topic, _ in wanted))
            client.cluster.coordinate(txn.transactional_id)
            found = await transactions.missing_partitions(
                client.db, txn.transactional_id, txn.producer_id, txn.producer_epoch, wanted
            )
            missing, code = set(found), ErrorCode.none
        except FAILURES as failure:
            code = error_code(failure)
    else:
        code = await _added(
            client, txn.transactional_id, txn.producer_id, txn.producer_epoch, wanted
        )
    return reply(
        "AddPartitionsToTxnResult",
        transactional_id=txn.transactional_id,
        topic_results=tuple(
            reply(
                "AddPartitionsToTxnTopicResult",
                name=t.name,
                results_by_partition=tuple(
                    reply(
                        "AddPartitionsToTxnPartitionResult",
                        partition_index=p,
                        partition_error_code=ErrorCode.invalid_txn_state
                        if (t.name, p) in missing
                        else code,
                    )
                    for p in t.partitions
                ),
            )
            for t in txn.topics
        ),
    )


async def _added(
    client: Client, tid: str, producer_id: int, epoch: int, wanted: list[tuple[str, int]]
) -> ErrorCode:
    assert client.access is not None
    try:
        client.access.add_partitions(tid, (topic for topic, _ in wanted))
        client.cluster.coordinate(tid)
        await transactions.add_partitions(client.db, tid, Caller(producer_id, epoch), wanted)
    except FAILURES as failure:
        return error_code(failure)
    return ErrorCode.none


async def add_offsets_to_txn(client: Client, request: Request) -> Any:
    body = request.body
    assert client.access is not None
    try:
        client.access.transaction_offsets(body.transactional_id, body.group_id)
        client.cluster.coordinate(body.transactional_id)
        caller = Caller(body.producer_id, body.producer_epoch)
        await transactions.add_offsets(
            client.db, body.transactional_id, AddOffsets(caller, body.group_id)
        )
    except FAILURES as failure:
        return request.reply.body(error_code=error_code(failure))
    return request.reply.body(error_code=ErrorCode.none)


async def txn_offset_commit(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    member_id, generation = member_identity(body)
    code = ErrorCode.none
    try:
        client.access.transaction_offsets(
            body.transactional_id, body.group_id, (t.name for t in body.topics)
        )
        client.cluster.coordinate(body.group_id)  # Kafka sends it to the group's coordinator
        adding = AddOffsets(
            Caller(body.producer_id, body.producer_epoch),
            body.group_id,
            committed_offsets(body.topics),
            member_id,
            generation,
        )
        await transactions.add_offsets(client.db, body.transactional_id, adding)
    except FAILURES as failure:
        code = error_code(failure)
    return reply.body(
        topics=reply.same_code(
            ((t.name, (p.partition_index for p in t.partitions)) for t in body.topics),
            code,
            "TxnOffsetCommitResponseTopic",
            "TxnOffsetCommitResponsePartition",
        )
    )


async def end_txn(client: Client, request: Request) -> Any:
    body = request.body
    assert client.access is not None
    raising = request.version >= END_TXN_RAISING_EPOCH
    try:
        client.access.transactional_id(body.transactional_id)
        client.cluster.coordinate(body.transactional_id)
        ended = await transactions.end(
            client.db,
            body.transactional_id,
            Caller(body.producer_id, body.producer_epoch),
            body.committed,
            version=2 if raising else 1,
            kafka_aborts=raising,
        )
    except FAILURES as failure:
        return request.reply.body(error_code=error_code(failure))
    if not raising:
        return request.reply.body(error_code=ErrorCode.none)
    return request.reply.body(
        error_code=ErrorCode.none,
        producer_id=ended.producer_id,
        producer_epoch=ended.producer_epoch,
    )


async def describe_producers(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    topics = []
    for topic in body.topics:
        partitions = []
        for p in topic.partition_indexes:
            answer: dict[str, Any] = {"error_code": ErrorCode.none, "active_producers": ()}
            try:
                client.access.topic(topic.name, Operation.READ)
                producers_ = await describe_producer_states(client.db, topic.name, p)
                answer["active_producers"] = tuple(
                    reply(
                        "ProducerState",
                        producer_id=s.producer_id,
                        producer_epoch=s.producer_epoch,
                        last_sequence=s.last_sequence,
                        last_timestamp=s.last_timestamp,
                        coordinator_epoch=0,
                        current_txn_start_offset=-1
                        if s.current_txn_start_offset is None
                        else s.current_txn_start_offset,
                    )
                    for s in producers_.producers
                )
            except FAILURES as failure:
                answer = {
                    "error_code": error_code(failure),
                    "active_producers": (),
                    "error_message": str(failure),
                }
            partitions.append(reply("PartitionResponse", partition_index=p, **answer))
        topics.append(reply("TopicResponse", name=topic.name, partitions=tuple(partitions)))
    return reply.body(topics=tuple(topics))


async def describe_transactions(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    states = []
    for tid in body.transactional_ids:
        try:
            client.access.transactional_id(tid)
            d = await transactions.describe(client.db, tid)
            topics: dict[str, list[int]] = {}
            for tp in d.partitions:
                topics.setdefault(tp.topic, []).append(tp.partition)
            states.append(
                reply(
                    "TransactionState",
                    error_code=ErrorCode.none,
                    transactional_id=tid,
                    transaction_state=d.state,
                    transaction_timeout=d.timeout_ms,
                    transaction_start_time=-1 if d.started_ms is None else d.started_ms,
                    producer_id=d.producer_id,
                    producer_epoch=d.producer_epoch,
                    topics=tuple(
                        reply("TopicData", topic=t, partitions=tuple(ps))
                        for t, ps in topics.items()
                    ),
                )
            )
        except FAILURES as failure:
            states.append(
                reply(
                    "TransactionState",
                    error_code=error_code(failure),
                    transactional_id=tid,
                    # Kafka's defaults beside an error.
                    transaction_state="",
                    transaction_timeout=0,
                    transaction_start_time=0,
                    producer_id=0,
                    producer_epoch=0,
                    topics=(),
                )
            )
    return reply.body(transaction_states=tuple(states))


async def list_transactions(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    try:
        client.access.cluster(Operation.DESCRIBE)
    except FAILURES as failure:
        return reply.body(
            error_code=error_code(failure), unknown_state_filters=(), transaction_states=()
        )
    known = {s.value for s in State}
    wanted = set(body.state_filters)
    unknown = tuple(sorted(wanted - known))
    pids = set(body.producer_id_filters)
    older = milliseconds(getattr(body, "duration_filter", None))
    found = await listing.list_transactions(
        client.db, None, older if older >= 0 else None, None, limit=100_000
    )
    return reply.body(
        error_code=ErrorCode.none,
        unknown_state_filters=unknown,
        transaction_states=tuple(
            reply(
                "TransactionState",
                transactional_id=t.transactional_id,
                producer_id=t.producer_id,
                transaction_state=t.state,
            )
            for t in found.transactions
            if (not wanted or t.state in wanted)
            and (not pids or t.producer_id in pids)
            # As each Kafka broker lists the transactions it coordinates.
            and client.cluster.coordinates(t.transactional_id)
        ),
    )


async def write_txn_markers(client: Client, request: Request) -> Any:
    """WriteTxnMarkers, which Kafka's brokers send each other and `kafka-transactions abort` sends
    a partition's leader to abort a hanging transaction: here an abort marker is the operator's
    abort of the producer's open transaction (`transactions.service.abort_by_marker`), and a
    commit marker is refused, since only the coordinator commits. The cluster's rights."""
    reply, body = request.reply, request.body
    assert client.access is not None
    listed = await log_topics.list_topics(client.db)
    counts = {t.name: t.partitions for t in listed.topics}
    results = []
    for marker in body.markers:
        asked = [(t.name, p) for t in marker.topics for p in t.partition_indexes]
        # A partition that does not exist is answered UNKNOWN_TOPIC_OR_PARTITION, as Kafka's
        # leader answers it; the marker goes to the others.
        keys = [(t, p) for t, p in asked if 0 <= p < counts.get(t, 0)]
        code = ErrorCode.none
        try:
            client.access.cluster(Operation.CLUSTER_ACTION)
            if marker.transaction_result:
                code = ErrorCode.invalid_txn_state  # only the coordinator writes commit markers
            elif keys:
                await aborts.abort_by_marker(
                    client.db, marker.producer_id, marker.producer_epoch, keys
                )
        except FAILURES as failure:
            code = error_code(failure)
        known = set(keys)
        results.append(
            reply(
                "WritableTxnMarkerResult",
                producer_id=marker.producer_id,
                topics=tuple(
                    reply(
                        "WritableTxnMarkerTopicResult",
                        name=t.name,
                        partitions=tuple(
                            reply(
                                "WritableTxnMarkerPartitionResult",
                                partition_index=p,
                                error_code=code
                                if (t.name, p) in known
                                else ErrorCode.unknown_topic_or_partition,
                            )
                            for p in t.partition_indexes
                        ),
                    )
                    for t in marker.topics
                ),
            )
        )
    return reply.body(markers=tuple(results))
