"""The Postgres engine's fetch: a partition's bounds, the first chunk of its batches and the
aborted transactions among them in one statement, one round trip, one snapshot, on a hot standby
within the lag bound when there is one (`replicas`), else on the primary. The rules of what a
fetch takes are the log's (`log.fetch.Filling`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DBAPIError

from coordinator.core.errors import CoordinatorError
from coordinator.log.bounds import Bounds
from coordinator.log.fetch import (
    FETCH_CHUNK,
    FetchAsk,
    Fetched,
    Filling,
    KafkaFetch,
    PartitionAsk,
    begin,
    read_chunks,
)
from coordinator.log.models import CONTROL_ABORT
from coordinator.store.postgres.driver import Driven, on_driver
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


# Kafka's Fetch of several partitions in one statement: $1 topics, $2 partitions, $3 offsets,
# $4 each partition's own budget (in the request's order: `ord`), $5 read_committed, $6 the chunk
# limit, $7 the request's budget, $8 the aborted lists asked. Rows: kind 0 each partition's
# bounds (log start, high watermark, LSO, its chunk's row count); kind 1 a batch of its chunk
# (base offset, last offset, payload), up to the first that starts past the partition's budget;
# kind 2 an aborted transaction (producer id, first offset). Markers and aborted batches are in
# the chunks: a Kafka client filters them. A payload the rules cannot take is not sent: it is
# null where the rules stop (`Filling.take`), at the first batch that would take its partition
# past the partition's budget or the request past the request's (only the first batch of the
# first partition with data may pass them). So a fetch of batches near the budget's size reads
# from the store what it answers, where it read up to a batch more a partition (twice as much
# for 1 MB batches). `before_all` counts the batches before it that fit their partitions'
# budgets (and each partition's first): what the rules took of them, unless the request's
# budget cut one short or a first batch was past its partition's, and then the later partitions
# answer less than the rules would have taken, as a Kafka broker may.
_FETCH_MANY = f"""
WITH asked AS (
  SELECT a.topic, a."partition", a."offset", a.max_bytes, a.ord
  FROM unnest($1::varchar[], $2::int[], $3::bigint[], $4::bigint[]) WITH ORDINALITY
    AS a(topic, "partition", "offset", max_bytes, ord)
), bounds AS (
  SELECT a.ord, p.log_start_offset, p.high_watermark,
         least(p.high_watermark, coalesce(
           (SELECT min(s.current_txn_first_offset) FROM producer_states s
            WHERE s.topic = a.topic AND s."partition" = a."partition"), p.high_watermark)) AS stable
  FROM asked a JOIN partitions p ON p.topic = a.topic AND p."partition" = a."partition"
), span AS (
  SELECT a.*, CASE WHEN $5 THEN b.stable ELSE b.high_watermark END AS upper
  FROM asked a JOIN bounds b ON b.ord = a.ord
  WHERE a."offset" BETWEEN b.log_start_offset AND b.high_watermark
), chunk AS (
  SELECT s.ord, s.max_bytes, c.base_offset, c.last_offset, c.size, c.payload,
         sum(c.size) OVER (PARTITION BY s.ord ORDER BY c.base_offset) - c.size AS before_here
  FROM span s CROSS JOIN LATERAL (
    SELECT b.base_offset, b.last_offset, b.size, b.payload FROM batches b
    WHERE b.topic = s.topic AND b."partition" = s."partition"
      AND b.base_offset >= coalesce(
        (SELECT max(c.base_offset) FROM batches c
         WHERE c.topic = s.topic AND c."partition" = s."partition"
           AND c.base_offset <= s."offset"),
        s."offset")
      AND b.base_offset < s.upper AND b.last_offset >= s."offset"
    ORDER BY b.base_offset LIMIT $6
  ) c
), kept AS (
  SELECT ord, base_offset, last_offset, size, payload, fits,
         sum(counted) OVER (ORDER BY ord, base_offset) - counted AS before_all
  FROM (SELECT *, before_here + size <= max_bytes AS fits,
               CASE WHEN before_here + size <= max_bytes OR before_here = 0 THEN size ELSE 0 END
                 AS counted
        FROM chunk) c
  WHERE before_here < max_bytes
)
SELECT 0, b.ord, b.log_start_offset, b.high_watermark, b.stable,
       (SELECT count(*) FROM chunk c WHERE c.ord = b.ord), NULL::bytea
FROM bounds b
UNION ALL
SELECT 1, k.ord, k.base_offset, k.last_offset, NULL, NULL,
       CASE WHEN k.before_all = 0 OR k.fits AND k.before_all + k.size <= $7 THEN k.payload END
FROM kept k
UNION ALL
SELECT 2, s.ord, b.producer_id, b.first_offset, NULL, NULL, NULL
FROM span s JOIN batches b ON b.topic = s.topic AND b."partition" = s."partition"
WHERE $8 AND b.control = {CONTROL_ABORT} AND b.base_offset >= s."offset"
  AND b.first_offset < s.upper
"""


class _NotOnReplica(Exception):
    """The standby cannot answer this fetch as the primary would: the primary answers it."""


async def fetch_partitions(
    db: PostgresStore, asks: Sequence[PartitionAsk], rules: KafkaFetch
) -> list[Fetched | CoordinatorError]:
    """From a standby within the lag bound when there is one and it holds every partition at
    the offsets asked, else from the primary: one statement, then the rules on its rows."""
    replica = db.replicas.pick() if db.replicas is not None else None
    if replica is not None:
        with contextlib.suppress(_NotOnReplica):
            fetched = await _fetch_partitions_on(db, replica, asks, rules)
            count_fetch(replica=True)
            return fetched
    fetched = await _fetch_partitions_on(db, None, asks, rules)
    count_fetch(replica=False)
    return fetched


async def _fetch_partitions_on(
    db: PostgresStore, replica: Replica | None, asks: Sequence[PartitionAsk], rules: KafkaFetch
) -> list[Fetched | CoordinatorError]:
    async with _connection(db, replica, driven=True) as connection:
        found = await on_driver(
            connection,
            _FETCH_MANY,
            [a.topic for a in asks],
            [a.partition for a in asks],
            [a.offset for a in asks],
            [a.max_bytes for a in asks],
            rules.read_committed,
            FETCH_CHUNK,
            rules.budget - rules.total,
            rules.read_committed,
        )
    heads: dict[int, Any] = {}
    chunks: dict[int, list[tuple[int, int, bytes | None]]] = {}
    aborted: dict[int, list[tuple[int, int]]] = {}
    for kind, ord_, a, b, c, count, payload in found:
        if kind == 0:
            heads[ord_] = (a, b, c, count)
        elif kind == 1:
            chunks.setdefault(ord_, []).append((a, b, payload))
        else:
            aborted.setdefault(ord_, []).append((a, b))
    if replica is not None and any(
        heads.get(i) is None or asked.offset > heads[i][1] for i, asked in enumerate(asks, 1)
    ):
        # Not all on the standby yet: the primary answers, never an out-of-range the primary
        # would not give.
        raise _NotOnReplica
    results: list[Fetched | CoordinatorError] = []
    for i, partition in enumerate(asks, 1):
        ask = rules.ask(partition)
        head = heads.get(i)
        try:
            fetched, upper = begin(None if head is None else Bounds(*head[:3]), ask)
        except CoordinatorError as refused:
            results.append(refused)
            continue
        if ask.max_records != 0 and ask.offset < upper:
            rows = sorted(chunks.get(i, ()))
            assert head is not None
            await _fill(db, replica, fetched, Filling(fetched, upper, ask), rows, head[3])
            if ask.aborted_list and fetched.batches:
                fetched.aborted = sorted(
                    (pid, first) for pid, first in aborted.get(i, ()) if first < fetched.next_offset
                )
        results.append(rules.took(fetched, ask))
    return results


async def _fill(
    db: PostgresStore,
    replica: Replica | None,
    fetched: Fetched,
    filling: Filling,
    rows: list[tuple[int, int, bytes | None]],
    chunk_rows: int,
) -> None:
    """Take the statement's chunk of a partition; more chunks, from the same server, when the
    chunk was full and the rules want more."""
    # Rows cut by the budgets (and their payloads) are as if they had been read: the rules stop
    # at the first of them.
    limit = filling.take(rows, FETCH_CHUNK if chunk_rows == FETCH_CHUNK else chunk_rows + 1)
    if limit:
        ask = filling.ask
        params = {
            "topic": ask.topic,
            "partition": ask.partition,
            "upper": filling.upper,
            "cursor": rows[-1][0] + 1,
        }
        async with _connection(db, replica) as connection:
            await read_chunks(connection, filling, params, limit, first=False)


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
async def _connection(
    db: PostgresStore, replica: Replica | None, *, driven: bool = False
) -> AsyncIterator[Driven]:
    """A connection to the standby (its failures `_NotOnReplica`) or the primary: for
    statements sent to the driver alone (`driven`, `PostgresStore.driver`), or for SQLAlchemy's
    too."""
    if replica is None:
        async with db.driver() if driven else db.autocommit() as connection:
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
    async with _connection(db, replica, driven=True) as connection:
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
