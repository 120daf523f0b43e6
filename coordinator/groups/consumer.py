"""KIP-848's consumer protocol, as the coordinator runs it for REST members and Kafka's
ConsumerGroupHeartbeat alike: a member's heartbeat joins (epoch 0), reports what it owns, and
leaves (epoch -1); the group's membership and target are `membership`'s.

A steady member's heartbeat goes in two statements on Postgres, neither in a transaction: the
call every consumer makes every few seconds. The locking path (`heartbeat`) takes it instead for
a join, a leave, a classic member, and whenever the store writes nothing this way (always, on
SQLite). A heartbeat is steady when the locking path would change nothing but the member's own
liveness (`steady`): the member holds exactly what the target gives it, was told so at its
current epoch, has nothing to give up, keeps its subscription, and the group needs no rebalance
(no other member's timeout has passed, the subscribed topics' partition counts are those the
target was computed for). The store reads those facts with the versions of the rows they come
from, and renews the member's session only if each is still the version read
(`coordinator.store.postgres.groups`): a rebalance, a grant, a revocation, a commit's new member
row between the two sends the heartbeat to the locking path, which answers it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from coordinator.core.clock import now_ms
from coordinator.core.errors import CoordinatorError, InvalidRequest
from coordinator.core.metrics import record_limit_refusal
from coordinator.core.settings import Settings
from coordinator.groups.errors import (
    FencedMemberEpoch,
    GroupIdNotFound,
    GroupMaxSizeReached,
    InvalidSessionTimeout,
    UnknownMemberId,
    UnreleasedInstanceId,
)
from coordinator.groups.inputs import JOIN_EPOCH, LEAVE_EPOCH, STATIC_LEAVE_EPOCH, Beat, check_beat
from coordinator.groups.membership import (
    TP,
    GroupState,
    expire_gone,
    is_gone,
    load,
    lock_group,
    rebalance_if_needed,
    reconcile,
    remove,
    write,
)
from coordinator.groups.models import (
    CLASSIC,
    CONSUMER,
    SHARE,
    STREAMS,
    ConsumerGroup,
    GroupMember,
)
from coordinator.groups.schemas import HeartbeatResponse, TopicPartitionOut
from coordinator.store import Store

log = logging.getLogger("coordinator.groups")


@dataclass(frozen=True, slots=True)
class SteadyFacts:
    """What decides whether a heartbeat changes anything but the member's liveness."""

    consumer_group: bool  # a consumer-protocol group (not a classic one)
    member_epoch: int
    consumer_member: bool  # the member joined by heartbeats, not Kafka's JoinGroup
    session_deadline_ms: int
    revoke_deadline_ms: int | None
    subscribed_topics: list[str]
    assigned: list[TP]  # what it was last told it owns, at its epoch
    owned: set[TP]
    target: set[TP]
    others_gone: int  # other members whose timeouts passed
    partition_counts: dict[str, int]  # of the group's subscribed topics, now
    counted: dict[str, int]  # what the target was computed for


def steady(
    facts: SteadyFacts,
    member_epoch: int,
    subscribed_topics: Sequence[str] | None,
    owned_partitions: Sequence[TP] | None,
    now: int,
) -> bool:
    """True when the locking path's heartbeat (`membership.heartbeat`) would remove nobody,
    refuse nothing, rebalance nothing, grant and release nothing and answer the assignment the
    member already has: only its session is renewed."""
    return (
        facts.consumer_group
        and facts.consumer_member
        and facts.others_gone == 0
        and facts.session_deadline_ms >= now
        and facts.revoke_deadline_ms is None
        and member_epoch == facts.member_epoch
        and (owned_partitions is None or set(owned_partitions) <= facts.owned)
        and (subscribed_topics is None or sorted(set(subscribed_topics)) == facts.subscribed_topics)
        and facts.owned == facts.target
        and sorted(facts.target) == facts.assigned
        and facts.partition_counts == facts.counted
    )


@dataclass(frozen=True, slots=True)
class Renewal:
    """What the locking path writes of a steady heartbeat."""

    session_timeout_ms: int
    rebalance_timeout_ms: int | None  # None: the member's, unchanged
    client_id: str
    client_host: str
    assignor: str | None


SteadyRule = Callable[[SteadyFacts], bool]


async def renew_if_steady(
    db: Store,
    group_id: str,
    member_id: str,
    member_epoch: int,
    subscribed_topics: Sequence[str] | None,
    owned_partitions: Sequence[TP] | None,
    renewal: Renewal,
    now: int,
) -> list[TP] | None:
    """Renew a steady member's session; its assignment, or None when nothing was written and the
    locking path must answer."""

    def rule(facts: SteadyFacts) -> bool:
        return steady(facts, member_epoch, subscribed_topics, owned_partitions, now)

    return await db.renew_if_steady(group_id, member_id, now, rule, renewal)


# -- the heartbeat ------------------------------------------------------------------------------


def _session_timeout(settings: Settings, body: Beat) -> int:
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
    body: Beat,
    client_id: str,
    client_host: str,
    *,
    protocol: str = CONSUMER,
    assignor: str | None = None,
    keep_rebalance_timeout: bool = False,
    instance_id: str | None = None,
    static_leave: bool = False,
    group_type: str = CONSUMER,
    on_member: Callable[[GroupMember], None] | None = None,
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

    `group_type` STREAMS runs a streams group's member (KIP-1071, `groups.streams`): its
    "partitions" are the group's tasks, `on_member` records its streams metadata.
    """
    check_beat(body)
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
            None if owned is None else list(owned),
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
        if group.protocol_type == SHARE:
            raise GroupIdNotFound(
                f"Group {group_id} is not a {group_type} group (it is a share group)."
            )
        state = await load(session, group)
        live = any(not is_gone(m, now) for m in state.members.values())
        if group.protocol_type == CLASSIC and live and group_type == CONSUMER:
            # Kafka's answer to a consumer-protocol member of a classic group with members.
            raise GroupIdNotFound(
                f"group {group_id!r} is a classic group (Kafka's JoinGroup) with members"
            )
        if live and (group.protocol_type == STREAMS) != (group_type == STREAMS):
            kind = group.protocol_type or CONSUMER
            raise GroupIdNotFound(
                f"Group {group_id} is not a {group_type} group (it is a {kind} group)."
            )
        expire_gone(state, now, keep=body.member_id)
        member = state.members.get(body.member_id)
        try:
            if body.member_epoch == LEAVE_EPOCH:
                member = _require_member(group_id, body.member_id, member)
                if static_leave and member.group_instance_id is not None:
                    # Gone for now: its partitions stay its own, its epochs are no longer valid.
                    member.member_epoch = member.previous_member_epoch = STATIC_LEAVE_EPOCH
                    left = STATIC_LEAVE_EPOCH
                else:
                    remove(state, body.member_id, "left")
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
                        member = _take_place(state, body, held, now)
                    else:
                        member = _join(state, body, member, now, group_type)
                        member.group_instance_id = instance_id
                else:
                    member = _require_member(group_id, body.member_id, member)
                    if member.session_deadline_ms < now:
                        remove(state, member.member_id, "session timeout")
                        raise UnknownMemberId(
                            f"member {body.member_id!r} of group {group_id!r} missed its session "
                            f"timeout of {member.session_timeout_ms} ms and was removed"
                        )
                    _check_epoch(group_id, state, member, body)
                    _update(state, member, body)
                    _release(state, member, body.owned_partitions)
                    if is_gone(member, now):
                        remove(state, member.member_id, "rebalance timeout")
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
                if on_member is not None:
                    on_member(member)
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


def _require_member(group_id: str, member_id: str, member: GroupMember | None) -> GroupMember:
    if member is None:
        raise UnknownMemberId(f"group {group_id!r} has no member {member_id!r}; rejoin")
    return member


def _join(
    state: GroupState,
    body: Beat,
    member: GroupMember | None,
    now: int,
    group_type: str = CONSUMER,
) -> GroupMember:
    """A new member, or one joining again under its member id (having lost its partitions):
    the old incarnation's partitions are free, and its epochs are never valid again."""
    group = state.group
    if group.protocol_type != group_type:
        # An empty group of another kind (or one that only had offsets) becomes one of this.
        group.protocol_type, group.classic_state = group_type, None
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
    state.add(member)
    state.rebalance_reasons.append("joined")
    return member


def _new_member(group: ConsumerGroup, body: Beat, topics: list[str], now: int) -> GroupMember:
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


def _take_place(
    state: GroupState,
    body: Beat,
    held: GroupMember,
    now: int,
) -> GroupMember:
    """A static member back under a new member id: it takes the place of the member that left
    for now, its target and the partitions it owns, with no rebalance (but for a changed
    subscription)."""
    old_id, topics = held.member_id, sorted(set(body.subscribed_topics or ()))
    # Its row goes before its successor's is added (`write`): the instance id is unique in the
    # group. Its target and owned rows go with it, and `write` stores them anew as the
    # successor's.
    del state.members[old_id]
    state.drop(held)
    member = _new_member(state.group, body, topics, now)
    member.group_instance_id = held.group_instance_id
    state.add(member)
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


def _check_epoch(group_id: str, state: GroupState, member: GroupMember, body: Beat) -> None:
    """The current epoch, or the previous one (its answer may have been lost); either way it
    may not claim a partition it was not given."""
    epoch = body.member_epoch
    current, previous = member.member_epoch, member.previous_member_epoch
    if epoch != current and (epoch != previous or previous == JOIN_EPOCH):
        raise FencedMemberEpoch(
            f"member {member.member_id!r} of group {group_id!r} sent epoch {epoch}; its epoch "
            f"is {current}: rejoin with epoch 0"
        )
    claimed = set(body.owned_partitions or ())
    foreign = sorted(claimed - state.owned_by(member.member_id))
    if foreign:
        topic, partition = foreign[0]
        raise FencedMemberEpoch(
            f"member {member.member_id!r} of group {group_id!r} claims {topic}-{partition}, "
            "which it does not own: rejoin with epoch 0"
        )


def _update(state: GroupState, member: GroupMember, body: Beat) -> None:
    if body.subscribed_topics is not None:
        topics = sorted(set(body.subscribed_topics))
        if topics != member.subscribed_topics:
            member.subscribed_topics = topics
            state.rebalance_reasons.append("subscription changed")


def _release(state: GroupState, member: GroupMember, owned_partitions: Iterable[TP] | None) -> None:
    """Partitions the target moved away that the member no longer lists are free now."""
    if owned_partitions is None:
        return
    still = set(owned_partitions)
    for tp in state.owned_by(member.member_id) - state.target_of(member.member_id) - still:
        del state.owned[tp]
