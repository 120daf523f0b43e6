"""Produce, Fetch, ListOffsets and DeleteRecords: the client's record batches stored as they are,
and returned as stored, with what read_committed clients filter by (the LSO, and the aborted
transactions with their markers)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core.acls import Operation
from coordinator.kafka.connection import Client
from coordinator.kafka.errors import FAILURES, Refused, error_code, outcome
from coordinator.kafka.wire import Request, Spliced, WithRecords, milliseconds
from coordinator.log import epochs
from coordinator.log import fetch as log_fetch
from coordinator.log import produce as appending
from coordinator.log import topics as log_topics
from coordinator.log.errors import NotLeaderOrFollower
from coordinator.log.purgatory import PURGATORY

READ_COMMITTED = 1

# What Kafka's broker refuses in the read itself, where a refused partition's aborted list is
# null (an unknown partition is refused before the read: an empty list).
_READS_REFUSALS = (
    ErrorCode.offset_out_of_range,
    ErrorCode.fenced_leader_epoch,
    ErrorCode.unknown_leader_epoch,
)


async def produce(client: Client, request: Request) -> Any:
    """Every partition's batch checked at the edge, then all of them appended in one group (one
    unit of work with whatever else is waiting), each answered on its own."""
    reply, body = request.reply, request.body
    assert client.access is not None
    tid = body.transactional_id
    answers: list[Any] = []  # each partition's, in the request's order
    checked: list[tuple[int, appending.Append]] = []
    for topic in body.topic_data:
        for data in topic.partition_data:
            answers.append(None)
            try:
                if body.acks not in (0, 1, -1):
                    raise Refused(ErrorCode.invalid_required_acks, f"acks={body.acks}: 0, 1 or -1")
                client.access.produce(topic.name, tid)
                leader = await client.cluster.lead_as_read(
                    client.db, topic.name, data.index, epochs.NO_EPOCH
                )
                if data.records is None:
                    raise Refused(ErrorCode.corrupt_message, "no record batch")
                append = await appending.checked_append(
                    client.db,
                    client.settings,
                    topic.name,
                    data.index,
                    bytes(data.records),
                    tid,
                    leader,
                )
                checked.append((len(answers) - 1, append))
            except FAILURES as failure:
                answers[-1] = failure
    if checked:
        appended = appending.submit_all(client.db, client.settings, [a for _, a in checked])
        client.queued()
        results = await appended
        for (position, _), result in zip(checked, results, strict=True):
            answers[position] = result
        if any(isinstance(r, NotLeaderOrFollower) for r in results):
            await client.cluster.refresh(client.db)  # fenced: leadership moved since the view
    if body.acks == 0:
        return None
    responses = []
    each = iter(answers)
    for topic in body.topic_data:
        partitions = [_answer(reply, data.index, next(each)) for data in topic.partition_data]
        responses.append(
            reply("TopicProduceResponse", name=topic.name, partition_responses=tuple(partitions))
        )
    return reply.body(responses=tuple(responses))


def _answer(reply: Any, index: int, result: Any) -> Any:
    if isinstance(result, appending.Appended):
        return reply(
            "PartitionProduceResponse",
            index=index,
            base_offset=result.base_offset,
            log_append_time=result.log_append_time,
            log_start_offset=result.log_start_offset,
            error_code=ErrorCode.none,
            record_errors=(),
        )
    if not isinstance(result, FAILURES):
        raise result
    # KIP-467: the records that made the batch fail, by index in the batch.
    record_errors = tuple(
        reply("BatchIndexAndErrorMessage", batch_index=i, batch_index_error_message=None)
        for i in getattr(result, "extensions", {}).get("record_errors", ())
    )
    return reply(
        "PartitionProduceResponse",
        index=index,
        base_offset=-1,
        log_append_time=-1,
        log_start_offset=-1,
        record_errors=record_errors,
        **outcome(result),
    )


async def fetch(client: Client, request: Request) -> Any:
    """A long poll: answered once `min_bytes` are there, or at `max_wait`. Between reads it
    sleeps in the purgatory on the partitions it reads, woken when one of them moves."""
    body = request.body
    deadline = time.monotonic() + milliseconds(body.max_wait) / 1000
    min_bytes = max(1, body.min_bytes)
    names = [t.topic for t in body.topics] if request.version < 13 else await _names(client, body)
    read = [
        (name, asked.partition)
        for topic, name in zip(body.topics, names, strict=True)
        if name is not None
        for asked in topic.partitions
    ]
    while True:
        # Registered before the read: a move between the read and the sleep is not lost.
        with PURGATORY.waiting(read) as moved:
            topics, spliced = await _fetch_once(client, request, names)
            size = sum(records.size for records in spliced)
            remaining = deadline - time.monotonic()
            if size >= min_bytes or remaining <= 0 or client.closing.is_set():
                break
            await _sleep(moved, client.closing, remaining)
    body = request.reply.body(error_code=ErrorCode.none, session_id=0, responses=topics)
    return WithRecords(body, spliced)


async def _sleep(moved: asyncio.Future[None], closing: asyncio.Event, seconds: float) -> None:
    """Until a partition moves, the connection closes, or `seconds` pass."""
    closed = asyncio.ensure_future(closing.wait())
    try:
        await asyncio.wait((moved, closed), timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        closed.cancel()


async def _names(client: Client, body: Any) -> list[str | None]:
    """Fetch v13+ names its topics by id (KIP-516): a topic deleted and created again under its
    name is another id, UNKNOWN_TOPIC_ID to a client still fetching the old one."""
    by_id = await log_topics.names_by_id(client.db, {t.topic_id for t in body.topics})
    return [by_id.get(t.topic_id) for t in body.topics]


async def _fetch_once(
    client: Client, request: Request, names: list[str | None]
) -> tuple[tuple[Any, ...], list[Spliced]]:
    """Every partition's answer, its batches spliced in as they are stored (`Spliced`)."""
    reply, body = request.reply, request.body
    assert client.access is not None
    read_committed = getattr(body, "isolation_level", 0) == READ_COMMITTED
    # Each partition's answer: a refusal, or its index among those the log fetches.
    checked: list[BaseException | int] = []
    wanted: list[log_fetch.PartitionAsk] = []
    leader_epochs: list[int] = []  # the leader's epoch of each partition in `wanted`
    for topic, name in zip(body.topics, names, strict=True):
        for asked in topic.partitions:
            if name is None:
                checked.append(Refused(ErrorCode.unknown_topic_id, "no topic has this id"))
                continue
            try:
                client.access.fetch(name)
                _, epoch = await client.cluster.lead_as_read(
                    client.db, name, asked.partition, _current(asked)
                )
            except FAILURES as failure:
                checked.append(failure)
                continue
            leader_epochs.append(epoch)
            checked.append(len(wanted))
            wanted.append(
                log_fetch.PartitionAsk(
                    name, asked.partition, asked.fetch_offset, asked.partition_max_bytes
                )
            )
    fetched = await client.read_ahead.fetch_partitions(
        client.db,
        wanted,
        getattr(body, "max_bytes", None) or None,
        client.settings.fetch_max_bytes,
        read_committed=read_committed,
        min_bytes=max(1, body.min_bytes),
    )
    spliced: list[Spliced] = []
    each = iter(checked)
    topics = []
    for topic, name in zip(body.topics, names, strict=True):
        partitions = []
        for asked in topic.partitions:
            outcome_ = next(each)
            if isinstance(outcome_, BaseException):
                answer = _partition_data(reply, outcome_, read_committed, 0)
            else:
                epoch = leader_epochs[outcome_]
                answer = _partition_data(reply, fetched[outcome_], read_committed, epoch)
            if isinstance(answer["records"], Spliced):
                spliced.append(answer["records"])
                answer["records"] = answer["records"].placeholder
            partitions.append(reply("PartitionData", partition_index=asked.partition, **answer))
        topics.append(
            reply(
                "FetchableTopicResponse",
                topic=name or "",
                topic_id=getattr(topic, "topic_id", None),
                partitions=tuple(partitions),
            )
        )
    return tuple(topics), spliced


def _current(asked: Any) -> int:
    """A partition's `current_leader_epoch` as a request asks it (-1 in versions without it)."""
    return int(getattr(asked, "current_leader_epoch", epochs.NO_EPOCH))


def _partition_data(
    reply: Any, result: Any, read_committed: bool, leader_epoch: int
) -> dict[str, Any]:
    """A partition's answer to a Fetch: its batches (with the leader's epoch in each), where it
    stands, and the aborted transactions a read_committed client filters by; or its refusal."""
    if isinstance(result, BaseException):
        code = error_code(result)
        return {
            "error_code": code,
            "high_watermark": -1,
            "last_stable_offset": -1,
            "log_start_offset": -1,
            # Beside a partition it cannot read, Kafka's broker answers an empty list; a read's
            # refusal carries a null one, as Kafka's does.
            "aborted_transactions": None if code in _READS_REFUSALS and not read_committed else (),
            "records": b"",
        }
    # The log keeps each batch as its producer wrote it; a Kafka leader's answer carries the
    # leader's epoch in each (`log.epochs`), written over it on the way out.
    records = Spliced(result.batches, leader_epoch) if result.batches else b""
    return {
        "error_code": ErrorCode.none,
        "high_watermark": result.high_watermark,
        "last_stable_offset": result.last_stable_offset,
        "log_start_offset": result.log_start_offset,
        # Kafka's broker: null unless read_committed (then a list, maybe empty).
        "aborted_transactions": tuple(
            reply("AbortedTransaction", producer_id=pid, first_offset=first)
            for pid, first in result.aborted
        )
        if read_committed
        else None,
        "records": records,
    }


async def list_offsets(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    read_committed = getattr(body, "isolation_level", 0) == READ_COMMITTED
    topics = []
    for topic in body.topics:
        partitions = []
        for asked in topic.partitions:
            answer: dict[str, Any] = {"offset": -1, "timestamp": -1, "leader_epoch": -1}
            try:
                client.access.fetch(topic.name)
                offset, timestamp = await log_fetch.list_offset(
                    client.db,
                    topic.name,
                    asked.partition_index,
                    asked.timestamp,
                    read_committed=read_committed,
                )
                _, epoch = await client.cluster.lead_as_read(
                    client.db, topic.name, asked.partition_index, _current(asked)
                )
                answer |= {
                    "offset": offset,
                    "timestamp": timestamp,
                    # Told in the leader's current epoch (`log.epochs`); none found, none given.
                    "leader_epoch": epochs.NO_EPOCH if offset < 0 else epoch,
                    "error_code": ErrorCode.none,
                }
            except FAILURES as failure:
                answer["error_code"] = error_code(failure)
            partitions.append(
                reply(
                    "ListOffsetsPartitionResponse", partition_index=asked.partition_index, **answer
                )
            )
        topics.append(
            reply("ListOffsetsTopicResponse", name=topic.name, partitions=tuple(partitions))
        )
    return reply.body(topics=tuple(topics))


async def offset_for_leader_epoch(client: Client, request: Request) -> Any:
    """Where each asked leader epoch ends (KIP-320: a consumer checks its position for
    truncation), answered from the log's one epoch (`log.epochs`); a topic the principal may
    not describe is TOPIC_AUTHORIZATION_FAILED, partition by partition, as on Kafka."""
    reply, body = request.reply, request.body
    assert client.access is not None
    topics = []
    for topic in body.topics:
        partitions = []
        for asked in topic.partitions:
            answer: dict[str, Any] = {"leader_epoch": epochs.NO_EPOCH, "end_offset": -1}
            try:
                client.access.describe_topic(topic.topic)
                # The partition found first, then the client's epoch and the leader checked.
                _, epoch = client.cluster.leader(topic.topic, asked.partition)
                end = await epochs.end_offset_for_epoch(
                    client.db,
                    topic.topic,
                    asked.partition,
                    asked.leader_epoch,
                    epochs.NO_EPOCH,
                    epoch,
                )
                await client.cluster.lead_as_read(
                    client.db, topic.topic, asked.partition, _current(asked)
                )
                answer = {
                    "leader_epoch": end.leader_epoch,
                    "end_offset": end.end_offset,
                    "error_code": ErrorCode.none,
                }
            except FAILURES as failure:
                answer["error_code"] = error_code(failure)
            partitions.append(reply("EpochEndOffset", partition=asked.partition, **answer))
        topics.append(
            reply("OffsetForLeaderTopicResult", topic=topic.topic, partitions=tuple(partitions))
        )
    return reply.body(topics=tuple(topics))


async def delete_records(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    topics = []
    for topic in body.topics:
        # Kafka answers each partition on its own: one above its high watermark is
        # OFFSET_OUT_OF_RANGE, and the others still move.
        results: dict[int, Any] = {}
        for p in topic.partitions:
            try:
                client.access.topic(topic.name, Operation.DELETE)
                deleted = await log_topics.delete_records(
                    client.db, topic.name, [(p.partition_index, p.offset)]
                )
                (moved,) = deleted.partitions
                results[p.partition_index] = {
                    "low_watermark": moved.log_start_offset,
                    "error_code": ErrorCode.none,
                }
            except FAILURES as failure:
                results[p.partition_index] = {
                    "low_watermark": -1,
                    "error_code": error_code(failure),
                }
        topics.append(
            reply(
                "DeleteRecordsTopicResult",
                name=topic.name,
                partitions=tuple(
                    reply("DeleteRecordsPartitionResult", partition_index=p, **r)
                    for p, r in results.items()
                ),
            )
        )
    return reply.body(topics=tuple(topics))
