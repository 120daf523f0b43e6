"""Consumer groups over Kafka's classic protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup),
offsets (OffsetCommit, OffsetFetch), ListGroups, DescribeGroups, DeleteGroups and OffsetDelete,
on the same group state as the HTTP membership.

The protocol's rules are the groups domain's (`groups.classic_rules`, run by `groups.classic`),
the consumer protocol's bytes too (`groups.consumer_protocol`): these handlers translate. A
classic member of a consumer group that has members (REST ones) is assigned by the coordinator
instead (`groups.classic_members`), as Kafka 4's consumer groups take classic members during an
upgrade.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core.acls import Operation
from coordinator.groups import classic, classic_rules, consumer_protocol
from coordinator.groups import service as groups_service
from coordinator.groups.consumer_protocol import encode_assignment, encode_subscription
from coordinator.groups.errors import MemberIdRequired
from coordinator.groups.inputs import CommittedOffset
from coordinator.groups.models import CONSUMER_PROTOCOL, SHARE, STREAMS
from coordinator.kafka.connection import NOT_ASKED, Client, kafka_host
from coordinator.kafka.errors import FAILURES, error_code
from coordinator.kafka.wire import Request, milliseconds


def _failed_join(member_id: str, version: int) -> dict[str, Any]:
    """A refused JoinGroup's fields, as Kafka's broker fills them (from version 7 the protocol's
    type and name are null)."""
    return {
        "generation_id": -1,
        "protocol_name": None if version >= 7 else "",
        "leader": "",
        "members": (),
        "protocol_type": None if version >= 7 else CONSUMER_PROTOCOL,
        "member_id": member_id,
    }


async def join_group(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    try:
        client.access.group(body.group_id, Operation.READ)
        client.cluster.coordinate(body.group_id)
        if not body.protocol_type or not body.protocols:
            return reply.body(
                error_code=ErrorCode.inconsistent_group_protocol,
                **_failed_join(body.member_id, request.version),
            )
        protocols = tuple(classic_rules.Protocol(p.name, bytes(p.metadata)) for p in body.protocols)
        topics, owned = consumer_protocol.subscription_of(body.protocol_type, protocols)
        client.access.join(body.group_id, topics)
        session_ms = milliseconds(body.session_timeout)
        rebalance_ms = milliseconds(getattr(body, "rebalance_timeout", None))
        joining = classic_rules.JoinRequest(
            group_id=body.group_id,
            member_id=body.member_id,
            group_instance_id=getattr(body, "group_instance_id", None),
            protocols=protocols,
            subscribed_topics=topics,
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms if rebalance_ms > 0 else session_ms,
            client_id=client.as_member[0],
            client_host=client.as_member[1],
            require_known_member_id=request.version >= 4,
            protocol_type=body.protocol_type,
        )
        answer = await classic.join(client.db, client.settings, joining, owned)
    except MemberIdRequired as required:
        return reply.body(
            error_code=ErrorCode.member_id_required,
            **_failed_join(required.member_id, request.version),
        )
    except FAILURES as failure:
        return reply.body(
            error_code=error_code(failure), **_failed_join(body.member_id, request.version)
        )
    return reply.body(
        error_code=ErrorCode.none,
        generation_id=answer.generation,
        protocol_type=answer.protocol_type,
        protocol_name=answer.protocol_name,
        leader=answer.leader,
        member_id=answer.member_id,
        skip_assignment=False,
        members=tuple(
            reply(
                "JoinGroupResponseMember",
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                metadata=m.metadata,
            )
            for m in answer.members
        ),
    )


async def sync_group(client: Client, request: Request) -> Any:
    body = request.body
    assert client.access is not None
    failed = {"protocol_type": None, "protocol_name": None, "assignment": b""}  # Kafka's
    try:
        client.access.group(body.group_id, Operation.READ)
        client.cluster.coordinate(body.group_id)
        synced = await classic.sync(
            client.db,
            client.settings,
            body.group_id,
            body.member_id,
            getattr(body, "group_instance_id", None),
            body.generation_id,
            getattr(body, "protocol_name", None),
            {a.member_id: bytes(a.assignment) for a in getattr(body, "assignments", ()) or ()},
            getattr(body, "protocol_type", None),
        )
    except FAILURES as failure:
        return request.reply.body(error_code=error_code(failure), **failed)
    return request.reply.body(
        error_code=ErrorCode.none,
        assignment=synced.assignment,
        protocol_type=synced.protocol_type,
        protocol_name=synced.protocol_name,
    )


async def heartbeat(client: Client, request: Request) -> Any:
    body = request.body
    assert client.access is not None
    try:
        client.access.group(body.group_id, Operation.READ)
        client.cluster.coordinate(body.group_id)
        await classic.heartbeat(
            client.db,
            client.settings,
            body.group_id,
            body.member_id,
            getattr(body, "group_instance_id", None),
            body.generation_id,
            *client.as_member,
        )
    except FAILURES as failure:
        return request.reply.body(error_code=error_code(failure))
    return request.reply.body(error_code=ErrorCode.none)


async def leave_group(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    batched = hasattr(body, "members")  # version 3+
    leaving: list[tuple[str, str | None]] = (
        [(m.member_id, m.group_instance_id) for m in body.members]
        if batched
        else [(body.member_id, None)]
    )
    try:
        client.access.group(body.group_id, Operation.READ)
        client.cluster.coordinate(body.group_id)
        refusals = await classic.leave(
            client.db,
            client.settings,
            body.group_id,
            leaving,
            *client.as_member,
        )
        codes = [ErrorCode.none if r is None else error_code(r) for r in refusals]
    except FAILURES as failure:
        if not batched:
            return reply.body(error_code=error_code(failure))
        return reply.body(error_code=error_code(failure), members=())
    if not batched:
        return reply.body(error_code=codes[0])
    return reply.body(
        error_code=ErrorCode.none,
        members=tuple(
            reply("MemberResponse", member_id=m, group_instance_id=i, error_code=code)
            for (m, i), code in zip(leaving, codes, strict=True)
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


def committed_offsets(topics: Any) -> list[CommittedOffset]:
    """An OffsetCommit's or TxnOffsetCommit's offsets, in the domain's shape."""
    return [
        CommittedOffset(
            t.name,
            p.partition_index,
            p.committed_offset,
            p.committed_metadata,
            getattr(p, "committed_leader_epoch", -1),
        )
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
        client.cluster.coordinate(body.group_id)
        offsets = committed_offsets(body.topics)
        if offsets:
            await groups_service.commit(client.db, body.group_id, offsets, member_id, epoch)
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
        client.access.group(body.group_id, Operation.DESCRIBE)
        client.cluster.coordinate(body.group_id)
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
    access, cluster = client.access, client.cluster
    # As each Kafka broker lists the groups it coordinates (the admin client asks them all).
    listed = await groups_service.list_groups(
        client.db, lambda group: access.visible_group(group) and cluster.coordinates(group)
    )
    wanted = set(getattr(body, "states_filter", ()) or ())
    # Version 5's type filter (KIP-848): classic groups run Kafka's classic protocol, share groups
    # KIP-932's, streams groups KIP-1071's, the others (REST and KIP-848 members, or only
    # offsets) are consumer groups.
    types = {t.lower() for t in getattr(body, "types_filter", ()) or ()}
    answered = []
    for g in listed.groups:
        kind = "classic" if g.classic_state is not None else "consumer"
        if g.type == SHARE or g.type == STREAMS:
            kind = g.type
        state = g.classic_state or g.state
        if (types and kind not in types) or (wanted and state not in wanted):
            continue
        answered.append(
            reply(
                "ListedGroup",
                group_id=g.group_id,
                protocol_type=kind
                if kind in (SHARE, STREAMS)
                else g.classic_protocol_type or CONSUMER_PROTOCOL,
                group_state=state,
                group_type=kind,
            )
        )
    return reply.body(error_code=ErrorCode.none, groups=tuple(answered))


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
            client.access.group(group_id, Operation.DESCRIBE)
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
        classic_group = d.classic_state is not None
        described.append(
            reply(
                "DescribedGroup",
                error_code=ErrorCode.none,
                group_id=group_id,
                # A classic group by Kafka's classic states; a consumer group by
                # docs/pages/http-api.md's.
                group_state=d.classic_state if classic_group else d.state,
                protocol_type=d.classic_protocol_type or CONSUMER_PROTOCOL,
                protocol_data=(
                    d.protocol_name or ""
                    if classic_group
                    else (sorted(assignors)[0] if assignors else "")
                ),
                authorized_operations=client.group_operations(
                    group_id, getattr(body, "include_authorized_operations", False)
                ),
                members=tuple(
                    reply(
                        "DescribedGroupMember",
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id,
                        client_id=m.client_id,
                        client_host=kafka_host(m.client_host),
                        member_metadata=(
                            m.metadata
                            if m.metadata is not None
                            else encode_subscription(m.subscribed_topics)
                        ),
                        member_assignment=(
                            m.assignment_data
                            if m.assignment_data is not None
                            else encode_assignment([(a.topic, a.partition) for a in m.assignment])
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
