"""Group membership run by the coordinator (KIP-848's shape over REST): heartbeats that join,
report what the member owns and leave; the target assignment; partitions handed over only once
their old owner gave them up; members removed when their session or rebalance timeout passes.

Concurrency: every change locks the group's row first (`lock_group`), then reads and writes its
members, target and owned partitions, so heartbeats reaching different service processes apply
one after another. Ownership is a row per partition (primary key): a partition can never have two
owners. Whatever changes membership (a heartbeat, the sweeper, a commit's check) goes through
`GroupState`, loaded and written under that lock.

The hand-over rule: a member is granted a partition only at its own heartbeat, and only if the
target gives it that partition and no member owns it. A member gives a partition up by a heartbeat
whose `owned_partitions` no longer lists it, after it was told so (the target moved it). So between
the old owner's last use and the new owner's first there is always the old owner's heartbeat.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sqlalchemy import ColumnElement, delete, func, insert, or_, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.clock import now_ms
from coordinator.core.metrics import record_rebalance
from coordinator.groups.assignor import assign
from coordinator.groups.errors import (
    InvalidGroupId,
)
from coordinator.groups.inputs import JOIN_EPOCH
from coordinator.groups.models import (
    CLASSIC,
    STREAMS,
    ConsumerGroup,
    GroupMember,
    GroupOwnedPartition,
    GroupTargetPartition,
    StreamsGroup,
)
from coordinator.log.models import Partition
from coordinator.store import Store, store_of

log = logging.getLogger("coordinator.groups")

TP = tuple[str, int]
V = TypeVar("V")

# Group states (docs/pages/http-api.md).
EMPTY = "Empty"
NOT_READY = "NotReady"
ASSIGNING = "Assigning"
RECONCILING = "Reconciling"
STABLE = "Stable"


class Deadlines(Protocol):
    """What `is_gone` reads of a member (a row, or the facts a commit read of it)."""

    @property
    def member_epoch(self) -> int: ...
    @property
    def session_deadline_ms(self) -> int: ...
    @property
    def revoke_deadline_ms(self) -> int | None: ...


def is_gone(member: Deadlines, now: int) -> bool:
    """Its session ran out, or it kept a partition it had to give up past its rebalance timeout
    (the deadline is set only while it holds such a partition). Such a member is no longer in
    the group, whether or not the sweeper has removed its row yet."""
    return member.session_deadline_ms < now or (
        member.revoke_deadline_ms is not None and member.revoke_deadline_ms < now
    )


# The longest group id the store keeps (`ConsumerGroup.group_id`).
GROUP_ID_MAX = 255


async def lock_group(
    session: AsyncSession, group_id: str, *, create: bool, share: bool = False
) -> ConsumerGroup | None:
    """Lock the group's row (FOR UPDATE, or FOR SHARE for a commit's check), creating it first
    when `create`. Always the first lock a group operation takes."""
    query = select(ConsumerGroup).where(ConsumerGroup.group_id == group_id)
    query = query.with_for_update(read=share)
    group = (await session.scalars(query)).one_or_none()
    if group is None and create:
        if not 0 < len(group_id) <= GROUP_ID_MAX:
            raise InvalidGroupId(
                f"a group id is 1 to {GROUP_ID_MAX} characters, not {len(group_id)}"
            )
        now = now_ms()
        await store_of(session).insert_ignore(
            session,
            ConsumerGroup,
            [
                {
                    "group_id": group_id,
                    "protocol_type": None,
                    "group_epoch": 0,
                    "assignment_epoch": 0,
                    "last_member_epoch": 0,
                    "subscribed_partitions": {},
                    "created_ms": now,
                    "updated_ms": now,
                }
            ],
            ["group_id"],
        )
        group = (await session.scalars(query.execution_options(populate_existing=True))).one()
    return group


@dataclass
class GroupState:
    """One group's membership, loaded under its row lock; `write()` stores what changed."""

    group: ConsumerGroup
    members: dict[str, GroupMember]
    target: dict[TP, str]
    owned: dict[TP, tuple[str, int]]  # partition -> (member id, granted epoch)
    _target_before: dict[TP, str] = field(default_factory=dict)
    _owned_before: dict[TP, tuple[str, int]] = field(default_factory=dict)
    _removed: set[str] = field(default_factory=set)
    rebalance_reasons: list[str] = field(default_factory=list)
    # Member rows this unit of work adds and drops (`write` stores them), and how many
    # rebalances it made (counted once it commits).
    added: list[GroupMember] = field(default_factory=list)
    dropped: list[GroupMember] = field(default_factory=list)
    rebalances: int = 0

    def add(self, member: GroupMember) -> None:
        self.members[member.member_id] = member
        self.added.append(member)

    def drop(self, member: GroupMember) -> None:
        """The member's row goes (its target and owned rows with it, ON DELETE CASCADE)."""
        if member in self.added:
            self.added.remove(member)
        else:
            self.dropped.append(member)

    def owned_by(self, member_id: str) -> set[TP]:
        return {tp for tp, (owner, _) in self.owned.items() if owner == member_id}

    def target_of(self, member_id: str) -> set[TP]:
        return {tp for tp, owner in self.target.items() if owner == member_id}


async def load(session: AsyncSession, group: ConsumerGroup) -> GroupState:
    gid = group.group_id
    members = (await session.scalars(select(GroupMember).where(GroupMember.group_id == gid))).all()
    target = {
        (t, p): m
        for t, p, m in await session.execute(
            select(
                GroupTargetPartition.topic,
                GroupTargetPartition.partition,
                GroupTargetPartition.member_id,
            ).where(GroupTargetPartition.group_id == gid)
        )
    }
    owned = {
        (t, p): (m, e)
        for t, p, m, e in await session.execute(
            select(
                GroupOwnedPartition.topic,
                GroupOwnedPartition.partition,
                GroupOwnedPartition.member_id,
                GroupOwnedPartition.granted_epoch,
            ).where(GroupOwnedPartition.group_id == gid)
        )
    }
    return GroupState(
        group,
        {m.member_id: m for m in members},
        dict(target),
        dict(owned),
        _target_before=dict(target),
        _owned_before=dict(owned),
    )


def remove(state: GroupState, member_id: str, reason: str) -> None:
    """The member leaves the group: its partitions are free, the target is computed anew. (A
    rejoin resets the row rather than dropping it and adding it again.)"""
    member = state.members.pop(member_id)
    state.target = {tp: m for tp, m in state.target.items() if m != member_id}
    state.owned = {tp: o for tp, o in state.owned.items() if o[0] != member_id}
    state._removed.add(member_id)
    state.rebalance_reasons.append(reason)
    state.drop(member)
    log.info("group %r: member %s removed (%s)", state.group.group_id, member_id, reason)


def expire_gone(state: GroupState, now: int, keep: str | None) -> None:
    """Remove every member whose session or rebalance timeout passed (but `keep`)."""
    for member_id, member in sorted(state.members.items()):
        if member_id != keep and is_gone(member, now):
            expired = member.session_deadline_ms < now
            remove(state, member_id, "session timeout" if expired else "rebalance timeout")


async def subscribed_partition_counts(
    session: AsyncSession, members: Iterable[GroupMember]
) -> dict[str, int]:
    topics = sorted({t for m in members for t in m.subscribed_topics})
    if not topics:
        return {}
    rows = await session.execute(
        select(Partition.topic, func.count())
        .where(Partition.topic.in_(topics))
        .group_by(Partition.topic)
    )
    return {topic: count for topic, count in rows}


async def _assignable(
    session: AsyncSession, state: GroupState
) -> tuple[dict[str, list[str]], dict[str, int]]:
    """What the assignor spreads: each member's subscription and each subscribed topic's
    partitions; a streams group's tasks (every member runs every subtopology, each with its
    task count: `groups.streams`)."""
    if state.group.protocol_type == STREAMS:
        row = await session.get(StreamsGroup, state.group.group_id)
        tasks = {} if row is None or row.shutdown else dict(row.task_counts)
        return {m: sorted(tasks) for m in state.members}, tasks
    counts = await subscribed_partition_counts(session, state.members.values())
    return {m.member_id: m.subscribed_topics for m in state.members.values()}, counts


async def rebalance_if_needed(session: AsyncSession, state: GroupState, now: int) -> None:
    """Compute the target anew when membership, a subscription or a subscribed topic's
    partitions changed since it was last computed; the group epoch rises each time."""
    subscriptions, counts = await _assignable(session, state)
    group = state.group
    if counts != group.subscribed_partitions and not state.rebalance_reasons:
        state.rebalance_reasons.append("topic metadata")
    if not state.rebalance_reasons:
        return
    group.group_epoch += 1
    state.target = assign(subscriptions, counts, state.target)
    group.assignment_epoch = group.group_epoch
    group.subscribed_partitions = counts
    # A member's rebalance timeout runs only while it holds what the target gives another.
    for member in state.members.values():
        if state.owned_by(member.member_id) <= state.target_of(member.member_id):
            member.revoke_deadline_ms = None
    group.updated_ms = now
    reasons = ", ".join(sorted(set(state.rebalance_reasons)))
    log.info("group %r: epoch %d (%s)", group.group_id, group.group_epoch, reasons)
    state.rebalances += 1


def reconcile(state: GroupState, member: GroupMember, now: int) -> list[TP]:
    """What `member` owns now, per the target: grant it the partitions the target gives it that
    nobody owns; a new member epoch whenever that changes. Returns its assignment."""
    wanted = state.target_of(member.member_id)
    holding = state.owned_by(member.member_id)
    grants = sorted(tp for tp in wanted - holding if tp not in state.owned)
    assignment = sorted((wanted & holding) | set(grants))
    if assignment != [tuple(tp) for tp in member.assigned] or member.member_epoch == JOIN_EPOCH:
        state.group.last_member_epoch += 1
        member.previous_member_epoch = member.member_epoch
        member.member_epoch = state.group.last_member_epoch
        member.assigned = [list(tp) for tp in assignment]
    for tp in grants:
        state.owned[tp] = (member.member_id, member.member_epoch)
    # Partitions it must give up: from now on it has its rebalance timeout to do so.
    if holding - wanted:
        if member.revoke_deadline_ms is None:
            member.revoke_deadline_ms = now + member.rebalance_timeout_ms
    else:
        member.revoke_deadline_ms = None
    return assignment


async def write(session: AsyncSession, state: GroupState) -> None:
    """Store what the unit of work changed: members dropped (their target and owned rows go by
    cascade) before members added (a successor may take a dropped member's instance id), the
    rows loaded and changed, the target and ownership changes; its rebalances are counted once
    it commits."""
    for member in state.dropped:
        await session.delete(member)
    if state.dropped:
        await session.flush()
    session.add_all(state.added)
    state.added, state.dropped = [], []
    await session.flush()
    hooks = session.info.setdefault("after_commit", [])
    hooks.extend(record_rebalance for _ in range(state.rebalances))
    state.rebalances = 0
    gid = state.group.group_id
    await _store(
        session,
        GroupOwnedPartition,
        gid,
        state._owned_before,
        state.owned,
        lambda owned: {"member_id": owned[0], "granted_epoch": owned[1]},
    )
    await _store(
        session,
        GroupTargetPartition,
        gid,
        state._target_before,
        state.target,
        lambda member_id: {"member_id": member_id},
    )


async def _store(
    session: AsyncSession,
    table: type[GroupOwnedPartition] | type[GroupTargetPartition],
    group_id: str,
    before: Mapping[TP, V],
    after: Mapping[TP, V],
    columns: Callable[[V], dict[str, Any]],
) -> None:
    """Delete the rows whose value changed or went, insert the new ones: a diff, not a rewrite."""
    gone = sorted(tp for tp, v in before.items() if after.get(tp) != v)
    for chunk in _chunks(gone):
        await session.execute(
            delete(table).where(
                table.group_id == group_id, tuple_(table.topic, table.partition).in_(chunk)
            )
        )
    fresh = sorted(tp for tp, v in after.items() if before.get(tp) != v)
    if fresh:
        await session.execute(
            insert(table),
            [
                {"group_id": group_id, "topic": t, "partition": p, **columns(after[(t, p)])}
                for t, p in fresh
            ],
        )


def _chunks(items: list[TP], size: int = 500) -> Iterable[list[TP]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# A classic group's state (Kafka's names) as docs/pages/http-api.md's: waiting for members to join
# again is reconciling; waiting for the leader's assignment is assigning.
_CLASSIC_STATES = {
    "PreparingRebalance": RECONCILING,
    "CompletingRebalance": ASSIGNING,
    "Stable": STABLE,
}


def group_state(state: GroupState, now: int, ready: bool = True) -> str:
    """Empty, Assigning, Reconciling or Stable (docs/pages/http-api.md), from what is stored;
    NotReady for a streams group with members whose topology cannot be configured (`ready`
    False: Kafka's state, `groups.streams`)."""
    live = [m for m in state.members.values() if not is_gone(m, now)]
    if not live:
        return EMPTY
    if not ready:
        return NOT_READY
    if state.group.protocol_type == CLASSIC:
        return _CLASSIC_STATES.get(state.group.classic_state or "", EMPTY)
    if state.group.assignment_epoch < state.group.group_epoch:
        return ASSIGNING
    for member in live:
        wanted = state.target_of(member.member_id)
        told = {(t, p) for t, p in member.assigned}
        if told != wanted or state.owned_by(member.member_id) != wanted:
            return RECONCILING
    return STABLE


async def member_of(db: Store, group_id: str, member_id: str) -> GroupMember | None:
    """The member as stored (its epoch and what it was told to own), or None; for a classic
    member's JoinGroup, which carries no epoch."""
    async with db.read() as session:
        member = await session.get(GroupMember, (group_id, member_id))
        if member is None or is_gone(member, now_ms()):
            return None
        session.expunge(member)
        return member


# -- the sweeper ---------------------------------------------------------------------------------


async def claim_due(
    session: AsyncSession, due: ColumnElement[bool], skipped: set[str]
) -> ConsumerGroup | None:
    """The next group (by id) the sweeper has work in, its row locked with SKIP LOCKED (a
    request or another process working on it is left alone: it is looked at again next round),
    but those already looked at this round."""
    query = select(ConsumerGroup).where(due)
    if skipped:
        query = query.where(ConsumerGroup.group_id.not_in(sorted(skipped)))
    found: ConsumerGroup | None = (
        await session.scalars(
            query.order_by(ConsumerGroup.group_id).limit(1).with_for_update(skip_locked=True)
        )
    ).one_or_none()
    return found


async def expire_members(db: Store, now: int | None = None) -> list[tuple[str, str]]:
    """Remove the members whose session or rebalance timeout passed, group by group (each
    claimed by `claim_due`). Returns the (group, member) pairs removed."""
    removed: list[tuple[str, str]] = []
    skipped: set[str] = set()
    while True:
        async with db.write() as session:
            moment = now_ms() if now is None else now
            late = (
                select(GroupMember.group_id)
                .where(
                    or_(
                        GroupMember.session_deadline_ms < moment,
                        GroupMember.revoke_deadline_ms < moment,
                    )
                )
                .scalar_subquery()
            )
            # Classic groups are swept by their protocol's rules (`classic.sweep`).
            due = ConsumerGroup.group_id.in_(late) & ConsumerGroup.protocol_type.is_distinct_from(
                CLASSIC
            )
            group = await claim_due(session, due, skipped)
            if group is None:
                return removed
            state = await load(session, group)
            before = set(state.members)
            expire_gone(state, moment, keep=None)
            gone = sorted(before - set(state.members))
            if not gone:
                skipped.add(group.group_id)  # changed since the query looked: next round
                continue
            await rebalance_if_needed(session, state, moment)
            await write(session, state)
            removed.extend((group.group_id, m) for m in gone)
