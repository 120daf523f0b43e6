"""A share group's offsets, as the admin sees and sets them: DescribeShareGroupOffsets (each share
partition's start offset and lag), AlterShareGroupOffsets (start anew at an offset) and
DeleteShareGroupOffsets (forget a topic's share partitions), the last two only while the group
has no members (kafka-share-groups.sh --describe, --reset-offsets, --delete-offsets)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.clock import now_ms
from coordinator.core.errors import CoordinatorError, InvalidRequest
from coordinator.core.settings import Settings
from coordinator.groups.errors import GroupIdNotFound, NonEmptyGroup
from coordinator.groups.models import SHARE, ConsumerGroup, ShareMember
from coordinator.log.bounds import partition_bounds
from coordinator.log.errors import UnknownTopicOrPartition
from coordinator.shares.inflight import ShareState
from coordinator.shares.models import SharePartitionRow
from coordinator.shares.service import load, rules_of, share_group, store
from coordinator.store import Store

TP = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ShareOffset:
    topic: str
    partition: int
    start_offset: int
    lag: int | None


async def _live_members(session: AsyncSession, group_id: str, now: int) -> list[ShareMember]:
    members = await session.scalars(select(ShareMember).where(ShareMember.group_id == group_id))
    return [m for m in members if m.session_deadline_ms >= now]


async def describe_offsets(
    db: Store, settings: Settings, group_id: str, partitions: Sequence[TP] | None
) -> list[ShareOffset]:
    """DescribeShareGroupOffsets: each share partition's start offset and lag (those asked, or
    all the group has). A partition the group has no state of is left out."""
    async with db.read() as session:
        await share_group(session, group_id)
        rules = await rules_of(session, settings, group_id)
        query = select(SharePartitionRow).where(SharePartitionRow.group_id == group_id)
        rows = {(r.topic, r.partition): r for r in await session.scalars(query)}
        connection = await session.connection()
        answers = []
        for tp in sorted(rows) if partitions is None else partitions:
            row = rows.get(tp)
            if row is None:
                continue
            state = ShareState.of(row.start_offset, row.end_offset, row.spans)
            bounds = await partition_bounds(connection, *tp)
            lag = None
            if bounds is not None:
                state.trim(bounds.log_start_offset)
                upper = bounds.last_stable_offset if rules.read_committed else bounds.high_watermark
                lag = state.lag(upper)
            answers.append(ShareOffset(tp[0], tp[1], state.start, lag))
        return answers


async def alter_offsets(
    db: Store, settings: Settings, group_id: str, offsets: Mapping[TP, int]
) -> dict[TP, CoordinatorError | None]:
    """AlterShareGroupOffsets: each share partition starts anew at its offset, nothing in
    flight; only while the group has no members (NON_EMPTY_GROUP)."""
    answers: dict[TP, CoordinatorError | None] = {}
    async with db.write() as session:
        group = await _locked_share_group(session, group_id)
        now = now_ms()
        if await _live_members(session, group.group_id, now):
            raise NonEmptyGroup(
                f"share group {group_id!r} has members: its offsets can be reset only while it "
                "is empty"
            )
        rules = await rules_of(session, settings, group_id)
        for tp in sorted(offsets):
            try:
                loaded = await load(session, group_id, tp, rules, now)
                offset = offsets[tp]
                if offset < 0:
                    raise InvalidRequest(f"{tp[0]}-{tp[1]}: offset {offset}, at least 0")
                loaded.state.reset(offset)
                loaded.row.state_epoch += 1
                store(loaded.row, loaded.state, now)
                answers[tp] = None
            except CoordinatorError as refused:
                answers[tp] = refused
    return answers


async def delete_offsets(
    db: Store, group_id: str, topics: Sequence[str]
) -> dict[str, CoordinatorError | None]:
    """DeleteShareGroupOffsets: the group forgets its share partitions of `topics` (they start
    anew if assigned again); only while the group has no members."""
    answers: dict[str, CoordinatorError | None] = {}
    async with db.write() as session:
        group = await _locked_share_group(session, group_id)
        if await _live_members(session, group.group_id, now_ms()):
            raise NonEmptyGroup(
                f"share group {group_id!r} has members: its offsets can be deleted only while "
                "it is empty"
            )
        for topic in topics:
            found = await session.scalars(
                delete(SharePartitionRow)
                .where(SharePartitionRow.group_id == group_id, SharePartitionRow.topic == topic)
                .returning(SharePartitionRow.partition)
            )
            answers[topic] = (
                None
                if found.all()
                else UnknownTopicOrPartition(f"share group {group_id!r} has no state of {topic!r}")
            )
    return answers


async def _locked_share_group(session: AsyncSession, group_id: str) -> ConsumerGroup:
    group = (
        await session.scalars(
            select(ConsumerGroup).where(ConsumerGroup.group_id == group_id).with_for_update()
        )
    ).one_or_none()
    if group is None or group.protocol_type != SHARE:
        raise GroupIdNotFound(f"{group_id!r} is not a share group")
    return group
