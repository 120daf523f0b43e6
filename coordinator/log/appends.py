"""The statements of an append, built once: they run on every produce.

On Postgres the three writes of an append (the batch row, the advanced high watermark, the
producer's state) travel as one statement of data-modifying CTEs: one round trip instead of
three. SQLite, in-process, runs them one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.core.database import one_statement
from coordinator.log.models import Batch, Partition, ProducerState, Topic
from coordinator.producers.models import ProducerId

batches = cast(Table, Batch.__table__)
partitions = cast(Table, Partition.__table__)
states = cast(Table, ProducerState.__table__)
topics = cast(Table, Topic.__table__)

# The partition's lock, with what the append needs of it and of its topic's configs.
LOCK_PARTITION = (
    select(partitions.c.high_watermark, partitions.c.log_start_offset, topics.c.configs)
    .select_from(partitions.join(topics, topics.c.name == partitions.c.topic))
    .where(
        partitions.c.topic == bindparam("topic"),
        partitions.c.partition == bindparam("partition"),
    )
    .with_for_update(of=partitions)
)

_BATCH_COLUMNS = (
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
    "control",
    "aborted",
    "first_offset",
    "record_count",
    "payload",
)
_STATE_COLUMNS = (
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

# Bind names are prefixed per statement: with column-named parameters, an UPDATE sharing them
# would grow SET clauses for those columns.
_producers = cast(Table, ProducerId.__table__)

# The producer's current epoch, its state on the partition, and its batch of this epoch at
# sequence 0 if the log holds one (what a first batch after the state expired must be told
# from). Run after LOCK_PARTITION, as a statement of its own, so it sees what the previous
# append committed (joined to the lock, it would read the snapshot taken before the lock wait).
_first = batches.alias("first_batch")
PRODUCER_STATE = (
    select(
        _producers.c.producer_epoch,
        states.c.producer_epoch,
        states.c.last_sequence,
        states.c.current_txn_first_offset,
        _first.c.base_offset,
        _first.c.last_offset,
        _first.c.last_sequence,
    )
    .select_from(
        _producers.outerjoin(
            states,
            (states.c.topic == bindparam("topic"))
            & (states.c.partition == bindparam("partition"))
            & (states.c.producer_id == _producers.c.producer_id),
        ).outerjoin(
            _first,
            (_first.c.topic == bindparam("topic"))
            & (_first.c.partition == bindparam("partition"))
            & (_first.c.producer_id == _producers.c.producer_id)
            & (_first.c.producer_epoch == bindparam("producer_epoch"))
            & (_first.c.base_sequence == 0)
            & (_first.c.producer_id >= 0)
            & _first.c.control.is_(None),
        )
    )
    .where(_producers.c.producer_id == bindparam("producer_id"))
)
# A written batch of this producer and epoch starting at this sequence: a retry's original.
ORIGINAL_BATCH = select(
    batches.c.base_offset, batches.c.last_offset, batches.c.last_sequence
).where(
    batches.c.topic == bindparam("topic"),
    batches.c.partition == bindparam("partition"),
    batches.c.producer_id == bindparam("producer_id"),
    batches.c.producer_epoch == bindparam("producer_epoch"),
    batches.c.base_sequence == bindparam("base_sequence"),
    batches.c.control.is_(None),
)

INSERT_BATCH = insert(batches).values({c: bindparam(f"b_{c}") for c in _BATCH_COLUMNS})
ADVANCE = (
    update(partitions)
    .where(
        partitions.c.topic == bindparam("at_topic"),
        partitions.c.partition == bindparam("at_partition"),
    )
    .values(high_watermark=bindparam("next_offset"))
)


def _upsert_state(dialect: Any) -> Any:
    stmt = dialect.insert(states).values({c: bindparam(f"s_{c}") for c in _STATE_COLUMNS})
    updates: dict[str, Any] = {c: stmt.excluded[c] for c in _STATE_COLUMNS if c not in _STATE_KEY}
    # An open transaction's first offset pins the LSO until its marker clears it: keep it.
    updates["current_txn_first_offset"] = func.coalesce(
        states.c.current_txn_first_offset, stmt.excluded.current_txn_first_offset
    )
    return stmt.on_conflict_do_update(index_elements=_STATE_KEY, set_=updates)


UPSERT_STATE_SQLITE = _upsert_state(sqlite)
_UPSERT_STATE_POSTGRES = _upsert_state(postgresql)
_BATCH_CTE = INSERT_BATCH.cte("appended")
_ADVANCE_CTE = ADVANCE.cte("advanced")
# One round trip on Postgres: the batch, the high watermark and the producer's state.
APPEND_IDEMPOTENT_POSTGRES = _UPSERT_STATE_POSTGRES.add_cte(_BATCH_CTE, _ADVANCE_CTE)
APPEND_PLAIN_POSTGRES = ADVANCE.add_cte(_BATCH_CTE)


async def append(
    connection: AsyncConnection,
    batch: dict[str, Any],
    state: dict[str, Any] | None,
    also: Sequence[Any] = (),
    also_params: dict[str, Any] | None = None,
) -> None:
    """Write a batch row, advance the high watermark past it and, for a producer with an id,
    record its state; the caller holds the partition's lock. `also`: the caller's own writes of
    the same unit (a transaction joined; statements built once, taking `also_params`), in the same
    statement on Postgres."""
    batch_params = {f"b_{k}": v for k, v in batch.items()}
    advance_params = {
        "at_topic": batch["topic"],
        "at_partition": batch["partition"],
        "next_offset": batch["last_offset"] + 1,
    }
    state_params = {} if state is None else {f"s_{k}": v for k, v in state.items()}
    if connection.dialect.name == "postgresql":
        statement = APPEND_PLAIN_POSTGRES if state is None else APPEND_IDEMPOTENT_POSTGRES
        if also:
            statement = one_statement(also, statement)
        params = {**batch_params, **advance_params, **state_params, **(also_params or {})}
        await connection.execute(statement, params)
        return
    for write in also:
        await connection.execute(write, also_params or {})
    await connection.execute(INSERT_BATCH, batch_params)
    await connection.execute(ADVANCE, advance_params)
    if state is not None:
        await connection.execute(UPSERT_STATE_SQLITE, state_params)
