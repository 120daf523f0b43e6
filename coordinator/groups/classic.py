"""Kafka's classic group protocol as Kafka's coordinator runs it (GroupMetadataManager and
ClassicGroup in Kafka 4), on the group state `membership` keeps: JoinGroup waits for the members
of the next generation (the barrier), a leader is elected and gets every member's subscription,
SyncGroup carries the leader's assignment to each member; static members (`group.instance.id`)
keep their assignment across restarts within their session timeout.

A group is classic when a Kafka classic client joins it while it has no members; a consumer group
(REST or KIP-848 members) that has members takes classic members into its own assignment
instead (`join` answers None, and the Kafka door joins them through `membership.heartbeat`), as
Kafka 4 does during an upgrade. A REST heartbeat to a classic group that has members is refused.

Kafka parks a JoinGroup or SyncGroup until the group moves on; here the state is in the store, so
a parked request waits for a wake-up from its own process or looks at the store every `POLL_S`
(another process's change), and whoever finds a phase due completes it, under the group's row
lock: the last member to join, any parked request, any heartbeat, or the sweeper. The state
machine (Kafka's names): Empty -> PreparingRebalance -> CompletingRebalance -> Stable, and back to
PreparingRebalance whenever membership or a member's protocols change.

Where this differs from Kafka's broker: a member id the group does not hold (one handed out with
MEMBER_ID_REQUIRED, or one the group removed) joins as a new member, rather than the broker
keeping a list of pending ids; only protocol type "consumer" is taken (the door's choice).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.clock import now_ms
from coordinator.core.errors import CoordinatorError
from coordinator.core.metrics import record_limit_refusal, record_rebalance
from coordinator.core.settings import Settings
from coordinator.groups.errors import (
    FencedInstanceId,
    GroupMaxSizeReached,
    IllegalGeneration,
    InconsistentGroupProtocol,
    InvalidSessionTimeout,
    MemberIdRequired,
    RebalanceInProgress,
    UnknownMemberId,
)
from coordinator.groups.membership import (
    GroupState,
    claim_due,
    is_gone,
    load,
    lock_group,
    remove,
    write,
)
from coordinator.groups.models import CLASSIC, CONSUMER_PROTOCOL, ConsumerGroup, GroupMember
from coordinator.groups.schemas import JOIN_EPOCH
from coordinator.store import Store

log = logging.getLogger("coordinator.groups")

T = TypeVar("T")
R = TypeVar("R")

# Kafka's classic group states.
EMPTY = "Empty"
PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"

# What a member's parked request is waiting for (`GroupMember.awaiting`).
JOIN = "join"
SYNC = "sync"

# How often a parked request looks at the store for a change another process made (its own
# process wakes it at once).
POLL_S = 0.1


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


# -- waking parked requests -----------------------------------------------------------------------


Waiter = tuple[asyncio.AbstractEventLoop, asyncio.Event]


class _Wakeups:
    """Parked requests of this process by group; a committed change wakes them at once. The
    service may run several event loops (tests do), so a wake-up goes to the waiter's own."""

    def __init__(self) -> None:
        self._waiting: defaultdict[str, set[Waiter]] = defaultdict(set)

    def wake(self, group_id: str) -> None:
        for loop, event in list(self._waiting.get(group_id, ())):
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

    def wake_after_commit(self, session: AsyncSession, group_id: str) -> None:
        session.info.setdefault("after_commit", []).append(partial(self.wake, group_id))

    def register(self, group_id: str) -> Waiter:
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        self._waiting[group_id].add(waiter)
        return waiter

    def unregister(self, group_id: str, waiter: Waiter) -> None:
        waiting = self._waiting.get(group_id)
        if waiting is not None:
            waiting.discard(waiter)
            if not waiting:
                del self._waiting[group_id]

    @staticmethod
    async def wait(waiter: Waiter, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await waiter[1].wait()


_wakeups = _Wakeups()


# -- the rules, on the group's state under its row lock -----------------------------------------


@dataclass
class _Locked:
    """A classic group under its row lock: the unit of work's session, the group's state and
    the settings its rules read."""

    session: AsyncSession
    state: GroupState
    settings: Settings
    now: int

    @property
    def group(self) -> ConsumerGroup:
        return self.state.group


def _protocols(member: GroupMember) -> list[tuple[str, bytes]]:
    return [(name, base64.b64decode(data)) for name, data in member.classic_protocols or ()]


def classic_metadata(member: GroupMember, protocol_name: str | None) -> bytes | None:
    """A classic member's metadata for the group's protocol (DescribeGroups shows it)."""
    if member.classic_protocols is None:
        return None
    return dict(_protocols(member)).get(protocol_name or "", b"")


def classic_state(state: GroupState, now: int) -> str | None:
    """A classic group's state by Kafka's name (None for a consumer group)."""
    if not is_classic(state.group):
        return None
    if all(is_gone(m, now) for m in state.members.values()):
        return EMPTY
    return state.group.classic_state or EMPTY


def _stored(protocols: Iterable[Protocol]) -> list[list[str]]:
    return [[p.name, base64.b64encode(p.metadata).decode()] for p in protocols]


def protocol_type_of(group: ConsumerGroup) -> str | None:
    """A classic group's protocol type (its members' metadata is that protocol's); None for a
    group that is not classic."""
    if group.protocol_type != CLASSIC:
        return None
    return group.classic_protocol_type or CONSUMER_PROTOCOL


def _take_protocol_type(locked: _Locked, protocol_type: str) -> None:
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


def is_classic(group: ConsumerGroup) -> bool:
    return group.protocol_type == CLASSIC


def _matches(member: GroupMember, protocols: Iterable[Protocol]) -> bool:
    return _protocols(member) == [(p.name, p.metadata) for p in protocols]


def select_protocol(members: Iterable[GroupMember]) -> str:
    """Kafka's vote: among the protocols every member supports, each member votes for the first
    in its order of preference; the most votes win (ties: the name that sorts first, where
    Kafka takes its hash map's order)."""
    preferences = [[name for name, _ in _protocols(m)] for m in members]
    common = set(preferences[0]).intersection(*preferences[1:])
    votes = Counter(next(name for name in names if name in common) for names in preferences)
    most = max(votes.values())
    return min(name for name, count in votes.items() if count == most)


def _supports(state: GroupState, protocols: Iterable[Protocol], besides: str | None) -> bool:
    """A member may join when one of its protocols is supported by every other member."""
    names = {p.name for p in protocols}
    for member in state.members.values():
        if member.member_id != besides:
            names &= {name for name, _ in _protocols(member)}
    return bool(names)


def _rebalance_timeout(state: GroupState) -> int:
    return max((m.rebalance_timeout_ms for m in state.members.values()), default=0)


def _prepare_rebalance(locked: _Locked, reason: str) -> None:
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


def _rebalance_or_complete(locked: _Locked, reason: str) -> None:
    """Kafka's maybePrepareRebalanceOrCompleteJoin."""
    if locked.group.classic_state != PREPARING:
        _prepare_rebalance(locked, reason)
    _maybe_complete_join(locked)


def _maybe_complete_join(locked: _Locked) -> None:
    """End the join phase when every member joined (and an initial rebalance's wait is over)
    or its deadline passed: dynamic members that did not join are removed, the generation
    rises, a leader that joined is kept or one is elected, the protocol is chosen."""
    group, state, now = locked.group, locked.state, locked.now
    members = list(state.members.values())
    if group.classic_state != PREPARING or not _due(group, members, now):
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
    locked.session.info.setdefault("after_commit", []).append(record_rebalance)


def _due(group: ConsumerGroup, members: Iterable[GroupMember], now: int) -> bool:
    """The group's phase must end now: its deadline passed, or (preparing a rebalance) every
    member joined and an initial rebalance's wait is over."""
    if group.phase_deadline_ms is not None and now >= group.phase_deadline_ms:
        return True
    if group.classic_state != PREPARING or any(m.awaiting != JOIN for m in members):
        return False
    return group.join_wait_until_ms is None or now >= group.join_wait_until_ms


def _remove(locked: _Locked, member_id: str, reason: str) -> None:
    group = locked.group
    remove(locked.session, locked.state, member_id, reason)
    if group.leader_id == member_id:
        rest = sorted(locked.state.members.values(), key=lambda m: (m.joined_ms, m.member_id))
        group.leader_id = rest[0].member_id if rest else None


def _remove_and_rebalance(locked: _Locked, member_id: str, reason: str) -> None:
    """Kafka's removeMemberAndUpdateClassicGroup."""
    _remove(locked, member_id, reason)
    if locked.group.classic_state in (STABLE, COMPLETING):
        _rebalance_or_complete(locked, reason)
    else:
        _maybe_complete_join(locked)


def tick(locked: _Locked, keep: str | None = None) -> None:
    """What time alone does to a classic group: members whose session passed are removed; a
    join phase past its deadline completes; a leader that did not send its SyncGroup within
    the rebalance timeout is removed with the members that sent none (Kafka's pending sync)."""
    now = locked.now
    for member_id, member in sorted(locked.state.members.items()):
        if member_id != keep and is_gone(member, now):
            _remove_and_rebalance(locked, member_id, "session timeout")
    _maybe_complete_join(locked)
    group = locked.group
    if (
        group.classic_state == COMPLETING
        and group.phase_deadline_ms is not None
        and now >= group.phase_deadline_ms
    ):
        late = sorted(m.member_id for m in locked.state.members.values() if m.awaiting != SYNC)
        for member_id in late:
            _remove(locked, member_id, "sent no SyncGroup within the rebalance timeout")
        _rebalance_or_complete(locked, "the leader's assignment did not come in time")


def _validate_member(
    state: GroupState, member_id: str, group_instance_id: str | None
) -> GroupMember:
    """Kafka's validateMember: a static member's instance id must map to this member id
    (FENCED_INSTANCE_ID: another incarnation replaced it), and the member must exist."""
    if group_instance_id is not None:
        holder = _static_member(state, group_instance_id)
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


def _static_member(state: GroupState, group_instance_id: str) -> GroupMember | None:
    for member in state.members.values():
        if member.group_instance_id == group_instance_id:
            return member
    return None


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
                dict(_protocols(m)).get(group.protocol_name or "", b""),
            )
            for m in sorted(generation, key=lambda m: (m.joined_ms, m.member_id))
        ]
        if member_id == group.leader_id
        else [],
    )


def _update(member: GroupMember, request: JoinRequest, deadline_ms: int | None) -> None:
    """The member's JoinGroup: its protocols and timeouts, and it waits for the phase's end
    (not expired meanwhile, as Kafka does not expire a member whose JoinGroup is parked)."""
    member.classic_protocols = _stored(request.protocols)
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


def _add(locked: _Locked, member_id: str, request: JoinRequest) -> GroupMember:
    group, now = locked.group, locked.now
    if len(locked.state.members) >= locked.settings.group_consumer_max_size:
        record_limit_refusal("group_max_size")
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
    locked.session.add(member)
    locked.state.members[member_id] = member
    if group.leader_id is None:
        group.leader_id = member_id
    if group.classic_state == PREPARING and group.join_wait_until_ms is not None:
        # An initial rebalance waits a delay longer for each new member, up to its deadline.
        wait = now + locked.settings.group_initial_rebalance_delay_ms
        group.join_wait_until_ms = min(wait, group.phase_deadline_ms or wait)
    return member


def _join_new(locked: _Locked, request: JoinRequest) -> JoinAnswer | str:
    """Kafka's classicGroupJoinNewMember (an unknown member id): the answer, or the member id
    that waits for the join phase to complete."""
    state = locked.state
    if not _supports(state, request.protocols, besides=None):
        raise InconsistentGroupProtocol(
            f"none of the protocols {[p.name for p in request.protocols]} is supported by every "
            f"member of group {state.group.group_id!r}"
        )
    member_id = f"{request.group_instance_id or request.client_id}-{uuid.uuid4()}"[:255]
    if request.group_instance_id is not None:
        existing = _static_member(state, request.group_instance_id)
        if existing is not None:
            return _replace_static(locked, existing, member_id, request)
    elif request.require_known_member_id:
        raise MemberIdRequired("join again with the member id given", member_id)
    return _join_as_new(locked, member_id, request)


def _join_as_new(locked: _Locked, member_id: str, request: JoinRequest) -> str:
    member = _add(locked, member_id, request)
    _update(member, request, None)
    _rebalance_or_complete(locked, f"member {member_id} joined")
    if member.awaiting == JOIN:
        _update(member, request, locked.group.phase_deadline_ms)
    return member_id


def _replace_static(
    locked: _Locked, old: GroupMember, member_id: str, request: JoinRequest
) -> JoinAnswer | str:
    """A static member back under a new member id: it takes the old one's place (the old id is
    fenced). In a Stable group whose protocol stays it gets the current generation at once and
    keeps its assignment, with no rebalance; otherwise the group rebalances."""
    group, state = locked.group, locked.state
    leader_before = group.leader_id or ""
    was_leader = group.leader_id == old.member_id
    remove(locked.session, state, old.member_id, f"replaced by {member_id} (static member)")
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
    locked.session.info.setdefault("replaced", []).append(member)
    state.members[member_id] = member
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
        _rebalance_or_complete(locked, f"static member {member_id} changed its protocols")
        return member_id
    if group.classic_state == COMPLETING:
        _prepare_rebalance(locked, f"static member {member_id} joined again")
    _update(member, request, group.phase_deadline_ms)
    _maybe_complete_join(locked)
    return member_id


def _join_known(locked: _Locked, request: JoinRequest) -> JoinAnswer | str:
    """Kafka's classicGroupJoinExistingMember: the answer, or the member id that waits."""
    group, state = locked.group, locked.state
    if request.member_id not in state.members and request.group_instance_id is None:
        # An id this group does not hold: one handed out with MEMBER_ID_REQUIRED (Kafka's
        # pending member), or one the group removed; either joins as new.
        if not _supports(state, request.protocols, besides=None):
            raise InconsistentGroupProtocol(
                f"none of the protocols {[p.name for p in request.protocols]} is supported by "
                f"every member of group {group.group_id!r}"
            )
        return _join_as_new(locked, request.member_id, request)
    if not _supports(state, request.protocols, besides=request.member_id):
        raise InconsistentGroupProtocol(
            f"none of the protocols {[p.name for p in request.protocols]} is supported by every "
            f"member of group {group.group_id!r}"
        )
    member = _validate_member(state, request.member_id, request.group_instance_id)
    if group.classic_state == PREPARING:
        _update(member, request, group.phase_deadline_ms)
        _maybe_complete_join(locked)
        return member.member_id
    if group.classic_state in (COMPLETING, STABLE):
        unchanged = _matches(member, request.protocols)
        if unchanged and (group.classic_state == COMPLETING or member.member_id != group.leader_id):
            # Its JoinGroup answer was lost, or a follower joins with nothing new: the current
            # generation, at once.
            return _answer(group, state.members.values(), member.member_id)
        # The leader joining again in a Stable group asks for a rebalance (its topics' metadata
        # changed, which its metadata does not show), as does changed metadata.
        _update(member, request, None)
        _rebalance_or_complete(locked, f"member {member.member_id} joined again")
        if member.awaiting == JOIN:
            _update(member, request, group.phase_deadline_ms)
        return member.member_id
    raise UnknownMemberId(f"group {group.group_id!r} is empty; join again without a member id")


# -- the calls -------------------------------------------------------------------------------------


class NotClassic(Exception):
    """The group is a consumer group that has members: a classic member joins its assignment
    (`membership.heartbeat`), as Kafka 4's consumer groups take classic members."""


def _check_session_timeout(settings: Settings, session_timeout_ms: int) -> None:
    low, high = settings.group_min_session_timeout_ms, settings.group_max_session_timeout_ms
    if not low <= session_timeout_ms <= high:
        raise InvalidSessionTimeout(
            f"session timeout {session_timeout_ms} ms is outside the service's bounds {low}..{high}"
        )


async def _locked_step(
    db: Store,
    settings: Settings,
    group_id: str,
    step: Callable[[_Locked], T],
    *,
    create: bool = False,
    keep: str | None = None,
) -> T:
    """One unit of work on a classic group: lock it (creating it when `create`), let time act
    on it (`tick`), run `step`; a refusal is raised once what changed (expired members, a
    completed phase) is committed, and the group's parked requests in this process are woken.
    NotClassic for a consumer group that has members; UNKNOWN_MEMBER_ID for no group."""
    refusal: CoordinatorError | None = None
    async with db.write() as session:
        now = now_ms()
        group = await lock_group(session, group_id, create=create)
        if group is None:
            raise UnknownMemberId(f"group {group_id!r} does not exist")
        state = await load(session, group)
        if group.protocol_type != CLASSIC:
            if any(not is_gone(m, now) for m in state.members.values()):
                raise NotClassic(group_id)
            if not create:
                raise UnknownMemberId(f"group {group_id!r} has no members")
            # An empty group (or one that only had offsets) becomes a classic group.
            group.protocol_type, group.classic_state = CLASSIC, EMPTY
        locked = _Locked(session, state, settings, now)
        tick(locked, keep=keep)
        result: T | None = None
        try:
            result = step(locked)
        except CoordinatorError as error:
            refusal = error
        await write(session, state)
        # A replaced static member's new row goes in once its old one is gone (the instance id
        # is unique within the group).
        for member in session.info.pop("replaced", ()):
            session.add(member)
        _wakeups.wake_after_commit(session, group_id)
    if refusal is not None:
        raise refusal
    return result  # type: ignore[return-value]


async def _look(db: Store, group_id: str) -> tuple[ConsumerGroup | None, list[GroupMember]]:
    """The group and its members as stored now, for a parked request (no lock): one statement,
    so one snapshot. (Read apart, on Postgres each read sees the commits before it: a group a
    generation ahead of its members, and a parked JoinGroup answered REBALANCE_IN_PROGRESS,
    which Kafka never answers there and franz-go takes as its group session's end.)"""
    async with db.read() as session:
        rows = (
            await session.execute(
                select(ConsumerGroup, GroupMember)
                .outerjoin(GroupMember, GroupMember.group_id == ConsumerGroup.group_id)
                .where(ConsumerGroup.group_id == group_id)
                .execution_options(populate_existing=True)
            )
        ).all()
        if not rows:
            return None, []
        return rows[0][0], [member for _, member in rows if member is not None]


def _gone(
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


async def _park(
    db: Store,
    settings: Settings,
    group_id: str,
    member_id: str,
    ready: Callable[[ConsumerGroup, GroupMember, list[GroupMember]], R | None],
) -> R:
    """Wait until `ready` has an answer for the member (it raises a refusal), completing the
    group's phase when its deadline passes (any parked request may)."""
    while True:
        waiter = _wakeups.register(group_id)
        try:
            group, members = await _look(db, group_id)
            member = next((m for m in members if m.member_id == member_id), None)
            if group is None or member is None:
                raise UnknownMemberId(f"group {group_id!r} removed member {member_id!r}")
            answer = ready(group, member, members)
            if answer is not None:
                return answer
            now = now_ms()
            if _due(group, members, now):
                await _locked_step(db, settings, group_id, lambda _: None, keep=member_id)
                continue
            times = [t for t in (group.phase_deadline_ms, group.join_wait_until_ms) if t]
            wait_s = min([POLL_S, *((t - now) / 1000 for t in times if t > now)])
            await _wakeups.wait(waiter, wait_s)
        finally:
            _wakeups.unregister(group_id, waiter)


async def join(db: Store, settings: Settings, request: JoinRequest) -> JoinAnswer:
    """A JoinGroup: the member's answer once the join phase it takes part in completes (or at
    once where Kafka answers at once). NotClassic for a consumer group that has members."""
    _check_session_timeout(settings, request.session_timeout_ms)

    def step(locked: _Locked) -> JoinAnswer | str:
        _take_protocol_type(locked, request.protocol_type)
        if not request.member_id:
            return _join_new(locked, request)
        return _join_known(locked, request)

    joined = await _locked_step(
        db, settings, request.group_id, step, create=True, keep=request.member_id or None
    )
    if isinstance(joined, JoinAnswer):
        return joined
    member_id = joined

    def ready(
        group: ConsumerGroup, member: GroupMember, members: list[GroupMember]
    ) -> JoinAnswer | None:
        if member.awaiting == JOIN:
            return None
        # Its join phase completed (only that clears JOIN): its generation's answer.
        answer = _answer(group, members, member_id)
        if member.member_epoch != group.group_epoch:
            raise RebalanceInProgress(f"group {group.group_id!r} moved past its generation")
        return answer

    try:
        return await _park(db, settings, request.group_id, member_id, ready)
    except UnknownMemberId:
        _, members = await _look(db, request.group_id)
        raise _gone(request.group_id, member_id, request.group_instance_id, members) from None


async def sync(
    db: Store,
    settings: Settings,
    group_id: str,
    member_id: str,
    group_instance_id: str | None,
    generation: int,
    protocol_name: str | None,
    assignments: dict[str, Assignment],
    protocol_type: str | None = None,
) -> SyncAnswer:
    """A SyncGroup: the member's assignment for `generation` and the group's protocol. The
    leader's carries every member's assignment (a member it leaves out gets an empty one); a
    follower's waits for the leader's. `protocol_type` (SyncGroup v5+) must be the group's."""

    def answer(group: ConsumerGroup, member: GroupMember) -> SyncAnswer:
        return SyncAnswer(
            group.classic_protocol_type or CONSUMER_PROTOCOL,
            group.protocol_name,
            member.classic_assignment or b"",
        )

    def step(locked: _Locked) -> SyncAnswer | None:
        group, state, now = locked.group, locked.state, locked.now
        if not state.members:
            raise UnknownMemberId(f"group {group_id!r} has no members")
        member = _validate_member(state, member_id, group_instance_id)
        _check_generation(group, generation)
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
        return answer(group, member)

    synced = await _locked_step(db, settings, group_id, step, keep=member_id)
    if synced is not None:
        return synced

    def ready(
        group: ConsumerGroup, member: GroupMember, members: list[GroupMember]
    ) -> SyncAnswer | None:
        if group.group_epoch != generation or group.classic_state == PREPARING:
            raise RebalanceInProgress(f"group {group_id!r} is rebalancing: join again")
        if group.classic_state == STABLE:
            return answer(group, member)
        return None

    try:
        return await _park(db, settings, group_id, member_id, ready)
    except UnknownMemberId:
        _, members = await _look(db, group_id)
        raise _gone(group_id, member_id, group_instance_id, members) from None


def _check_generation(group: ConsumerGroup, generation: int) -> None:
    if generation != group.group_epoch:
        raise IllegalGeneration(
            f"group {group.group_id!r} is at generation {group.group_epoch}, not {generation}"
        )


async def heartbeat(
    db: Store,
    settings: Settings,
    group_id: str,
    member_id: str,
    group_instance_id: str | None,
    generation: int,
) -> None:
    """A classic Heartbeat: the member's session goes on; REBALANCE_IN_PROGRESS while the group
    prepares a rebalance (the member joins again)."""

    def step(locked: _Locked) -> None:
        group, now = locked.group, locked.now
        member = _validate_member(locked.state, member_id, group_instance_id)
        _check_generation(group, generation)
        if group.classic_state == EMPTY:
            raise UnknownMemberId(f"group {group_id!r} is empty")
        member.last_heartbeat_ms = now
        member.session_deadline_ms = max(
            member.session_deadline_ms, now + member.session_timeout_ms
        )
        if group.classic_state == PREPARING:
            raise RebalanceInProgress(f"group {group_id!r} is rebalancing: join again")

    await _locked_step(db, settings, group_id, step, keep=member_id)


async def leave(
    db: Store, settings: Settings, group_id: str, leaving: list[tuple[str, str | None]]
) -> list[CoordinatorError | None]:
    """A LeaveGroup: each (member id, group instance id) leaves; an empty member id with an
    instance id removes that static member (an operator's removal). One answer per member."""

    def step(locked: _Locked) -> list[CoordinatorError | None]:
        answers: list[CoordinatorError | None] = []
        left = []
        for member_id, instance_id in leaving:
            try:
                if not member_id:
                    holder = _static_member(locked.state, instance_id) if instance_id else None
                    if holder is None:
                        raise UnknownMemberId(f"no member has group instance id {instance_id!r}")
                    member_id = holder.member_id
                else:
                    _validate_member(locked.state, member_id, instance_id)
            except (UnknownMemberId, FencedInstanceId) as refusal:
                answers.append(refusal)
                continue
            _remove(locked, member_id, "left")
            left.append(member_id)
            answers.append(None)
        if left and locked.group.classic_state in (STABLE, COMPLETING):
            _rebalance_or_complete(locked, f"{', '.join(left)} left")
        elif left:
            _maybe_complete_join(locked)
        return answers

    return await _locked_step(db, settings, group_id, step)


async def sweep(db: Store, settings: Settings) -> list[str]:
    """The sweeper's part: classic groups a member's session or a phase's deadline is due in,
    each claimed by `membership.claim_due` and ticked. Returns the groups that moved."""
    ticked: list[str] = []
    skipped: set[str] = set()
    while True:
        async with db.write() as session:
            now = now_ms()
            late = (
                select(GroupMember.group_id)
                .where(GroupMember.session_deadline_ms < now)
                .scalar_subquery()
            )
            # An initial rebalance's wait is ended by its members' parked JoinGroups; the
            # sweeper ends what no request is left to end: deadlines and sessions.
            due = (ConsumerGroup.protocol_type == CLASSIC) & (
                (ConsumerGroup.phase_deadline_ms < now) | ConsumerGroup.group_id.in_(late)
            )
            group = await claim_due(session, due, skipped)
            if group is None:
                return ticked
            state = await load(session, group)
            epoch, phase = group.group_epoch, group.classic_state
            tick(_Locked(session, state, settings, now))
            await write(session, state)
            skipped.add(group.group_id)  # once per round
            if (epoch, phase) != (group.group_epoch, group.classic_state) or state._removed:
                ticked.append(group.group_id)
                _wakeups.wake_after_commit(session, group.group_id)
