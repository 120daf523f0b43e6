"""A steady member's heartbeat in two statements on Postgres, neither in a transaction: the call
every consumer makes every few seconds. `membership.heartbeat` takes its locking path instead for
a join, a leave, a classic member, and whenever the store writes nothing this way (always, on
SQLite).

A heartbeat is steady when the locking path would change nothing but the member's own liveness
(`steady`): the member holds exactly what the target gives it, was told so at its current
epoch, has nothing to give up, keeps its subscription, and the group needs no rebalance (no
other member's timeout has passed, the subscribed topics' partition counts are those the target
was computed for). The first statement reads those facts with the versions of the group's row,
the member's and its ownership rows; the second locks them in the fixed order (the group's FOR
SHARE, as a commit does: a heartbeat on the locking path, which locks it FOR UPDATE, waits for
it) and renews the member's session only if each is still the version read. A rebalance, a
grant, a revocation, a commit's new member row between the two sends the heartbeat to the
locking path, which answers it (`coordinator.store.postgres.groups`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from coordinator.store import Store

TP = tuple[str, int]


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


SteadyRule = Callable[[SteadyFacts], bool]


async def renew_if_steady(
    db: Store,
    group_id: str,
    member_id: str,
    member_epoch: int,
    subscribed_topics: Sequence[str] | None,
    owned_partitions: Sequence[TP] | None,
    renewal: Renewal,
    now: int,
) -> list[TP] | None:
    """Renew a steady member's session; its assignment, or None when nothing was written and the
    locking path must answer."""

    def rule(facts: SteadyFacts) -> bool:
        return steady(facts, member_epoch, subscribed_topics, owned_partitions, now)

    return await db.renew_if_steady(group_id, member_id, now, rule, renewal)
