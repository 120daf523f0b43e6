"""Kafka's classic group protocol as Kafka's coordinator runs it (GroupMetadataManager and
ClassicGroup in Kafka 4): the state machine. JoinGroup waits for the members of the next
generation (the barrier), a leader is elected and gets every member's subscription, SyncGroup
carries the leader's assignment to each member; static members (`group.instance.id`) keep their
assignment across restarts within their session timeout. The state machine (Kafka's names):
Empty -> PreparingRebalance -> CompletingRebalance -> Stable, and back to PreparingRebalance
whenever membership or a member's protocols change.

Each call is a step (`sync_step`, `heartbeat_step`, `leave_step`; a join's are
`classic_joining`'s) on the group locked with its members (`Locked`): it changes the group's
state, the rows it adds and drops included, and answers, or raises the refusal; it does no I/O.
`groups.classic` is the runtime that locks, writes, parks and wakes (Kafka's split:
GroupMetadataManager under the CoordinatorRuntime).

Where this differs from Kafka's broker: a member id the group does not hold (one handed out with
MEMBER_ID_REQUIRED, or one the group removed) joins as a new member, rather than the broker
keeping a list of pending ids.
"""

from __future__ import annotations

import base64
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from coordinator.core.errors import CoordinatorError
from coordinator.core.settings import Settings
from coordinator.groups.errors import (
    FencedInstanceId,
    IllegalGeneration,
    InconsistentGroupProtocol,
    RebalanceInProgress,
    UnknownMemberId,
)
from coordinator.groups.membership import GroupState, is_gone, remove
from coordinator.groups.models import CLASSIC, CONSUMER_PROTOCOL, ConsumerGroup, GroupMember

log = logging.getLogger("coordinator.groups")

# Kafka's classic group states.
EMPTY = "Empty"
PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"

# What a member's parked request is waiting for (`GroupMember.awaiting`).
JOIN = "join"
SYNC = "sync"


@dataclass(frozen=True)
class Protocol:
    name: str
    metadata: bytes


@dataclass(frozen=True)
class JoinRequest:
    group_id: str
    member_id: str  # "" for a member that has none yet
    group_instance_id: str | None
    protocols: tuple[Protocol, ...]  # in the member's order of preference
    subscribed_topics: list[str]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str
    client_host: str
    # JoinGroup v4+ (KIP-394): a new dynamic member is given its id first, and joins again.
    require_known_member_id: bool
    # The members' protocol type: Kafka's consumer protocol, or another kept opaque.
    protocol_type: str = CONSUMER_PROTOCOL


@dataclass(frozen=True)
class JoinedMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes  # its metadata for the group's protocol


@dataclass(frozen=True)
class JoinAnswer:
    member_id: str
    generation: int
    protocol_name: str | None
    leader: str
    members: list[JoinedMember]  # the leader's answer only
    protocol_type: str = CONSUMER_PROTOCOL


@dataclass(frozen=True)
class SyncAnswer:
    protocol_type: str
    protocol_name: str | None
    assignment: bytes


@dataclass(frozen=True)
class Assignment:
    """What the leader assigned one member: the bytes it is handed, and the partitions they
    name where the door could read them (the consumer protocol's), for descriptions."""

    data: bytes
    partitions: list[tuple[str, int]] | None


# -- the rules, on the group's state under its row lock -----------------------------------------


@dataclass
class Locked:
    """A classic group under its row lock: the group's state (what the rules change, and the
    rows they add and drop, which the runtime then writes) and the settings its rules read."""

    state: GroupState
    settings: Settings
    now: int

    @property
    def group(self) -> ConsumerGroup:
        return self.state.group


def protocols_of(member: GroupMember) -> list[tuple[str, bytes]]:
    return [(name, base64.b64decode(data)) for name, data in member.classic_protocols or ()]


def classic_metadata(member: GroupMember, protocol_name: str | None) -> bytes | None:
    """A classic member's metadata for the group's protocol (DescribeGroups shows it)."""
    if member.classic_protocols is None:
        return None
    return dict(protocols_of(member)).get(protocol_name or "", b"")


def classic_state(state: GroupState, now: int) -> str | None:
    """A classic group's state by Kafka's name (None for a consumer group)."""
    if not is_classic(state.group):
        return None
    if all(is_gone(m, now) for m in state.members.values()):
        return EMPTY
    return state.group.classic_state or EMPTY


def stored(protocols: Iterable[Protocol]) -> list[list[str]]:
    return [[p.name, base64.b64encode(p.metadata).decode()] for p in protocols]


def protocol_type_of(group: ConsumerGroup) -> str | None:
    """A classic group's protocol type (its members' metadata is that protocol's); None for a
    group that is not classic."""
    if group.protocol_type != CLASSIC:
        return None
    return group.classic_protocol_type or CONSUMER_PROTOCOL


def is_classic(group: ConsumerGroup) -> bool:
    return group.protocol_type == CLASSIC


def matches(member: GroupMember, protocols: Iterable[Protocol]) -> bool:
    return protocols_of(member) == [(p.name, p.metadata) for p in protocols]


def select_protocol(members: Iterable[GroupMember]) -> str:
    """Kafka's vote: among the protocols every member supports, each member votes for the first
    in its order of preference; the most votes win (ties: the name that sorts first, where
    Kafka takes its hash map's order)."""
    preferences = [[name for name, _ in protocols_of(m)] for m in members]
    common = set(preferences[0]).intersection(*preferences[1:])
    votes = Counter(next(name for name in names if name in common) for names in preferences)
    most = max(votes.values())
    return min(name for name, count in votes.items() if count == most)


def supports(state: GroupState, protocols: Iterable[Protocol], besides: str | None) -> bool:
    """A member may join when one of its protocols is supported by every other member."""
    names = {p.name for p in protocols}
    for member in state.members.values():
        if member.member_id != besides:
            names &= {name for name, _ in protocols_of(member)}
    return bool(names)


def _rebalance_timeout(state: GroupState) -> int:
    return max((m.rebalance_timeout_ms for m in state.members.values()), default=0)


def prepare_rebalance(locked: Locked, reason: str) -> None:
    """To PreparingRebalance: every member must join again. An empty group's first rebalance
    waits `group_initial_rebalance_delay_ms` for more members (Kafka's initial delay)."""
    group, now = locked.group, locked.now
    if group.classic_state == COMPLETING:
        # SyncGroups parked for this generation answer REBALANCE_IN_PROGRESS (they see it).
        for member in locked.state.members.values():
            if member.awaiting == SYNC:
                member.awaiting = None
    timeout = _rebalance_timeout(locked.state)
    if group.classic_state in (None, EMPTY):
        delay = locked.settings.group_initial_rebalance_delay_ms
        group.join_wait_until_ms = now + delay
        group.phase_deadline_ms = now + max(timeout, delay)
    else:
        group.join_wait_until_ms = None
        group.phase_deadline_ms = now + timeout
    group.classic_state = PREPARING
    group.updated_ms = now
    log.info("group %r: preparing to rebalance (%s)", group.group_id, reason)


def rebalance_or_complete(locked: Locked, reason: str) -> None:
    """Kafka's maybePrepareRebalanceOrCompleteJoin."""
    if locked.group.classic_state != PREPARING:
        prepare_rebalance(locked, reason)
    maybe_complete_join(locked)


def maybe_complete_join(locked: Locked) -> None:
    """End the join phase when every member joined (and an initial rebalance's wait is over)
    or its deadline passed: dynamic members that did not join are removed, the generation
    rises, a leader that joined is kept or one is elected, the protocol is chosen."""
    group, state, now = locked.group, locked.state, locked.now
    members = list(state.members.values())
    if group.classic_state != PREPARING or not due(group, members, now):
        return
    joined = [m for m in members if m.awaiting == JOIN]
    for member in members:
        if member.awaiting != JOIN and member.group_instance_id is None:
            _remove(locked, member.member_id, "did not join the rebalance in time")
    if not joined and state.members:
        # Only static members are left and none joined: wait again for them (or their session).
        group.phase_deadline_ms = now + _rebalance_timeout(state)
        return
    group.group_epoch += 1
    group.join_wait_until_ms = None
    group.updated_ms = now
    if not state.members:
        group.classic_state, group.leader_id, group.protocol_name = EMPTY, None, None
        group.phase_deadline_ms = None
        log.info("group %r: generation %d is empty", group.group_id, group.group_epoch)
        return
    leader = state.members.get(group.leader_id or "")
    if leader is None or leader.awaiting != JOIN:
        group.leader_id = min(joined, key=lambda m: (m.joined_ms, m.member_id)).member_id
    group.protocol_name = select_protocol(state.members.values())
    group.classic_state = COMPLETING
    # The leader's SyncGroup is due within the rebalance timeout (Kafka's pending sync).
    group.phase_deadline_ms = now + _rebalance_timeout(state)
    for member in state.members.values():
        member.previous_member_epoch = member.member_epoch
        member.member_epoch = group.group_epoch
        member.awaiting = None
        member.assignor = group.protocol_name
        member.classic_assignment = None
        member.assigned = []
        member.session_deadline_ms = now + member.session_timeout_ms
    log.info(
        "group %r: generation %d with %d member(s), leader %s, protocol %s",
        group.group_id,
        group.group_epoch,
        len(state.members),
        group.leader_id,
        group.protocol_name,
    )
    locked.state.rebalances += 1


def due(group: ConsumerGroup, members: Iterable[GroupMember], now: int) -> bool:
    """The group's phase must end now: its deadline passed, or (preparing a rebalance) every
    member joined and an initial rebalance's wait is over."""
    if group.phase_deadline_ms is not None and now >= group.phase_deadline_ms:
        return True
    if group.classic_state != PREPARING or any(m.awaiting != JOIN for m in members):
        return False
    return group.join_wait_until_ms is None or now >= group.join_wait_until_ms


def _remove(locked: Locked, member_id: str, reason: str) -> None:
    group = locked.group
    remove(locked.state, member_id, reason)
    if group.leader_id == member_id:
        rest = sorted(locked.state.members.values(), key=lambda m: (m.joined_ms, m.member_id))
        group.leader_id = rest[0].member_id if rest else None


def _remove_and_rebalance(locked: Locked, member_id: str, reason: str) -> None:
    """Kafka's removeMemberAndUpdateClassicGroup."""
    _remove(locked, member_id, reason)
    if locked.group.classic_state in (STABLE, COMPLETING):
        rebalance_or_complete(locked, reason)
    else:
        maybe_complete_join(locked)


def tick(locked: Locked, keep: str | None = None) -> None:
    """What time alone does to a classic group: members whose session passed are removed; a
    join phase past its deadline completes; a leader that did not send its SyncGroup within
    the rebalance timeout is removed with the members that sent none (Kafka's pending sync)."""
    now = locked.now
    for member_id, member in sorted(locked.state.members.items()):
        if member_id != keep and is_gone(member, now):
            _remove_and_rebalance(locked, member_id, "session timeout")
    maybe_complete_join(locked)
    group = locked.group
    if (
        group.classic_state == COMPLETING
        and group.phase_deadline_ms is not None
        and now >= group.phase_deadline_ms
    ):
        late = sorted(m.member_id for m in locked.state.members.values() if m.awaiting != SYNC)
        for member_id in late:
            _remove(locked, member_id, "sent no SyncGroup within the rebalance timeout")
        rebalance_or_complete(locked, "the leader's assignment did not come in time")


def validate_member(
    state: GroupState, member_id: str, group_instance_id: str | None
) -> GroupMember:
    """Kafka's validateMember: a static member's instance id must map to this member id
    (FENCED_INSTANCE_ID: another incarnation replaced it), and the member must exist."""
    if group_instance_id is not None:
        holder = static_member(state, group_instance_id)
        if holder is None:
            raise UnknownMemberId(f"no member has group instance id {group_instance_id!r}")
        if holder.member_id != member_id:
            raise FencedInstanceId(
                f"group instance id {group_instance_id!r} is member {holder.member_id!r} now; "
                f"{member_id!r} was replaced by a newer instance"
            )
    member = state.members.get(member_id)
    if member is None:
        raise UnknownMemberId(
            f"group {state.group.group_id!r} has no member {member_id!r}; join again"
        )
    return member


def static_member(state: GroupState, group_instance_id: str) -> GroupMember | None:
    for member in state.members.values():
        if member.group_instance_id == group_instance_id:
            return member
    return None


# -- the calls' steps: each a transition of the locked group, answered ----------------------------


def sync_answer(group: ConsumerGroup, member: GroupMember) -> SyncAnswer:
    return SyncAnswer(
        group.classic_protocol_type or CONSUMER_PROTOCOL,
        group.protocol_name,
        member.classic_assignment or b"",
    )


def sync_step(
    locked: Locked,
    member_id: str,
    group_instance_id: str | None,
    generation: int,
    protocol_name: str | None,
    assignments: dict[str, Assignment],
    protocol_type: str | None,
) -> SyncAnswer | None:
    """A SyncGroup: the answer at once (the leader's, which assigns; a follower's once it is
    assigned), or None for a follower that waits for the leader's."""
    group, state, now = locked.group, locked.state, locked.now
    group_id = group.group_id
    if not state.members:
        raise UnknownMemberId(f"group {group_id!r} has no members")
    member = validate_member(state, member_id, group_instance_id)
    check_generation(group, generation)
    runs = group.classic_protocol_type or CONSUMER_PROTOCOL
    if protocol_type is not None and protocol_type != runs:
        raise InconsistentGroupProtocol(
            f"group {group_id!r} runs protocol type {runs!r}, not {protocol_type!r}"
        )
    if protocol_name is not None and protocol_name != group.protocol_name:
        raise InconsistentGroupProtocol(
            f"group {group_id!r} runs protocol {group.protocol_name!r}, not {protocol_name!r}"
        )
    if group.classic_state == PREPARING:
        raise RebalanceInProgress(f"group {group_id!r} is rebalancing: join again")
    if group.classic_state == COMPLETING and member_id == group.leader_id:
        for each in state.members.values():
            given = assignments.get(each.member_id, Assignment(b"", []))
            each.classic_assignment = given.data
            each.assigned = [[t, p] for t, p in sorted(given.partitions or ())]
            each.awaiting = None
            each.last_heartbeat_ms = now
            each.session_deadline_ms = now + each.session_timeout_ms
        group.classic_state = STABLE
        group.assignment_epoch = group.group_epoch
        group.phase_deadline_ms = None
        group.updated_ms = now
        log.info("group %r: generation %d assigned by its leader", group_id, group.group_epoch)
    elif group.classic_state == COMPLETING:
        member.awaiting = SYNC
        return None
    return sync_answer(group, member)


def sync_ready(group: ConsumerGroup, member: GroupMember, generation: int) -> SyncAnswer | None:
    """A parked SyncGroup's answer, once its leader assigned the generation."""
    if group.group_epoch != generation or group.classic_state == PREPARING:
        raise RebalanceInProgress(f"group {group.group_id!r} is rebalancing: join again")
    if group.classic_state == STABLE:
        return sync_answer(group, member)
    return None


def check_generation(group: ConsumerGroup, generation: int) -> None:
    if generation != group.group_epoch:
        raise IllegalGeneration(
            f"group {group.group_id!r} is at generation {group.group_epoch}, not {generation}"
        )


def heartbeat_step(
    locked: Locked, member_id: str, group_instance_id: str | None, generation: int
) -> None:
    """A classic Heartbeat: the member's session goes on; REBALANCE_IN_PROGRESS while the group
    prepares a rebalance (the member joins again)."""
    group, now = locked.group, locked.now
    member = validate_member(locked.state, member_id, group_instance_id)
    check_generation(group, generation)
    if group.classic_state == EMPTY:
        raise UnknownMemberId(f"group {group.group_id!r} is empty")
    member.last_heartbeat_ms = now
    member.session_deadline_ms = max(member.session_deadline_ms, now + member.session_timeout_ms)
    if group.classic_state == PREPARING:
        raise RebalanceInProgress(f"group {group.group_id!r} is rebalancing: join again")


def leave_step(
    locked: Locked, leaving: list[tuple[str, str | None]]
) -> list[CoordinatorError | None]:
    """A LeaveGroup: each (member id, group instance id) leaves; an empty member id with an
    instance id removes that static member (an operator's removal). One answer per member."""
    answers: list[CoordinatorError | None] = []
    left = []
    for member_id, instance_id in leaving:
        try:
            if not member_id:
                holder = static_member(locked.state, instance_id) if instance_id else None
                if holder is None:
                    raise UnknownMemberId(f"no member has group instance id {instance_id!r}")
                member_id = holder.member_id
            else:
                validate_member(locked.state, member_id, instance_id)
        except (UnknownMemberId, FencedInstanceId) as refusal:
            answers.append(refusal)
            continue
        _remove(locked, member_id, "left")
        left.append(member_id)
        answers.append(None)
    if left and locked.group.classic_state in (STABLE, COMPLETING):
        rebalance_or_complete(locked, f"{', '.join(left)} left")
    elif left:
        maybe_complete_join(locked)
    return answers


def gone(
    group_id: str, member_id: str, group_instance_id: str | None, members: list[GroupMember]
) -> CoordinatorError:
    """Why a parked member is no longer in the group: replaced by a newer static instance, or
    removed."""
    if group_instance_id is not None:
        holder = next((m for m in members if m.group_instance_id == group_instance_id), None)
        if holder is not None:
            return FencedInstanceId(
                f"group instance id {group_instance_id!r} is member {holder.member_id!r} now"
            )
    return UnknownMemberId(f"group {group_id!r} removed member {member_id!r}; join again")
