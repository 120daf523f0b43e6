"""KIP-848's consumer group protocol over Kafka's wire (ConsumerGroupHeartbeat v0-v1,
ConsumerGroupDescribe v0): thin over the membership the REST heartbeat already runs (it has
KIP-848's shape), translating topic ids to names and back. librdkafka's
`group.protocol=consumer` speaks it.

A member id is the client's (v1, KIP-1082) or, joining under v0 without one, made here. A
subscription by regular expression is resolved against the topics at each heartbeat (Python's
`re`, where Kafka uses RE2/J: anchored at both ends as Kafka matches, at most 256 characters).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core.acls import Operation
from coordinator.groups import consumer
from coordinator.groups import service as groups_service
from coordinator.groups.inputs import LEAVE_EPOCH, Beat
from coordinator.groups.models import CONSUMER, STREAMS
from coordinator.kafka.connection import NOT_ASKED, Client, kafka_host
from coordinator.kafka.errors import FAILURES, Refused, error_code, message
from coordinator.kafka.wire import Request, milliseconds
from coordinator.log import topics as log_topics

# -2: a static member leaving for now (KIP-848); it leaves here (no static membership yet).
_STATIC_LEAVE_EPOCH = -2
_MAX_REGEX = 256


def by_topic(partitions: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    """Partitions grouped by topic, both in order (how group answers list them)."""
    out: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        out.setdefault(topic, []).append(partition)
    return out


def failed_description(reply: Any, group_id: str, failure: BaseException, **empty: Any) -> Any:
    """A describe's entry for a group it could not describe: the error, with Kafka's defaults
    beside it (`empty`: those of the fields that differ by kind of group)."""
    return reply(
        "DescribedGroup",
        error_code=error_code(failure),
        error_message=message(failure),
        group_id=group_id,
        group_state="",
        group_epoch=0,
        assignment_epoch=0,
        members=(),
        authorized_operations=NOT_ASKED,
        **empty,
    )


async def topic_ids(client: Client) -> tuple[dict[str, uuid.UUID], dict[uuid.UUID, str]]:
    """Every topic's id by name, and its name by id (KIP-516's ids, as the group calls carry
    them)."""
    listed = await log_topics.list_topics(client.db)
    ids = {t.name: t.topic_id for t in listed.topics if t.topic_id is not None}
    return ids, {topic_id: name for name, topic_id in ids.items()}


def _matching(pattern: str, names: list[str]) -> list[str]:
    if len(pattern) > _MAX_REGEX:
        raise Refused(ErrorCode.invalid_regular_expression, "at most 256 characters")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise Refused(ErrorCode.invalid_regular_expression, str(exc)) from None
    return [name for name in names if compiled.fullmatch(name)]


async def consumer_group_heartbeat(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    member_id = body.member_id or str(uuid.uuid4())
    # A refusal carries Kafka's defaults: no member id, epoch 0, no heartbeat interval.
    failed = {"member_id": None, "member_epoch": 0, "heartbeat_interval": 0}
    try:
        client.access.group(body.group_id, Operation.READ)
        client.cluster.coordinate(body.group_id)
        names, by_id = await topic_ids(client)
        topics = body.subscribed_topic_names
        regex = getattr(body, "subscribed_topic_regex", None)
        if regex:
            topics = tuple(_matching(regex, sorted(names)))
        if topics is not None:
            client.access.join(body.group_id, topics)
        leaving = body.member_epoch in (LEAVE_EPOCH, _STATIC_LEAVE_EPOCH)
        static_leave = body.member_epoch == _STATIC_LEAVE_EPOCH
        if static_leave and body.instance_id is None:
            raise Refused(ErrorCode.invalid_request, "InstanceId can't be null.")
        # -1: unchanged since the member's last heartbeat (a client sends it only to join).
        rebalance_timeout_ms = milliseconds(body.rebalance_timeout)
        unchanged = rebalance_timeout_ms < 0
        if unchanged and body.member_epoch == 0:
            raise Refused(
                ErrorCode.invalid_request, "RebalanceTimeoutMs must be provided in first request."
            )
        owned = (
            None
            if body.topic_partitions is None
            else [
                (by_id[tp.topic_id], p)
                for tp in body.topic_partitions
                if tp.topic_id in by_id
                for p in tp.partitions
            ]
        )
        beat = Beat(
            member_id,
            LEAVE_EPOCH if leaving else body.member_epoch,
            None if topics is None else list(topics),
            owned,
            max(1, rebalance_timeout_ms),
        )
        answer = await consumer.heartbeat(
            client.db,
            client.settings,
            body.group_id,
            beat,
            *client.as_member,
            protocol=CONSUMER,
            keep_rebalance_timeout=unchanged,
            instance_id=body.instance_id,
            static_leave=static_leave,
        )
    except FAILURES as failure:
        return reply.body(
            error_code=error_code(failure),
            error_message=message(failure),
            assignment=None,
            **failed,
        )
    assigned: dict[str, list[int]] = {}
    for tp in answer.assignment:
        assigned.setdefault(tp.topic, []).append(tp.partition)
    return reply.body(
        error_code=ErrorCode.none,
        error_message=None,
        member_id=member_id,
        member_epoch=answer.member_epoch,
        heartbeat_interval=0 if leaving else answer.heartbeat_interval_ms,
        assignment=None
        if leaving
        else reply(
            "Assignment",
            topic_partitions=tuple(
                reply("TopicPartitions", topic_id=names[topic], partitions=tuple(partitions))
                for topic, partitions in sorted(assigned.items())
                if topic in names
            ),
        ),
    )


async def consumer_group_describe(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    names, _ = await topic_ids(client)

    def assignment(partitions: Any) -> Any:
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        return reply(
            "Assignment",
            topic_partitions=tuple(
                reply(
                    "TopicPartitions",
                    topic_id=names.get(topic, uuid.UUID(int=0)),
                    topic_name=topic,
                    partitions=tuple(sorted(ps)),
                )
                for topic, ps in sorted(by_topic.items())
            ),
        )

    described = []
    for group_id in body.group_ids:
        try:
            client.access.group(group_id, Operation.DESCRIBE)
            d = await groups_service.describe(client.db, group_id)
            if d.classic_state is not None or d.type == STREAMS:
                kind = "a classic" if d.classic_state is not None else "a streams"
                raise Refused(ErrorCode.group_id_not_found, f"{group_id!r} is {kind} group")
        except FAILURES as failure:
            described.append(failed_description(reply, group_id, failure, assignor_name=""))
            continue
        described.append(
            reply(
                "DescribedGroup",
                error_code=ErrorCode.none,
                error_message=None,
                group_id=group_id,
                group_state=d.state,  # Kafka's names: Empty, Assigning, Reconciling, Stable
                group_epoch=d.group_epoch,
                assignment_epoch=d.assignment_epoch,
                assignor_name="uniform",
                authorized_operations=client.group_operations(
                    group_id, body.include_authorized_operations
                ),
                members=tuple(
                    reply(
                        "Member",
                        member_id=m.member_id,
                        instance_id=m.group_instance_id,
                        rack_id=None,
                        member_epoch=m.member_epoch,
                        client_id=m.client_id,
                        client_host=kafka_host(m.client_host),
                        subscribed_topic_names=tuple(m.subscribed_topics),
                        subscribed_topic_regex="",
                        assignment=assignment(m.assignment),
                        target_assignment=assignment(m.target_assignment),
                        member_type=1 if m.protocol == CONSUMER else 0,
                    )
                    for m in d.members
                ),
            )
        )
    return reply.body(groups=tuple(described))
