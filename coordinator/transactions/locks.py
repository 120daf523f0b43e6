"""A transaction's locks, in the fixed order: its transactional id's row with its producer's
current epoch first, then its partitions sorted by topic and number; so concurrent calls, appends
and ends never deadlock."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Table, bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.log.models import Partition, ProducerState
from coordinator.producers.models import ProducerId
from coordinator.transactions.errors import (
    TransactionalIdNotFound,
)
from coordinator.transactions.models import (
    Transaction,
    TransactionOffset,
    TransactionPartition,
)

_transactions = cast(Table, Transaction.__table__)
_txn_partitions = cast(Table, TransactionPartition.__table__)
_txn_offsets = cast(Table, TransactionOffset.__table__)


# A transaction's partitions, locked in the fixed order, with what its markers need (built once:
# it runs on every EndTxn and every abort).
_LOCK_TRANSACTION_PARTITIONS = (
    select(
        Partition.topic,
        Partition.partition,
        Partition.high_watermark,
        TransactionPartition.producer_id,
        ProducerState.current_txn_first_offset,
    )
    .join(
        TransactionPartition,
        (TransactionPartition.topic == Partition.topic)
        & (TransactionPartition.partition == Partition.partition),
    )
    .outerjoin(
        ProducerState,
        (ProducerState.topic == Partition.topic)
        & (ProducerState.partition == Partition.partition)
        & (ProducerState.producer_id == TransactionPartition.producer_id),
    )
    .where(TransactionPartition.transactional_id == bindparam("tid"))
    .order_by(Partition.topic, Partition.partition)
    .with_for_update(of=Partition)
)


async def lock_transaction_partitions(
    session: AsyncSession, transactional_id: str
) -> dict[tuple[str, int], tuple[int, int, int | None]]:
    """Lock the partitions of a transaction, in the fixed order, in one query; returns each one's
    high watermark, the producer id whose records the transaction holds there, and the first
    offset of those records (None if it wrote none there). The caller holds the transactional
    id's lock, so its partition list cannot change meanwhile, nor can that producer's state."""
    rows = await session.execute(_LOCK_TRANSACTION_PARTITIONS, {"tid": transactional_id})
    return {(t, p): (hw, pid, first) for t, p, hw, pid, first in rows}


@dataclass(slots=True)
class Locked:
    """A transaction row locked for this unit of work, with its producer's current epoch."""

    txn: Transaction
    epoch: int


async def lock_ids(session: AsyncSession, transactional_ids: Collection[str]) -> list[Locked]:
    """Lock the transactional ids in the fixed order (sorted), each with its producer's current
    epoch; unknown ones are left out."""
    rows = await session.execute(
        select(Transaction, ProducerId.producer_epoch)
        .join(ProducerId, ProducerId.producer_id == Transaction.producer_id)
        .where(Transaction.transactional_id.in_(sorted(transactional_ids)))
        .order_by(Transaction.transactional_id)
        .with_for_update()
    )
    return [Locked(txn, epoch) for txn, epoch in rows]


async def lock(session: AsyncSession, transactional_id: str) -> Locked | None:
    locked = await lock_ids(session, [transactional_id])
    return locked[0] if locked else None


async def lock_existing(session: AsyncSession, transactional_id: str) -> Locked:
    locked = await lock(session, transactional_id)
    if locked is None:
        raise TransactionalIdNotFound(f"transactional id {transactional_id!r} is not known")
    return locked


async def partitions_by_id(
    session: AsyncSession, transactional_ids: list[str]
) -> list[tuple[str, str, int, int]]:
    """(transactional id, topic, partition, producer id) of every partition the ids' open
    transactions include."""
    rows = await session.execute(
        select(
            TransactionPartition.transactional_id,
            TransactionPartition.topic,
            TransactionPartition.partition,
            TransactionPartition.producer_id,
        ).where(TransactionPartition.transactional_id.in_(transactional_ids))
    )
    return [(tid, t, p, pid) for tid, t, p, pid in rows]


async def lock_including(session: AsyncSession, topic: str) -> list[Locked]:
    """Lock, in the fixed order, the transactional ids whose open transaction includes a
    partition of `topic` (a topic's deletion aborts them)."""
    tids = (
        await session.scalars(
            select(TransactionPartition.transactional_id)
            .where(TransactionPartition.topic == topic)
            .distinct()
            .order_by(TransactionPartition.transactional_id)
        )
    ).all()
    return [await lock_existing(session, tid) for tid in tids]


async def partitions_of(session: AsyncSession, locked: list[Locked]) -> list[tuple[str, int]]:
    """The partitions the locked transactions include."""
    rows = await partitions_by_id(session, [entry.txn.transactional_id for entry in locked])
    return [(topic, partition) for _, topic, partition, _ in rows]
