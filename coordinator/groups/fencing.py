"""The one rule for who may commit a group's offsets (docs/pages/http-api.md; KIP-447 for the
transactional commit), called by the plain commit, by the transactional one
(AddOffsets/TxnOffsetCommit), and by any other front door that commits offsets.

- With member identity: the member must be in the group (else UNKNOWN_MEMBER_ID), and must own
  every partition committed, granted at or before the epoch it sends, which may not be newer than
  its current epoch (else FENCED_MEMBER_EPOCH). An epoch older than the current one is accepted
  for a partition the member already owned at that epoch (as KIP-1251 has it): a commit sent just
  before a heartbeat raised the epoch is not a zombie's, since ownership only passes to another
  member after this one gave the partition up or left.
- In a classic group (Kafka's classic protocol, where a leader assigns and the coordinator does
  not know who owns what), as Kafka's ClassicGroup checks it: the member and the group's current
  generation (else ILLEGAL_GENERATION); a plain commit while the group waits for its leader's
  assignment is REBALANCE_IN_PROGRESS.
- Without identity, plain (a consumer that `assign`s, an operator): accepted only while the group
  has no members, else UNKNOWN_MEMBER_ID, as Kafka does.
- Without identity, transactional (a Spark job's driver; Kafka's TxnOffsetCommit v0-v2, which
  carry none): accepted whatever the group's members, as Kafka exempts it from the member check:
  the producer's epoch fences it (a zombie's transaction cannot commit).

The check locks the group row (FOR SHARE: commits do not wait for each other, heartbeats wait for
them), so ownership cannot change before the commit's unit of work ends. A transactional commit is
checked when its offsets join the transaction, as Kafka checks TxnOffsetCommit: EndTxn then applies
them without asking again. That is safe because a new owner reads committed offsets with
`require_stable`, which waits while a transaction still holds pending offsets for its partitions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.clock import now_ms
from coordinator.groups.errors import (
    FencedMemberEpoch,
    GroupIdNotFound,
    IllegalGeneration,
    RebalanceInProgress,
    StaleMemberEpoch,
    UnknownMemberId,
)
from coordinator.groups.membership import Deadlines, is_gone, lock_group
from coordinator.groups.models import CLASSIC, SHARE, STREAMS, GroupMember, GroupOwnedPartition
from coordinator.store.sql import pairs_in


async def check_offset_commit(
    session: AsyncSession,
    group_id: str,
    member_id: str | None,
    member_epoch: int | None,
    partitions: Iterable[tuple[str, int]],
    *,
    transactional: bool = False,
) -> None:
    """Raise unless this caller may commit offsets of `partitions` for the group now. Locks the
    group row (creating the group for a commit without identity); call it after the locks of a
    transactional id and before any partition's."""
    now = now_ms()
    group = await lock_group(session, group_id, create=member_id is None, share=True)
    if group is not None and group.protocol_type == SHARE:
        raise GroupIdNotFound(
            f"Group {group_id} is a share group: its records are acknowledged, not committed."
        )
    if member_id is None or member_epoch is None:
        assert group is not None
        if transactional:
            return
        members = (
            await session.scalars(select(GroupMember).where(GroupMember.group_id == group_id))
        ).all()
        live = sorted(m.member_id for m in members if not is_gone(m, now))
        if live:
            raise UnknownMemberId(
                f"group {group_id!r} has {len(live)} member(s); only its members may commit its "
                "offsets (send member_id and member_epoch), or stop them first"
            )
        return
    member = (
        None
        if group is None
        else await session.get(GroupMember, (group_id, member_id), populate_existing=True)
    )
    wanted = sorted(set(partitions))
    granted: dict[tuple[str, int], int] = {}
    owning = group is not None and group.protocol_type not in (CLASSIC, STREAMS)
    if owning and member is not None and wanted:
        granted = {
            (t, p): epoch
            for t, p, epoch in await session.execute(
                select(
                    GroupOwnedPartition.topic,
                    GroupOwnedPartition.partition,
                    GroupOwnedPartition.granted_epoch,
                ).where(
                    GroupOwnedPartition.group_id == group_id,
                    GroupOwnedPartition.member_id == member_id,
                    pairs_in(GroupOwnedPartition.topic, GroupOwnedPartition.partition, wanted),
                )
            )
        }
    check_member_commit(
        CommitFacts(group, member, granted),
        group_id,
        member_id,
        member_epoch,
        wanted,
        transactional=transactional,
        now=now,
    )


class GroupFacts(Protocol):
    """What the rule reads of a group's row (the row, or the facts a commit read of it)."""

    @property
    def group_id(self) -> str: ...
    @property
    def protocol_type(self) -> str | None: ...
    @property
    def group_epoch(self) -> int: ...
    @property
    def classic_state(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class CommitFacts:
    """What the rule reads for a commit by a member: the group's row, the member's (None when
    there is none) and the epochs at which it was given the partitions committed."""

    group: GroupFacts | None
    member: Deadlines | None
    granted: dict[tuple[str, int], int]


def check_member_commit(
    facts: CommitFacts,
    group_id: str,
    member_id: str,
    member_epoch: int,
    partitions: Sequence[tuple[str, int]],
    *,
    transactional: bool,
    now: int,
) -> None:
    """The rule for a commit with member identity (a pure function: the locking path and
    Postgres's one-statement commit both apply it): raise unless the member may commit
    `partitions` (sorted, distinct) at `member_epoch` now."""
    group, member = facts.group, facts.member
    if group is None or member is None or is_gone(member, now):
        raise UnknownMemberId(
            f"group {group_id!r} has no member {member_id!r} (it left, or its session or "
            "rebalance timeout passed); nothing was committed"
        )
    if group.protocol_type == CLASSIC:
        _check_classic(group, member_epoch, transactional)
        return
    if group.protocol_type == STREAMS:
        _check_streams(group_id, member_id, member_epoch, member.member_epoch)
        return
    if not 0 < member_epoch <= member.member_epoch:
        raise FencedMemberEpoch(
            f"member {member_id!r} of group {group_id!r} sent epoch {member_epoch}; its epoch is "
            f"{member.member_epoch}; nothing was committed"
        )
    for topic, partition in partitions:
        epoch = facts.granted.get((topic, partition))
        if epoch is None:
            raise FencedMemberEpoch(
                f"member {member_id!r} of group {group_id!r} does not own {topic}-{partition}; "
                "nothing was committed"
            )
        if epoch > member_epoch:
            raise FencedMemberEpoch(
                f"member {member_id!r} of group {group_id!r} was given {topic}-{partition} at "
                f"epoch {epoch}, after the epoch {member_epoch} it sent; nothing was committed"
            )


def _check_streams(group_id: str, member_id: str, sent: int, current: int) -> None:
    """A streams group member commits at its current epoch, as Kafka's StreamsGroup checks it:
    its tasks (which hold the partitions it commits) are its own at that epoch."""
    if sent > current:
        raise FencedMemberEpoch(
            f"member {member_id!r} of streams group {group_id!r} sent epoch {sent}, newer than "
            f"its {current}; nothing was committed"
        )
    if sent < current:
        raise StaleMemberEpoch(
            f"member {member_id!r} of streams group {group_id!r} sent epoch {sent}, older than "
            f"its {current}: heartbeat, then commit again; nothing was committed"
        )


def _check_classic(group: GroupFacts, generation: int, transactional: bool) -> None:
    if generation != group.group_epoch:
        raise IllegalGeneration(
            f"group {group.group_id!r} is at generation {group.group_epoch}, not {generation}; "
            "nothing was committed"
        )
    if not transactional and group.classic_state == "CompletingRebalance":
        raise RebalanceInProgress(
            f"group {group.group_id!r} waits for its leader's assignment; nothing was committed"
        )
