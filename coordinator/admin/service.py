"""What an operator sees and does: the admin calls, like `kafka-transactions.sh`."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Select, and_, exists, func, select

from coordinator.admin.schemas import (
    EffectStats,
    Hanging,
    LapsedClaim,
    MinuteCount,
    PartitionLag,
    PinnedPartition,
    ProducerInfo,
    ProducerList,
    Stats,
    TopicLag,
    TransactionList,
)
from coordinator.core.clock import now_ms, rfc3339
from coordinator.core.database import Database
from coordinator.core.settings import Settings
from coordinator.effects.service import counts as effect_counts
from coordinator.effects.service import lapsed_claims
from coordinator.log import configs
from coordinator.log.bounds import all_bounds, bytes_kept
from coordinator.log.errors import UnknownTopicOrPartition
from coordinator.log.models import CONTROL_COMMIT, Batch, Partition, ProducerState, Topic
from coordinator.producers.models import ProducerId
from coordinator.transactions.models import Transaction, TransactionPartition
from coordinator.transactions.service import describe_rows
from coordinator.transactions.states import OPEN, State


async def list_transactions(
    db: Database,
    state: State | None,
    older_than_ms: int | None,
    prefix: str | None,
    limit: int,
) -> TransactionList:
    """Transactions by state, by age (open ones started at least `older_than_ms` ago), by prefix."""
    query = select(Transaction, ProducerId.producer_epoch).join(
        ProducerId, ProducerId.producer_id == Transaction.producer_id
    )
    if state is not None:
        query = query.where(Transaction.state == state)
    if older_than_ms is not None:
        query = query.where(Transaction.started_ms <= now_ms() - older_than_ms)
    if prefix is not None:
        query = query.where(Transaction.transactional_id.startswith(prefix, autoescape=True))
    query = query.order_by(Transaction.transactional_id).limit(limit)
    async with db.read() as session:
        rows = [(txn, epoch) for txn, epoch in (await session.execute(query)).all()]
        return TransactionList(transactions=await describe_rows(session, rows))


async def describe_producers(db: Database, topic: str, partition: int) -> ProducerList:
    async with db.read() as session:
        known = await session.scalar(
            select(Partition.partition).where(
                Partition.topic == topic, Partition.partition == partition
            )
        )
        if known is None:
            raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
        rows = await session.execute(
            select(
                ProducerState.producer_id,
                ProducerState.producer_epoch,
                ProducerState.last_sequence,
                ProducerState.last_timestamp,
                ProducerState.current_txn_first_offset,
            )
            .where(ProducerState.topic == topic, ProducerState.partition == partition)
            .order_by(ProducerState.producer_id)
        )
        return ProducerList(
            producers=[
                ProducerInfo(
                    producer_id=pid,
                    producer_epoch=epoch,
                    last_sequence=sequence,
                    last_timestamp=timestamp,
                    current_txn_start_offset=first,
                )
                for pid, epoch, sequence, timestamp, first in rows
            ]
        )


async def find_hanging(db: Database, max_transaction_timeout_ms: int) -> Hanging:
    """Open transactions older than the largest timeout any producer may have, and partitions
    whose LSO is pinned by a producer with no open transaction there at the coordinator.

    The second kind is Kafka's classic hanging transaction; here markers and state commit in one
    database transaction, so finding any means the store was changed behind the service's back.
    """
    older = await list_transactions(
        db, state=None, older_than_ms=max_transaction_timeout_ms, prefix=None, limit=10_000
    )
    open_here = exists().where(
        TransactionPartition.topic == ProducerState.topic,
        TransactionPartition.partition == ProducerState.partition,
        TransactionPartition.producer_id == ProducerState.producer_id,
        Transaction.transactional_id == TransactionPartition.transactional_id,
        Transaction.state.in_(list(OPEN)),
    )
    async with db.read() as session:
        rows = await session.execute(
            select(
                ProducerState.topic,
                ProducerState.partition,
                ProducerState.producer_id,
                ProducerState.current_txn_first_offset,
            )
            .where(and_(ProducerState.current_txn_first_offset.is_not(None), ~open_here))
            .order_by(ProducerState.topic, ProducerState.partition, ProducerState.producer_id)
        )
        pinned = [
            PinnedPartition(topic=t, partition=p, producer_id=pid, current_txn_start_offset=first)
            for t, p, pid, first in rows
        ]
    return Hanging(
        transactions=[t for t in older.transactions if t.state in OPEN], partitions=pinned
    )


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


async def stats(db: Database, settings: Settings, minutes: int) -> Stats:
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
