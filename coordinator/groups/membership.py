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
from functools import partial
from typing import Any, Protocol, TypeVar

from sqlalchemy import ColumnElement, delete, func, insert, or_, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.clock import now_ms
from coordinator.core.errors import CoordinatorError, InvalidRequest
from coordinator.core.metrics import record_limit_refusal, record_rebalance
from coordinator.core.settings import Settings
from coordinator.groups.assignor import assign
from coordinator.groups.errors import (
    FencedMemberEpoch,
    GroupIdNotFound,
    GroupMaxSizeReached,
    InvalidGroupId,
    InvalidSessionTimeout,
    UnknownMemberId,
    UnreleasedInstanceId,
)
from coordinator.groups.heartbeats import Renewal, renew_if_steady
from coordinator.groups.models import (
    CLASSIC,
    CONSUMER,
    ConsumerGroup,
    GroupMember,
    GroupOwnedPartition,
    GroupTargetPartition,
)
from coordinator.groups.schemas import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    HeartbeatRequest,
    HeartbeatResponse,
    TopicPartitionOut,
)
from coordinator.log.models import Partition
from coordinator.store import Store, store_of

log = logging.getLogger("coordinator.groups")

TP = tuple[str, int]
V = TypeVar("V")

# Group states (API.md).
EMPTY = "Empty"
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


def remove(session: AsyncSession, state: GroupState, member_id: str, reason: str) -> None:
    """The member leaves the group: its partitions are free, the target is computed anew."""
    member = state.members.pop(member_id)
    state.target = {tp: m for tp, m in state.target.items() if m != member_id}
    state.owned = {tp: o for tp, o in state.owned.items() if o[0] != member_id}
    state._removed.add(member_id)
    state.rebalance_reasons.append(reason)
    # Its target and owned rows go with it (ON DELETE CASCADE). (A rejoin resets the row rather
    # than deleting and adding it again, which one flush could not do.)
    if member in session.new:
        session.expunge(member)
    else:
        session.sync_session.delete(member)
    log.info("group %r: member %s removed (%s)", state.group.group_id, member_id, reason)


def expire_gone(session: AsyncSession, state: GroupState, now: int, keep: str | None) -> None:
    """Remove every member whose session or rebalance timeout passed (but `keep`)."""
    for member_id, member in sorted(state.members.items()):
        if member_id != keep and is_gone(member, now):
            expired = member.session_deadline_ms < now
            remove(session, state, member_id, "session timeout" if expired else "rebalance timeout")


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


async def rebalance_if_needed(session: AsyncSession, state: GroupState, now: int) -> None:
    """Compute the target anew when membership, a subscription or a subscribed topic's
    partitions changed since it was last computed; the group epoch rises each time."""
    counts = await subscribed_partition_counts(session, state.members.values())
    group = state.group
    if counts != group.subscribed_partitions and not state.rebalance_reasons:
        state.rebalance_reasons.append("topic metadata")
    if not state.rebalance_reasons:
        return
    group.group_epoch += 1
    state.target = assign(
        {m.member_id: m.subscribed_topics for m in state.members.values()},
        counts,
        state.target,
    )
    group.assignment_epoch = group.group_epoch
    group.subscribed_partitions = counts
    # A member's rebalance timeout runs only while it holds what the target gives another.
    for member in state.members.values():
        if state.owned_by(member.member_id) <= state.target_of(member.member_id):
            member.revoke_deadline_ms = None
    group.updated_ms = now
    reasons = ", ".join(sorted(set(state.rebalance_reasons)))
    log.info("group %r: epoch %d (%s)", group.group_id, group.group_epoch, reasons)
    session.info.setdefault("after_commit", []).append(partial(record_rebalance))


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
    """Store the target and ownership changes (rows of removed members went by cascade)."""
    await session.flush()
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


# A classic group's state (Kafka's names) as API.md's: waiting for members to join again is
# reconciling; waiting for the leader's assignment is assigning.
_CLASSIC_STATES = {
    "PreparingRebalance": RECONCILING,
    "CompletingRebalance": ASSIGNING,
    "Stable": STABLE,
}


def group_state(state: GroupState, now: int) -> str:
    """Empty, Assigning, Reconciling or Stable (API.md), from what is stored."""
    live = [m for m in state.members.values() if not is_gone(m, now)]
    if not live:
        return EMPTY
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


# -- the heartbeat ------------------------------------------------------------------------------


def _session_timeout(settings: Settings, body: HeartbeatRequest) -> int:
    if body.session_timeout_ms is None:
        return settings.group_session_timeout_ms
    low, high = settings.group_min_session_timeout_ms, settings.group_max_session_timeout_ms
    if not low <= body.session_timeout_ms <= high:
        raise InvalidSessionTimeout(
            f"session_timeout_ms: {body.session_timeout_ms} is outside the service's bounds "
            f"{low}..{high}"
        )
    return body.session_timeout_ms


def _interval(settings: Settings, session_timeout_ms: int) -> int:
    return max(1, min(settings.group_heartbeat_interval_ms, session_timeout_ms // 3))


async def heartbeat(
    db: Store,
    settings: Settings,
    group_id: str,
    body: HeartbeatRequest,
    client_id: str,
    client_host: str,
    *,
    protocol: str = CONSUMER,
    assignor: str | None = None,
    keep_rebalance_timeout: bool = False,
    instance_id: str | None = None,
    static_leave: bool = False,
) -> HeartbeatResponse:
    """Join (epoch 0), heartbeat (the current epoch, or the previous one after a lost answer)
    or leave (epoch -1); answers the member's epoch and the partitions it may own now. With
    `keep_rebalance_timeout` a member that is not joining keeps the rebalance timeout it has
    (Kafka's -1: unchanged since its last heartbeat), whatever `body` holds.

    Static membership (KIP-848, Kafka's listener): a member joins with its `instance_id`. A leave
    with `static_leave` (Kafka's epoch -2) from such a member keeps its place and partitions
    (epoch -2) until its session runs out; its instance joining again under a new member id
    takes that place, target and partitions with no rebalance. Joining with the instance id of
    a member that has not left is UNRELEASED_INSTANCE_ID.

    Members of the group whose timeouts passed are removed on the way, and stay removed even
    when this call is refused: the refusal is raised once that is committed.
    """
    session_timeout_ms = _session_timeout(settings, body)
    if body.member_epoch == JOIN_EPOCH and body.subscribed_topics is None:
        raise InvalidRequest("subscribed_topics: required to join (member_epoch 0)")
    if protocol == CONSUMER and body.member_epoch > 0:
        owned = body.owned_partitions
        assignment = await renew_if_steady(
            db,
            group_id,
            body.member_id,
            body.member_epoch,
            body.subscribed_topics,
            None if owned is None else [(p.topic, p.partition) for p in owned],
            Renewal(
                session_timeout_ms,
                None if keep_rebalance_timeout else body.rebalance_timeout_ms,
                client_id,
                client_host,
                assignor,
            ),
            now_ms(),
        )
        if assignment is not None:
            return HeartbeatResponse(
                member_id=body.member_id,
                member_epoch=body.member_epoch,
                heartbeat_interval_ms=_interval(settings, session_timeout_ms),
                assignment=[TopicPartitionOut(topic=t, partition=p) for t, p in assignment],
            )
    refusal: CoordinatorError | None = None
    answer: HeartbeatResponse | None = None
    async with db.write() as session:
        now = now_ms()
        group = await lock_group(session, group_id, create=body.member_epoch == JOIN_EPOCH)
        if group is None:
            raise UnknownMemberId(f"group {group_id!r} has no member {body.member_id!r}")
        state = await load(session, group)
        if group.protocol_type == CLASSIC and any(
            not is_gone(m, now) for m in state.members.values()
        ):
            # Kafka's answer to a consumer-protocol member of a classic group with members.
            raise GroupIdNotFound(
                f"group {group_id!r} is a classic group (Kafka's JoinGroup) with members"
            )
        expire_gone(session, state, now, keep=body.member_id)
        member = state.members.get(body.member_id)
        try:
            if body.member_epoch == LEAVE_EPOCH:
                member = _require_member(group_id, body.member_id, member)
                if static_leave and member.group_instance_id is not None:
                    # Gone for now: its partitions stay its own, its epochs are no longer valid.
                    member.member_epoch = member.previous_member_epoch = STATIC_LEAVE_EPOCH
                    left = STATIC_LEAVE_EPOCH
                else:
                    remove(session, state, body.member_id, "left")
                    await rebalance_if_needed(session, state, now)
                    left = LEAVE_EPOCH
                answer = HeartbeatResponse(
                    member_id=body.member_id,
                    member_epoch=left,
                    heartbeat_interval_ms=_interval(settings, session_timeout_ms),
                    assignment=[],
                )
            else:
                if body.member_epoch == JOIN_EPOCH:
                    if member is None and len(state.members) >= settings.group_consumer_max_size:
                        record_limit_refusal("group_max_size")
                        raise GroupMaxSizeReached(
                            f"group {group_id!r} has {len(state.members)} members, its most "
                            "(COORDINATOR_GROUP_CONSUMER_MAX_SIZE)"
                        )
                    held = _instance_holder(state, instance_id, body.member_id, now)
                    if held is not None:
                        member = await _take_place(session, state, body, held, now)
                    else:
                        member = _join(session, state, body, member, now)
                        member.group_instance_id = instance_id
                else:
                    member = _require_member(group_id, body.member_id, member)
                    if member.session_deadline_ms < now:
                        remove(session, state, member.member_id, "session timeout")
                        raise UnknownMemberId(
                            f"member {body.member_id!r} of group {group_id!r} missed its session "
                            f"timeout of {member.session_timeout_ms} ms and was removed"
                        )
                    _check_epoch(group_id, state, member, body)
                    _update(state, member, body)
                    _release(state, member, body.owned_partitions)
                    if is_gone(member, now):
                        remove(session, state, member.member_id, "rebalance timeout")
                        raise UnknownMemberId(
                            f"member {body.member_id!r} of group {group_id!r} kept partitions it "
                            f"had to give up longer than its rebalance timeout of "
                            f"{member.rebalance_timeout_ms} ms and was removed"
                        )
                member.client_id = client_id
                member.client_host = client_host
                member.protocol = protocol
                member.assignor = assignor
                member.session_timeout_ms = session_timeout_ms
                if body.member_epoch == JOIN_EPOCH or not keep_rebalance_timeout:
                    member.rebalance_timeout_ms = body.rebalance_timeout_ms
                member.last_heartbeat_ms = now
                member.session_deadline_ms = now + session_timeout_ms
                await rebalance_if_needed(session, state, now)
                assignment = reconcile(state, member, now)
                answer = HeartbeatResponse(
                    member_id=member.member_id,
                    member_epoch=member.member_epoch,
                    heartbeat_interval_ms=_interval(settings, session_timeout_ms),
                    assignment=[TopicPartitionOut(topic=t, partition=p) for t, p in assignment],
                )
        except (UnknownMemberId, FencedMemberEpoch, GroupMaxSizeReached) as error:
            refusal = error
            await rebalance_if_needed(session, state, now)
        await write(session, state)
    if refusal is not None:
        raise refusal
    assert answer is not None
    return answer


async def member_of(db: Store, group_id: str, member_id: str) -> GroupMember | None:
    """The member as stored (its epoch and what it was told to own), or None; for a classic
    member's JoinGroup, which carries no epoch."""
    async with db.read() as session:
        member = await session.get(GroupMember, (group_id, member_id))
        if member is None or is_gone(member, now_ms()):
            return None
        session.expunge(member)
        return member


def _require_member(group_id: str, member_id: str, member: GroupMember | None) -> GroupMember:
    if member is None:
        raise UnknownMemberId(f"group {group_id!r} has no member {member_id!r}; rejoin")
    return member


def _join(
    session: AsyncSession,
    state: GroupState,
    body: HeartbeatRequest,
    member: GroupMember | None,
    now: int,
) -> GroupMember:
    """A new member, or one joining again under its member id (having lost its partitions):
    the old incarnation's partitions are free, and its epochs are never valid again."""
    group = state.group
    if group.protocol_type != CONSUMER:
        # An empty classic group (or one that only had offsets) becomes a consumer group.
        group.protocol_type, group.classic_state = CONSUMER, None
        group.leader_id = group.protocol_name = None
        group.phase_deadline_ms = group.join_wait_until_ms = None
    topics = sorted(set(body.subscribed_topics or ()))
    if member is not None:
        state.target = {tp: m for tp, m in state.target.items() if m != member.member_id}
        state.owned = {tp: o for tp, o in state.owned.items() if o[0] != member.member_id}
        member.member_epoch = JOIN_EPOCH
        member.previous_member_epoch = JOIN_EPOCH
        member.subscribed_topics = topics
        member.assigned = []
        member.revoke_deadline_ms = None
        member.joined_ms = now
        state.rebalance_reasons.append("rejoined")
        return member
    member = _new_member(group, body, topics, now)
    session.add(member)
    state.members[member.member_id] = member
    state.rebalance_reasons.append("joined")
    return member


def _new_member(
    group: ConsumerGroup, body: HeartbeatRequest, topics: list[str], now: int
) -> GroupMember:
    return GroupMember(
        group_id=group.group_id,
        member_id=body.member_id,
        member_epoch=JOIN_EPOCH,
        previous_member_epoch=JOIN_EPOCH,
        client_id="",
        client_host="",
        subscribed_topics=topics,
        assigned=[],
        rebalance_timeout_ms=body.rebalance_timeout_ms,
        session_timeout_ms=0,
        joined_ms=now,
        last_heartbeat_ms=now,
        session_deadline_ms=now,
        revoke_deadline_ms=None,
    )


def _instance_holder(
    state: GroupState, instance_id: str | None, member_id: str, now: int
) -> GroupMember | None:
    """The member whose place a static member joining as `member_id` takes: the one with its
    instance id that left for now; UNRELEASED_INSTANCE_ID while that one has not left."""
    if instance_id is None:
        return None
    for other in state.members.values():
        if other.group_instance_id != instance_id or other.member_id == member_id:
            continue
        if other.member_epoch != STATIC_LEAVE_EPOCH and not is_gone(other, now):
            raise UnreleasedInstanceId(
                f"instance {instance_id!r} of group {state.group.group_id!r} is member "
                f"{other.member_id!r}, which has not left"
            )
        return other
    return None


async def _take_place(
    session: AsyncSession,
    state: GroupState,
    body: HeartbeatRequest,
    held: GroupMember,
    now: int,
) -> GroupMember:
    """A static member back under a new member id: it takes the place of the member that left
    for now, its target and the partitions it owns, with no rebalance (but for a changed
    subscription)."""
    old_id, topics = held.member_id, sorted(set(body.subscribed_topics or ()))
    del state.members[old_id]
    if held in session.new:
        session.expunge(held)
    else:
        # Gone before its successor is added (the instance id is unique in the group); its
        # target and owned rows go with it, and `write` stores them anew as the successor's.
        await session.delete(held)
        await session.flush()
    member = _new_member(state.group, body, topics, now)
    member.group_instance_id = held.group_instance_id
    session.add(member)
    state.members[member.member_id] = member
    state.target = {tp: body.member_id if m == old_id else m for tp, m in state.target.items()}
    state.owned = {
        tp: (body.member_id, epoch) if owner == old_id else (owner, epoch)
        for tp, (owner, epoch) in state.owned.items()
    }
    if topics != held.subscribed_topics:
        state.rebalance_reasons.append("subscription changed")
    log.info(
        "group %r: instance %r back as member %s (was %s)",
        state.group.group_id,
        held.group_instance_id,
        member.member_id,
        old_id,
    )
    return member


def _check_epoch(
    group_id: str, state: GroupState, member: GroupMember, body: HeartbeatRequest
) -> None:
    """The current epoch, or the previous one (its answer may have been lost); either way it
    may not claim a partition it was not given."""
    epoch = body.member_epoch
    current, previous = member.member_epoch, member.previous_member_epoch
    if epoch != current and (epoch != previous or previous == JOIN_EPOCH):
        raise FencedMemberEpoch(
            f"member {member.member_id!r} of group {group_id!r} sent epoch {epoch}; its epoch "
            f"is {current}: rejoin with epoch 0"
        )
    claimed = {(p.topic, p.partition) for p in body.owned_partitions or ()}
    foreign = sorted(claimed - state.owned_by(member.member_id))
    if foreign:
        topic, partition = foreign[0]
        raise FencedMemberEpoch(
            f"member {member.member_id!r} of group {group_id!r} claims {topic}-{partition}, "
            "which it does not own: rejoin with epoch 0"
        )


def _update(state: GroupState, member: GroupMember, body: HeartbeatRequest) -> None:
    if body.subscribed_topics is not None:
        topics = sorted(set(body.subscribed_topics))
        if topics != member.subscribed_topics:
            member.subscribed_topics = topics
            state.rebalance_reasons.append("subscription changed")


def _release(
    state: GroupState, member: GroupMember, owned_partitions: Iterable[Any] | None
) -> None:
    """Partitions the target moved away that the member no longer lists are free now."""
    if owned_partitions is None:
        return
    still = {(p.topic, p.partition) for p in owned_partitions}
    for tp in state.owned_by(member.member_id) - state.target_of(member.member_id) - still:
        del state.owned[tp]


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
            expire_gone(session, state, moment, keep=None)
            gone = sorted(before - set(state.members))
            if not gone:
                skipped.add(group.group_id)  # changed since the query looked: next round
                continue
            await rebalance_if_needed(session, state, moment)
            await write(session, state)
            removed.extend((group.group_id, m) for m in gone)
