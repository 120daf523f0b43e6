"""The Postgres engine's fast paths of the groups: a member's commit and a steady member's
heartbeat, each in two statements on one connection, neither in a transaction. The first reads
the facts the domain's rule decides on, with each row's version (its xmin); the rule runs
(`groups.committing.commit_rule`, `groups.consumer.steady`); the second locks the rows in the
fixed order and writes only if each is still the version read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from sqlalchemy.dialects import postgresql

from coordinator.groups.committing import (
    CommitRule,
    GroupFacts,
    MemberCommit,
    MemberFacts,
    ReadFacts,
)
from coordinator.groups.consumer import Renewal, SteadyFacts, SteadyRule
from coordinator.groups.fencing import CommitFacts
from coordinator.groups.models import CLASSIC, CONSUMER
from coordinator.groups.offsets import COLUMNS, commit_from
from coordinator.store.postgres.driver import Driven, on_driver, render, rows_of

# -- a member's commit ----------------------------------------------------------------------------

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
_ROWS = rows_of(
    """SELECT $1, w.topic, w."partition", w."offset", w.metadata, w.leader_epoch, $11
  FROM unnest($3::varchar[], $4::int[], $8::bigint[], $9::bytea[], $10::int[])
    AS w(topic, "partition", "offset", metadata, leader_epoch)
  WHERE (SELECT passes FROM checked)""",
    COLUMNS,
)

_WRITE = f"""
WITH {member_locks()}, checked AS (
  SELECT (SELECT version FROM g) = $5 AND (SELECT version FROM m) = $6
     AND (SELECT coalesce(array_agg(version ORDER BY topic, "partition"), '{{}}') FROM o)
         = $7::text[] AS passes
), written AS (
  {render(commit_from(postgresql.insert, _ROWS))}
)
SELECT passes FROM checked
"""


def read_facts(group_id: str, row: Sequence[Any]) -> ReadFacts | None:
    """A row of `FACTS` as the rule's facts; None when the group does not exist."""
    (protocol, group_epoch, classic_state, group_version) = row[0:4]
    (member_epoch, session_deadline, revoke_deadline, member_version) = row[4:8]
    owned_topics, owned_partitions, granted_epochs, owned_versions, existing = row[8:13]
    if group_version is None:
        return None
    member = (
        None
        if member_version is None
        else MemberFacts(member_epoch, session_deadline, revoke_deadline)
    )
    owned = zip(owned_topics, owned_partitions, strict=True)
    return ReadFacts(
        CommitFacts(
            GroupFacts(group_id, protocol, group_epoch, classic_state),
            member,
            dict(zip(owned, granted_epochs, strict=True)),
        ),
        group_version,
        member_version,
        list(owned_versions),
        existing,
    )


async def commit_as_member(connection: Driven, commit: MemberCommit, rule: CommitRule) -> bool:
    topics, partitions = [t for t, _ in commit.keys], [p for _, p in commit.keys]
    group_id, member_id = commit.group_id, commit.member_id
    (row,) = await on_driver(connection, FACTS, group_id, member_id, topics, partitions)
    read = read_facts(group_id, row)
    if not rule(commit, read):
        return False
    assert read is not None
    (written,) = await on_driver(
        connection,
        _WRITE,
        group_id,
        member_id,
        topics,
        partitions,
        read.group_version,
        read.member_version,
        read.owned_versions,
        [offset for offset, _, _ in commit.offsets],
        [None if metadata is None else metadata.encode() for _, metadata, _ in commit.offsets],
        [leader_epoch for _, _, leader_epoch in commit.offsets],
        commit.now,
    )
    return bool(written[0])


# -- a steady member's heartbeat ------------------------------------------------------------------

_STEADY_FACTS = """
SELECT g.protocol_type, g.subscribed_partitions::text, g.xmin::text,
       m.member_epoch, m.protocol, m.session_deadline_ms, m.revoke_deadline_ms,
       m.subscribed_topics::text, m.assigned::text, m.xmin::text,
       (SELECT coalesce(array_agg(o.topic ORDER BY o.topic, o."partition"), '{}')
        FROM group_owned_partitions o WHERE o.group_id = $1 AND o.member_id = $2),
       (SELECT coalesce(array_agg(o."partition" ORDER BY o.topic, o."partition"), '{}')
        FROM group_owned_partitions o WHERE o.group_id = $1 AND o.member_id = $2),
       (SELECT coalesce(array_agg(o.xmin::text ORDER BY o.topic, o."partition"), '{}')
        FROM group_owned_partitions o WHERE o.group_id = $1 AND o.member_id = $2),
       (SELECT coalesce(array_agg(t.topic ORDER BY t.topic, t."partition"), '{}')
        FROM group_target_partitions t WHERE t.group_id = $1 AND t.member_id = $2),
       (SELECT coalesce(array_agg(t."partition" ORDER BY t.topic, t."partition"), '{}')
        FROM group_target_partitions t WHERE t.group_id = $1 AND t.member_id = $2),
       (SELECT count(*) FROM group_members x
        WHERE x.group_id = $1 AND x.member_id <> $2
          AND (x.session_deadline_ms < $3::bigint OR x.revoke_deadline_ms < $3::bigint)),
       (SELECT coalesce(json_object_agg(c.topic, c.n), '{}')::text
        FROM (SELECT p.topic, count(*) AS n FROM partitions p
              WHERE p.topic IN (SELECT json_array_elements_text(x.subscribed_topics)
                                FROM group_members x WHERE x.group_id = $1)
              GROUP BY p.topic) AS c)
FROM (SELECT 1) AS one
LEFT JOIN consumer_groups g ON g.group_id = $1
LEFT JOIN group_members m ON m.group_id = $1 AND m.member_id = $2
"""

_RENEW = """
WITH g AS (
  SELECT xmin::text AS version FROM consumer_groups WHERE group_id = $1 FOR SHARE
), m AS (
  SELECT xmin::text AS version FROM group_members
  WHERE group_id = $1 AND member_id = $2 AND (SELECT count(*) FROM g) >= 0
  FOR UPDATE
), o AS (
  SELECT topic, "partition", xmin::text AS version FROM group_owned_partitions
  WHERE group_id = $1 AND member_id = $2 AND (SELECT count(*) FROM g) >= 0
  FOR SHARE
), checked AS (
  SELECT (SELECT version FROM g) = $3 AND (SELECT version FROM m) = $4
     AND (SELECT coalesce(array_agg(version ORDER BY topic, "partition"), '{}') FROM o)
         = $5::text[] AS passes
), renewed AS (
  UPDATE group_members
  SET last_heartbeat_ms = $6, session_deadline_ms = $6::bigint + $7::int, session_timeout_ms = $7,
      rebalance_timeout_ms = coalesce($8::int, rebalance_timeout_ms), client_id = $9,
      client_host = $10, assignor = $11
  WHERE group_id = $1 AND member_id = $2 AND (SELECT passes FROM checked)
)
SELECT passes FROM checked
"""


async def renew_if_steady(
    connection: Driven,
    group_id: str,
    member_id: str,
    now: int,
    steady: SteadyRule,
    renewal: Renewal,
) -> list[tuple[str, int]] | None:
    (row,) = await on_driver(connection, _STEADY_FACTS, group_id, member_id, now)
    group_version, member_version = row[2], row[9]
    if group_version is None or member_version is None:
        return None
    facts = _facts(row)
    if not steady(facts):
        return None
    (renewed,) = await on_driver(
        connection,
        _RENEW,
        group_id,
        member_id,
        group_version,
        member_version,
        list(row[12]),
        now,
        renewal.session_timeout_ms,
        renewal.rebalance_timeout_ms,
        renewal.client_id,
        renewal.client_host,
        renewal.assignor,
    )
    return facts.assigned if renewed[0] else None


def _facts(row: Sequence[Any]) -> SteadyFacts:
    (protocol_type, counted, _, member_epoch, protocol, session_deadline, revoke_deadline) = row[
        0:7
    ]
    subscribed, assigned = orjson.loads(row[7]), orjson.loads(row[8])
    owned = set(zip(row[10], row[11], strict=True))
    target = set(zip(row[13], row[14], strict=True))
    return SteadyFacts(
        consumer_group=protocol_type != CLASSIC,
        member_epoch=member_epoch,
        consumer_member=protocol == CONSUMER,
        session_deadline_ms=session_deadline,
        revoke_deadline_ms=revoke_deadline,
        subscribed_topics=subscribed,
        assigned=[(t, p) for t, p in assigned],
        owned=owned,
        target=target,
        others_gone=row[15],
        partition_counts=orjson.loads(row[16]),
        counted=orjson.loads(counted),
    )
