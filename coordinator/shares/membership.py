"""A share group's membership (KIP-932's ShareGroupHeartbeat, KIP-848's shape): members join with
their topics, the coordinator assigns the partitions, members leave or their session runs out.

Unlike a consumer group's, a share group's partitions may be assigned to several members at
once, so an assignment changes with no hand-over: a member is told its new assignment at its next
heartbeat, its epoch raised to the group's assignment epoch. The assignor is Kafka's "simple"
one in spirit: each subscribed topic's partitions spread evenly over its members, and when a
topic has more members than partitions, each partition shared by several.

What a member that leaves or expires acquired is released, in the same unit of work, after the
group's row (the lock order: group, then its share partitions).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.clock import now_ms
from coordinator.core.errors import InvalidRequest
from coordinator.core.settings import Settings
from coordinator.groups.errors import (
    FencedMemberEpoch,
    GroupIdNotFound,
    GroupMaxSizeReached,
    UnknownMemberId,
)
from coordinator.groups.inputs import JOIN_EPOCH, LEAVE_EPOCH
from coordinator.groups.membership import lock_group
from coordinator.groups.models import SHARE, ConsumerGroup, GroupMember, ShareMember
from coordinator.log.models import Partition
from coordinator.shares import service
from coordinator.store import Store

TP = tuple[str, int]

EMPTY = "Empty"
STABLE = "Stable"
ASSIGNOR = "simple"


@dataclass(frozen=True, slots=True)
class ShareBeat:
    member_id: str
    member_epoch: int
    subscribed_topics: Sequence[str] | None
    rack_id: str | None = None


@dataclass(frozen=True, slots=True)
class ShareBeatAnswer:
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: list[TP] | None


def assign(
    subscriptions: Mapping[str, Sequence[str]], counts: Mapping[str, int]
) -> dict[str, list[TP]]:
    """Each subscribed topic's partitions over the members that subscribe to it: round robin
    when there are at least as many partitions as members, else each member one partition, so
    that every partition has a member and no member two more than another. A rotation carried
    from topic to topic spreads the remainders."""
    out: dict[str, list[TP]] = {m: [] for m in subscriptions}
    rotation = 0
    for topic in sorted({t for ts in subscriptions.values() for t in ts}):
        count = counts.get(topic, 0)
        members = sorted(m for m, ts in subscriptions.items() if topic in ts)
        if count <= 0 or not members:
            continue
        if len(members) <= count:
            for p in range(count):
                out[members[(p + rotation) % len(members)]].append((topic, p))
            rotation += count
        else:
            for i, member in enumerate(members):
                out[member].append((topic, (i + rotation) % count))
            rotation += len(members)
    return {m: sorted(tps) for m, tps in out.items()}


async def _counts(session: AsyncSession, topics: set[str]) -> dict[str, int]:
    if not topics:
        return {}
    rows = await session.execute(
        select(Partition.topic, func.count())
        .where(Partition.topic.in_(sorted(topics)))
        .group_by(Partition.topic)
    )
    return {topic: count for topic, count in rows}


@dataclass
class _Group:
    """A share group under its row lock: its members, and those removed (`_write` deletes their
    rows and releases what they held)."""

    group: ConsumerGroup
    members: dict[str, ShareMember]
    gone: list[ShareMember] = field(default_factory=list)

    def remove(self, member_id: str) -> None:
        self.gone.append(self.members.pop(member_id))
        self.group.group_epoch += 1
        self.group.updated_ms = now_ms()


async def _locked(session: AsyncSession, group_id: str, create: bool) -> _Group | None:
    group = await lock_group(session, group_id, create=False)
    if group is None:
        if not create:
            return None
        group = await lock_group(session, group_id, create=True)
        assert group is not None
        group.protocol_type = SHARE
    if group.protocol_type != SHARE:
        has_members = (
            await session.scalar(
                select(func.count())
                .select_from(GroupMember)
                .where(GroupMember.group_id == group_id)
            )
        ) or 0
        kind = group.protocol_type or "consumer"
        if group.protocol_type is not None or has_members:
            raise GroupIdNotFound(f"Group {group_id} is not a share group (it is a {kind} group).")
        raise GroupIdNotFound(f"Group {group_id} is not a share group (it holds consumer offsets).")
    members = await session.scalars(select(ShareMember).where(ShareMember.group_id == group_id))
    return _Group(group, {m.member_id: m for m in members})


async def _write(session: AsyncSession, state: _Group, rules: service.GroupRules) -> None:
    for member in state.gone:
        await session.delete(member)
    await session.flush()
    gone = [m.member_id for m in state.gone]
    await service.release_in(session, state.group.group_id, gone, rules)


def _expire(state: _Group, now: int, keep: str | None) -> None:
    for member_id, member in list(state.members.items()):
        if member_id != keep and member.session_deadline_ms < now:
            state.remove(member_id)


async def _target(session: AsyncSession, state: _Group) -> dict[str, list[TP]]:
    """The assignment of every member now; the group epoch raised if the subscribed topics'
    partitions changed since the last one."""
    group = state.group
    topics = {t for m in state.members.values() for t in m.subscribed_topics}
    counts = await _counts(session, topics)
    if counts != dict(group.subscribed_partitions or {}):
        group.subscribed_partitions = counts
        group.group_epoch += 1
    if group.assignment_epoch != group.group_epoch:
        group.assignment_epoch = group.group_epoch
    return assign({m.member_id: m.subscribed_topics for m in state.members.values()}, counts)


async def heartbeat(
    db: Store,
    settings: Settings,
    group_id: str,
    beat: ShareBeat,
    client_id: str,
    client_host: str,
) -> ShareBeatAnswer:
    """Join (epoch 0), heartbeat (the member's epoch), or leave (epoch -1). Members whose
    session ran out are removed on the way, and stay removed even if this call is refused."""
    if not beat.member_id:
        raise InvalidRequest("MemberId can't be empty.")
    if beat.member_epoch < LEAVE_EPOCH:
        raise InvalidRequest(f"MemberEpoch is {beat.member_epoch}: 0 to join, -1 to leave")
    if beat.member_epoch == JOIN_EPOCH and not beat.subscribed_topics:
        raise InvalidRequest("SubscribedTopicNames must be set in first request.")
    refusal: Exception | None = None
    answer: ShareBeatAnswer | None = None
    async with db.write() as session:
        now = now_ms()
        state = await _locked(session, group_id, create=beat.member_epoch == JOIN_EPOCH)
        if state is None:
            raise UnknownMemberId(f"share group {group_id!r} has no member {beat.member_id!r}")
        rules = await service.rules_of(session, settings, group_id)
        _expire(state, now, keep=beat.member_id)
        member = state.members.get(beat.member_id)
        try:
            if beat.member_epoch == LEAVE_EPOCH:
                if member is None:
                    raise UnknownMemberId(
                        f"share group {group_id!r} has no member {beat.member_id!r}"
                    )
                state.remove(beat.member_id)
                answer = ShareBeatAnswer(beat.member_id, LEAVE_EPOCH, 0, None)
            else:
                if beat.member_epoch == JOIN_EPOCH:
                    if member is None:
                        if len(state.members) >= settings.share_max_size:
                            raise GroupMaxSizeReached(
                                f"share group {group_id!r} has {len(state.members)} members, "
                                "its most (COORDINATOR_SHARE_MAX_SIZE)"
                            )
                        member = ShareMember(
                            group_id=group_id,
                            member_id=beat.member_id,
                            member_epoch=0,
                            subscribed_topics=[],
                            assigned=[],
                            joined_ms=now,
                        )
                        session.add(member)
                        state.members[beat.member_id] = member
                        state.group.group_epoch += 1
                    else:
                        member.member_epoch = 0  # rejoining: told its assignment anew
                else:
                    if member is None:
                        raise UnknownMemberId(
                            f"share group {group_id!r} has no member {beat.member_id!r}"
                        )
                    if member.session_deadline_ms < now:
                        state.remove(member.member_id)
                        raise UnknownMemberId(
                            f"member {beat.member_id!r} of share group {group_id!r} missed its "
                            "session timeout and was removed"
                        )
                    if beat.member_epoch != member.member_epoch:
                        raise FencedMemberEpoch(
                            f"member {beat.member_id!r} of share group {group_id!r} is at epoch "
                            f"{member.member_epoch}, not {beat.member_epoch}"
                        )
                if beat.subscribed_topics is not None:
                    topics = sorted(set(beat.subscribed_topics))
                    if topics != member.subscribed_topics:
                        member.subscribed_topics = topics
                        state.group.group_epoch += 1
                member.rack_id = beat.rack_id
                member.client_id = client_id
                member.client_host = client_host
                member.session_timeout_ms = rules.session_timeout_ms
                member.last_heartbeat_ms = now
                member.session_deadline_ms = now + rules.session_timeout_ms
                target = (await _target(session, state))[member.member_id]
                told = None
                if member.member_epoch != state.group.assignment_epoch or beat.member_epoch == 0:
                    member.member_epoch = state.group.assignment_epoch
                    member.assigned = [list(tp) for tp in target]
                    told = target
                    await service.ensure(session, group_id, rules, target)
                state.group.updated_ms = now
                answer = ShareBeatAnswer(
                    member.member_id, member.member_epoch, rules.heartbeat_interval_ms, told
                )
        except (UnknownMemberId, FencedMemberEpoch, GroupMaxSizeReached) as error:
            refusal = error
        await _write(session, state, rules)
    if refusal is not None:
        raise refusal
    assert answer is not None
    return answer


# -- reading ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShareMemberView:
    member_id: str
    member_epoch: int
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topics: list[str]
    assignment: list[TP]
    last_heartbeat_ms: int


@dataclass(frozen=True, slots=True)
class ShareGroupView:
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    members: list[ShareMemberView]


async def describe(db: Store, group_id: str) -> ShareGroupView:
    async with db.read() as session:
        group = await service.share_group(session, group_id)
        now = now_ms()
        rows = await session.scalars(
            select(ShareMember)
            .where(ShareMember.group_id == group_id)
            .order_by(ShareMember.member_id)
        )
        members = [
            ShareMemberView(
                m.member_id,
                m.member_epoch,
                m.rack_id,
                m.client_id,
                m.client_host,
                list(m.subscribed_topics),
                [(t, p) for t, p in m.assigned],
                m.last_heartbeat_ms,
            )
            for m in rows
            if m.session_deadline_ms >= now
        ]
        return ShareGroupView(
            group_id,
            STABLE if members else EMPTY,
            group.group_epoch,
            group.assignment_epoch,
            members,
        )


async def assignment_of(db: Store, group_id: str, member_id: str) -> list[TP]:
    """What the member was last assigned; UNKNOWN_MEMBER_ID if it is not in the group."""
    async with db.read() as session:
        member = await session.get(ShareMember, (group_id, member_id))
        if member is None or member.session_deadline_ms < now_ms():
            raise UnknownMemberId(f"share group {group_id!r} has no member {member_id!r}")
        return [(t, p) for t, p in member.assigned]


async def expire_members(
    db: Store, settings: Settings, now: int | None = None
) -> list[tuple[str, str]]:
    """The sweep: share members whose session ran out are removed, and what they acquired is
    released. Each group claimed with SKIP LOCKED, so processes share the work."""
    now = now_ms() if now is None else now
    async with db.read() as session:
        due = sorted(
            {
                g
                for (g,) in await session.execute(
                    select(ShareMember.group_id).where(ShareMember.session_deadline_ms < now)
                )
            }
        )
    removed: list[tuple[str, str]] = []
    for group_id in due:
        async with db.write() as session:
            group = (
                await session.scalars(
                    select(ConsumerGroup)
                    .where(ConsumerGroup.group_id == group_id)
                    .with_for_update(skip_locked=True)
                )
            ).one_or_none()
            if group is None or group.protocol_type != SHARE:
                continue
            members = await session.scalars(
                select(ShareMember).where(ShareMember.group_id == group_id)
            )
            state = _Group(group, {m.member_id: m for m in members})
            _expire(state, now, keep=None)
            removed += [(group_id, m.member_id) for m in state.gone]
            await _write(session, state, await service.rules_of(session, settings, group_id))
    return removed
