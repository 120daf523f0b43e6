"""The statements of an append group, built once: they run on every produce.

A group of appends (`coordinator.log.produce`) is one unit of work of a fixed number of
statements whatever its size: the partitions locked by one statement (in the fixed lock order),
then the producers' epochs and states on those partitions read, then every batch, producer state
and high watermark written.

On Postgres the last two are one statement each, sent straight to asyncpg as prepared
statements over arrays (`unnest`), inside the unit of work SQLAlchemy began with the lock: no
statement compilation, no result processing, one round trip each whatever the group's size.
SQLite (in-process, no round trips) runs the same reads and writes through SQLAlchemy, the writes
as executemany. Only the statements differ per store; the rules that use what they read are
`coordinator.log.produce`'s.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, insert, select, update
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.core.database import on_driver, pairs_in
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


_VIEWS_POSTGRES = """
SELECT k.topic, k."partition", k.producer_id, i.producer_epoch,
       s.producer_epoch, s.last_sequence, s.current_txn_first_offset
FROM unnest($1::varchar[], $2::int[], $3::bigint[]) AS k(topic, "partition", producer_id)
JOIN producer_ids i ON i.producer_id = k.producer_id
LEFT JOIN producer_states s
  ON s.topic = k.topic AND s."partition" = k."partition" AND s.producer_id = k.producer_id
"""


async def producer_views(
    connection: AsyncConnection, keys: Iterable[tuple[str, int, int]]
) -> dict[tuple[str, int, int], ProducerView]:
    """Each (topic, partition, producer id)'s view; a producer id never issued is left out.
    Run after `lock_partitions`, as statements of their own, so they see what the previous
    append committed (joined to the lock, they would read the snapshot taken before its wait)."""
    keys = set(keys)
    if connection.dialect.name == "postgresql":
        topics_, partitions_, pids_ = zip(*keys, strict=True) if keys else ((), (), ())
        found = await on_driver(connection, _VIEWS_POSTGRES, topics_, partitions_, pids_)
        return {(r[0], r[1], r[2]): ProducerView(r[3], r[4], r[5], r[6]) for r in found}
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
            states.c.producer_id.in_(list(epochs)),
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


def _upsert_states_sqlite() -> Any:
    """SQLite's; on Postgres the same rule is a CTE of `_WRITE_POSTGRES`."""
    stmt = sqlite.insert(states)
    updates: dict[str, Any] = {c: stmt.excluded[c] for c in STATE_COLUMNS if c not in _STATE_KEY}
    # An open transaction's first offset pins the LSO until its marker clears it: keep it.
    updates["current_txn_first_offset"] = func.coalesce(
        states.c.current_txn_first_offset, stmt.excluded.current_txn_first_offset
    )
    return stmt.on_conflict_do_update(index_elements=_STATE_KEY, set_=updates)


_UPSERT_STATES_SQLITE = _upsert_states_sqlite()


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
    "record_count",
    "payload",
)
_BATCH_TYPES = (
    "varchar",
    "int",
    "bigint",
    "bigint",
    "bigint",
    "int",
    "int",
    "int",
    "bigint",
    "bigint",
    "int",
    "bool",
    "int",
    "bytea",
)
_STATE_TYPES = ("varchar", "int", "bigint", "int", "int", "bigint", "bigint", "bigint")


def _unnest(columns: tuple[str, ...], types: tuple[str, ...], first: int) -> str:
    arrays = ", ".join(f"${first + i}::{t}[]" for i, t in enumerate(types))
    return f"unnest({arrays}) AS v({_quoted(columns)})"


def _quoted(columns: Iterable[str]) -> str:
    return ", ".join(f'"{c}"' for c in columns)


# Data batches only: a producer never writes a control batch (`control` null, not aborted, no
# first offset).
_B, _S = len(_BATCH_COLUMNS), len(STATE_COLUMNS)
# A producer's state after an append; an open transaction's first offset pins the LSO until its
# marker clears it: kept.
_STATE_UPDATE = """
  ON CONFLICT (topic, partition, producer_id) DO UPDATE SET
    producer_epoch = EXCLUDED.producer_epoch,
    last_sequence = EXCLUDED.last_sequence,
    last_offset = EXCLUDED.last_offset,
    last_timestamp = EXCLUDED.last_timestamp,
    current_txn_first_offset = COALESCE(
      producer_states.current_txn_first_offset, EXCLUDED.current_txn_first_offset)"""
_WRITE_POSTGRES = f"""
WITH appended AS (
  INSERT INTO batches ({_quoted(_BATCH_COLUMNS)}, control, aborted, first_offset)
  SELECT {_quoted(_BATCH_COLUMNS)}, NULL, false, NULL
  FROM {_unnest(_BATCH_COLUMNS, _BATCH_TYPES, 1)}
), stated AS (
  INSERT INTO producer_states ({_quoted(STATE_COLUMNS)})
  SELECT {_quoted(STATE_COLUMNS)} FROM {_unnest(STATE_COLUMNS, _STATE_TYPES, _B + 1)}
  {_STATE_UPDATE}
)
UPDATE partitions p SET high_watermark = v.next_offset
FROM {_unnest(("topic", "partition", "next_offset"), ("varchar", "int", "bigint"), _B + _S + 1)}
WHERE p.topic = v.topic AND p."partition" = v."partition"
"""


async def write(
    connection: AsyncConnection, rows: list[dict[str, Any]], producer_states: list[dict[str, Any]]
) -> None:
    """Write the group's batch rows (in offset order per partition), its producers' states (one
    row per key) and the high watermarks past the rows; the caller holds the partitions' locks."""
    if not rows:
        return
    # The last row of each partition is its newest.
    moved = sorted({(r["topic"], r["partition"]): r["last_offset"] + 1 for r in rows}.items())
    if connection.dialect.name == "postgresql":
        await on_driver(
            connection,
            _WRITE_POSTGRES,
            *([row[c] for row in rows] for c in _BATCH_COLUMNS),
            *([state[c] for state in producer_states] for c in STATE_COLUMNS),
            [t for (t, _), _ in moved],
            [p for (_, p), _ in moved],
            [hw for _, hw in moved],
        )
        return
    await connection.execute(_INSERT_BATCHES, rows)
    if producer_states:
        await connection.execute(_UPSERT_STATES_SQLITE, producer_states)
    await connection.execute(
        _ADVANCE, [{"at_topic": t, "at_partition": p, "next_offset": hw} for (t, p), hw in moved]
    )


# -- an optimistic group: one statement, one round trip -----------------------------------------

_EXPECTED_COLUMNS = (
    "topic",
    "partition",
    "producer_id",
    "current_epoch",
    "state_epoch",
    "last_sequence",
    "open_txn_offset",
)
_EXPECTED_TYPES = ("varchar", "int", "bigint", "int", "int", "int", "bigint")
_WANTED_COLUMNS = ("topic", "partition", "configs", "advance")
_WANTED_TYPES = ("varchar", "int", "text", "bigint")
_W = _B + _S + 1
_E = _W + len(_WANTED_COLUMNS)
_T = _E + len(_EXPECTED_COLUMNS)
_OFFSET_COLUMNS = ("base_offset", "last_offset")
_PASSES = "(SELECT passes FROM checked)"

# The group planned on what its process saw written (offsets relative to each partition's high
# watermark), written only if the locked rows are still what it saw. Rows locked FOR UPDATE are
# read as the newest committed version (READ COMMITTED re-reads a row it waited for), not as the
# statement's snapshot, in the fixed order: the transactions its batches belong to (sorted), then
# the partitions (sorted; the scalar subquery on `txns` is evaluated before the first partition
# row is read), then the producers' states on them (every writer of a producer state holds its
# partition's lock, so nothing waits for a state while holding a partition this statement
# wants). Epochs are read from the snapshot, as the locking path reads them just after its
# locks. A transactional batch's transaction must be Ongoing for its producer, and the state
# must show the same open transaction on the partition (its first offset there, which only the
# transaction's marker clears): the partition is already in it. A batch that joins its
# transaction (the state shows none open there) needs the transaction in a state that takes it
# and unchanged since the statement's snapshot: an InitPid that fenced the producer while the
# statement waited raised the epoch the snapshot still shows, and changed that row. Its first
# offset there is planned from 0, as the batches' are. Every write
# is gated on `checked`, computed once from all the locked rows; nothing is written if it fails.
_WRITE_OPTIMISTIC_POSTGRES = f"""
WITH txns AS (
  SELECT t.transactional_id, t.producer_id, t.state, v.producer_id AS expected_producer,
         v.joining,
         t.xmin::text = (SELECT s.xmin::text FROM transactions s
                         WHERE s.transactional_id = t.transactional_id) AS unchanged
  FROM transactions t
  JOIN unnest(${_T}::varchar[], ${_T + 1}::bigint[], ${_T + 2}::boolean[])
    AS v(transactional_id, producer_id, joining)
    ON v.transactional_id = t.transactional_id
  ORDER BY t.transactional_id
  FOR UPDATE OF t
), wanted AS (
  SELECT * FROM {_unnest(_WANTED_COLUMNS, _WANTED_TYPES, _W)}
), locked AS (
  SELECT p.topic, p."partition", p.high_watermark, p.log_start_offset, v.advance,
         t.configs = v.configs AS same_configs
  FROM partitions p
  JOIN wanted v ON v.topic = p.topic AND v."partition" = p."partition"
  JOIN topics t ON t.name = p.topic
  WHERE (SELECT count(*) FROM txns) >= 0
  ORDER BY p.topic, p."partition"
  FOR UPDATE OF p
), expected AS (
  SELECT * FROM {_unnest(_EXPECTED_COLUMNS, _EXPECTED_TYPES, _E)}
), held AS (
  SELECT s.producer_epoch, s.last_sequence, s.current_txn_first_offset, e.producer_id,
         e.current_epoch, e.state_epoch, e.last_sequence AS expected_sequence,
         e.open_txn_offset
  FROM producer_states s
  JOIN locked l ON l.topic = s.topic AND l."partition" = s."partition"
  JOIN expected e
    ON e.topic = s.topic AND e."partition" = s."partition" AND e.producer_id = s.producer_id
  FOR UPDATE OF s
), checked AS (
  SELECT (SELECT count(*) FROM locked WHERE same_configs) = cardinality(${_W}::varchar[])
     AND (SELECT count(*) FROM held h JOIN producer_ids i ON i.producer_id = h.producer_id
          WHERE h.producer_epoch = h.state_epoch AND h.last_sequence = h.expected_sequence
            AND h.current_txn_first_offset IS NOT DISTINCT FROM h.open_txn_offset
            AND i.producer_epoch = h.current_epoch)
         = cardinality(${_E}::varchar[])
     AND (SELECT count(*) FROM txns
          WHERE producer_id = expected_producer
            AND CASE WHEN joining THEN unchanged AND state = ANY(${_T + 4}::varchar[])
                     ELSE state = ${_T + 3}::varchar END)
         = cardinality(${_T}::varchar[]) AS passes
), joined AS (
  INSERT INTO transaction_partitions (transactional_id, topic, "partition", producer_id)
  SELECT v.transactional_id, v.topic, v."partition", v.producer_id
  FROM unnest(${_T + 6}::varchar[], ${_T + 7}::varchar[], ${_T + 8}::int[], ${_T + 9}::bigint[])
    AS v(transactional_id, topic, "partition", producer_id)
  WHERE {_PASSES}
  ON CONFLICT DO NOTHING
), begun AS (
  UPDATE transactions t
  SET state = ${_T + 3}::varchar,
      started_ms = CASE WHEN t.state = ${_T + 3}::varchar THEN t.started_ms ELSE ${
    _T + 5
}::bigint END,
      deadline_ms = CASE WHEN t.state = ${_T + 3}::varchar THEN t.deadline_ms
                         ELSE ${_T + 5}::bigint + t.timeout_ms END,
      updated_ms = ${_T + 5}::bigint
  FROM txns x
  WHERE t.transactional_id = x.transactional_id AND x.joining AND {_PASSES}
), appended AS (
  INSERT INTO batches ({_quoted(_BATCH_COLUMNS)}, control, aborted, first_offset)
  SELECT {
    ", ".join(
        f"l.high_watermark + v.{c}"
        if c in _OFFSET_COLUMNS
        else "overlay(v.payload PLACING int8send(l.high_watermark + v.base_offset) FROM 1 FOR 8)"
        if c == "payload"
        else f'v."{c}"'
        for c in _BATCH_COLUMNS
    )
}, NULL, false, NULL
  FROM {_unnest(_BATCH_COLUMNS, _BATCH_TYPES, 1)}
  JOIN locked l ON l.topic = v.topic AND l."partition" = v."partition"
  WHERE {_PASSES}
), stated AS (
  INSERT INTO producer_states ({_quoted(STATE_COLUMNS)})
  SELECT {
    ", ".join(
        "l.high_watermark + v.last_offset"
        if c == "last_offset"
        else "CASE WHEN e.open_txn_offset IS NULL"
        " THEN l.high_watermark + v.current_txn_first_offset"
        " ELSE v.current_txn_first_offset END"
        if c == "current_txn_first_offset"
        else f'v."{c}"'
        for c in STATE_COLUMNS
    )
}
  FROM {_unnest(STATE_COLUMNS, _STATE_TYPES, _B + 1)}
  JOIN locked l ON l.topic = v.topic AND l."partition" = v."partition"
  JOIN expected e
    ON e.topic = v.topic AND e."partition" = v."partition" AND e.producer_id = v.producer_id
  WHERE {_PASSES}
  {_STATE_UPDATE}
), moved AS (
  UPDATE partitions p SET high_watermark = l.high_watermark + l.advance
  FROM locked l
  WHERE p.topic = l.topic AND p."partition" = l."partition" AND {_PASSES}
)
SELECT l.topic, l."partition", l.high_watermark, l.log_start_offset, {_PASSES} FROM locked l
"""


async def write_optimistic(
    connection: AsyncConnection,
    rows: list[dict[str, Any]],
    producer_states: list[dict[str, Any]],
    wanted: dict[tuple[str, int], tuple[str, int]],
    expected: dict[tuple[str, int, int], ProducerView],
    transactions: dict[str, int],
    open_state: str,
    joins: Collection[tuple[str, str, int]] = (),
    joinable_states: Collection[str] = (),
    now: int = 0,
) -> dict[tuple[str, int], tuple[int, int]] | None:
    """Postgres, on a connection with no transaction open: write the group's rows and states
    (offsets relative to each partition's high watermark) and move each partition in `wanted`
    by its advance, in one statement that commits by itself, if every partition in `wanted`
    still has the configs given there, every producer in `expected` still has that view and
    every transactional id in `transactions` has a transaction of that producer id in
    `open_state`; each partition's (high watermark, log start offset) before the write, or
    None when nothing was written.

    `joins` (transactional id, topic, partition) are partitions that batches add to their
    transactions: those transactions may be in any of `joinable_states` (the transaction
    starts, at `now`, if it was not open) and must not have changed while the statement waited
    for their locks (its snapshot, which its other reads use, must be theirs)."""
    joining = {tid for tid, _, _ in joins}
    found = await on_driver(
        connection,
        _WRITE_OPTIMISTIC_POSTGRES,
        *([row[c] for row in rows] for c in _BATCH_COLUMNS),
        *([state[c] for state in producer_states] for c in STATE_COLUMNS),
        [t for t, _ in wanted],
        [p for _, p in wanted],
        [configs for configs, _ in wanted.values()],
        [advance for _, advance in wanted.values()],
        [t for t, _, _ in expected],
        [p for _, p, _ in expected],
        [pid for _, _, pid in expected],
        [v.current_epoch for v in expected.values()],
        [v.state_epoch for v in expected.values()],
        [v.last_sequence for v in expected.values()],
        [v.open_txn_offset for v in expected.values()],
        sorted(transactions),
        [transactions[tid] for tid in sorted(transactions)],
        [tid in joining for tid in sorted(transactions)],
        open_state,
        list(joinable_states),
        now,
        [tid for tid, _, _ in joins],
        [topic for _, topic, _ in joins],
        [partition for _, _, partition in joins],
        [transactions[tid] for tid, _, _ in joins],
    )
    if not found or not found[0][4]:
        return None
    return {(r[0], r[1]): (r[2], r[3]) for r in found}
