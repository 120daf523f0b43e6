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
from dataclasses import astuple, dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, select

from coordinator.core.database import Database
from coordinator.core.errors import InvalidRequest
from coordinator.log import recordbatch
from coordinator.log.bounds import partition_bounds
from coordinator.log.errors import (
    OffsetOutOfRange,
    UnknownTopicOrPartition,
)
from coordinator.log.models import CONTROL_ABORT, Batch, Partition, ProducerState

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
) -> Fetched:
    """Whole batches from the one holding `offset` up to the LSO (read_committed) or the high
    watermark, at least one and then while under `max_bytes` (and, given, until they hold
    `max_records` records from `offset`). With `fit` (Kafka's fetch), a batch is added only
    while the batches stay within `max_bytes`, except a first one when `at_least_one` (Kafka
    lets only the first non-empty partition's first batch exceed the budget). HTTP leaves out
    control batches always and aborted batches under read_committed (the default of
    `include_aborted`); Kafka's door includes both and sends `aborted_transactions` so its
    clients filter. An offset below the log start offset
    or above the high watermark is OFFSET_OUT_OF_RANGE."""
    if include_aborted is None:
        include_aborted = not read_committed
    params: dict[str, Any] = {"topic": topic, "partition": partition}
    async with db.read() as session:
        connection = await session.connection()
        bounds = await partition_bounds(connection, topic, partition)
        if bounds is None:
            raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
        log_start, high_watermark, stable = astuple(bounds)
        if not log_start <= offset <= high_watermark:
            raise OffsetOutOfRange(
                f"offset {offset} is outside {topic}-{partition}'s log: the log start offset is "
                f"{log_start} and the high watermark {high_watermark}"
            )
        upper = stable if read_committed else high_watermark
        fetched = Fetched([], offset, high_watermark, stable, log_start)
        if offset >= upper:
            return fetched
        params |= {"offset": offset, "upper": upper}
        size = 0
        records = 0
        first = True
        limit = FIRST_CHUNK
        while True:
            statement = _CHUNKS[(include_control, include_aborted, first)]
            rows = (await connection.execute(statement, {**params, "limit": limit})).all()
            first = False
            for base_offset, last_offset, payload in rows:
                if (
                    fit
                    and size + len(payload) > max_bytes
                    and (fetched.batches or not at_least_one)
                ):
                    return fetched
                fetched.batches.append(payload)
                fetched.next_offset = last_offset + 1
                size += len(payload)
                records += last_offset + 1 - max(base_offset, offset)
                if size >= max_bytes or (max_records is not None and records >= max_records):
                    return fetched
            if len(rows) < limit:
                # Everything below `upper` was read: skipped markers and aborted batches too.
                fetched.next_offset = upper
                return fetched
            params["cursor"] = rows[-1].base_offset + 1
            average = max(1, size // len(fetched.batches))
            limit = max(1, min(FETCH_CHUNK, (max_bytes - size) // average + 1))


async def aborted_transactions(
    db: Database, topic: str, partition: int, start: int, end: int
) -> list[tuple[int, int]]:
    """Kafka's aborted-transactions list for fetched offsets [start, end): (producer id, first
    offset) of every aborted transaction with records there, oldest first, for read_committed
    clients that filter batches themselves."""
    async with db.read() as session:
        rows = await session.execute(
            select(Batch.producer_id, Batch.first_offset)
            .where(
                Batch.topic == topic,
                Batch.partition == partition,
                Batch.control == CONTROL_ABORT,
                Batch.base_offset >= start,
                Batch.first_offset.is_not(None),
                Batch.first_offset < end,
            )
            .order_by(Batch.first_offset)
        )
        return [(pid, first) for pid, first in rows if first is not None]


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
