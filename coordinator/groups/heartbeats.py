"""A steady member's heartbeat in two statements on Postgres, neither in a transaction: the call
every consumer makes every few seconds. `membership.heartbeat` takes its locking path instead on
SQLite, for a join, a leave, a classic member, and whenever this one writes nothing.

A heartbeat is steady when the locking path would change nothing but the member's own liveness
(`steady`): the member holds exactly what the target gives it, was told so at its current
epoch, has nothing to give up, keeps its subscription, and the group needs no rebalance (no
other member's timeout has passed, the subscribed topics' partition counts are those the target
was computed for). The first statement reads those facts with the versions of the group's row,
the member's and its ownership rows; the second locks them in the fixed order (the group's FOR
SHARE, as a commit does: a heartbeat on the locking path, which locks it FOR UPDATE, waits for
it) and renews the member's session only if each is still the version read. A rebalance, a
grant, a revocation, a commit's new member row between the two sends the heartbeat to the
locking path, which answers it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from coordinator.core.database import Database, on_driver
from coordinator.groups.models import CLASSIC, CONSUMER

TP = tuple[str, int]

_FACTS = """
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


async def renew_if_steady(
    db: Database,
    group_id: str,
    member_id: str,
    member_epoch: int,
    subscribed_topics: Sequence[str] | None,
    owned_partitions: Sequence[TP] | None,
    renewal: Renewal,
    now: int,
) -> list[TP] | None:
    """Renew a steady member's session; its assignment, or None when nothing was written and the
    locking path must answer (Postgres only; the caller checks)."""
    async with db.autocommit() as connection:
        (row,) = await on_driver(connection, _FACTS, group_id, member_id, now)
        group_version, member_version = row[2], row[9]
        if group_version is None or member_version is None:
            return None
        facts = _facts(row)
        if not steady(facts, member_epoch, subscribed_topics, owned_partitions, now):
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
