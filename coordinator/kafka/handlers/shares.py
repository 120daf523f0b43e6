"""Share groups' records over Kafka's wire (KIP-932): ShareFetch v1-v2 and ShareAcknowledge v1-v2,
thin over `coordinator.shares`; the share sessions are this door's
(`coordinator.kafka.share_sessions`). KafkaShareConsumer fetches and acknowledges with them.

A ShareFetch is a long poll (`shares.service.acquire_waiting`) on its session's partitions.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core.acls import Operation
from coordinator.kafka.connection import Client
from coordinator.kafka.errors import FAILURES, Refused, error_code, message
from coordinator.kafka.handlers.cluster import NODE_ID
from coordinator.kafka.handlers.consumer_groups import topic_ids
from coordinator.kafka.share_sessions import CLOSE, OPEN, ShareSession, ShareSessions
from coordinator.kafka.wire import Request, Spliced, WithRecords, milliseconds
from coordinator.log.epochs import LEADER_EPOCH
from coordinator.shares import service as shares
from coordinator.shares.inflight import Acquired
from coordinator.shares.service import AckBatch, PartitionResult

TP = tuple[str, int]
_NO_TOPIC_ID = uuid.UUID(int=0)
# ShareFetch v2's share_acquire_mode: 1 takes exactly max_records (KIP-1206).
_RECORD_LIMIT = 1


# -- fetching and acknowledging -----------------------------------------------------------------


def _acks(
    topics: Sequence[Any], by_id: Mapping[uuid.UUID, str], unknown: dict[tuple[uuid.UUID, int], Any]
) -> dict[TP, list[AckBatch]]:
    """The request's acknowledgements by partition; those of unknown topic ids noted apart."""
    acks: dict[TP, list[AckBatch]] = {}
    for topic in topics:
        name = by_id.get(topic.topic_id)
        for p in topic.partitions:
            batches = [
                AckBatch(b.first_offset, b.last_offset, tuple(b.acknowledge_types))
                for b in p.acknowledgement_batches
            ]
            if not batches:
                continue
            if name is None:
                unknown[(topic.topic_id, p.partition_index)] = None
                continue
            acks.setdefault((name, p.partition_index), []).extend(batches)
    return acks


def _sessions(client: Client) -> ShareSessions:
    return client.share_sessions


def _leader(reply: Any) -> Any:
    return reply("LeaderIdAndEpoch", leader_id=NODE_ID, leader_epoch=LEADER_EPOCH)


def _acquired(reply: Any, acquired: Sequence[Acquired]) -> tuple[Any, ...]:
    return tuple(
        reply(
            "AcquiredRecords",
            first_offset=a.first,
            last_offset=a.last,
            delivery_count=a.deliveries,
        )
        for a in acquired
    )


async def _authorized(client: Client, partitions: Iterable[TP]) -> dict[TP, BaseException]:
    """The partitions the caller may not read: each its refusal."""
    assert client.access is not None
    refused: dict[TP, BaseException] = {}
    for tp in partitions:
        try:
            client.access.fetch(tp[0])
        except FAILURES as failure:
            refused[tp] = failure
    return refused


def _top_error(reply: Any, failure: BaseException, lock_ms: int = 0) -> Any:
    return reply.body(
        error_code=error_code(failure),
        error_message=message(failure),
        acquisition_lock_timeout=lock_ms,
        responses=(),
        node_endpoints=(),
    )


async def share_fetch(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    group_id, member_id, epoch = body.group_id, body.member_id, body.share_session_epoch
    ids, by_id = await topic_ids(client)
    unknown: dict[tuple[uuid.UUID, int], Any] = {}
    acks = _acks(body.topics, by_id, unknown)
    asked: list[TP] = []
    for topic in body.topics:
        name = by_id.get(topic.topic_id)
        for p in topic.partitions:
            if name is None:
                unknown[(topic.topic_id, p.partition_index)] = None
            else:
                asked.append((name, p.partition_index))
    forgotten = [
        (by_id[t.topic_id], p) for t in body.forgotten_topics_data if t.topic_id in by_id
        for p in t.partitions
    ]  # fmt: skip
    sessions = _sessions(client)
    try:
        if not group_id:
            raise Refused(ErrorCode.invalid_request, "GroupId must be set.")
        if not member_id:
            raise Refused(ErrorCode.invalid_request, "MemberId must be set.")
        client.access.group(group_id, Operation.READ)
        if epoch == OPEN and acks:
            raise Refused(
                ErrorCode.invalid_request,
                "Acknowledge data present on initial share fetch request",
            )
        if epoch == OPEN:
            session, old = sessions.open(group_id, member_id)
            if old is not None:
                await shares.release(
                    client.db, client.settings, group_id, member_id, old.partitions
                )
        elif epoch == CLOSE:
            session = sessions.close(group_id, member_id) or _detached(group_id, member_id)
        else:
            session = sessions.advance(group_id, member_id, epoch)
    except FAILURES as failure:
        return _top_error(reply, failure)
    session.partitions |= set(asked)
    session.partitions -= set(forgotten)
    refused = await _authorized(client, session.partitions | set(acks))
    fetching = (
        [] if epoch == CLOSE else sorted(tp for tp in session.partitions if tp not in refused)
    )
    allowed_acks = {tp: b for tp, b in acks.items() if tp not in refused}
    whole = getattr(body, "share_acquire_mode", 0) != _RECORD_LIMIT
    max_records = max(1, body.max_records) if body.max_records > 0 else 500
    lock_ms = 0
    try:
        results, lock_ms = await shares.acquire_waiting(
            client.db,
            client.settings,
            group_id,
            member_id,
            fetching,
            allowed_acks,
            max_records=max_records,
            max_bytes=body.max_bytes,
            wait_ms=milliseconds(body.max_wait),
            whole_batches=whole,
            stop=client.closing,
        )
        if epoch == CLOSE:
            await shares.release(
                client.db, client.settings, group_id, member_id, session.partitions
            )
    except FAILURES as failure:
        return _top_error(reply, failure, lock_ms)
    return _fetch_answer(reply, results, refused, unknown, ids, lock_ms)


def _detached(group_id: str, member_id: str) -> ShareSession:
    """A closing request of a member with no session here: its acknowledgements still count."""
    return ShareSession(group_id, member_id, CLOSE)


def _fetch_answer(
    reply: Any,
    results: Mapping[TP, PartitionResult],
    refused: Mapping[TP, BaseException],
    unknown: Mapping[tuple[uuid.UUID, int], Any],
    ids: Mapping[str, uuid.UUID],
    lock_ms: int,
) -> Any:
    spliced: list[Spliced] = []
    by_topic: dict[uuid.UUID, list[Any]] = {}

    def partition(index: int, **fields: Any) -> Any:
        data = {
            "error_code": ErrorCode.none,
            "error_message": None,
            "acknowledge_error_code": ErrorCode.none,
            "acknowledge_error_message": None,
            "current_leader": _leader(reply),
            "records": b"",
            "acquired_records": (),
            **fields,
        }
        return reply("PartitionData", partition_index=index, **data)

    for tp, failure in sorted(refused.items()):
        by_topic.setdefault(ids[tp[0]], []).append(
            partition(
                tp[1],
                error_code=error_code(failure),
                error_message=message(failure),
                acknowledge_error_code=error_code(failure),
                acknowledge_error_message=message(failure),
            )
        )
    for (topic_id, index), _ in sorted(unknown.items(), key=lambda k: (str(k[0][0]), k[0][1])):
        by_topic.setdefault(topic_id, []).append(
            partition(
                index,
                error_code=ErrorCode.unknown_topic_id,
                acknowledge_error_code=ErrorCode.unknown_topic_id,
            )
        )
    for tp, r in sorted(results.items()):
        if not (r.acquired or r.error or r.acknowledged):
            continue  # as Kafka answers: only partitions with records, errors or acks
        fields: dict[str, Any] = {}
        if r.error is not None:
            fields |= {"error_code": error_code(r.error), "error_message": message(r.error)}
        if r.ack_error is not None:
            fields |= {
                "acknowledge_error_code": error_code(r.ack_error),
                "acknowledge_error_message": message(r.ack_error),
            }
        if r.batches:
            records = Spliced(r.batches, LEADER_EPOCH)
            spliced.append(records)
            fields["records"] = records.placeholder
            fields["acquired_records"] = _acquired(reply, r.acquired)
        by_topic.setdefault(ids.get(tp[0], _NO_TOPIC_ID), []).append(partition(tp[1], **fields))
    body = reply.body(
        error_code=ErrorCode.none,
        error_message=None,
        acquisition_lock_timeout=lock_ms,
        responses=tuple(
            reply("ShareFetchableTopicResponse", topic_id=topic_id, partitions=tuple(parts))
            for topic_id, parts in by_topic.items()
        ),
        node_endpoints=(),
    )
    return WithRecords(body, spliced)


async def share_acknowledge(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    group_id, member_id, epoch = body.group_id, body.member_id, body.share_session_epoch
    ids, by_id = await topic_ids(client)
    unknown: dict[tuple[uuid.UUID, int], Any] = {}
    acks = _acks(body.topics, by_id, unknown)
    sessions = _sessions(client)
    lock_ms = 0
    try:
        if not group_id:
            raise Refused(ErrorCode.invalid_request, "GroupId must be set.")
        if not member_id:
            raise Refused(ErrorCode.invalid_request, "MemberId must be set.")
        client.access.group(group_id, Operation.READ)
        if epoch == OPEN:
            raise Refused(
                ErrorCode.invalid_share_session_epoch,
                "ShareAcknowledge cannot open a share session (epoch 0)",
            )
        session = (
            sessions.close(group_id, member_id) or _detached(group_id, member_id)
            if epoch == CLOSE
            else sessions.advance(group_id, member_id, epoch)
        )
        refused = await _authorized(client, acks)
        results, lock_ms = await shares.acknowledge(
            client.db,
            client.settings,
            group_id,
            member_id,
            {tp: b for tp, b in acks.items() if tp not in refused},
        )
        if epoch == CLOSE:
            await shares.release(
                client.db, client.settings, group_id, member_id, session.partitions
            )
    except FAILURES as failure:
        return reply.body(
            error_code=error_code(failure),
            error_message=message(failure),
            acquisition_lock_timeout=lock_ms,
            responses=(),
            node_endpoints=(),
        )

    def partition(index: int, refusal: BaseException | None) -> Any:
        return reply(
            "PartitionData",
            partition_index=index,
            error_code=ErrorCode.none if refusal is None else error_code(refusal),
            error_message=None if refusal is None else message(refusal),
            current_leader=_leader(reply),
        )

    by_topic: dict[uuid.UUID, list[Any]] = {}
    for tp, refusal in sorted(refused.items()):
        by_topic.setdefault(ids[tp[0]], []).append(partition(tp[1], refusal))
    for r in results:
        by_topic.setdefault(ids.get(r.topic, _NO_TOPIC_ID), []).append(
            partition(r.partition, r.ack_error)
        )
    for (topic_id, index), _ in unknown.items():
        by_topic.setdefault(topic_id, []).append(
            reply(
                "PartitionData",
                partition_index=index,
                error_code=ErrorCode.unknown_topic_id,
                error_message=None,
                current_leader=_leader(reply),
            )
        )
    return reply.body(
        error_code=ErrorCode.none,
        error_message=None,
        acquisition_lock_timeout=lock_ms,
        responses=tuple(
            reply("ShareAcknowledgeTopicResponse", topic_id=topic_id, partitions=tuple(parts))
            for topic_id, parts in by_topic.items()
        ),
        node_endpoints=(),
    )
