"""The Postgres engine's statements of the log's appends: prepared on the driver, over arrays
(`unnest`), one round trip each whatever the group's size.

An append group on the locking path reads its producers' views in one statement and writes its
batches, producer states and high watermarks in one more. An optimistic group
(`log.appends.ConditionalAppends`) is one statement that locks, checks and writes. A producer's
state is written as `log.appends.state_on_conflict` says, and a transaction's caller checked as
`transactions.caller.is_current` says: both rendered into the statements from there.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from sqlalchemy import column, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.log.appends import (
    BATCH_COLUMNS,
    STATE_COLUMNS,
    STATE_KEY,
    ConditionalAppends,
    ProducerView,
    WrittenIfUnchanged,
    state_on_conflict,
    states,
)
from coordinator.log.epochs import leads_in_sql
from coordinator.store.postgres.driver import Driven, on_driver
from coordinator.transactions.caller import in_sql

_VIEWS = """
SELECT k.topic, k."partition", k.producer_id, i.producer_epoch,
       s.producer_epoch, s.last_sequence, s.current_txn_first_offset
FROM unnest($1::varchar[], $2::int[], $3::bigint[]) AS k(topic, "partition", producer_id)
JOIN producer_ids i ON i.producer_id = k.producer_id
LEFT JOIN producer_states s
  ON s.topic = k.topic AND s."partition" = k."partition" AND s.producer_id = k.producer_id
"""

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


def _on_conflict() -> str:
    """The ON CONFLICT clause of `state_on_conflict`, as the statements below end their insert
    of producer states with it."""
    source = text("SELECT 1").columns(*(column(c) for c in STATE_COLUMNS))
    insert = postgresql.insert(states).from_select(list(STATE_COLUMNS), source)
    upsert = insert.on_conflict_do_update(
        index_elements=STATE_KEY, set_=state_on_conflict(states.c, insert.excluded)
    )
    rendered = str(upsert.compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]
    return rendered[rendered.index("ON CONFLICT") :]


_STATE_ON_CONFLICT = _on_conflict()
_B, _S = len(BATCH_COLUMNS), len(STATE_COLUMNS)
_WRITE = f"""
WITH appended AS (
  INSERT INTO batches ({_quoted(BATCH_COLUMNS)}, control, aborted, first_offset)
  SELECT {_quoted(BATCH_COLUMNS)}, NULL, false, NULL
  FROM {_unnest(BATCH_COLUMNS, _BATCH_TYPES, 1)}
), stated AS (
  INSERT INTO producer_states ({_quoted(STATE_COLUMNS)})
  SELECT {_quoted(STATE_COLUMNS)} FROM {_unnest(STATE_COLUMNS, _STATE_TYPES, _B + 1)}
  {_STATE_ON_CONFLICT}
)
UPDATE partitions p SET high_watermark = v.next_offset
FROM {_unnest(("topic", "partition", "next_offset"), ("varchar", "int", "bigint"), _B + _S + 1)}
WHERE p.topic = v.topic AND p."partition" = v."partition"
"""


async def producer_views(
    connection: AsyncConnection, keys: Collection[tuple[str, int, int]]
) -> dict[tuple[str, int, int], ProducerView]:
    topics_, partitions_, pids_ = zip(*keys, strict=True) if keys else ((), (), ())
    found = await on_driver(connection, _VIEWS, topics_, partitions_, pids_)
    return {(r[0], r[1], r[2]): ProducerView(r[3], r[4], r[5], r[6]) for r in found}


async def write_appends(
    connection: AsyncConnection,
    rows: list[dict[str, Any]],
    producer_states: list[dict[str, Any]],
    moved: list[tuple[str, int, int]],
) -> None:
    await on_driver(
        connection,
        _WRITE,
        *([row[c] for row in rows] for c in BATCH_COLUMNS),
        *([state[c] for state in producer_states] for c in STATE_COLUMNS),
        [t for t, _, _ in moved],
        [p for _, p, _ in moved],
        [hw for _, _, hw in moved],
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
    "transactional_id",
    "reopen_offset",
)
_EXPECTED_TYPES = ("varchar", "int", "bigint", "int", "int", "int", "bigint", "varchar", "bigint")
_WANTED_COLUMNS = ("topic", "partition", "configs", "advance", "leader_id", "leader_epoch")
_WANTED_TYPES = ("varchar", "int", "text", "bigint", "int", "int")
_W = _B + _S + 1
_E = _W + len(_WANTED_COLUMNS)
_T = _E + len(_EXPECTED_COLUMNS)
_OFFSET_COLUMNS = ("base_offset", "last_offset")
_PASSES = "(SELECT passes FROM checked)"

# The group planned on what its process saw written (offsets relative to each partition's high
# watermark), written only if the locked rows are still what it saw (each partition still led
# as its appends were taken under: `log.epochs.leads`). Rows locked FOR UPDATE are
# read as the newest committed version (READ COMMITTED re-reads a row it waited for), not as the
# statement's snapshot, in the fixed order: the transactions its batches belong to (sorted), then
# the partitions (sorted; the scalar subquery on `txns` is evaluated before the first partition
# row is read), then the producers' states on them (every writer of a producer state holds its
# partition's lock, so nothing waits for a state while holding a partition this statement
# wants). A transaction's producer row is locked with it, as InitPid, AddPartitions and EndTxn
# lock them: the epoch checked is the one the lock frees, not the statement's snapshot's (an
# InitPid that raised it while the statement waited fences the batch, whatever the transaction
# looks like by then: a new instance's may be Ongoing already). Other epochs are read from the
# snapshot, as the locking path reads them just after its locks. A transactional batch's
# transaction must be Ongoing for its producer, and the state must show the same open
# transaction on the partition (its first offset there, which only the transaction's marker
# clears): the partition is already in it. A batch that joins its
# transaction (the state shows none open there) needs the transaction in a state that takes it
# and unchanged since the statement's snapshot: an InitPid that fenced the producer while the
# statement waited raised the epoch the snapshot still shows, and changed that row. Its first
# offset there is planned from 0, as the batches' are. A batch whose view shows its transaction
# open on the partition may find it ended there instead (the state shows none open: its marker
# was written by another process, whose end this process did not see): it then reopens, starting
# the producer's next transaction there, which must be Ongoing already for its producer (begun
# at the same epoch, transaction version 1, by an AddPartitions elsewhere), at its first batch's
# offset, and joins it there if that transaction does not include the partition yet. Every write
# is gated on `checked`, computed once from all the locked rows; nothing is written if it fails.
_WRITE_IF_UNCHANGED = f"""
WITH txns AS (
  SELECT t.transactional_id, t.state, v.joining,
         {in_sql("t.producer_id", "i.producer_epoch", "v.producer_id", "v.producer_epoch")}
           AS current,
         t.xmin::text = (SELECT s.xmin::text FROM transactions s
                         WHERE s.transactional_id = t.transactional_id) AS unchanged
  FROM transactions t
  JOIN producer_ids i ON i.producer_id = t.producer_id
  JOIN unnest(${_T}::varchar[], ${_T + 1}::bigint[], ${_T + 2}::int[], ${_T + 3}::boolean[])
    AS v(transactional_id, producer_id, producer_epoch, joining)
    ON v.transactional_id = t.transactional_id
  ORDER BY t.transactional_id
  FOR UPDATE OF t, i
), wanted AS (
  SELECT * FROM {_unnest(_WANTED_COLUMNS, _WANTED_TYPES, _W)}
), locked AS (
  SELECT p.topic, p."partition", p.high_watermark, p.log_start_offset, v.advance,
         t.configs = v.configs
           AND {leads_in_sql("p.leader_id", "p.leader_epoch", "v.leader_id", "v.leader_epoch")}
           AS same_configs
  FROM partitions p
  JOIN wanted v ON v.topic = p.topic AND v."partition" = p."partition"
  JOIN topics t ON t.name = p.topic
  WHERE (SELECT count(*) FROM txns) >= 0
  ORDER BY p.topic, p."partition"
  FOR UPDATE OF p
), expected AS (
  SELECT * FROM {_unnest(_EXPECTED_COLUMNS, _EXPECTED_TYPES, _E)}
), held AS (
  SELECT s.topic, s."partition", s.producer_epoch, s.last_sequence, s.current_txn_first_offset,
         e.producer_id, e.current_epoch, e.state_epoch, e.last_sequence AS expected_sequence,
         e.open_txn_offset, e.transactional_id, e.reopen_offset,
         e.reopen_offset IS NOT NULL AND s.current_txn_first_offset IS NULL AS reopened
  FROM producer_states s
  JOIN locked l ON l.topic = s.topic AND l."partition" = s."partition"
  JOIN expected e
    ON e.topic = s.topic AND e."partition" = s."partition" AND e.producer_id = s.producer_id
  FOR UPDATE OF s
), checked AS (
  SELECT (SELECT count(*) FROM locked WHERE same_configs) = cardinality(${_W}::varchar[])
     AND (SELECT count(*) FROM held h JOIN producer_ids i ON i.producer_id = h.producer_id
          WHERE h.producer_epoch = h.state_epoch AND h.last_sequence = h.expected_sequence
            AND (h.current_txn_first_offset IS NOT DISTINCT FROM h.open_txn_offset
                 OR h.reopened)
            AND i.producer_epoch = h.current_epoch)
         = cardinality(${_E}::varchar[])
     AND (SELECT count(*) FROM txns
          WHERE current
            AND CASE WHEN joining THEN unchanged AND state = ANY(${_T + 5}::varchar[])
                     ELSE state = ${_T + 4}::varchar END)
         = cardinality(${_T}::varchar[]) AS passes
), joined AS (
  INSERT INTO transaction_partitions (transactional_id, topic, "partition", producer_id)
  SELECT v.transactional_id, v.topic, v."partition", v.producer_id
  FROM unnest(${_T + 7}::varchar[], ${_T + 8}::varchar[], ${_T + 9}::int[], ${_T + 10}::bigint[])
    AS v(transactional_id, topic, "partition", producer_id)
  WHERE {_PASSES}
  UNION ALL
  SELECT h.transactional_id, h.topic, h."partition", h.producer_id FROM held h
  WHERE h.reopened AND {_PASSES}
  ON CONFLICT DO NOTHING
), begun AS (
  UPDATE transactions t
  SET state = ${_T + 4}::varchar,
      started_ms = CASE WHEN t.state = ${_T + 4}::varchar THEN t.started_ms ELSE ${
    _T + 6
}::bigint END,
      deadline_ms = CASE WHEN t.state = ${_T + 4}::varchar THEN t.deadline_ms
                         ELSE ${_T + 6}::bigint + t.timeout_ms END,
      updated_ms = ${_T + 6}::bigint
  FROM txns x
  WHERE t.transactional_id = x.transactional_id AND x.joining AND {_PASSES}
), appended AS (
  INSERT INTO batches ({_quoted(BATCH_COLUMNS)}, control, aborted, first_offset)
  SELECT {
    ", ".join(
        f"l.high_watermark + v.{c}"
        if c in _OFFSET_COLUMNS
        else "overlay(v.payload PLACING int8send(l.high_watermark + v.base_offset) FROM 1 FOR 8)"
        if c == "payload"
        else f'v."{c}"'
        for c in BATCH_COLUMNS
    )
}, NULL, false, NULL
  FROM {_unnest(BATCH_COLUMNS, _BATCH_TYPES, 1)}
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
        " WHEN h.reopened THEN l.high_watermark + e.reopen_offset"
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
  LEFT JOIN held h
    ON h.topic = v.topic AND h."partition" = v."partition" AND h.producer_id = v.producer_id
  WHERE {_PASSES}
  {_STATE_ON_CONFLICT}
), moved AS (
  UPDATE partitions p SET high_watermark = l.high_watermark + l.advance
  FROM locked l
  WHERE p.topic = l.topic AND p."partition" = l."partition" AND {_PASSES}
)
SELECT l.topic, l."partition", l.high_watermark, l.log_start_offset, {_PASSES},
       ARRAY(SELECT h.producer_id FROM held h
             WHERE h.reopened AND h.topic = l.topic AND h."partition" = l."partition")
FROM locked l
"""


async def write_if_unchanged(
    connection: Driven, planned: ConditionalAppends
) -> WrittenIfUnchanged | None:
    """`planned` in one statement that commits by itself, on a connection with no transaction
    open: what it found and wrote, or None when nothing was written."""
    wanted, expected, transactions = planned.wanted, planned.expected, planned.transactions
    joining = {tid for tid, _, _ in planned.joins}
    ids = sorted(transactions)
    found = await on_driver(
        connection,
        _WRITE_IF_UNCHANGED,
        *([row[c] for row in planned.rows] for c in BATCH_COLUMNS),
        *([state[c] for state in planned.states] for c in STATE_COLUMNS),
        [t for t, _ in wanted],
        [p for _, p in wanted],
        [configs for configs, _, _ in wanted.values()],
        [advance for _, advance, _ in wanted.values()],
        [None if led is None else led[0] for _, _, led in wanted.values()],
        [None if led is None else led[1] for _, _, led in wanted.values()],
        [t for t, _, _ in expected],
        [p for _, p, _ in expected],
        [pid for _, _, pid in expected],
        [v.current_epoch for v in expected.values()],
        [v.state_epoch for v in expected.values()],
        [v.last_sequence for v in expected.values()],
        [v.open_txn_offset for v in expected.values()],
        [planned.reopens.get(key, (None, None))[0] for key in expected],
        [planned.reopens.get(key, (None, None))[1] for key in expected],
        ids,
        [transactions[tid][0] for tid in ids],
        [transactions[tid][1] for tid in ids],
        [tid in joining for tid in ids],
        planned.open_state,
        list(planned.joinable_states),
        planned.now,
        [tid for tid, _, _ in planned.joins],
        [topic for _, topic, _ in planned.joins],
        [partition for _, _, partition in planned.joins],
        [transactions[tid][0] for tid, _, _ in planned.joins],
    )
    if not found or not found[0][4]:
        return None
    return WrittenIfUnchanged(
        {(r[0], r[1]): (r[2], r[3]) for r in found},
        frozenset((r[0], r[1], pid) for r in found for pid in r[5]),
    )
