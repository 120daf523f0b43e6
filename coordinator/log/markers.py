"""Control markers: how a transaction's end is written into the partition logs.

A marker is a Kafka control batch (control and transactional attributes, one control record), so
every front door returns the stored bytes as they are. It takes one offset on its partition,
like a record. An abort also flags the producer's
batches of that transaction as aborted, so read_committed readers skip them, and every marker
releases the partition's LSO by clearing the producer's open-transaction offset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Integer,
    String,
    Table,
    bindparam,
    column,
    insert,
    select,
    tuple_,
    update,
    values,
)
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
    also: Sequence[Any] = (),
    returning: Any | None = None,
) -> Sequence[Any]:
    """Append a commit or abort marker (a Kafka control batch) to every locked partition:
    (topic, partition) -> (high watermark, producer id, first offset), as
    `lock_transaction_partitions` answers. Each marker row keeps the first offset of the
    transaction it ends there; an abort flags the transaction's batches aborted.

    `also` (the caller's own writes ending the transaction, on Core tables) and `returning` (one
    more, with RETURNING, whose rows are answered) join those writes: on Postgres all of them
    travel as one statement of data-modifying CTEs, one round trip whatever the number of
    partitions; SQLite, in process, runs them one by one."""
    writes: list[Any] = []
    postgres = (await session.connection()).dialect.name == "postgresql"
    if locked:
        writes.extend(_marker_writes(producer_epoch, locked, commit, timestamp, postgres))
    writes.extend(also)
    if returning is not None:
        writes.append(returning)
    if postgres and len(writes) > 1:
        *ctes, last = writes
        statement = last.add_cte(*(w.cte(f"w{i}") for i, w in enumerate(ctes)))
        result = await session.execute(statement)
        return result.all() if returning is not None else ()
    rows: Sequence[Any] = ()
    for write in writes:
        if isinstance(write, tuple):
            await session.execute(*write)
            continue
        result = await session.execute(write)
        if write is returning:
            rows = result.all()
    return rows


def _marker_writes(
    producer_epoch: int,
    locked: dict[tuple[str, int], tuple[int, int, int | None]],
    commit: bool,
    timestamp: int,
    postgres: bool,
) -> list[Any]:
    """The writes of the markers: on Postgres single statements over VALUES lists (they become
    CTEs); elsewhere (statement, parameter list) pairs run as executemany."""
    owners = {key: pid for key, (_, pid, _) in locked.items()}
    first_offsets = {key: first for key, (_, _, first) in locked.items() if first is not None}
    writes: list[Any] = []
    if not commit and first_offsets:
        flagged = [(t, p, first, owners[(t, p)]) for (t, p), first in first_offsets.items()]
        if postgres:
            v = values(
                column("t", String), column("p", Integer), column("first", BigInteger),
                column("pid", BigInteger), name="aborting",
            ).data(flagged)  # fmt: skip
            writes.append(
                update(_batches)
                .where(
                    _batches.c.topic == v.c.t,
                    _batches.c.partition == v.c.p,
                    _batches.c.base_offset >= v.c.first,
                    _batches.c.producer_id == v.c.pid,
                    _batches.c.control.is_(None),
                )
                .values(aborted=True)
            )
        else:
            writes.append(
                (
                    _ABORT_BATCHES,
                    [dict(zip(("t", "p", "first", "pid"), f, strict=True)) for f in flagged],
                )
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
    advanced = [(t, p, hw + 1) for (t, p), (hw, _, _) in locked.items()]
    released = [(t, p, owners[(t, p)]) for (t, p) in first_offsets]
    if postgres:
        writes.append(insert(_batches).values(markers))
        v = values(
            column("t", String), column("p", Integer), column("hw", BigInteger), name="advancing"
        ).data(advanced)
        writes.append(
            update(_partitions)
            .where(_partitions.c.topic == v.c.t, _partitions.c.partition == v.c.p)
            .values(high_watermark=v.c.hw)
        )
        if released:
            v = values(
                column("t", String), column("p", Integer), column("pid", BigInteger),
                name="releasing",
            ).data(released)  # fmt: skip
            writes.append(
                update(_states)
                .where(
                    _states.c.topic == v.c.t,
                    _states.c.partition == v.c.p,
                    _states.c.producer_id == v.c.pid,
                )
                .values(current_txn_first_offset=None)
            )
        return writes
    writes.append((insert(_batches), markers))
    writes.append((_ADVANCE, [{"t": t, "p": p, "hw": hw} for t, p, hw in advanced]))
    if released:
        writes.append((_RELEASE, [{"t": t, "p": p, "pid": pid} for t, p, pid in released]))
    return writes


_states = cast(Table, ProducerState.__table__)
_batches = cast(Table, Batch.__table__)
_partitions = cast(Table, Partition.__table__)
# SQLite's statements, run as executemany (Core tables: an executemany with its own WHERE).
_ABORT_BATCHES = (
    update(_batches)
    .where(
        _batches.c.topic == bindparam("t"),
        _batches.c.partition == bindparam("p"),
        _batches.c.base_offset >= bindparam("first"),
        _batches.c.producer_id == bindparam("pid"),
        _batches.c.control.is_(None),
    )
    .values(aborted=True)
)
_ADVANCE = (
    update(_partitions)
    .where(_partitions.c.topic == bindparam("t"), _partitions.c.partition == bindparam("p"))
    .values(high_watermark=bindparam("hw"))
)
_RELEASE = (
    update(_states)
    .where(
        _states.c.topic == bindparam("t"),
        _states.c.partition == bindparam("p"),
        _states.c.producer_id == bindparam("pid"),
    )
    .values(current_txn_first_offset=None)
)
