"""Where partitions stand: log start offset, high watermark and last stable offset (LSO), read
one way for every caller (fetch, list-offsets, the log cleaner, describe, the admin stats and
the metrics), and the bytes each partition keeps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from coordinator.log.models import Batch, Partition, ProducerState

_partitions = cast(Table, Partition.__table__)
_states = cast(Table, ProducerState.__table__)


def stable_offset(high_watermark: int, first_open_offset: int | None) -> int:
    """The LSO: the first offset of the oldest open transaction, else the high watermark."""
    return high_watermark if first_open_offset is None else min(first_open_offset, high_watermark)


@dataclass(frozen=True, slots=True)
class Bounds:
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int


# One partition's, in one statement (on every fetch): the oldest open transaction's first offset
# is the smallest its producers' states hold.
_ONE = select(
    _partitions.c.log_start_offset,
    _partitions.c.high_watermark,
    select(func.min(_states.c.current_txn_first_offset))
    .where(
        _states.c.topic == bindparam("topic"),
        _states.c.partition == bindparam("partition"),
    )
    .scalar_subquery(),
).where(
    _partitions.c.topic == bindparam("topic"), _partitions.c.partition == bindparam("partition")
)


async def partition_bounds(
    connection: AsyncConnection, topic: str, partition: int
) -> Bounds | None:
    """The partition's bounds; None if it does not exist."""
    row = (await connection.execute(_ONE, {"topic": topic, "partition": partition})).first()
    if row is None:
        return None
    log_start, high_watermark, first_open = row
    return Bounds(log_start, high_watermark, stable_offset(high_watermark, first_open))


async def all_bounds(
    session: AsyncSession, topic: str | None = None
) -> dict[tuple[str, int], Bounds]:
    """Every partition's bounds (or those of `topic`), in (topic, partition) order."""
    pinned: Any = select(
        _states.c.topic,
        _states.c.partition,
        func.min(_states.c.current_txn_first_offset).label("first"),
    ).where(_states.c.current_txn_first_offset.is_not(None))
    partitions: Any = select(
        _partitions.c.topic,
        _partitions.c.partition,
        _partitions.c.log_start_offset,
        _partitions.c.high_watermark,
    )
    if topic is not None:
        pinned = pinned.where(_states.c.topic == topic)
        partitions = partitions.where(_partitions.c.topic == topic)
    pinned = pinned.group_by(_states.c.topic, _states.c.partition).subquery()
    rows = await session.execute(
        partitions.add_columns(pinned.c.first).outerjoin(
            pinned,
            (pinned.c.topic == _partitions.c.topic)
            & (pinned.c.partition == _partitions.c.partition),
        )
    )
    # Sorted here, by code point: a database's collation would make the order differ by store.
    return {
        (t, p): Bounds(start, hw, stable_offset(hw, first))
        for t, p, start, hw, first in sorted(rows)
    }


async def bytes_kept(session: AsyncSession) -> dict[tuple[str, int], int]:
    """Bytes of the record batches each partition keeps (partitions with none are absent)."""
    rows = await session.execute(
        select(Batch.topic, Batch.partition, func.sum(Batch.size)).group_by(
            Batch.topic, Batch.partition
        )
    )
    return {(topic, partition): int(size) for topic, partition, size in rows}
