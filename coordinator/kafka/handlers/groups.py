"""Consumer groups over Kafka's classic protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup),
offsets (OffsetCommit, OffsetFetch), ListGroups and DescribeGroups, on the same group state as
the HTTP membership.

A classic member is a member of the coordinator's group like any other: the coordinator assigns
(as Kafka 4's coordinator does for classic members of a consumer group), and answers in the
protocol the member chose (range, roundrobin, cooperative-sticky, ...). So no member is ever
made leader; SyncGroup hands each member its own assignment. The generation is the member's
epoch. Partitions move by the domain's rule, only after their owner gave them up: a classic
member gives up what it no longer lists when it joins again (an eager member lists nothing, a
cooperative one what it still owns), so a Heartbeat whose member's assignment changed answers
REBALANCE_IN_PROGRESS and the member joins again.
"""

from __future__ import annotations

import io
import uuid
from typing import Any

from kio.schema.consumer_protocol_assignment.v0 import data as assignment_v0
from kio.schema.consumer_protocol_subscription.v0 import data as subscription_v0
from kio.schema.consumer_protocol_subscription.v1 import data as subscription_v1
from kio.schema.consumer_protocol_subscription.v2 import data as subscription_v2
from kio.schema.consumer_protocol_subscription.v3 import data as subscription_v3
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from coordinator.groups import membership
from coordinator.groups import service as groups_service
from coordinator.groups.errors import FencedMemberEpoch, UnknownMemberId
from coordinator.groups.models import CLASSIC
from coordinator.groups.schemas import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    CommitOffsetsRequest,
    HeartbeatRequest,
    HeartbeatResponse,
)
from coordinator.kafka import guard
from coordinator.kafka.connection import Client
from coordinator.kafka.errors import FAILURES, error_code
from coordinator.kafka.handlers.cluster import NOT_ASKED
from coordinator.kafka.wire import Request, milliseconds

CONSUMER_PROTOCOL = "consumer"
_SUBSCRIPTIONS = [subscription_v0, subscription_v1, subscription_v2, subscription_v3]


def parse_subscription(metadata: bytes) -> tuple[list[str], list[tuple[str, int]]]:
    """A member's ConsumerProtocolSubscription: its topics and the partitions it owns (versions
    1+; a newer version is read as the newest known, as Kafka's clients do)."""
    data = bytes(metadata)
    if len(data) < 2:
        raise ValueError("subscription metadata shorter than its version")
    version = int.from_bytes(data[:2], "big", signed=True)
    module = _SUBSCRIPTIONS[max(0, min(version, len(_SUBSCRIPTIONS) - 1))]
    # Lengths checked first: the subscription is the client's bytes, read by kio (see guard).
    subscription, _ = guard.read(module.ConsumerProtocolSubscription, data, 2)
    owned = [
        (tp.topic, p) for tp in getattr(subscription, "owned_partitions", ()) for p in tp.partitions
    ]
    return list(subscription.topics), owned


def encode_assignment(partitions: list[tuple[str, int]] | list[list[Any]]) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    entity = assignment_v0.ConsumerProtocolAssignment(
        assigned_partitions=tuple(
            assignment_v0.TopicPartition(topic=t, partitions=tuple(sorted(ps)))  # type: ignore[arg-type]
            for t, ps in sorted(by_topic.items())
        ),
        user_data=None,
    )
    out = io.BytesIO(b"\0\0")
    out.seek(2)
    entity_writer(assignment_v0.ConsumerProtocolAssignment)(out, entity)
    return out.getvalue()


def encode_subscription(topics: list[str]) -> bytes:
    entity = subscription_v0.ConsumerProtocolSubscription(topics=tuple(topics), user_data=None)
    out = io.BytesIO(b"\0\0")
    out.seek(2)
    entity_writer(subscription_v0.ConsumerProtocolSubscription)(out, entity)
    return out.getvalue()


async def _beat(
    client: Client, group_id: str, body: HeartbeatRequest, assignor: str | None
) -> HeartbeatResponse:
    return await membership.heartbeat(
        client.db,
        client.settings,
        group_id,
        body,
        client.client_id[:255] or "kafka",
        client.client_host[:255],
        protocol=CLASSIC,
        assignor=assignor,
    )


async def join_group(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    failed = {
        "generation_id": -1,
        "protocol_name": "",
        "leader": "",
        "members": (),
        "protocol_type": CONSUMER_PROTOCOL,
    }
    member_id = body.member_id
    try:
        client.access.group(body.group_id, "consumer")
        if body.protocol_type != CONSUMER_PROTOCOL or not body.protocols:
            return reply.body(
                error_code=ErrorCode.inconsistent_group_protocol, member_id=member_id, **failed
            )
        if not member_id:
            member_id = f"{client.client_id or 'kafka'}-{uuid.uuid4()}"[:255]
            if request.version >= 4:
                # KIP-394: the client joins again with the member id it was given.
                return reply.body(
                    error_code=ErrorCode.member_id_required, member_id=member_id, **failed
                )
        protocol = body.protocols[0]
        try:
            topics, owned = parse_subscription(protocol.metadata)
        except Exception:
            return reply.body(
                error_code=ErrorCode.inconsistent_group_protocol, member_id=member_id, **failed
            )
        client.access.join(body.group_id, topics)
        session_ms = milliseconds(body.session_timeout)
        rebalance_ms = milliseconds(getattr(body, "rebalance_timeout", None))
        common = {
            "member_id": member_id,
            "subscribed_topics": topics,
            "session_timeout_ms": session_ms,
            "rebalance_timeout_ms": rebalance_ms if rebalance_ms > 0 else session_ms,
        }
        known = await membership.member_of(client.db, body.group_id, member_id)
        answer = None
        if known is not None and known.member_epoch > 0:
            try:
                answer = await _beat(
                    client,
                    body.group_id,
                    HeartbeatRequest.model_validate(
                        {
                            **common,
                            "member_epoch": known.member_epoch,
                            "owned_partitions": [{"topic": t, "partition": p} for t, p in owned],
                        }
                    ),
                    protocol.name,
                )
            except (UnknownMemberId, FencedMemberEpoch):
                answer = None
        if answer is None:
            answer = await _beat(
                client,
                body.group_id,
                HeartbeatRequest.model_validate({**common, "member_epoch": JOIN_EPOCH}),
                protocol.name,
            )
    except FAILURES as failure:
        return reply.body(error_code=error_code(failure), member_id=member_id, **failed)
    return reply.body(
        error_code=ErrorCode.none,
        generation_id=answer.member_epoch,
        protocol_type=CONSUMER_PROTOCOL,
        protocol_name=protocol.name,
        # Nobody leads: the coordinator assigns, and SyncGroup answers each member its share.
        leader="",
        member_id=member_id,
        members=(),
    )


async def sync_group(client: Client, request: Request) -> Any:
    body = request.body
    assert client.access is not None
    extra = {"protocol_type": CONSUMER_PROTOCOL, "protocol_name": None}
    try:
        client.access.group(body.group_id, "consumer")
        member = await membership.member_of(client.db, body.group_id, body.member_id)
        if member is None:
            return request.reply.body(
                error_code=ErrorCode.unknown_member_id, assignment=b"", **extra
            )
        if member.member_epoch != body.generation_id:
            return request.reply.body(
                error_code=ErrorCode.illegal_generation, assignment=b"", **extra
            )
    except FAILURES as failure:
        return request.reply.body(error_code=error_code(failure), assignment=b"", **extra)
    return request.reply.body(
        error_code=ErrorCode.none,
        assignment=encode_assignment(member.assigned),
        protocol_type=CONSUMER_PROTOCOL,
        protocol_name=member.assignor,
    )


async def heartbeat(client: Client, request: Request) -> Any:
    body = request.body
    assert client.access is not None
    try:
        client.access.group(body.group_id, "consumer")
        member = await membership.member_of(client.db, body.group_id, body.member_id)
        # `owned_partitions` unset: a heartbeat never gives a partition up (the member may still
        # be using everything it was given); joining again does.
        answer = await _beat(
            client,
            body.group_id,
            HeartbeatRequest.model_validate(
                {
                    "member_id": body.member_id,
                    "member_epoch": body.generation_id,
                    "session_timeout_ms": member.session_timeout_ms if member else None,
                    "rebalance_timeout_ms": member.rebalance_timeout_ms if member else 300_000,
                }
            ),
            member.assignor if member else None,
        )
    except FAILURES as failure:
        return request.reply.body(error_code=error_code(failure))
    if answer.member_epoch != body.generation_id:
        return request.reply.body(error_code=ErrorCode.rebalance_in_progress)
    return request.reply.body(error_code=ErrorCode.none)


async def leave_group(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    batched = hasattr(body, "members")  # version 3+
    leaving = [m.member_id for m in body.members] if batched else [body.member_id]
    codes = []
    for member_id in leaving:
        code = ErrorCode.none
        try:
            client.access.group(body.group_id, "consumer")
            await _beat(
                client,
                body.group_id,
                HeartbeatRequest(member_id=member_id, member_epoch=LEAVE_EPOCH),
                None,
            )
        except FAILURES as failure:
            code = error_code(failure)
        codes.append(code)
    if not batched:
        return reply.body(error_code=codes[0])
    return reply.body(
        error_code=ErrorCode.none,
        members=tuple(
            reply("MemberResponse", member_id=m, group_instance_id=None, error_code=code)
            for m, code in zip(leaving, codes, strict=True)
        ),
    )


def member_identity(body: Any) -> tuple[str | None, int | None]:
    """The member id and generation an OffsetCommit or TxnOffsetCommit carries, or neither
    (a commit from outside the group: no member id, or generation -1)."""
    generation: int | None = getattr(body, "generation_id_or_member_epoch", None)
    if generation is None:
        generation = int(getattr(body, "generation_id", -1))
    member_id = getattr(body, "member_id", "") or None
    if member_id is None or generation < 0:
        return None, None
    return member_id, generation


def committed_offsets(topics: Any) -> list[dict[str, Any]]:
    """An OffsetCommit's or TxnOffsetCommit's offsets, in the domain's shape."""
    return [
        {
            "topic": t.name,
            "partition": p.partition_index,
            "offset": p.committed_offset,
            "metadata": p.committed_metadata,
            "leader_epoch": getattr(p, "committed_leader_epoch", -1),
        }
        for t in topics
        for p in t.partitions
    ]


async def offset_commit(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    member_id, epoch = member_identity(body)
    code = ErrorCode.none
    try:
        client.access.offsets(body.group_id, (t.name for t in body.topics))
        offsets = committed_offsets(body.topics)
        if offsets:
            await groups_service.commit(
                client.db,
                body.group_id,
                CommitOffsetsRequest.model_validate(
                    {"offsets": offsets, "member_id": member_id, "member_epoch": epoch}
                ),
            )
    except FAILURES as failure:
        code = error_code(failure)
    return reply.body(
        topics=reply.same_code(
            ((t.name, (p.partition_index for p in t.partitions)) for t in body.topics),
            code,
            "OffsetCommitResponseTopic",
            "OffsetCommitResponsePartition",
        )
    )


async def offset_fetch(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    try:
        client.access.group(body.group_id, "consumer")
        stored = await groups_service.fetch(
            client.db, body.group_id, None, bool(getattr(body, "require_stable", False))
        )
    except FAILURES as failure:
        code = error_code(failure)
        if body.topics is None:
            return reply.body(error_code=code, topics=())
        return reply.body(
            error_code=code if code is not ErrorCode.unstable_offset_commit else ErrorCode.none,
            topics=tuple(
                reply(
                    "OffsetFetchResponseTopic",
                    name=t.name,
                    partitions=tuple(
                        reply(
                            "OffsetFetchResponsePartition",
                            partition_index=p,
                            committed_offset=-1,
                            committed_leader_epoch=-1,
                            metadata="",
                            error_code=code,
                        )
                        for p in t.partition_indexes
                    ),
                )
                for t in body.topics
            ),
        )
    committed = {(o.topic, o.partition): o for o in stored.offsets}
    if body.topics is None:
        wanted: dict[str, list[int]] = {}
        for topic, partition in sorted(committed):
            wanted.setdefault(topic, []).append(partition)
    else:
        wanted = {t.name: list(t.partition_indexes) for t in body.topics}
    topics = []
    for name, partitions in wanted.items():
        answers = []
        for p in partitions:
            found = committed.get((name, p))
            visible = client.access.visible_topic(name)
            answers.append(
                reply(
                    "OffsetFetchResponsePartition",
                    partition_index=p,
                    committed_offset=found.offset if found and visible else -1,
                    committed_leader_epoch=(
                        found.leader_epoch
                        if found and visible and found.leader_epoch is not None
                        else -1
                    ),
                    metadata=(found.metadata or "") if found and visible else "",
                    error_code=ErrorCode.none if visible else ErrorCode.topic_authorization_failed,
                )
            )
        topics.append(reply("OffsetFetchResponseTopic", name=name, partitions=tuple(answers)))
    return reply.body(error_code=ErrorCode.none, topics=tuple(topics))


async def list_groups(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    listed = await groups_service.list_groups(client.db, client.access.visible_group)
    wanted = set(getattr(body, "states_filter", ()) or ())
    # Version 5's type filter (KIP-848): every group here is a consumer group (its classic
    # members run the classic protocol in it, as Kafka 4's consumer groups take them).
    types = {t.lower() for t in getattr(body, "types_filter", ()) or ()}
    if types and "consumer" not in types:
        return reply.body(error_code=ErrorCode.none, groups=())
    return reply.body(
        error_code=ErrorCode.none,
        groups=tuple(
            reply(
                "ListedGroup",
                group_id=g.group_id,
                protocol_type=CONSUMER_PROTOCOL,
                group_state=g.state,
                group_type="consumer",
            )
            for g in listed.groups
            if not wanted or g.state in wanted
        ),
    )


async def delete_groups(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    results = []
    for group_id in body.groups_names:
        code = ErrorCode.none
        try:
            client.access.delete_group(group_id)
            await groups_service.delete_group(client.db, group_id)
        except FAILURES as failure:
            code = error_code(failure)
        results.append(reply("DeletableGroupResult", group_id=group_id, error_code=code))
    return reply.body(results=tuple(results))


async def describe_groups(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    described = []
    for group_id in body.groups:
        try:
            client.access.group(group_id, "consumer")
            d = await groups_service.describe(client.db, group_id)
        except FAILURES as failure:
            code = error_code(failure)
            if code is ErrorCode.group_id_not_found:
                # As Kafka before DescribeGroups v6: an unknown group is Dead, not an error.
                code = ErrorCode.none
            described.append(
                reply(
                    "DescribedGroup",
                    error_code=code,
                    group_id=group_id,
                    group_state="Dead",
                    protocol_type="",
                    protocol_data="",
                    authorized_operations=NOT_ASKED,
                    members=(),
                )
            )
            continue
        assignors = {m.assignor for m in d.members if m.assignor}
        described.append(
            reply(
                "DescribedGroup",
                error_code=ErrorCode.none,
                group_id=group_id,
                group_state=d.state,
                protocol_type=CONSUMER_PROTOCOL,
                protocol_data=sorted(assignors)[0] if assignors else "",
                authorized_operations=(
                    client.access.group_operations(group_id)
                    if getattr(body, "include_authorized_operations", False)
                    else NOT_ASKED
                ),
                members=tuple(
                    reply(
                        "DescribedGroupMember",
                        member_id=m.member_id,
                        group_instance_id=None,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        member_metadata=encode_subscription(m.subscribed_topics),
                        member_assignment=encode_assignment(
                            [(a.topic, a.partition) for a in m.assignment]
                        ),
                    )
                    for m in d.members
                ),
            )
        )
    return reply.body(groups=tuple(described))


async def offset_delete(client: Client, request: Request) -> Any:
    """Kafka's OffsetDelete: a group's committed offsets removed, per partition, but for topics
    its members subscribe to."""
    reply, body = request.reply, request.body
    assert client.access is not None
    wanted = [(t.name, p.partition_index) for t in body.topics for p in t.partitions]
    try:
        client.access.delete_offsets(body.group_id, (t.name for t in body.topics))
        answers = await groups_service.delete_offsets(client.db, body.group_id, wanted)
    except FAILURES as failure:
        return reply.body(error_code=error_code(failure), topics=())
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), refusal in answers.items():
        by_topic.setdefault(topic, []).append(
            reply(
                "OffsetDeleteResponsePartition",
                partition_index=partition,
                error_code=ErrorCode.none if refusal is None else error_code(refusal),
            )
        )
    return reply.body(
        error_code=ErrorCode.none,
        topics=tuple(
            reply("OffsetDeleteResponseTopic", name=name, partitions=tuple(partitions))
            for name, partitions in by_topic.items()
        ),
    )
