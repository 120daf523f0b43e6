"""Fetch and offsets by time: the reads of API.md's Records section for every front door (HTTP
JSON, HTTP record batches, and Kafka's protocol).

Fetch returns stored batches (`fetch_batches`), with the options each door needs; JSON fetch
reads their records. Appends to a partition are serial: their unit of work locks the partition's
counter row (`SELECT ... FOR UPDATE`; on SQLite the write unit already holds the database lock),
so a fetch reads a partition's bounds and batches as the last committed append left them.
Different partitions never wait for each other.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import astuple, dataclass, field
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.core.database import Database, on_driver
from coordinator.core.errors import InvalidRequest
from coordinator.core.replicas import Replica, count_fetch
from coordinator.log.bounds import Bounds, partition_bounds
from coordinator.log.errors import (
    OffsetOutOfRange,
    UnknownTopicOrPartition,
)
from coordinator.log.models import CONTROL_ABORT, Batch, Partition, ProducerState
from sdk import recordbatch

# Most batches read per query while filling a fetch; the first query reads FIRST_CHUNK, later
# ones as many as the batches seen so far say will fill `max_bytes` (so a fetch does not read
# many more rows from the store than it returns).
FETCH_CHUNK = 64
FIRST_CHUNK = 4


_batches = cast(Table, Batch.__table__)
_partitions = cast(Table, Partition.__table__)
_states = cast(Table, ProducerState.__table__)

# Where a fetch from `offset` starts: the batch holding it (possibly a marker). In a gap that
# compaction left, the batch before it, which the first chunk's `last_offset` bound drops.
_CONTAINING = (
    select(func.max(_batches.c.base_offset))
    .where(
        _batches.c.topic == bindparam("topic"),
        _batches.c.partition == bindparam("partition"),
        _batches.c.base_offset <= bindparam("offset"),
    )
    .scalar_subquery()
)


def _chunk_query(include_control: bool, include_aborted: bool, first: bool) -> Any:
    columns = (_batches.c.base_offset, _batches.c.last_offset, _batches.c.payload)
    query = select(*columns).where(
        _batches.c.topic == bindparam("topic"),
        _batches.c.partition == bindparam("partition"),
        _batches.c.base_offset
        >= (func.coalesce(_CONTAINING, bindparam("offset")) if first else bindparam("cursor")),
        _batches.c.base_offset < bindparam("upper"),
    )
    if first:
        query = query.where(_batches.c.last_offset >= bindparam("offset"))
    if not include_control:
        query = query.where(_batches.c.control.is_(None))
    if not include_aborted:
        query = query.where(_batches.c.aborted.is_(False))
    return query.order_by(_batches.c.base_offset).limit(bindparam("limit"))


# Built once: (include_control, include_aborted, first chunk) -> statement.
_CHUNKS = {
    (c, a, f): _chunk_query(c, a, f)
    for c in (False, True)
    for a in (False, True)
    for f in (False, True)
}


@dataclass(slots=True)
class Fetched:
    """Stored batches, whole, in offset order, and where the partition stands."""

    batches: list[bytes]
    next_offset: int  # where the next fetch starts: past what was returned or skipped
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    # Asked for (`aborted_list`): Kafka's aborted transactions of the fetched range.
    aborted: list[tuple[int, int]] = field(default_factory=list)


@dataclass(slots=True)
class _Filling:
    """A fetch's batches taken chunk by chunk, by its rules of bytes and records."""

    fetched: Fetched
    offset: int
    upper: int
    max_bytes: int
    max_records: int | None
    fit: bool
    at_least_one: bool
    size: int = 0
    records: int = 0

    def take(self, rows: Sequence[Any], limit: int) -> int:
        """Take what the rules allow of a chunk of (base offset, last offset, payload) rows read
        with `limit`: how many to read next, 0 when the fetch is complete."""
        fetched = self.fetched
        for base_offset, last_offset, payload in rows:
            if (
                self.fit
                and self.size + len(payload) > self.max_bytes
                and (fetched.batches or not self.at_least_one)
            ):
                return 0
            fetched.batches.append(payload)
            fetched.next_offset = last_offset + 1
            self.size += len(payload)
            self.records += last_offset + 1 - max(base_offset, self.offset)
            if self.size >= self.max_bytes or (
                self.max_records is not None and self.records >= self.max_records
            ):
                return 0
        if len(rows) < limit:
            # Everything below `upper` was read: skipped markers and aborted batches too.
            fetched.next_offset = self.upper
            return 0
        average = max(1, self.size // max(1, len(fetched.batches)))
        return max(1, min(FETCH_CHUNK, (self.max_bytes - self.size) // average + 1))


def _begin(
    bounds: Bounds | None, topic: str, partition: int, offset: int, read_committed: bool
) -> tuple[Fetched, int]:
    """The fetch's answer so far and the offset its batches stop below (the LSO under
    read_committed, else the high watermark)."""
    if bounds is None:
        raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
    log_start, high_watermark, stable = astuple(bounds)
    if not log_start <= offset <= high_watermark:
        raise OffsetOutOfRange(
            f"offset {offset} is outside {topic}-{partition}'s log: the log start offset is "
            f"{log_start} and the high watermark {high_watermark}"
        )
    upper = stable if read_committed else high_watermark
    return Fetched([], offset, high_watermark, stable, log_start), upper


async def fetch_batches(
    db: Database,
    topic: str,
    partition: int,
    offset: int,
    *,
    max_bytes: int,
    read_committed: bool,
    include_control: bool = False,
    include_aborted: bool | None = None,
    max_records: int | None = None,
    fit: bool = False,
    at_least_one: bool = True,
    aborted_list: bool = False,
) -> Fetched:
    """Whole batches from the one holding `offset` up to the LSO (read_committed) or the high
    watermark, at least one and then while under `max_bytes` (and, given, until they hold
    `max_records` records from `offset`). With `fit` (Kafka's fetch), a batch is added only
    while the batches stay within `max_bytes`, except a first one when `at_least_one` (Kafka
    lets only the first non-empty partition's first batch exceed the budget). HTTP leaves out
    control batches always and aborted batches under read_committed (the default of
    `include_aborted`); Kafka's door includes both and asks for the `aborted_list` of what it
    fetched, so its clients filter. An offset below the log start offset or above the high
    watermark is OFFSET_OUT_OF_RANGE.

    On Postgres the bounds, the first chunk of batches (up to FETCH_CHUNK, the payloads only of
    those within `max_bytes`) and the aborted list are one statement, one round trip, one
    snapshot; a fetch that needs more batches reads them in further chunks."""
    if include_aborted is None:
        include_aborted = not read_committed
    if not db.is_sqlite:
        asked = _Asked(
            offset, max_bytes, read_committed, include_control, include_aborted, max_records,
            fit, at_least_one, aborted_list,
        )  # fmt: skip
        return await _fetch_postgres(db, topic, partition, asked)
    params: dict[str, Any] = {"topic": topic, "partition": partition}
    async with db.read() as session:
        connection = await session.connection()
        bounds = await partition_bounds(connection, topic, partition)
        fetched, upper = _begin(bounds, topic, partition, offset, read_committed)
        if offset >= upper:
            return fetched
        filling = _Filling(fetched, offset, upper, max_bytes, max_records, fit, at_least_one)
        params |= {"offset": offset, "upper": upper}
        chunks = (include_control, include_aborted)
        await _read_chunks(connection, filling, chunks, params, FIRST_CHUNK, first=True)
        if aborted_list and fetched.batches:
            end = fetched.next_offset
            fetched.aborted = await _aborted(connection, topic, partition, offset, end)
    return fetched


async def _read_chunks(
    connection: AsyncConnection,
    filling: _Filling,
    chunks: tuple[bool, bool],
    params: dict[str, Any],
    limit: int,
    *,
    first: bool,
) -> None:
    """Read chunks of batches (`_CHUNKS[(*chunks, first)]`) into `filling` until it is
    complete, the first of `limit` rows; past the first, from `params["cursor"]` on."""
    while limit:
        statement = _CHUNKS[(*chunks, first)]
        rows = (await connection.execute(statement, {**params, "limit": limit})).all()
        first = False
        limit = filling.take(rows, limit)
        if limit:
            params["cursor"] = rows[-1][0] + 1


# Kafka's aborted-transactions list for fetched offsets [start, end): (producer id, first offset)
# of every aborted transaction with records there, oldest first. Abort markers are indexed.
_ABORTED = (
    select(_batches.c.producer_id, _batches.c.first_offset)
    .where(
        _batches.c.topic == bindparam("topic"),
        _batches.c.partition == bindparam("partition"),
        _batches.c.control == CONTROL_ABORT,
        _batches.c.base_offset >= bindparam("start"),
        _batches.c.first_offset.is_not(None),
        _batches.c.first_offset < bindparam("end"),
    )
    .order_by(_batches.c.first_offset)
)


async def _aborted(
    connection: AsyncConnection, topic: str, partition: int, start: int, end: int
) -> list[tuple[int, int]]:
    params = {"topic": topic, "partition": partition, "start": start, "end": end}
    return [(pid, first) for pid, first in await connection.execute(_ABORTED, params)]


async def aborted_transactions(
    db: Database, topic: str, partition: int, start: int, end: int
) -> list[tuple[int, int]]:
    """Kafka's aborted-transactions list for fetched offsets [start, end): (producer id, first
    offset) of every aborted transaction with records there, oldest first, for read_committed
    clients that filter batches themselves."""
    async with db.read() as session:
        return await _aborted(await session.connection(), topic, partition, start, end)


# The bounds, the first chunk and the aborted list of a fetch, in one statement: $1 topic, $2
# partition, $3 offset, $4 read_committed, $5 include_control, $6 include_aborted, $7 limit,
# $8 max_bytes, $9 aborted_list. Rows: kind 0 the bounds (log start, high watermark, LSO, the
# chunk's row count), kind 1 a batch within the budget (base offset, last offset, payload),
# kind 2 an aborted transaction (producer id, first offset). Out of range: the bounds alone.
_FETCH_POSTGRES = f"""
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


@dataclass(frozen=True, slots=True)
class _Asked:
    """What a fetch asked for (`fetch_batches`'s arguments)."""

    offset: int
    max_bytes: int
    read_committed: bool
    include_control: bool
    include_aborted: bool
    max_records: int | None
    fit: bool
    at_least_one: bool
    aborted_list: bool


class _NotOnReplica(Exception):
    """The standby cannot answer this fetch as the primary would: the primary answers it."""


async def _fetch_postgres(db: Database, topic: str, partition: int, asked: _Asked) -> Fetched:
    """From a standby within the lag bound when there is one (`Replicas.pick`), else, or when
    the standby cannot answer it, from the primary."""
    replica = db.replicas.pick() if db.replicas is not None else None
    if replica is not None:
        with contextlib.suppress(_NotOnReplica):
            fetched = await _fetch_postgres_on(db, replica, topic, partition, asked)
            count_fetch(replica=True)
            return fetched
    fetched = await _fetch_postgres_on(db, None, topic, partition, asked)
    count_fetch(replica=False)
    return fetched


@asynccontextmanager
async def _connection(db: Database, replica: Replica | None) -> AsyncIterator[AsyncConnection]:
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


async def _fetch_postgres_on(
    db: Database, replica: Replica | None, topic: str, partition: int, asked: _Asked
) -> Fetched:
    offset, max_bytes, read_committed = asked.offset, asked.max_bytes, asked.read_committed
    async with _connection(db, replica) as connection:
        found = await on_driver(
            connection, _FETCH_POSTGRES, topic, partition, offset, read_committed,
            asked.include_control, asked.include_aborted, FETCH_CHUNK, max_bytes,
            asked.aborted_list,
        )  # fmt: skip
    head = next((row for row in found if row[0] == 0), None)
    if replica is not None and (head is None or offset > head[2]):
        # Not on the standby yet (a new partition; an offset a consumer just fetched from the
        # primary): the primary answers, never an out-of-range the primary would not give.
        raise _NotOnReplica
    bounds = None if head is None else Bounds(head[1], head[2], head[3])
    fetched, upper = _begin(bounds, topic, partition, offset, read_committed)
    if offset >= upper:
        return fetched
    assert head is not None
    rows = sorted((r[1], r[2], r[5]) for r in found if r[0] == 1)
    filling = _Filling(
        fetched, offset, upper, max_bytes, asked.max_records, asked.fit, asked.at_least_one
    )
    # The budget cut the chunk short: as if it had been read with the rows it returned.
    limit = filling.take(rows, FETCH_CHUNK if head[4] == FETCH_CHUNK else len(rows) + 1)
    if limit:
        # More than a chunk's batches within the budget: the rest in chunks, from the same
        # server (the snapshot is another, but what lies below `upper` is written already,
        # and a standby's later snapshot holds all of an earlier one).
        params = {"topic": topic, "partition": partition, "upper": upper, "cursor": rows[-1][0] + 1}
        chunks = (asked.include_control, asked.include_aborted)
        async with _connection(db, replica) as connection:
            await _read_chunks(connection, filling, chunks, params, limit, first=False)
    if fetched.batches:
        fetched.aborted = sorted(
            (r[1], r[2]) for r in found if r[0] == 2 and r[2] < fetched.next_offset
        )
    return fetched


def _text_of(raw: bytes, offset: int) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise InvalidRequest(
            f"the record at offset {offset} is not valid UTF-8; fetch it with encoding=base64"
        ) from None


def _base64_of(raw: bytes, _: int) -> str:
    return base64.b64encode(raw).decode("ascii")


async def fetch_json(
    db: Database,
    topic: str,
    partition: int,
    offset: int,
    max_records: int,
    read_committed: bool,
    encoding: str,
    max_bytes: int,
) -> dict[str, Any]:
    """API.md's JSON fetch: the records of the fetched batches from `offset` on, at most
    `max_records`, keys, values and header values as text or base64."""
    fetched = await fetch_batches(
        db,
        topic,
        partition,
        offset,
        max_bytes=max_bytes,
        read_committed=read_committed,
        max_records=max_records,
    )
    text = _text_of if encoding == "utf8" else _base64_of
    out: list[dict[str, Any]] = []
    next_offset = fetched.next_offset
    # `max_bytes` bounds the answer too, not only the stored batches read: a compressed batch
    # inflates, so records stop once their keys, values and headers pass it (the first is
    # always given, as Kafka gives the first batch whatever its size).
    taken = 0
    for payload in fetched.batches:
        for record in recordbatch.records(payload):
            record_offset = record.offset
            if record_offset < offset:
                continue
            key, value = record.key, record.value
            size = len(key or b"") + len(value or b"")
            size += sum(len(name) + len(v or b"") for name, v in record.headers)
            if out and taken + size > max_bytes:
                next_offset = record_offset
                break
            taken += size
            out.append(
                {
                    "offset": record_offset,
                    "key": None if key is None else text(key, record_offset),
                    "value": None if value is None else text(value, record_offset),
                    "headers": {
                        name: None if v is None else text(v, record_offset)
                        for name, v in record.headers
                    },
                    "timestamp": record.timestamp,
                }
            )
            if len(out) >= max_records:
                next_offset = record_offset + 1
                break
        else:
            continue
        break
    return {
        "records": out,
        "next_offset": next_offset,
        "high_watermark": fetched.high_watermark,
        "last_stable_offset": fetched.last_stable_offset,
        "log_start_offset": fetched.log_start_offset,
    }


# -- offsets by time ----------------------------------------------------------------------------

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3


# Batches a ListOffsets by time reads at most before it answers none (the log start cuts through
# at most one batch, so two would do).
_LIST_OFFSET_BATCHES = 4


async def list_offset(
    db: Database, topic: str, partition: int, timestamp: int, *, read_committed: bool
) -> tuple[int, int]:
    """Kafka's ListOffsets for one partition: (offset, timestamp). LATEST is the high
    watermark (the LSO for read_committed), EARLIEST the log start offset; MAX_TIMESTAMP the
    first record holding the newest timestamp; a timestamp, the first record at least that
    old. The store indexes timestamps per batch: the batch is found by its newest timestamp,
    then its records are read for the exact one, as Kafka answers. -1 when there is none."""
    async with db.read() as session:
        connection = await session.connection()
        bounds = await partition_bounds(connection, topic, partition)
        if bounds is None:
            raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
        if timestamp == LATEST:
            return bounds.last_stable_offset if read_committed else bounds.high_watermark, -1
        if timestamp == EARLIEST:
            return bounds.log_start_offset, -1
        if timestamp < MAX_TIMESTAMP:
            raise InvalidRequest(f"timestamp {timestamp}: -3, -2, -1 or a time in ms")
        query = select(Batch.payload, Batch.max_timestamp).where(
            Batch.topic == topic, Batch.partition == partition, Batch.control.is_(None)
        )
        if timestamp == MAX_TIMESTAMP:
            query = query.order_by(Batch.max_timestamp.desc(), Batch.base_offset)
        else:
            query = query.where(Batch.max_timestamp >= timestamp).order_by(Batch.base_offset)
        # Usually the first batch found holds the answer; a batch the log start cuts through
        # may not (its records at that time were deleted), and the next one is asked.
        for payload, newest in await session.execute(query.limit(_LIST_OFFSET_BATCHES)):
            wanted = newest if timestamp == MAX_TIMESTAMP else timestamp
            for record in recordbatch.records(payload):
                if record.offset >= bounds.log_start_offset and record.timestamp >= wanted:
                    return record.offset, record.timestamp
        return -1, -1
