"""Transactions listed by state, age and prefix, and the hanging ones: what `kafka-transactions.sh`
lists and finds, for both doors."""

from __future__ import annotations

from sqlalchemy import and_, exists, select

from coordinator.core.clock import now_ms
from coordinator.log.models import ProducerState
from coordinator.producers.models import ProducerId
from coordinator.store import Store
from coordinator.transactions.models import Transaction, TransactionPartition
from coordinator.transactions.schemas import Hanging, PinnedPartition, TransactionList
from coordinator.transactions.service import describe_rows
from coordinator.transactions.states import OPEN, State


async def list_transactions(
    db: Store,
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


async def find_hanging(db: Store, max_transaction_timeout_ms: int) -> Hanging:
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
