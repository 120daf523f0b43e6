"""The Postgres engine's fetch: a partition's bounds, the first chunk of its batches and the
aborted transactions among them in one statement, one round trip, one snapshot, on a hot standby
within the lag bound when there is one (`replicas`), else on the primary. The rules of what a
fetch takes are the log's (`log.fetch.Filling`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.log.bounds import Bounds
from coordinator.log.fetch import FETCH_CHUNK, FetchAsk, Fetched, Filling, begin, read_chunks
from coordinator.log.models import CONTROL_ABORT
from coordinator.store.postgres.driver import on_driver
from coordinator.store.postgres.replicas import Replica, count_fetch

if TYPE_CHECKING:
    from coordinator.store.postgres import PostgresStore

# The bounds, the first chunk and the aborted list of a fetch, in one statement: $1 topic, $2
# partition, $3 offset, $4 read_committed, $5 include_control, $6 include_aborted, $7 limit,
# $8 max_bytes, $9 aborted_list. Rows: kind 0 the bounds (log start, high watermark, LSO, the
# chunk's row count), kind 1 a batch within the budget (base offset, last offset, payload),
# kind 2 an aborted transaction (producer id, first offset). Out of range: the bounds alone.
_FETCH = f"""
WITH bounds AS (
  SELECT p.log_start_offset, p.high_watermark,
         least(p.high_watermark, coalesce(
           (SELECT min(s.current_txn_first_offset) FROM producer_states s
            WHERE s.topic = $1 AND s."partition" = $2), p.high_watermark)) AS stable
  FROM partitions p WHERE p.topic = $1 AND p."partition" = $2
), span AS (
  SELECT CASE WHEN $4 THEN stable ELSE high_watermark END AS upper FROM bounds
  WHERE $3 BETWEEN log_start_offset AND high_watermark
), chunk AS (
  SELECT b.base_offset, b.last_offset, b.payload,
         sum(b.size) OVER (ORDER BY b.base_offset) - b.size AS before
  FROM batches b, span
  WHERE b.topic = $1 AND b."partition" = $2
    AND b.base_offset >= coalesce(
      (SELECT max(c.base_offset) FROM batches c
       WHERE c.topic = $1 AND c."partition" = $2 AND c.base_offset <= $3), $3)
    AND b.base_offset < span.upper AND b.last_offset >= $3
    AND ($5 OR b.control IS NULL) AND ($6 OR NOT b.aborted)
  ORDER BY b.base_offset LIMIT $7
)
SELECT 0, log_start_offset, high_watermark, stable, (SELECT count(*) FROM chunk), NULL::bytea
FROM bounds
UNION ALL
SELECT 1, base_offset, last_offset, NULL, NULL, payload FROM chunk WHERE before < $8
UNION ALL
SELECT 2, b.producer_id, b.first_offset, NULL, NULL, NULL
FROM batches b, span
WHERE $9 AND b.topic = $1 AND b."partition" = $2 AND b.control = {CONTROL_ABORT}
  AND b.base_offset >= $3 AND b.first_offset < span.upper
"""


class _NotOnReplica(Exception):
    """The standby cannot answer this fetch as the primary would: the primary answers it."""


async def fetch(db: PostgresStore, ask: FetchAsk) -> Fetched:
    """From a standby within the lag bound when there is one (`Replicas.pick`), else, or when
    the standby cannot answer it, from the primary."""
    replica = db.replicas.pick() if db.replicas is not None else None
    if replica is not None:
        with contextlib.suppress(_NotOnReplica):
            fetched = await _fetch_on(db, replica, ask)
            count_fetch(replica=True)
            return fetched
    fetched = await _fetch_on(db, None, ask)
    count_fetch(replica=False)
    return fetched


@asynccontextmanager
async def _connection(db: PostgresStore, replica: Replica | None) -> AsyncIterator[AsyncConnection]:
    """A connection to the standby (its failures `_NotOnReplica`) or the primary."""
    if replica is None:
        async with db.autocommit() as connection:
            yield connection
        return
    assert db.replicas is not None
    try:
        async with db.replicas.connection(replica) as connection:
            yield connection
    except (ConnectionError, OSError, DBAPIError):
        raise _NotOnReplica from None


async def _fetch_on(db: PostgresStore, replica: Replica | None, ask: FetchAsk) -> Fetched:
    topic, partition, offset = ask.topic, ask.partition, ask.offset
    async with _connection(db, replica) as connection:
        found = await on_driver(
            connection, _FETCH, topic, partition, offset, ask.read_committed,
            ask.include_control, ask.include_aborted, FETCH_CHUNK, ask.max_bytes,
            ask.aborted_list,
        )  # fmt: skip
    head = next((row for row in found if row[0] == 0), None)
    if replica is not None and (head is None or offset > head[2]):
        # Not on the standby yet (a new partition; an offset a consumer just fetched from the
        # primary): the primary answers, never an out-of-range the primary would not give.
        raise _NotOnReplica
    bounds = None if head is None else Bounds(head[1], head[2], head[3])
    fetched, upper = begin(bounds, ask)
    if offset >= upper:
        return fetched
    assert head is not None
    rows = sorted((r[1], r[2], r[5]) for r in found if r[0] == 1)
    filling = Filling(fetched, upper, ask)
    # The budget cut the chunk short: as if it had been read with the rows it returned.
    limit = filling.take(rows, FETCH_CHUNK if head[4] == FETCH_CHUNK else len(rows) + 1)
    if limit:
        # More than a chunk's batches within the budget: the rest in chunks, from the same
        # server (the snapshot is another, but what lies below `upper` is written already,
        # and a standby's later snapshot holds all of an earlier one).
        params = {"topic": topic, "partition": partition, "upper": upper, "cursor": rows[-1][0] + 1}
        async with _connection(db, replica) as connection:
            await read_chunks(connection, filling, params, limit, first=False)
    if fetched.batches:
        fetched.aborted = sorted(
            (r[1], r[2]) for r in found if r[0] == 2 and r[2] < fetched.next_offset
        )
    return fetched
