"""Kafka's classic JoinGroup, the state machine's join steps (Kafka's classicGroupJoinNewMember and
classicGroupJoinExistingMember): a new member, a known one joining again, a static member back
under a new member id; each changes the locked group (`classic_rules.Locked`) and answers at
once, or names the member that waits for the join phase to complete. No I/O: the runtime is
`groups.classic`."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from coordinator.groups.classic_rules import (
    COMPLETING,
    JOIN,
    PREPARING,
    STABLE,
    JoinAnswer,
    JoinedMember,
    JoinRequest,
    Locked,
    matches,
    maybe_complete_join,
    prepare_rebalance,
    protocols_of,
    rebalance_or_complete,
    select_protocol,
    static_member,
    stored,
    supports,
    validate_member,
)
from coordinator.groups.errors import (
    GroupMaxSizeReached,
    InconsistentGroupProtocol,
    MemberIdRequired,
    RebalanceInProgress,
    UnknownMemberId,
)
from coordinator.groups.inputs import JOIN_EPOCH
from coordinator.groups.membership import remove
from coordinator.groups.models import CLASSIC, CONSUMER_PROTOCOL, ConsumerGroup, GroupMember


def _take_protocol_type(locked: Locked, protocol_type: str) -> None:
    """A joining member's protocol type: an empty group takes it, as Kafka's does; a group with
    members runs theirs, and any other is INCONSISTENT_GROUP_PROTOCOL."""
    group = locked.group
    if not locked.state.members:
        group.classic_protocol_type = protocol_type
        return
    current = group.classic_protocol_type or CONSUMER_PROTOCOL
    if protocol_type != current:
        raise InconsistentGroupProtocol(
            f"group {group.group_id!r} runs protocol type {current!r}, not {protocol_type!r}"
        )


def _answer(group: ConsumerGroup, members: Iterable[GroupMember], member_id: str) -> JoinAnswer:
    """A JoinGroup's answer in the group's current generation: the leader gets every member of
    the generation with its metadata for the chosen protocol."""
    generation = [m for m in members if m.member_epoch == group.group_epoch]
    return JoinAnswer(
        protocol_type=group.classic_protocol_type or CONSUMER_PROTOCOL,
        member_id=member_id,
        generation=group.group_epoch,
        protocol_name=group.protocol_name,
        leader=group.leader_id or "",
        members=[
            JoinedMember(
                m.member_id,
                m.group_instance_id,
                dict(protocols_of(m)).get(group.protocol_name or "", b""),
            )
            for m in sorted(generation, key=lambda m: (m.joined_ms, m.member_id))
        ]
        if member_id == group.leader_id
        else [],
    )


def _update(member: GroupMember, request: JoinRequest, deadline_ms: int | None) -> None:
    """The member's JoinGroup: its protocols and timeouts, and it waits for the phase's end
    (not expired meanwhile, as Kafka does not expire a member whose JoinGroup is parked)."""
    member.classic_protocols = stored(request.protocols)
    member.subscribed_topics = sorted(set(request.subscribed_topics))
    member.session_timeout_ms = request.session_timeout_ms
    member.rebalance_timeout_ms = request.rebalance_timeout_ms
    member.client_id = request.client_id
    member.client_host = request.client_host
    member.awaiting = JOIN
    if deadline_ms is not None:
        member.session_deadline_ms = max(
            member.session_deadline_ms, deadline_ms + member.session_timeout_ms
        )


def _add(locked: Locked, member_id: str, request: JoinRequest) -> GroupMember:
    group, now = locked.group, locked.now
    if len(locked.state.members) >= locked.settings.group_consumer_max_size:
        raise GroupMaxSizeReached(
            f"group {group.group_id!r} has {len(locked.state.members)} members, its most "
            "(COORDINATOR_GROUP_CONSUMER_MAX_SIZE)"
        )
    member = GroupMember(
        group_id=group.group_id,
        member_id=member_id,
        member_epoch=JOIN_EPOCH,
        previous_member_epoch=JOIN_EPOCH,
        client_id=request.client_id,
        client_host=request.client_host,
        subscribed_topics=[],
        assigned=[],
        rebalance_timeout_ms=request.rebalance_timeout_ms,
        session_timeout_ms=request.session_timeout_ms,
        joined_ms=now,
        last_heartbeat_ms=now,
        session_deadline_ms=now + request.session_timeout_ms,
        revoke_deadline_ms=None,
        protocol=CLASSIC,
        group_instance_id=request.group_instance_id,
    )
    locked.state.add(member)
    if group.leader_id is None:
        group.leader_id = member_id
    if group.classic_state == PREPARING and group.join_wait_until_ms is not None:
        # An initial rebalance waits a delay longer for each new member, up to its deadline.
        wait = now + locked.settings.group_initial_rebalance_delay_ms
        group.join_wait_until_ms = min(wait, group.phase_deadline_ms or wait)
    return member


def _join_new(locked: Locked, request: JoinRequest) -> JoinAnswer | str:
    """Kafka's classicGroupJoinNewMember (an unknown member id): the answer, or the member id
    that waits for the join phase to complete."""
    state = locked.state
    if not supports(state, request.protocols, besides=None):
        raise InconsistentGroupProtocol(
            f"none of the protocols {[p.name for p in request.protocols]} is supported by every "
            f"member of group {state.group.group_id!r}"
        )
    member_id = f"{request.group_instance_id or request.client_id}-{uuid.uuid4()}"[:255]
    if request.group_instance_id is not None:
        existing = static_member(state, request.group_instance_id)
        if existing is not None:
            return _replace_static(locked, existing, member_id, request)
    elif request.require_known_member_id:
        raise MemberIdRequired("join again with the member id given", member_id)
    return _join_as_new(locked, member_id, request)


def _join_as_new(locked: Locked, member_id: str, request: JoinRequest) -> str:
    member = _add(locked, member_id, request)
    _update(member, request, None)
    rebalance_or_complete(locked, f"member {member_id} joined")
    if member.awaiting == JOIN:
        _update(member, request, locked.group.phase_deadline_ms)
    return member_id


def _replace_static(
    locked: Locked, old: GroupMember, member_id: str, request: JoinRequest
) -> JoinAnswer | str:
    """A static member back under a new member id: it takes the old one's place (the old id is
    fenced). In a Stable group whose protocol stays it gets the current generation at once and
    keeps its assignment, with no rebalance; otherwise the group rebalances."""
    group, state = locked.group, locked.state
    leader_before = group.leader_id or ""
    was_leader = group.leader_id == old.member_id
    remove(state, old.member_id, f"replaced by {member_id} (static member)")
    state.rebalance_reasons.pop()
    member = GroupMember(
        group_id=group.group_id,
        member_id=member_id,
        member_epoch=old.member_epoch,
        previous_member_epoch=old.previous_member_epoch,
        client_id=request.client_id,
        client_host=request.client_host,
        subscribed_topics=old.subscribed_topics,
        assigned=old.assigned,
        rebalance_timeout_ms=old.rebalance_timeout_ms,
        session_timeout_ms=old.session_timeout_ms,
        joined_ms=old.joined_ms,
        last_heartbeat_ms=locked.now,
        session_deadline_ms=locked.now + request.session_timeout_ms,
        revoke_deadline_ms=None,
        protocol=CLASSIC,
        assignor=old.assignor,
        group_instance_id=old.group_instance_id,
        classic_protocols=old.classic_protocols,
        classic_assignment=old.classic_assignment,
    )
    # Added once the old row is gone (`membership.write`): the instance id is unique in the group.
    state.add(member)
    if was_leader:
        group.leader_id = member_id
    if group.classic_state == STABLE:
        protocol_before = group.protocol_name
        _update(member, request, None)
        if select_protocol(state.members.values()) == protocol_before:
            member.awaiting = None
            member.session_deadline_ms = locked.now + member.session_timeout_ms
            # Kafka answers a follower's shape (the old leader id, no members) below JoinGroup
            # v9, which this listener serves: the member syncs and gets its assignment back.
            return JoinAnswer(
                member_id=member_id,
                generation=group.group_epoch,
                protocol_name=group.protocol_name,
                leader=leader_before if was_leader else group.leader_id or "",
                members=[],
            )
        rebalance_or_complete(locked, f"static member {member_id} changed its protocols")
        return member_id
    if group.classic_state == COMPLETING:
        prepare_rebalance(locked, f"static member {member_id} joined again")
    _update(member, request, group.phase_deadline_ms)
    maybe_complete_join(locked)
    return member_id


def _join_known(locked: Locked, request: JoinRequest) -> JoinAnswer | str:
    """Kafka's classicGroupJoinExistingMember: the answer, or the member id that waits."""
    group, state = locked.group, locked.state
    if request.member_id not in state.members and request.group_instance_id is None:
        # An id this group does not hold: one handed out with MEMBER_ID_REQUIRED (Kafka's
        # pending member), or one the group removed; either joins as new.
        if not supports(state, request.protocols, besides=None):
            raise InconsistentGroupProtocol(
                f"none of the protocols {[p.name for p in request.protocols]} is supported by "
                f"every member of group {group.group_id!r}"
            )
        return _join_as_new(locked, request.member_id, request)
    if not supports(state, request.protocols, besides=request.member_id):
        raise InconsistentGroupProtocol(
            f"none of the protocols {[p.name for p in request.protocols]} is supported by every "
            f"member of group {group.group_id!r}"
        )
    member = validate_member(state, request.member_id, request.group_instance_id)
    if group.classic_state == PREPARING:
        _update(member, request, group.phase_deadline_ms)
        maybe_complete_join(locked)
        return member.member_id
    if group.classic_state in (COMPLETING, STABLE):
        unchanged = matches(member, request.protocols)
        if unchanged and (group.classic_state == COMPLETING or member.member_id != group.leader_id):
            # Its JoinGroup answer was lost, or a follower joins with nothing new: the current
            # generation, at once.
            return _answer(group, state.members.values(), member.member_id)
        # The leader joining again in a Stable group asks for a rebalance (its topics' metadata
        # changed, which its metadata does not show), as does changed metadata.
        _update(member, request, None)
        rebalance_or_complete(locked, f"member {member.member_id} joined again")
        if member.awaiting == JOIN:
            _update(member, request, group.phase_deadline_ms)
        return member.member_id
    raise UnknownMemberId(f"group {group.group_id!r} is empty; join again without a member id")


def join_step(locked: Locked, request: JoinRequest) -> JoinAnswer | str:
    """A JoinGroup: the answer at once, or the member id that waits for the join phase."""
    _take_protocol_type(locked, request.protocol_type)
    if not request.member_id:
        return _join_new(locked, request)
    return _join_known(locked, request)


def join_ready(
    group: ConsumerGroup, member: GroupMember, members: list[GroupMember]
) -> JoinAnswer | None:
    """A parked JoinGroup's answer, once its join phase completed (only that clears JOIN)."""
    if member.awaiting == JOIN:
        return None
    answer = _answer(group, members, member.member_id)
    if member.member_epoch != group.group_epoch:
        raise RebalanceInProgress(f"group {group.group_id!r} moved past its generation")
    return answer
