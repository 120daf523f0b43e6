"""Control markers: how a transaction's end is written into the partition logs.

A marker is a Kafka control batch (control and transactional attributes, one control record), so
every front door returns the stored bytes as they are. It takes one offset on its partition,
like a record. An abort also flags the producer's
batches of that transaction as aborted, so read_committed readers skip them, and every marker
releases the partition's LSO by clearing the producer's open-transaction offset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from sqlalchemy import Table, bindparam, insert, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.log import recordbatch
from coordinator.log.models import CONTROL_ABORT, CONTROL_COMMIT, Batch, Partition, ProducerState
from coordinator.transactions.models import TransactionPartition


async def lock_partitions(
    session: AsyncSession, keys: Sequence[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """Lock partition rows in (topic, partition) order, the coordinator's fixed lock order after
    transactional ids, so concurrent ends and appends never deadlock. Returns high watermarks."""
    if not keys:
        return {}
    rows = (
        await session.execute(
            select(Partition.topic, Partition.partition, Partition.high_watermark)
            .where(tuple_(Partition.topic, Partition.partition).in_(sorted(set(keys))))
            .order_by(Partition.topic, Partition.partition)
            .with_for_update()
        )
    ).all()
    return {(t, p): hw for t, p, hw in rows}


async def lock_transaction_partitions(
    session: AsyncSession, transactional_id: str
) -> dict[tuple[str, int], tuple[int, int, int | None]]:
    """Lock the partitions of a transaction, in the fixed order, in one query; returns each one's
    high watermark, the producer id whose records the transaction holds there, and the first
    offset of those records (None if it wrote none there). The caller holds the transactional
    id's lock, so its partition list cannot change meanwhile, nor can that producer's state."""
    rows = await session.execute(
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
        .where(TransactionPartition.transactional_id == transactional_id)
        .order_by(Partition.topic, Partition.partition)
        .with_for_update(of=Partition)
    )
    return {(t, p): (hw, pid, first) for t, p, hw, pid, first in rows}


async def write_markers(
    session: AsyncSession,
    producer_epoch: int,
    locked: dict[tuple[str, int], tuple[int, int, int | None]],
    commit: bool,
    timestamp: int,
) -> None:
    """Append a commit or abort marker (a Kafka control batch) to every locked partition:
    (topic, partition) -> (high watermark, producer id, first offset), as
    `lock_transaction_partitions` answers. Each marker row keeps the first offset of the
    transaction it ends there; an abort flags the transaction's batches aborted."""
    if not locked:
        return
    states = cast(Table, ProducerState.__table__)
    batches = cast(Table, Batch.__table__)
    partitions_table = cast(Table, Partition.__table__)
    owners = {key: pid for key, (_, pid, _) in locked.items()}
    first_offsets = {key: first for key, (_, _, first) in locked.items() if first is not None}
    if not commit and first_offsets:
        await session.execute(
            update(batches)
            .where(
                batches.c.topic == bindparam("t"),
                batches.c.partition == bindparam("p"),
                batches.c.base_offset >= bindparam("first"),
                batches.c.producer_id == bindparam("pid"),
                batches.c.control.is_(None),
            )
            .values(aborted=True),
            [
                {"t": t, "p": p, "first": first, "pid": owners[(t, p)]}
                for (t, p), first in first_offsets.items()
            ],
        )
    markers = []
    for (topic, partition), (hw, producer_id, _) in locked.items():
        payload = recordbatch.build_control(
            commit, producer_id, producer_epoch, timestamp, base_offset=hw
        )
        markers.append(
            {
                "topic": topic,
                "partition": partition,
                "base_offset": hw,
                "last_offset": hw,
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "base_sequence": -1,
                "last_sequence": -1,
                "timestamp": timestamp,
                "max_timestamp": timestamp,
                "size": len(payload),
                "is_transactional": True,
                "control": CONTROL_COMMIT if commit else CONTROL_ABORT,
                "aborted": not commit,
                "first_offset": first_offsets.get((topic, partition)),
                "record_count": 1,
                "payload": payload,
            }
        )
    await session.execute(insert(Batch), markers)
    await session.execute(
        # The Core table, not the ORM entity: an executemany with its own WHERE.
        update(partitions_table)
        .where(
            partitions_table.c.topic == bindparam("t"),
            partitions_table.c.partition == bindparam("p"),
        )
        .values(high_watermark=bindparam("hw")),
        [{"t": t, "p": p, "hw": hw + 1} for (t, p), (hw, _, _) in locked.items()],
    )
    if first_offsets:
        await session.execute(
            update(states)
            .where(
                states.c.topic == bindparam("t"),
                states.c.partition == bindparam("p"),
                states.c.producer_id == bindparam("pid"),
            )
            .values(current_txn_first_offset=None),
            [{"t": t, "p": p, "pid": owners[(t, p)]} for (t, p) in first_offsets],
        )
