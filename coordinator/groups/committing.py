"""A member's offset commit in two statements on Postgres, neither of them in a transaction: the
hot call of every consumer that commits. `service.commit` takes its locking path instead for a
commit without member identity, and whenever the store writes nothing this way (always, on
SQLite).

The first statement reads what `fencing.check_member_commit` decides on (the group's row, the
member's, the epochs at which it was given the partitions) with each row's version, and whether
the partitions exist (`ReadFacts`). `commit_rule` runs on those facts; a commit it refuses is left
to the locking path, which answers from rows read under its locks. The second statement locks
the group's row (FOR SHARE, as the locking path's check does: commits do not wait for each
other, heartbeats wait for them), then the member's and those partitions' ownership rows, and
writes the offsets (`offsets.commit_from`) only if every locked row is still the version the
rule read: a heartbeat, a rebalance or a departure between the two statements sends the commit
to the locking path (`coordinator.store.postgres.groups`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from coordinator.core.errors import CoordinatorError
from coordinator.groups.fencing import CommitFacts, check_member_commit
from coordinator.store import Store


@dataclass(frozen=True, slots=True)
class GroupFacts:
    group_id: str
    protocol_type: str | None
    group_epoch: int
    classic_state: str | None


@dataclass(frozen=True, slots=True)
class MemberFacts:
    member_epoch: int
    session_deadline_ms: int
    revoke_deadline_ms: int | None


@dataclass(frozen=True, slots=True)
class ReadFacts:
    """What a fast path read for a commit: the rule's facts, the versions of the rows they came
    from (the member's None when it has none), and how many of the partitions exist."""

    facts: CommitFacts
    group_version: str
    member_version: str | None
    owned_versions: list[str]
    existing: int


@dataclass(frozen=True, slots=True)
class MemberCommit:
    """A member's commit, as the rule and the store take it: `keys` sorted and distinct,
    `offsets` (offset, metadata, leader epoch) in their order."""

    group_id: str
    member_id: str
    member_epoch: int
    keys: Sequence[tuple[str, int]]
    offsets: Sequence[tuple[int, str | None, int | None]]
    now: int


CommitRule = Callable[[MemberCommit, ReadFacts | None], bool]


def commit_rule(commit: MemberCommit, read: ReadFacts | None) -> bool:
    """The member may commit these partitions now, on what was read (False: the locking path
    decides, and answers)."""
    if read is None or read.member_version is None or read.existing != len(commit.keys):
        return False
    try:
        check_member_commit(
            read.facts,
            commit.group_id,
            commit.member_id,
            commit.member_epoch,
            commit.keys,
            transactional=False,
            now=commit.now,
        )
    except CoordinatorError:
        return False
    return True


async def commit_as_member(db: Store, commit: MemberCommit) -> bool:
    """Commit the member's offsets if the rule lets it and nothing it read changed before the
    write; False when nothing was written and the locking path must decide."""
    return await db.commit_as_member(commit, commit_rule)
