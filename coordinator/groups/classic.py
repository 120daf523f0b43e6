"""Kafka's classic group protocol, the runtime: each call (JoinGroup, SyncGroup, Heartbeat,
LeaveGroup) locks its group in a unit of work, lets time act on it and runs the call's step of
the state machine (`groups.classic_rules`), writes what the step changed, wakes the requests
parked on the group in this process, and parks a request whose answer waits for the group to
move on.

A group is classic when a Kafka classic client joins it while it has no members; a consumer group
(REST or KIP-848 members) that has members takes classic members into its own assignment
instead (`groups.classic_members`), as Kafka 4 does during an upgrade: the calls here send them
there. A REST heartbeat to a classic group that has members is refused.

Kafka parks a JoinGroup or SyncGroup until the group moves on; here the state is in the store, so
a parked request waits for a wake-up from its own process or looks at the store every `POLL_S`
(another process's change), and whoever finds a phase due completes it, under the group's row
lock: the last member to join, any parked request, any heartbeat, or the sweeper.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.clock import now_ms
from coordinator.core.errors import CoordinatorError
from coordinator.core.metrics import record_limit_refusal
from coordinator.core.settings import Settings
from coordinator.groups import classic_joining, classic_members, classic_rules
from coordinator.groups.classic_rules import (
    EMPTY,
    Assignment,
    JoinAnswer,
    JoinRequest,
    Locked,
    SyncAnswer,
    tick,
)
from coordinator.groups.consumer_protocol import encode_assignment, parse_assignment
from coordinator.groups.errors import (
    GroupIdNotFound,
    GroupMaxSizeReached,
    InconsistentGroupProtocol,
    InvalidSessionTimeout,
    UnknownMemberId,
)
from coordinator.groups.membership import claim_due, is_gone, load, lock_group, write
from coordinator.groups.models import (
    CLASSIC,
    CONSUMER_PROTOCOL,
    SHARE,
    STREAMS,
    ConsumerGroup,
    GroupMember,
)
from coordinator.store import Store

log = logging.getLogger("coordinator.groups")

T = TypeVar("T")
R = TypeVar("R")

# How often a parked request looks at the store for a change another process made (its own
# process wakes it at once).
POLL_S = 0.1


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


class NotClassic(Exception):
    """The group is a consumer group that has members: a classic member joins its assignment
    (`groups.classic_members`), as Kafka 4's consumer groups take classic members."""


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
    step: Callable[[Locked], T],
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
        if group.protocol_type in (SHARE, STREAMS):
            raise GroupIdNotFound(
                f"Group {group_id} is not a classic group (it is a {group.protocol_type} group)."
            )
        state = await load(session, group)
        if group.protocol_type != CLASSIC:
            if any(not is_gone(m, now) for m in state.members.values()):
                raise NotClassic(group_id)
            if not create:
                raise UnknownMemberId(f"group {group_id!r} has no members")
            # An empty group (or one that only had offsets) becomes a classic group.
            group.protocol_type, group.classic_state = CLASSIC, EMPTY
        locked = Locked(state, settings, now)
        tick(locked, keep=keep)
        result: T | None = None
        try:
            result = step(locked)
        except CoordinatorError as error:
            if isinstance(error, GroupMaxSizeReached):
                record_limit_refusal("group_max_size")
            refusal = error
        await write(session, state)
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


async def _park(
    db: Store,
    settings: Settings,
    group_id: str,
    member_id: str,
    group_instance_id: str | None,
    ready: Callable[[ConsumerGroup, GroupMember, list[GroupMember]], R | None],
) -> R:
    """Wait until `ready` has an answer for the member (it raises a refusal), completing the
    group's phase when its deadline passes (any parked request may); a member the group no
    longer holds is told why (`classic_rules.gone`)."""
    try:
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
                if classic_rules.due(group, members, now):
                    await _locked_step(db, settings, group_id, lambda _: None, keep=member_id)
                    continue
                times = [t for t in (group.phase_deadline_ms, group.join_wait_until_ms) if t]
                wait_s = min([POLL_S, *((t - now) / 1000 for t in times if t > now)])
                await _wakeups.wait(waiter, wait_s)
            finally:
                _wakeups.unregister(group_id, waiter)
    except UnknownMemberId:
        _, members = await _look(db, group_id)
        raise classic_rules.gone(group_id, member_id, group_instance_id, members) from None


# -- the calls, for a classic group or for a classic member of a consumer group ------------------


async def join(
    db: Store, settings: Settings, request: JoinRequest, owned: list[tuple[str, int]]
) -> JoinAnswer:
    """A JoinGroup: the member's answer once the join phase it takes part in completes (or at
    once where Kafka answers at once). In a consumer group that has members, the member joins
    its assignment, listing the partitions it owns (`owned`); only a member of Kafka's consumer
    protocol can."""
    _check_session_timeout(settings, request.session_timeout_ms)
    try:
        joined = await _locked_step(
            db,
            settings,
            request.group_id,
            partial(classic_joining.join_step, request=request),
            create=True,
            keep=request.member_id or None,
        )
    except NotClassic:
        if request.protocol_type != CONSUMER_PROTOCOL:
            raise InconsistentGroupProtocol(
                f"group {request.group_id!r} is a consumer group: its classic members speak "
                f"the consumer protocol, not {request.protocol_type!r}"
            ) from None
        member = await classic_members.join(db, settings, request, owned)
        return JoinAnswer(member.member_id, member.generation, member.protocol_name, "", [])
    if isinstance(joined, JoinAnswer):
        return joined
    ready = classic_joining.join_ready
    return await _park(db, settings, request.group_id, joined, request.group_instance_id, ready)


async def sync(
    db: Store,
    settings: Settings,
    group_id: str,
    member_id: str,
    group_instance_id: str | None,
    generation: int,
    protocol_name: str | None,
    assignments: dict[str, bytes],
    protocol_type: str | None = None,
) -> SyncAnswer:
    """A SyncGroup: the member's assignment for `generation` and the group's protocol. The
    leader's carries every member's assignment (a member it leaves out gets an empty one); a
    follower's waits for the leader's. `protocol_type` (SyncGroup v5+) must be the group's. A
    classic member of a consumer group gets the share the coordinator assigned it."""
    given = {member: _assignment(data) for member, data in assignments.items()}
    step = partial(
        classic_rules.sync_step,
        member_id=member_id,
        group_instance_id=group_instance_id,
        generation=generation,
        protocol_name=protocol_name,
        assignments=given,
        protocol_type=protocol_type,
    )
    try:
        synced = await _locked_step(db, settings, group_id, step, keep=member_id)
    except NotClassic:
        if protocol_type is not None and protocol_type != CONSUMER_PROTOCOL:
            raise InconsistentGroupProtocol(
                f"group {group_id!r} is a consumer group: its classic members speak the "
                f"consumer protocol, not {protocol_type!r}"
            ) from None
        assignor, assigned = await classic_members.sync(db, group_id, member_id, generation)
        return SyncAnswer(CONSUMER_PROTOCOL, assignor, encode_assignment(assigned))
    if synced is not None:
        return synced

    def ready(group: ConsumerGroup, member: GroupMember, _: list[GroupMember]) -> SyncAnswer | None:
        return classic_rules.sync_ready(group, member, generation)

    return await _park(db, settings, group_id, member_id, group_instance_id, ready)


def _assignment(data: bytes) -> Assignment:
    """What the leader gave a member, with the partitions it names where they are the consumer
    protocol's (a custom assignor's are opaque bytes to the coordinator)."""
    try:
        return Assignment(data, parse_assignment(data))
    except Exception:
        return Assignment(data, None)


async def heartbeat(
    db: Store,
    settings: Settings,
    group_id: str,
    member_id: str,
    group_instance_id: str | None,
    generation: int,
    client_id: str,
    client_host: str,
) -> None:
    """A classic Heartbeat: the member's session goes on; REBALANCE_IN_PROGRESS while the group
    prepares a rebalance (the member joins again)."""
    step = partial(
        classic_rules.heartbeat_step,
        member_id=member_id,
        group_instance_id=group_instance_id,
        generation=generation,
    )
    try:
        await _locked_step(db, settings, group_id, step, keep=member_id)
    except NotClassic:
        await classic_members.heartbeat(
            db, settings, group_id, member_id, generation, client_id, client_host
        )


async def leave(
    db: Store,
    settings: Settings,
    group_id: str,
    leaving: list[tuple[str, str | None]],
    client_id: str,
    client_host: str,
) -> list[CoordinatorError | None]:
    """A LeaveGroup: each (member id, group instance id) leaves. One answer per member."""
    try:
        step = partial(classic_rules.leave_step, leaving=leaving)
        return await _locked_step(db, settings, group_id, step)
    except NotClassic:
        answers: list[CoordinatorError | None] = []
        for member_id, _ in leaving:
            try:
                await classic_members.leave(
                    db, settings, group_id, member_id, client_id, client_host
                )
                answers.append(None)
            except CoordinatorError as refused:
                answers.append(refused)
        return answers


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
            tick(Locked(state, settings, now))
            removed = bool(state._removed)
            await write(session, state)
            skipped.add(group.group_id)  # once per round
            if (epoch, phase) != (group.group_epoch, group.classic_state) or removed:
                ticked.append(group.group_id)
                _wakeups.wake_after_commit(session, group.group_id)
