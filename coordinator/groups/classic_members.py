"""Classic members of a consumer group: a member of Kafka's classic protocol (JoinGroup,
SyncGroup, Heartbeat, LeaveGroup) in a group that has consumer-protocol members, as Kafka 4's
consumer groups take classic members during an upgrade (`groups.classic` sends them here).

The coordinator assigns them, so nobody leads: a join is the member's heartbeat of the consumer
protocol (at its epoch, or a new member's), SyncGroup hands it its share, and its generation is
its member epoch. Partitions move by the consumer protocol's rule: a member gives up what it
no longer lists when it joins again, never by a heartbeat (it may still be using everything it
was given); a heartbeat whose member's epoch moved on answers REBALANCE_IN_PROGRESS, so the
member joins again. The Kafka door only translates these to and from its bytes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from coordinator.core.settings import Settings
from coordinator.groups import consumer, membership
from coordinator.groups.classic_rules import JoinRequest
from coordinator.groups.errors import (
    FencedMemberEpoch,
    IllegalGeneration,
    MemberIdRequired,
    RebalanceInProgress,
    UnknownMemberId,
)
from coordinator.groups.inputs import DEFAULT_REBALANCE_TIMEOUT_MS, JOIN_EPOCH, LEAVE_EPOCH, Beat
from coordinator.groups.models import CLASSIC
from coordinator.groups.schemas import HeartbeatResponse
from coordinator.store import Store


@dataclass(frozen=True, slots=True)
class Joined:
    member_id: str
    generation: int  # the member's epoch
    protocol_name: str  # the assignor it named first


async def _beat(
    db: Store,
    settings: Settings,
    group_id: str,
    body: Beat,
    assignor: str | None,
    client_id: str,
    client_host: str,
) -> HeartbeatResponse:
    return await consumer.heartbeat(
        db, settings, group_id, body, client_id, client_host, protocol=CLASSIC, assignor=assignor
    )


async def join(
    db: Store, settings: Settings, joining: JoinRequest, owned: list[tuple[str, int]]
) -> Joined:
    """JoinGroup: a member it holds at a live epoch beats at that epoch, listing what it owns
    (so what it dropped is given up); any other joins anew. A new member without an id is given
    one first (MemberIdRequired) when it asks for that (KIP-394)."""
    member_id = joining.member_id or f"{joining.client_id}-{uuid.uuid4()}"[:255]
    if not joining.member_id and joining.require_known_member_id:
        raise MemberIdRequired("join again with the member id given", member_id)
    protocol = joining.protocols[0].name

    def beat(epoch: int, owned: list[tuple[str, int]] | None = None) -> Beat:
        return Beat(
            member_id,
            epoch,
            joining.subscribed_topics,
            owned,
            joining.rebalance_timeout_ms,
            joining.session_timeout_ms,
        )

    group_id, client_id, client_host = joining.group_id, joining.client_id, joining.client_host
    known = await membership.member_of(db, group_id, member_id)
    answer = None
    if known is not None and known.member_epoch > 0:
        again = beat(known.member_epoch, owned)
        try:
            answer = await _beat(db, settings, group_id, again, protocol, client_id, client_host)
        except (UnknownMemberId, FencedMemberEpoch):
            answer = None
    if answer is None:
        anew = beat(JOIN_EPOCH)
        answer = await _beat(db, settings, group_id, anew, protocol, client_id, client_host)
    return Joined(member_id, answer.member_epoch, protocol)


async def sync(
    db: Store, group_id: str, member_id: str, generation: int
) -> tuple[str | None, list[tuple[str, int]]]:
    """SyncGroup: the assignor the member named and the partitions it may own now."""
    member = await membership.member_of(db, group_id, member_id)
    if member is None:
        raise UnknownMemberId(f"member {member_id!r} is not in group {group_id!r}")
    if member.member_epoch != generation:
        raise IllegalGeneration(
            f"generation {generation} of member {member_id!r}; its epoch is {member.member_epoch}"
        )
    return member.assignor, [(t, p) for t, p in member.assigned]


async def heartbeat(
    db: Store,
    settings: Settings,
    group_id: str,
    member_id: str,
    generation: int,
    client_id: str,
    client_host: str,
) -> None:
    """Heartbeat: keeps the member; RebalanceInProgress when its epoch moved on."""
    member = await membership.member_of(db, group_id, member_id)
    # `owned_partitions` unset: a heartbeat never gives a partition up.
    # A member the group no longer holds is given the longest rebalance timeout.
    body = Beat(
        member_id,
        generation,
        session_timeout_ms=member.session_timeout_ms if member else None,
        rebalance_timeout_ms=member.rebalance_timeout_ms
        if member
        else DEFAULT_REBALANCE_TIMEOUT_MS,
    )
    assignor = member.assignor if member else None
    answer = await _beat(db, settings, group_id, body, assignor, client_id, client_host)
    if answer.member_epoch != generation:
        raise RebalanceInProgress(f"member {member_id!r} is at epoch {answer.member_epoch} now")


async def leave(
    db: Store, settings: Settings, group_id: str, member_id: str, client_id: str, host: str
) -> None:
    """LeaveGroup: the member leaves, its partitions free at once."""
    body = Beat(member_id, LEAVE_EPOCH)
    await _beat(db, settings, group_id, body, None, client_id, host)
