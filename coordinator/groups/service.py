"""Consumer groups: offset commits (checked by `fencing`), reads with `require_stable`
(KIP-447), and the groups' descriptions, listing and deletion. Membership itself is
`membership`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Protocol

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.clock import now_ms, rfc3339
from coordinator.core.errors import CoordinatorError, InvalidRequest
from coordinator.groups.classic_rules import classic_metadata, classic_state, protocol_type_of
from coordinator.groups.committing import MemberCommit, commit_as_member
from coordinator.groups.errors import (
    GroupIdNotFound,
    GroupSubscribedToTopic,
    NonEmptyGroup,
    UnstableOffsetCommit,
)
from coordinator.groups.fencing import check_offset_commit
from coordinator.groups.inputs import CommittedOffset, check_member, check_offsets
from coordinator.groups.membership import GroupState, group_state, is_gone, load, lock_group
from coordinator.groups.models import (
    CLASSIC,
    SHARE,
    STREAMS,
    ConsumerGroup,
    GroupMember,
    GroupOffset,
    GroupOwnedPartition,
    GroupTargetPartition,
    ShareMember,
    StreamsGroup,
)
from coordinator.groups.offsets import commit_offsets
from coordinator.groups.schemas import (
    DeletedGroup,
    GroupDescription,
    GroupList,
    GroupSummary,
    MemberDescription,
    OffsetOut,
    OffsetsResponse,
    PartitionOffset,
    TopicPartitionOut,
)
from coordinator.log.models import Partition
from coordinator.log.topics import require_partitions
from coordinator.store import Store


class PendingOffset(Protocol):
    """What a stable offset fetch (KIP-447's require_stable) needs of the transactions above:
    a (topic, partition) of `group_id` (of `topic` only, if given) whose offset an open
    transaction holds, or None. The groups domain declares it; the app gives it the
    transactions' (`use_pending_offsets`), so this domain never imports that one."""

    async def __call__(
        self, session: AsyncSession, group_id: str, topic: str | None
    ) -> tuple[str, int] | None: ...


_pending_offset: PendingOffset | None = None


def use_pending_offsets(pending: PendingOffset) -> None:
    """Set by the app that composes the domains (`coordinator.app.wire_domains`)."""
    global _pending_offset
    _pending_offset = pending


async def commit(
    db: Store,
    group_id: str,
    offsets: Sequence[CommittedOffset],
    member_id: str | None = None,
    member_epoch: int | None = None,
) -> OffsetsResponse:
    """Commit the offsets, by the member (with its epoch: KIP-447) or by no member."""
    check_member(member_id, member_epoch)
    check_offsets(offsets, at_least=1)
    keys = sorted({(o.topic, o.partition) for o in offsets})
    if len(keys) != len(offsets):
        raise InvalidRequest("offsets: a partition appears more than once")
    if member_id is not None and member_epoch is not None:
        by_key = {(o.topic, o.partition): o for o in offsets}
        commit = MemberCommit(
            group_id,
            member_id,
            member_epoch,
            keys,
            [(o.offset, o.metadata, o.leader_epoch) for o in (by_key[key] for key in keys)],
            now_ms(),
        )
        if await commit_as_member(db, commit):
            return _committed(offsets)
    async with db.write() as session:
        await check_offset_commit(session, group_id, member_id, member_epoch, keys)
        await require_partitions(session, keys)
        now = now_ms()
        await commit_offsets(
            session,
            [
                (group_id, o.topic, o.partition, o.offset, o.metadata, o.leader_epoch)
                for o in offsets
            ],
            now,
        )
    return _committed(offsets)


def _committed(offsets: Sequence[CommittedOffset]) -> OffsetsResponse:
    return OffsetsResponse(
        offsets=[
            OffsetOut(
                topic=o.topic,
                partition=o.partition,
                offset=o.offset,
                metadata=o.metadata,
                leader_epoch=o.leader_epoch,
            )
            for o in sorted(offsets, key=lambda o: (o.topic, o.partition))
        ]
    )


async def fetch(
    db: Store, group_id: str, topic: str | None, require_stable: bool
) -> OffsetsResponse:
    async with db.read() as session:
        if require_stable:
            if _pending_offset is None:
                raise RuntimeError("a stable offset fetch needs the transactions' pending offsets")
            held = await _pending_offset(session, group_id, topic)
            if held is not None:
                raise UnstableOffsetCommit(
                    f"an open transaction holds a pending offset of group {group_id!r} for "
                    f"{held[0]}-{held[1]}; retry once it ends"
                )
        query = (
            select(
                GroupOffset.topic,
                GroupOffset.partition,
                GroupOffset.offset,
                GroupOffset.metadata_,
                GroupOffset.leader_epoch,
            )
            .where(GroupOffset.group_id == group_id)
            .order_by(GroupOffset.topic, GroupOffset.partition)
        )
        if topic is not None:
            query = query.where(GroupOffset.topic == topic)
        rows = (await session.execute(query)).all()
    return OffsetsResponse(
        offsets=[
            OffsetOut(topic=t, partition=p, offset=o, metadata=m, leader_epoch=e)
            for t, p, o, m, e in rows
        ]
    )


# -- describing, listing, deleting ----------------------------------------------------------------


async def _unready(session: AsyncSession, groups: Sequence[ConsumerGroup]) -> set[str]:
    """Those of `groups` that are streams groups whose topology has no tasks yet (missing or
    wrongly partitioned topics: `groups.streams_topology`)."""
    ids = [g.group_id for g in groups if g.protocol_type == STREAMS]
    if not ids:
        return set()
    rows = await session.execute(
        select(StreamsGroup.group_id, StreamsGroup.task_counts).where(
            StreamsGroup.group_id.in_(ids)
        )
    )
    return {group_id for group_id, tasks in rows if not tasks}


def _partitions(tps: object) -> list[TopicPartitionOut]:
    assert isinstance(tps, list | set)
    return [TopicPartitionOut(topic=t, partition=p) for t, p in sorted(tuple(tp) for tp in tps)]


async def _describe(session: AsyncSession, state: GroupState, now: int) -> GroupDescription:
    group = state.group
    live = sorted(
        (m for m in state.members.values() if not is_gone(m, now)), key=lambda m: m.member_id
    )
    alive = {m.member_id for m in live}
    owners = {tp: owner for tp, (owner, _) in state.owned.items() if owner in alive}
    classic = group.protocol_type == CLASSIC
    if classic:
        # The leader assigns: what each member was given is what it owns.
        owners = {(t, p): m.member_id for m in live for t, p in m.assigned}
    rows = await session.execute(
        select(
            GroupOffset.topic, GroupOffset.partition, GroupOffset.offset, Partition.high_watermark
        )
        .join(
            Partition,
            (Partition.topic == GroupOffset.topic) & (Partition.partition == GroupOffset.partition),
        )
        .where(GroupOffset.group_id == group.group_id)
        .order_by(GroupOffset.topic, GroupOffset.partition)
    )
    return GroupDescription(
        group_id=group.group_id,
        state=group_state(state, now, group.group_id not in await _unready(session, [group])),
        type=group.protocol_type,
        group_epoch=group.group_epoch,
        assignment_epoch=group.assignment_epoch,
        members=[
            MemberDescription(
                member_id=m.member_id,
                member_epoch=m.member_epoch,
                client_id=m.client_id,
                client_host=m.client_host,
                protocol=m.protocol,
                assignor=m.assignor,
                subscribed_topics=list(m.subscribed_topics),
                assignment=_partitions(m.assigned),
                target_assignment=_partitions(
                    m.assigned if classic else state.target_of(m.member_id)
                ),
                last_heartbeat_at=rfc3339(m.last_heartbeat_ms),
                group_instance_id=m.group_instance_id,
                metadata=classic_metadata(m, group.protocol_name),
                assignment_data=m.classic_assignment,
            )
            for m in live
        ],
        offsets=[
            PartitionOffset(
                topic=topic,
                partition=partition,
                offset=offset,
                high_watermark=hw,
                lag=hw - offset,
                member_id=owners.get((topic, partition)),
            )
            for topic, partition, offset, hw in rows
        ],
        classic_state=classic_state(state, now),
        protocol_name=group.protocol_name,
        classic_protocol_type=protocol_type_of(group),
    )


async def describe(db: Store, group_id: str) -> GroupDescription:
    async with db.read() as session:
        group = await session.get(ConsumerGroup, group_id)
        if group is None:
            raise GroupIdNotFound(f"group {group_id!r} does not exist")
        if group.protocol_type == SHARE:
            raise GroupIdNotFound(f"{group_id!r} is a share group (/v1/share-groups/{group_id})")
        return await _describe(session, await load(session, group), now_ms())


async def describe_all(db: Store, visible: Callable[[str], bool]) -> list[GroupDescription]:
    """Every group the caller may see, described (the dashboard's groups panel)."""
    async with db.read() as session:
        groups = (
            await session.scalars(select(ConsumerGroup).order_by(ConsumerGroup.group_id))
        ).all()
        now = now_ms()
        return [
            await _describe(session, await load(session, g), now)
            for g in groups
            if visible(g.group_id) and g.protocol_type != SHARE
        ]


async def list_groups(db: Store, visible: Callable[[str], bool]) -> GroupList:
    async with db.read() as session:
        groups = (
            await session.scalars(select(ConsumerGroup).order_by(ConsumerGroup.group_id))
        ).all()
        members: defaultdict[str, dict[str, GroupMember]] = defaultdict(dict)
        for m in await session.scalars(select(GroupMember)):
            members[m.group_id][m.member_id] = m
        targets: defaultdict[str, dict[tuple[str, int], str]] = defaultdict(dict)
        for gid, t, p, mid in await session.execute(
            select(
                GroupTargetPartition.group_id,
                GroupTargetPartition.topic,
                GroupTargetPartition.partition,
                GroupTargetPartition.member_id,
            )
        ):
            targets[gid][(t, p)] = mid
        owned: defaultdict[str, dict[tuple[str, int], tuple[str, int]]] = defaultdict(dict)
        for gid, t, p, mid, epoch in await session.execute(
            select(
                GroupOwnedPartition.group_id,
                GroupOwnedPartition.topic,
                GroupOwnedPartition.partition,
                GroupOwnedPartition.member_id,
                GroupOwnedPartition.granted_epoch,
            )
        ):
            owned[gid][(t, p)] = (mid, epoch)
        now = now_ms()
        sharing = await _live_share_members(session, now)
        unready = await _unready(session, groups)
    summaries = []
    for group in groups:
        if not visible(group.group_id):
            continue
        if group.protocol_type == SHARE:
            count = sharing.get(group.group_id, 0)
            summaries.append(
                GroupSummary(
                    group_id=group.group_id,
                    state="Stable" if count else "Empty",
                    type=SHARE,
                    members=count,
                )
            )
            continue
        state = GroupState(
            group, members[group.group_id], targets[group.group_id], owned[group.group_id]
        )
        summaries.append(
            GroupSummary(
                group_id=group.group_id,
                state=group_state(state, now, group.group_id not in unready),
                type=group.protocol_type,
                members=sum(not is_gone(m, now) for m in state.members.values()),
                classic_state=classic_state(state, now),
                classic_protocol_type=protocol_type_of(group),
            )
        )
    return GroupList(groups=summaries)


async def _live_share_members(session: AsyncSession, now: int) -> dict[str, int]:
    """Each share group's members whose session has not run out."""
    rows = await session.execute(
        select(ShareMember.group_id, func.count())
        .where(ShareMember.session_deadline_ms >= now)
        .group_by(ShareMember.group_id)
    )
    return {group_id: count for group_id, count in rows}


async def _live_members_of_locked(
    session: AsyncSession, group_id: str
) -> tuple[ConsumerGroup, Sequence[GroupMember | ShareMember]]:
    """The group, its row locked, and its members whose timeouts have not passed;
    GROUP_ID_NOT_FOUND without one."""
    group = await lock_group(session, group_id, create=False)
    if group is None:
        raise GroupIdNotFound(f"group {group_id!r} does not exist")
    now = now_ms()
    if group.protocol_type == SHARE:
        shared = (
            await session.scalars(select(ShareMember).where(ShareMember.group_id == group_id))
        ).all()
        return group, [m for m in shared if m.session_deadline_ms >= now]
    members = (
        await session.scalars(select(GroupMember).where(GroupMember.group_id == group_id))
    ).all()
    return group, [m for m in members if not is_gone(m, now)]


async def delete_offsets(
    db: Store, group_id: str, partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], CoordinatorError | None]:
    """Kafka's OffsetDelete: the group's committed offsets of `partitions` removed, but for the
    topics its live members subscribe to (GROUP_SUBSCRIBED_TO_TOPIC for those); each partition
    answered on its own."""
    async with db.write() as session:
        _, members = await _live_members_of_locked(session, group_id)
        subscribed = {t for m in members for t in m.subscribed_topics}
        answers: dict[tuple[str, int], CoordinatorError | None] = {}
        for topic, partition in partitions:
            if topic in subscribed:
                answers[(topic, partition)] = GroupSubscribedToTopic(
                    f"group {group_id!r} has members subscribed to {topic!r}"
                )
                continue
            await session.execute(
                delete(GroupOffset).where(
                    GroupOffset.group_id == group_id,
                    GroupOffset.topic == topic,
                    GroupOffset.partition == partition,
                )
            )
            answers[(topic, partition)] = None
    return answers


async def delete_group(db: Store, group_id: str) -> DeletedGroup:
    """Remove an empty group with its committed offsets (members whose timeouts passed go with
    it). Offsets still pending in an open transaction stay there and, if it commits, bring the
    group back, as in Kafka."""
    async with db.write() as session:
        group, live = await _live_members_of_locked(session, group_id)
        if live:
            count = len(live)
            raise NonEmptyGroup(
                f"group {group_id!r} still has {count} member(s); they must leave (or their "
                "session time out) before it can be deleted"
            )
        await session.execute(delete(GroupOffset).where(GroupOffset.group_id == group_id))
        await session.delete(group)
    return DeletedGroup(group_id=group_id)
