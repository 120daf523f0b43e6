"""What an operator sees and does: the admin calls, like `kafka-transactions.sh`."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Select, func, select

from coordinator.admin.schemas import (
    EffectStats,
    LapsedClaim,
    MinuteCount,
    PartitionLag,
    Stats,
    TopicLag,
)
from coordinator.core.clock import now_ms, rfc3339
from coordinator.core.settings import Settings
from coordinator.effects.service import counts as effect_counts
from coordinator.effects.service import lapsed_claims
from coordinator.log import configs
from coordinator.log.bounds import all_bounds, bytes_kept
from coordinator.log.models import CONTROL_COMMIT, Batch, Topic
from coordinator.store import Store
from coordinator.transactions.models import Transaction
from coordinator.transactions.states import State

MINUTE_MS = 60_000
LAPSED_SHOWN = 20  # lapsed side-effect claims listed by the stats


def transaction_ends_query(since_ms: int) -> Select[Any]:
    """Transaction ends per minute from `since_ms` on: rows of (minute, control, count), the
    minute as whole minutes since the Unix epoch.

    A transaction ending on n partitions writes n markers with one producer id, epoch and
    timestamp, so it counts once, as a distinct (producer id, epoch, timestamp, outcome) in its
    minute. The timestamp is needed: Kafka's clients speak transaction version 1, whose ends keep
    the epoch, so one producer's ends differ only in their time (two of its ends in one
    millisecond would count once; each is a database transaction of its own, so that takes a
    clock that does not move). A transaction with no partitions
    (offsets only, or prepared empty) writes no marker and is not counted. Only marker rows are
    read, through the partial index `ix_batches_control_timestamp`.
    """
    ends = (
        select(
            (Batch.timestamp // MINUTE_MS).label("minute"),
            Batch.producer_id,
            Batch.producer_epoch,
            Batch.timestamp,
            Batch.control,
        )
        .where(Batch.control.is_not(None), Batch.timestamp >= since_ms)
        .distinct()
        .subquery()
    )
    return select(ends.c.minute, ends.c.control, func.count()).group_by(
        ends.c.minute, ends.c.control
    )


async def stats(db: Store, settings: Settings, minutes: int) -> Stats:
    """Transactions by state, commits and aborts in each of the last `minutes` minutes (the
    current one last, empty minutes included), every partition's LSO lag, and side-effect keys
    by state."""
    now = now_ms()
    first_minute = now // MINUTE_MS - minutes + 1
    async with db.read() as session:
        by_state: dict[str, int] = {
            state: count
            for state, count in await session.execute(
                select(Transaction.state, func.count()).group_by(Transaction.state)
            )
        }
        ends = (await session.execute(transaction_ends_query(first_minute * MINUTE_MS))).all()
        partitions = await all_bounds(session)
        kept = await bytes_kept(session)
        cleanup = {
            name: configs.cleanup_settings(stored, settings)
            for name, stored in await session.execute(select(Topic.name, Topic.configs))
        }
        effects = await effect_counts(session, now)
        lapsed = [
            LapsedClaim(
                key=e.key,
                owner=e.owner,
                fencing_token=e.fencing_token,
                lease_expires_at=rfc3339(e.lease_expires_ms),
            )
            for e in await lapsed_claims(session, now, LAPSED_SHOWN)
        ]
    counts: dict[tuple[int, bool], int] = {
        (int(minute), control == CONTROL_COMMIT): count for minute, control, count in ends
    }
    topics: defaultdict[str, list[PartitionLag]] = defaultdict(list)
    for (topic, partition), bounds in partitions.items():
        topics[topic].append(
            PartitionLag(
                partition=partition,
                log_start_offset=bounds.log_start_offset,
                high_watermark=bounds.high_watermark,
                last_stable_offset=bounds.last_stable_offset,
                lso_lag=bounds.high_watermark - bounds.last_stable_offset,
                bytes=kept.get((topic, partition), 0),
            )
        )
    return Stats(
        now=rfc3339(now) or "",
        states={state: by_state.get(state, 0) for state in State},
        per_minute=[
            MinuteCount(
                minute=rfc3339(minute * MINUTE_MS) or "",
                commits=counts.get((minute, True), 0),
                aborts=counts.get((minute, False), 0),
            )
            for minute in range(first_minute, first_minute + minutes)
        ],
        topics=[
            TopicLag(
                name=name,
                retention_ms=cleanup[name].retention_ms,
                retention_bytes=cleanup[name].retention_bytes,
                cleanup_policy=",".join(
                    p
                    for p, on in (
                        ("compact", cleanup[name].compact),
                        ("delete", cleanup[name].delete),
                    )
                    if on
                ),
                partitions=lags,
            )
            for name, lags in topics.items()
            if name in cleanup
        ],
        effects=EffectStats(**effects, lapsed_claims=lapsed),
    )
