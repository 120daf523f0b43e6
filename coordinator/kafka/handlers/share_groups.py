"""Share groups' membership and offsets over Kafka's wire (KIP-932): ShareGroupHeartbeat v1,
ShareGroupDescribe v1, DescribeShareGroupOffsets v0-v1, AlterShareGroupOffsets v0 and
DeleteShareGroupOffsets v0; thin over `coordinator.shares`, translating topic ids to names and
back. KafkaShareConsumer heartbeats with them; kafka-share-groups.sh describes, resets and
deletes with them (ShareFetch and ShareAcknowledge are `shares`')."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core.acls import Operation
from coordinator.kafka.connection import Client, kafka_host
from coordinator.kafka.errors import FAILURES, error_code, message
from coordinator.kafka.handlers.consumer_groups import by_topic, failed_description, topic_ids
from coordinator.kafka.wire import Request
from coordinator.log.epochs import LEADER_EPOCH
from coordinator.shares import membership
from coordinator.shares import offsets as share_offsets

TP = tuple[str, int]
_NO_TOPIC_ID = uuid.UUID(int=0)


# -- membership ---------------------------------------------------------------------------------


async def share_group_heartbeat(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    try:
        client.access.group(body.group_id, Operation.READ)
        client.cluster.coordinate(body.group_id)
        topics = body.subscribed_topic_names
        if topics is not None:
            client.access.join(body.group_id, topics)
        answer = await membership.heartbeat(
            client.db,
            client.settings,
            body.group_id,
            membership.ShareBeat(
                body.member_id,
                body.member_epoch,
                None if topics is None else list(topics),
                body.rack_id,
            ),
            *client.as_member,
        )
    except FAILURES as failure:
        return reply.body(
            error_code=error_code(failure),
            error_message=message(failure),
            member_id=None,
            member_epoch=0,
            heartbeat_interval=0,
            assignment=None,
        )
    assignment = None
    if answer.assignment is not None:
        ids, _ = await topic_ids(client)
        assignment = reply(
            "Assignment",
            topic_partitions=tuple(
                reply("TopicPartitions", topic_id=ids[topic], partitions=tuple(partitions))
                for topic, partitions in by_topic(answer.assignment).items()
                if topic in ids
            ),
        )
    return reply.body(
        error_code=ErrorCode.none,
        error_message=None,
        member_id=answer.member_id,
        member_epoch=answer.member_epoch,
        heartbeat_interval=answer.heartbeat_interval_ms,
        assignment=assignment,
    )


async def share_group_describe(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    ids, _ = await topic_ids(client)

    def assignment(partitions: Iterable[TP]) -> Any:
        return reply(
            "Assignment",
            topic_partitions=tuple(
                reply(
                    "TopicPartitions",
                    topic_id=ids.get(topic, _NO_TOPIC_ID),
                    topic_name=topic,
                    partitions=tuple(ps),
                )
                for topic, ps in by_topic(partitions).items()
            ),
        )

    described = []
    for group_id in body.group_ids:
        try:
            client.access.group(group_id, Operation.DESCRIBE)
            view = await membership.describe(client.db, group_id)
        except FAILURES as failure:
            described.append(failed_description(reply, group_id, failure, assignor_name=""))
            continue
        described.append(
            reply(
                "DescribedGroup",
                error_code=ErrorCode.none,
                error_message=None,
                group_id=group_id,
                group_state=view.state,
                group_epoch=view.group_epoch,
                assignment_epoch=view.assignment_epoch,
                assignor_name=membership.ASSIGNOR,
                authorized_operations=client.group_operations(
                    group_id, body.include_authorized_operations
                ),
                members=tuple(
                    reply(
                        "Member",
                        member_id=m.member_id,
                        rack_id=m.rack_id,
                        member_epoch=m.member_epoch,
                        client_id=m.client_id,
                        client_host=kafka_host(m.client_host),
                        subscribed_topic_names=tuple(m.subscribed_topics),
                        assignment=assignment(m.assignment),
                    )
                    for m in view.members
                ),
            )
        )
    return reply.body(groups=tuple(described))


# -- the admin's calls --------------------------------------------------------------------------


async def describe_share_group_offsets(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    ids, _ = await topic_ids(client)
    groups = []
    for group in body.groups:
        try:
            client.access.group(group.group_id, Operation.DESCRIBE)
            asked = (
                None
                if group.topics is None
                else [(t.topic_name, p) for t in group.topics for p in t.partitions]
            )
            for topic, _ in asked or ():
                client.access.describe_topic(topic)
            offsets = await share_offsets.describe_offsets(
                client.db, client.settings, group.group_id, asked
            )
        except FAILURES as failure:
            groups.append(
                reply(
                    "DescribeShareGroupOffsetsResponseGroup",
                    group_id=group.group_id,
                    topics=(),
                    error_code=error_code(failure),
                    error_message=message(failure),
                )
            )
            continue
        found = {(o.topic, o.partition): o for o in offsets}
        wanted = asked if asked is not None else sorted(found)
        by_topic: dict[str, list[Any]] = {}
        for topic, index in wanted:
            o = found.get((topic, index))
            by_topic.setdefault(topic, []).append(
                reply(
                    "DescribeShareGroupOffsetsResponsePartition",
                    partition_index=index,
                    start_offset=-1 if o is None else o.start_offset,
                    leader_epoch=LEADER_EPOCH,
                    lag=-1 if o is None or o.lag is None else o.lag,
                    error_code=ErrorCode.none,
                    error_message=None,
                )
            )
        groups.append(
            reply(
                "DescribeShareGroupOffsetsResponseGroup",
                group_id=group.group_id,
                topics=tuple(
                    reply(
                        "DescribeShareGroupOffsetsResponseTopic",
                        topic_name=topic,
                        topic_id=ids.get(topic, _NO_TOPIC_ID),
                        partitions=tuple(parts),
                    )
                    for topic, parts in by_topic.items()
                ),
                error_code=ErrorCode.none,
                error_message=None,
            )
        )
    return reply.body(groups=tuple(groups))


async def alter_share_group_offsets(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    ids, _ = await topic_ids(client)
    offsets = {
        (t.topic_name, p.partition_index): p.start_offset for t in body.topics for p in t.partitions
    }
    try:
        client.access.group(body.group_id, Operation.READ)
        client.cluster.coordinate(body.group_id)
        for topic in {t for t, _ in offsets}:
            client.access.fetch(topic)
        answers = await share_offsets.alter_offsets(
            client.db, client.settings, body.group_id, offsets
        )
    except FAILURES as failure:
        return reply.body(
            error_code=error_code(failure), error_message=message(failure), responses=()
        )
    by_topic: dict[str, list[Any]] = {}
    for (topic, index), refusal in sorted(answers.items()):
        by_topic.setdefault(topic, []).append(
            reply(
                "AlterShareGroupOffsetsResponsePartition",
                partition_index=index,
                error_code=ErrorCode.none if refusal is None else error_code(refusal),
                error_message=None if refusal is None else message(refusal),
            )
        )
    return reply.body(
        error_code=ErrorCode.none,
        error_message=None,
        responses=tuple(
            reply(
                "AlterShareGroupOffsetsResponseTopic",
                topic_name=topic,
                topic_id=ids.get(topic, _NO_TOPIC_ID),
                partitions=tuple(parts),
            )
            for topic, parts in by_topic.items()
        ),
    )


async def delete_share_group_offsets(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    ids, _ = await topic_ids(client)
    topics = [t.topic_name for t in body.topics]
    try:
        client.access.group(body.group_id, Operation.DELETE)
        for topic in topics:
            client.access.fetch(topic)
        answers = await share_offsets.delete_offsets(client.db, body.group_id, topics)
    except FAILURES as failure:
        return reply.body(
            error_code=error_code(failure), error_message=message(failure), responses=()
        )
    return reply.body(
        error_code=ErrorCode.none,
        error_message=None,
        responses=tuple(
            reply(
                "DeleteShareGroupOffsetsResponseTopic",
                topic_name=topic,
                topic_id=ids.get(topic, _NO_TOPIC_ID),
                error_code=ErrorCode.none if refusal is None else error_code(refusal),
                error_message=None if refusal is None else message(refusal),
            )
            for topic, refusal in answers.items()
        ),
    )
