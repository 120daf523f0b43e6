"""A member's offset commit in two statements on Postgres, neither of them in a transaction: the
hot call of every consumer that commits. `service.commit` takes its locking path instead for a
commit without member identity, on SQLite, and whenever this one writes nothing.

The first statement reads what `fencing.check_member_commit` decides on (the group's row, the
member's, the epochs at which it was given the partitions) with each row's version, and whether
the partitions exist. The rule runs on those facts; a commit it refuses is left to the locking
path, which answers from rows read under its locks. The second statement locks the group's row
(FOR SHARE, as the locking path's check does: commits do not wait for each other, heartbeats
wait for them), then the member's and those partitions' ownership rows, and writes the offsets
only if every locked row is still the version the rule read: a heartbeat, a rebalance or a
departure between the two statements sends the commit to the locking path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.core.database import Database, on_driver
from coordinator.core.errors import CoordinatorError
from coordinator.groups.fencing import CommitFacts, check_member_commit
from coordinator.groups.offsets import upsert_sql
from coordinator.groups.schemas import CommitOffsetsRequest

# Each row's version is its xmin: a new version of the row has a new one.
FACTS = """
WITH wanted AS (
  SELECT * FROM unnest($3::varchar[], $4::int[]) AS w(topic, "partition")
), owned AS (
  SELECT o.topic, o."partition", o.granted_epoch, o.xmin::text AS version
  FROM group_owned_partitions o
  JOIN wanted w ON w.topic = o.topic AND w."partition" = o."partition"
  WHERE o.group_id = $1 AND o.member_id = $2
)
SELECT g.protocol_type, g.group_epoch, g.classic_state, g.xmin::text,
       m.member_epoch, m.session_deadline_ms, m.revoke_deadline_ms, m.xmin::text,
       (SELECT coalesce(array_agg(topic ORDER BY topic, "partition"), '{}') FROM owned),
       (SELECT coalesce(array_agg("partition" ORDER BY topic, "partition"), '{}') FROM owned),
       (SELECT coalesce(array_agg(granted_epoch ORDER BY topic, "partition"), '{}') FROM owned),
       (SELECT coalesce(array_agg(version ORDER BY topic, "partition"), '{}') FROM owned),
       (SELECT count(*) FROM partitions p
        JOIN wanted w ON w.topic = p.topic AND w."partition" = p."partition")
FROM (SELECT 1) AS one
LEFT JOIN consumer_groups g ON g.group_id = $1
LEFT JOIN group_members m ON m.group_id = $1 AND m.member_id = $2
"""


def member_locks(after: str | None = None) -> str:
    """The CTEs `g`, `m` and `o` that lock what a member's commit stands on, in the fixed order,
    with each row's version: the group's row FOR SHARE ($1), the member's ($2), and its
    ownership rows of the partitions ($3 topics, $4 partitions). `after` names a CTE whose locks
    come first."""
    first = "" if after is None else f" AND (SELECT count(*) FROM {after}) >= 0"
    return f"""g AS (
  SELECT xmin::text AS version FROM consumer_groups WHERE group_id = $1{first} FOR SHARE
), m AS (
  SELECT xmin::text AS version FROM group_members
  WHERE group_id = $1 AND member_id = $2 AND (SELECT count(*) FROM g) >= 0
  FOR SHARE
), o AS (
  SELECT o.topic, o."partition", o.xmin::text AS version
  FROM group_owned_partitions o
  JOIN unnest($3::varchar[], $4::int[]) AS w(topic, "partition")
    ON w.topic = o.topic AND w."partition" = o."partition"
  WHERE o.group_id = $1 AND o.member_id = $2 AND (SELECT count(*) FROM g) >= 0
  FOR SHARE OF o
)"""


# The commit's rows: $3 topics, $4 partitions, $8 offsets, $9 metadata, $10 leader epochs.
_ROWS = """SELECT $1, w.topic, w."partition", w."offset", w.metadata, w.leader_epoch, $11
  FROM unnest($3::varchar[], $4::int[], $8::bigint[], $9::bytea[], $10::int[])
    AS w(topic, "partition", "offset", metadata, leader_epoch)
  WHERE (SELECT passes FROM checked)"""

_WRITE = f"""
WITH {member_locks()}, checked AS (
  SELECT (SELECT version FROM g) = $5 AND (SELECT version FROM m) = $6
     AND (SELECT coalesce(array_agg(version ORDER BY topic, "partition"), '{{}}') FROM o)
         = $7::text[] AS passes
), written AS (
  {upsert_sql(_ROWS)}
)
SELECT passes FROM checked
"""


@dataclass(frozen=True, slots=True)
class _Group:
    group_id: str
    protocol_type: str | None
    group_epoch: int
    classic_state: str | None


@dataclass(frozen=True, slots=True)
class _Member:
    member_epoch: int
    session_deadline_ms: int
    revoke_deadline_ms: int | None


@dataclass(frozen=True, slots=True)
class ReadFacts:
    """What `FACTS` read: the rule's facts, the versions of the rows they came from (the
    member's None when it has none), and how many of the partitions exist."""

    facts: CommitFacts
    group_version: str
    member_version: str | None
    owned_versions: list[str]
    existing: int


def read_facts(group_id: str, row: Sequence[Any]) -> ReadFacts | None:
    """A row of `FACTS` as the rule's facts; None when the group does not exist."""
    (protocol, group_epoch, classic_state, group_version) = row[0:4]
    (member_epoch, session_deadline, revoke_deadline, member_version) = row[4:8]
    owned_topics, owned_partitions, granted_epochs, owned_versions, existing = row[8:13]
    if group_version is None:
        return None
    member = (
        None if member_version is None else _Member(member_epoch, session_deadline, revoke_deadline)
    )
    owned = zip(owned_topics, owned_partitions, strict=True)
    return ReadFacts(
        CommitFacts(
            _Group(group_id, protocol, group_epoch, classic_state),
            member,
            dict(zip(owned, granted_epochs, strict=True)),
        ),
        group_version,
        member_version,
        list(owned_versions),
        existing,
    )


async def commit_as_member(
    db: Database,
    group_id: str,
    body: CommitOffsetsRequest,
    keys: Sequence[tuple[str, int]],
    now: int,
) -> bool:
    """Commit `body`'s offsets (of the sorted, distinct partitions `keys`) for its member, if the
    rule lets it and nothing it read changed before the write; False when nothing was written
    and the locking path must decide (Postgres only; the caller checks)."""
    assert body.member_id is not None and body.member_epoch is not None
    topics, partitions = [t for t, _ in keys], [p for _, p in keys]
    async with db.autocommit() as connection:
        (row,) = await on_driver(connection, FACTS, group_id, body.member_id, topics, partitions)
        read = read_facts(group_id, row)
        if read is None or read.member_version is None or read.existing != len(keys):
            return False
        facts = read.facts
        member_id, epoch = body.member_id, body.member_epoch
        try:
            check_member_commit(
                facts, group_id, member_id, epoch, keys, transactional=False, now=now
            )
        except CoordinatorError:
            return False
        offsets = {(o.topic, o.partition): o for o in body.offsets}
        ordered = [offsets[key] for key in keys]
        (written,) = await on_driver(
            connection,
            _WRITE,
            group_id,
            body.member_id,
            topics,
            partitions,
            read.group_version,
            read.member_version,
            read.owned_versions,
            [o.offset for o in ordered],
            [None if o.metadata is None else o.metadata.encode() for o in ordered],
            [o.leader_epoch for o in ordered],
            now,
        )
    return bool(written[0])
