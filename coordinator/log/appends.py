"""The statements of an append group, built once: they run on every produce.

A group of appends (`coordinator.log.produce`) is one unit of work of a fixed number of
statements whatever its size: the partitions locked by one statement (in the fixed lock order),
the producers' epochs and their states on those partitions read by one each, and then one
statement inserting every batch, one upserting every producer state and one advancing every high
watermark (executemany: asyncpg sends the rows of a prepared statement in one pipeline).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.core.database import pairs_in
from coordinator.log.models import Batch, Partition, ProducerState, Topic
from coordinator.producers.models import ProducerId

batches = cast(Table, Batch.__table__)
partitions = cast(Table, Partition.__table__)
states = cast(Table, ProducerState.__table__)
topics = cast(Table, Topic.__table__)
_producers = cast(Table, ProducerId.__table__)

STATE_COLUMNS = (
    "topic",
    "partition",
    "producer_id",
    "producer_epoch",
    "last_sequence",
    "last_offset",
    "last_timestamp",
    "current_txn_first_offset",
)
_STATE_KEY = ["topic", "partition", "producer_id"]


@dataclass(slots=True)
class LockedPartition:
    """A partition locked for the group, with what its appends need; `high_watermark` moves
    forward as the group plans its appends."""

    high_watermark: int
    log_start_offset: int
    configs: str


@dataclass(slots=True)
class ProducerView:
    """What the idempotence rules read of a producer on a partition: its id's current epoch and
    its state there (the state's fields None when it has none)."""

    current_epoch: int
    state_epoch: int | None = None
    last_sequence: int | None = None
    open_txn_offset: int | None = None


async def lock_partitions(
    connection: AsyncConnection, keys: Collection[tuple[str, int]]
) -> dict[tuple[str, int], LockedPartition]:
    """Lock the partitions in (topic, partition) order, the fixed lock order, with their topics'
    configs; a partition that does not exist is left out."""
    rows = await connection.execute(
        select(
            partitions.c.topic,
            partitions.c.partition,
            partitions.c.high_watermark,
            partitions.c.log_start_offset,
            topics.c.configs,
        )
        .select_from(partitions.join(topics, topics.c.name == partitions.c.topic))
        .where(pairs_in(partitions.c.topic, partitions.c.partition, sorted(keys)))
        .order_by(partitions.c.topic, partitions.c.partition)
        .with_for_update(of=partitions)
    )
    return {(t, p): LockedPartition(hw, start, configs) for t, p, hw, start, configs in rows}


async def producer_views(
    connection: AsyncConnection, keys: Iterable[tuple[str, int, int]]
) -> dict[tuple[str, int, int], ProducerView]:
    """Each (topic, partition, producer id)'s view; a producer id never issued is left out.
    Run after `lock_partitions`, as statements of their own, so they see what the previous
    append committed (joined to the lock, they would read the snapshot taken before its wait)."""
    keys = set(keys)
    pids = {pid for _, _, pid in keys}
    epochs = dict(
        (
            await connection.execute(
                select(_producers.c.producer_id, _producers.c.producer_epoch).where(
                    _producers.c.producer_id.in_(pids)
                )
            )
        ).all()
    )
    views = {key: ProducerView(epochs[key[2]]) for key in keys if key[2] in epochs}
    rows = await connection.execute(
        select(
            states.c.topic,
            states.c.partition,
            states.c.producer_id,
            states.c.producer_epoch,
            states.c.last_sequence,
            states.c.current_txn_first_offset,
        ).where(
            pairs_in(states.c.topic, states.c.partition, {(t, p) for t, p, _ in keys}),
            states.c.producer_id.in_(epochs),
        )
    )
    for topic, partition, pid, epoch, last_sequence, open_offset in rows:
        view = views.get((topic, partition, pid))
        if view is not None:
            view.state_epoch, view.last_sequence, view.open_txn_offset = (
                epoch,
                last_sequence,
                open_offset,
            )
    return views


# A written batch of this producer and epoch starting at this sequence: a retry's original, or
# (at sequence 0) the first batch of an epoch whose state expired.
_ORIGINAL_BATCH = select(
    batches.c.base_offset, batches.c.last_offset, batches.c.last_sequence
).where(
    batches.c.topic == bindparam("topic"),
    batches.c.partition == bindparam("partition"),
    batches.c.producer_id == bindparam("producer_id"),
    batches.c.producer_epoch == bindparam("producer_epoch"),
    batches.c.base_sequence == bindparam("base_sequence"),
    batches.c.control.is_(None),
)


async def written_batch(
    connection: AsyncConnection, topic: str, partition: int, pid: int, epoch: int, sequence: int
) -> tuple[int, int, int] | None:
    """The (base offset, last offset, last sequence) of the written batch of this producer and
    epoch starting at `sequence`, if the log holds one."""
    row = (
        await connection.execute(
            _ORIGINAL_BATCH,
            {
                "topic": topic,
                "partition": partition,
                "producer_id": pid,
                "producer_epoch": epoch,
                "base_sequence": sequence,
            },
        )
    ).first()
    return None if row is None else (row[0], row[1], row[2])


_INSERT_BATCHES = insert(batches)
_ADVANCE = (
    update(partitions)
    .where(
        partitions.c.topic == bindparam("at_topic"),
        partitions.c.partition == bindparam("at_partition"),
    )
    .values(high_watermark=bindparam("next_offset"))
)


def _upsert_states(dialect: Any) -> Any:
    stmt = dialect.insert(states)
    updates: dict[str, Any] = {c: stmt.excluded[c] for c in STATE_COLUMNS if c not in _STATE_KEY}
    # An open transaction's first offset pins the LSO until its marker clears it: keep it.
    updates["current_txn_first_offset"] = func.coalesce(
        states.c.current_txn_first_offset, stmt.excluded.current_txn_first_offset
    )
    return stmt.on_conflict_do_update(index_elements=_STATE_KEY, set_=updates)


_UPSERT_STATES = {"sqlite": _upsert_states(sqlite), "postgresql": _upsert_states(postgresql)}


async def write(
    connection: AsyncConnection,
    rows: list[dict[str, Any]],
    producer_states: list[dict[str, Any]],
    high_watermarks: dict[tuple[str, int], int],
) -> None:
    """Write the group's batch rows, its producers' states (one row per key) and its partitions'
    new high watermarks; the caller holds the partitions' locks."""
    if not rows:
        return
    await connection.execute(_INSERT_BATCHES, rows)
    if producer_states:
        await connection.execute(_UPSERT_STATES[connection.dialect.name], producer_states)
    await connection.execute(
        _ADVANCE,
        [
            {"at_topic": t, "at_partition": p, "next_offset": hw}
            for (t, p), hw in sorted(high_watermarks.items())
        ],
    )
