"""The statements of an append group, and the facts they read: they run on every produce.

A group of appends (`coordinator.log.produce`) is one unit of work of a fixed number of
statements whatever its size: the partitions locked by one statement (in the fixed lock order),
then the producers' epochs and states on those partitions read, then every batch, producer state
and high watermark written. The reads and writes are the store's (`Store.producer_views`,
`Store.write_appends`): on Postgres prepared statements over arrays, one round trip each, and
an optimistic group's one statement (`ConditionalAppends`); on SQLite executemany statements.
Both write a producer's state as `state_on_conflict` says. The rules that use what they read
are `coordinator.log.produce`'s.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.log.models import Batch, Partition, ProducerState, Topic
from coordinator.store.sql import pairs_in

batches = cast(Table, Batch.__table__)
partitions = cast(Table, Partition.__table__)
states = cast(Table, ProducerState.__table__)
topics = cast(Table, Topic.__table__)

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
STATE_KEY = ["topic", "partition", "producer_id"]


@dataclass(slots=True)
class LockedPartition:
    """A partition locked for the group, with what its appends need; `high_watermark` moves
    forward as the group plans its appends."""

    high_watermark: int
    log_start_offset: int
    configs: str
    leader_id: int | None = None
    leader_epoch: int = 0


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
            partitions.c.leader_id,
            partitions.c.leader_epoch,
        )
        .select_from(partitions.join(topics, topics.c.name == partitions.c.topic))
        .where(pairs_in(partitions.c.topic, partitions.c.partition, sorted(keys)))
        .order_by(partitions.c.topic, partitions.c.partition)
        .with_for_update(of=partitions)
    )
    return {(t, p): LockedPartition(*rest) for t, p, *rest in rows}


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


def state_on_conflict(existing: Any, new: Any) -> dict[str, Any]:
    """What an append writes over a producer's state on a partition (`existing`, the row; `new`,
    the appended one, as columns): everything new, but an open transaction's first offset, which
    pins the LSO until its marker clears it. Both engines' statements are built from it."""
    updates: dict[str, Any] = {c: new[c] for c in STATE_COLUMNS if c not in STATE_KEY}
    updates["current_txn_first_offset"] = func.coalesce(
        existing.current_txn_first_offset, new.current_txn_first_offset
    )
    return updates


# The columns of a producer's data batch (a producer never writes a control batch: `control`
# null, not aborted, no first offset).
BATCH_COLUMNS = (
    "topic",
    "partition",
    "base_offset",
    "last_offset",
    "producer_id",
    "producer_epoch",
    "base_sequence",
    "last_sequence",
    "timestamp",
    "max_timestamp",
    "size",
    "is_transactional",
    "record_count",
    "payload",
)


# -- an optimistic group --------------------------------------------------------------------------


@dataclass(slots=True)
class ConditionalAppends:
    """An append group planned on what its process saw written, with offsets relative to each
    partition's high watermark, to be written by one statement only if the locked rows are
    still what it saw:

    - every partition in `wanted` still has the topic configs given there (and moves by the
      advance given there), and is still led as given there (`epochs.leads`);
    - every producer in `expected` still has that view;
    - every transactional id in `transactions` has a transaction of that producer id in
      `open_state`, with the partitions its batches go to in it already, but for `joins`
      (transactional id, topic, partition): those transactions may be in any of
      `joinable_states` (the transaction starts, at `now`, if it was not open) and must not
      have changed while the statement waited for their locks;
    - but a producer in `reopens` whose view shows its transaction open on the partition may
      find that transaction ended there instead (its marker written, by another process): the
      batch then starts the producer's next transaction there, which must be `open_state`
      already (begun elsewhere, at the same epoch: transaction version 1), at the offset given
      there (relative, as the batches')."""

    rows: list[dict[str, Any]]
    states: list[dict[str, Any]]
    # (topic, partition) -> (configs, advance, the (leader, epoch) its appends were taken under)
    wanted: dict[tuple[str, int], tuple[str, int, tuple[int, int] | None]]
    expected: dict[tuple[str, int, int], ProducerView]
    transactions: dict[str, tuple[int, int]]  # transactional id -> (producer id, epoch)
    open_state: str
    joins: Collection[tuple[str, str, int]] = ()
    joinable_states: Collection[str] = ()
    now: int = 0
    reopens: dict[tuple[str, int, int], tuple[str, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WrittenIfUnchanged:
    """What an optimistic group's statement found and wrote: each partition's (high watermark,
    log start offset) before it, and the producers of `ConditionalAppends.reopens` whose
    transaction it found ended and started again (topic, partition, producer id)."""

    before: dict[tuple[str, int], tuple[int, int]]
    reopened: frozenset[tuple[str, int, int]] = frozenset()
