"""Fetch and offsets by time: the reads of the HTTP API's Records section for every front door (HTTP
JSON, HTTP record batches, and Kafka's protocol).

Fetch returns stored batches (`fetch_batches`), with the options each door needs; JSON fetch
reads their records. Appends to a partition are serial: their unit of work locks the partition's
counter row (`SELECT ... FOR UPDATE`; on SQLite the write unit already holds the database lock),
so a fetch reads a partition's bounds and batches as the last committed append left them.
Different partitions never wait for each other.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import astuple, dataclass, field
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from coordinator.core.errors import CoordinatorError, InvalidRequest
from coordinator.core.names import topic_name_problem
from coordinator.log.bounds import Bounds, partition_bounds
from coordinator.log.errors import (
    OffsetOutOfRange,
    UnknownTopicOrPartition,
)
from coordinator.log.models import CONTROL_ABORT, Batch, Partition, ProducerState
from coordinator.store import Store
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


@dataclass(frozen=True, slots=True)
class FetchAsk:
    """What a fetch of one partition asked for (`fetch_batches`'s arguments)."""

    topic: str
    partition: int
    offset: int
    max_bytes: int
    read_committed: bool
    include_control: bool
    include_aborted: bool
    max_records: int | None
    fit: bool
    at_least_one: bool
    aborted_list: bool


@dataclass(slots=True)
class Filling:
    """A fetch's batches taken chunk by chunk, by its rules of bytes and records."""

    fetched: Fetched
    upper: int
    ask: FetchAsk
    size: int = 0
    records: int = 0

    def take(self, rows: Sequence[Any], limit: int) -> int:
        """Take what the rules allow of a chunk of (base offset, last offset, payload) rows read
        with `limit`: how many to read next, 0 when the fetch is complete."""
        fetched, ask = self.fetched, self.ask
        max_bytes = ask.max_bytes
        for base_offset, last_offset, payload in rows:
            if payload is None:
                return 0  # past a budget the store already applied
            if (
                ask.fit
                and self.size + len(payload) > max_bytes
                and (fetched.batches or not ask.at_least_one)
            ):
                return 0
            fetched.batches.append(payload)
            fetched.next_offset = last_offset + 1
            self.size += len(payload)
            self.records += last_offset + 1 - max(base_offset, ask.offset)
            if self.size >= max_bytes or (
                ask.max_records is not None and self.records >= ask.max_records
            ):
                return 0
        if len(rows) < limit:
            # Everything below `upper` was read: skipped markers and aborted batches too.
            fetched.next_offset = self.upper
            return 0
        average = max(1, self.size // max(1, len(fetched.batches)))
        return max(1, min(FETCH_CHUNK, (max_bytes - self.size) // average + 1))


def begin(bounds: Bounds | None, ask: FetchAsk) -> tuple[Fetched, int]:
    """The fetch's answer so far and the offset its batches stop below (the LSO under
    read_committed, else the high watermark)."""
    topic, partition, offset = ask.topic, ask.partition, ask.offset
    if bounds is None:
        raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
    log_start, high_watermark, stable = astuple(bounds)
    if not log_start <= offset <= high_watermark:
        raise OffsetOutOfRange(
            f"offset {offset} is outside {topic}-{partition}'s log: the log start offset is "
            f"{log_start} and the high watermark {high_watermark}"
        )
    upper = stable if ask.read_committed else high_watermark
    return Fetched([], offset, high_watermark, stable, log_start), upper


async def fetch_batches(
    db: Store,
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

    The store reads it (`Store.fetch`): on Postgres the bounds, the first chunk of batches and
    the aborted list in one statement, one round trip, one snapshot, maybe on a hot standby; a
    fetch that needs more batches reads them in further chunks (`read_chunks`)."""
    if include_aborted is None:
        include_aborted = not read_committed
    ask = FetchAsk(
        topic, partition, offset, max_bytes, read_committed, include_control, include_aborted,
        max_records, fit, at_least_one, aborted_list,
    )  # fmt: skip
    return await db.fetch(ask)


@dataclass(frozen=True, slots=True)
class PartitionAsk:
    """One partition of Kafka's Fetch: where it reads from, and its own byte budget."""

    topic: str
    partition: int
    offset: int
    max_bytes: int


class KafkaFetch:
    """The rules by which Kafka's broker fills a Fetch of several partitions, in order: each
    partition's batches, markers and aborted batches included (a Kafka client filters them, with
    the aborted list under read_committed), within its own budget and what is left of the
    request's. The first batch of the first partition with data comes whatever its size, so a
    client always makes progress; once the request's budget is spent, a partition answers where
    it stands, with no data. Every store fills a fetch by these (`Store.fetch_partitions`)."""

    def __init__(self, budget: int, read_committed: bool) -> None:
        self.budget = budget
        self.read_committed = read_committed
        self.total = 0

    @property
    def spent(self) -> bool:
        return self.total >= self.budget

    def ask(self, partition: PartitionAsk) -> FetchAsk:
        """What to read of the partition, given what the partitions before it took."""
        spent = self.spent
        return FetchAsk(
            partition.topic,
            partition.partition,
            partition.offset,
            1 if spent else max(1, min(partition.max_bytes, self.budget - self.total)),
            self.read_committed,
            include_control=True,
            include_aborted=True,
            max_records=0 if spent else None,
            fit=not spent,
            at_least_one=self.total == 0,
            aborted_list=self.read_committed and not spent,
        )

    def took(self, fetched: Fetched, ask: FetchAsk) -> Fetched:
        """The partition's answer, counted against the request's budget."""
        if ask.max_records == 0:
            fetched.batches = []  # where it stands, no data
        self.total += sum(len(batch) for batch in fetched.batches)
        return fetched


async def fetch_partitions(
    db: Store,
    asks: Sequence[PartitionAsk],
    max_bytes: int | None,
    limit: int,
    *,
    read_committed: bool,
) -> list[Fetched | CoordinatorError]:
    """Kafka's Fetch of several partitions (`KafkaFetch`'s rules) within the request's budget
    (`max_bytes`, at most `limit`, COORDINATOR_FETCH_MAX_BYTES; none asked: `limit`): each
    partition's answer, or the error that refused it alone. On Postgres, one statement reads
    every partition's bounds, first chunk and aborted list."""
    rules = KafkaFetch(min(max_bytes or limit, limit), read_committed)
    # A name no topic can have (a NUL in it, say, which no store keeps) is no topic's: that
    # partition alone is unknown, as Kafka answers it, and the others are read.
    named = [ask for ask in asks if topic_name_problem(ask.topic) is None]
    if len(named) == len(asks):
        return await db.fetch_partitions(asks, rules)
    read = iter(await db.fetch_partitions(named, rules) if named else ())
    return [
        next(read)
        if topic_name_problem(ask.topic) is None
        else UnknownTopicOrPartition(f"no topic is named {ask.topic[:64]!r}")
        for ask in asks
    ]


async def fetch_each(
    db: Store, asks: Sequence[PartitionAsk], rules: KafkaFetch
) -> list[Fetched | CoordinatorError]:
    """`Store.fetch_partitions` one partition after another (`Store.fetch` each)."""
    results: list[Fetched | CoordinatorError] = []
    for partition in asks:
        ask = rules.ask(partition)
        try:
            results.append(rules.took(await db.fetch(ask), ask))
        except CoordinatorError as refused:
            results.append(refused)
    return results


async def fetch_portably(session: AsyncSession, ask: FetchAsk) -> Fetched:
    """`Store.fetch` in portable statements, in a read unit of work: the bounds, then chunks of
    batches, then the aborted list."""
    connection = await session.connection()
    topic, partition, offset = ask.topic, ask.partition, ask.offset
    bounds = await partition_bounds(connection, topic, partition)
    fetched, upper = begin(bounds, ask)
    if offset >= upper:
        return fetched
    filling = Filling(fetched, upper, ask)
    params: dict[str, Any] = {"topic": topic, "partition": partition, "offset": offset}
    params["upper"] = upper
    await read_chunks(connection, filling, params, FIRST_CHUNK, first=True)
    if ask.aborted_list and fetched.batches:
        end = fetched.next_offset
        fetched.aborted = await aborted_in(connection, topic, partition, offset, end)
    return fetched


async def read_chunks(
    connection: AsyncConnection,
    filling: Filling,
    params: dict[str, Any],
    limit: int,
    *,
    first: bool,
) -> None:
    """Read chunks of batches into `filling` until it is complete, the first of `limit` rows;
    past the first, from `params["cursor"]` on."""
    chunks = (filling.ask.include_control, filling.ask.include_aborted)
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


async def aborted_in(
    connection: AsyncConnection, topic: str, partition: int, start: int, end: int
) -> list[tuple[int, int]]:
    params = {"topic": topic, "partition": partition, "start": start, "end": end}
    return [(pid, first) for pid, first in await connection.execute(_ABORTED, params)]


async def aborted_transactions(
    db: Store, topic: str, partition: int, start: int, end: int
) -> list[tuple[int, int]]:
    """Kafka's aborted-transactions list for fetched offsets [start, end): (producer id, first
    offset) of every aborted transaction with records there, oldest first, for read_committed
    clients that filter batches themselves."""
    async with db.read() as session:
        return await aborted_in(await session.connection(), topic, partition, start, end)


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
    db: Store,
    topic: str,
    partition: int,
    offset: int,
    max_records: int,
    read_committed: bool,
    encoding: str,
    max_bytes: int,
) -> dict[str, Any]:
    """The HTTP API's JSON fetch: the records of the fetched batches from `offset` on, at most
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


# -- batches by offset range (share groups' acquisitions) -----------------------------------


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """A stored batch, whole, with what a share partition's acquisition asks of it."""

    base_offset: int
    last_offset: int
    control: bool
    aborted: bool
    payload: bytes


_STORED = (
    _batches.c.base_offset,
    _batches.c.last_offset,
    _batches.c.control,
    _batches.c.aborted,
    _batches.c.payload,
)
_FROM = (
    select(*_STORED)
    .where(
        _batches.c.topic == bindparam("topic"),
        _batches.c.partition == bindparam("partition"),
        _batches.c.base_offset >= func.coalesce(_CONTAINING, bindparam("offset")),
        _batches.c.last_offset >= bindparam("offset"),
        _batches.c.base_offset < bindparam("upper"),
    )
    .order_by(_batches.c.base_offset)
    .limit(bindparam("limit"))
)
_COVERING = (
    select(*_STORED)
    .where(
        _batches.c.topic == bindparam("topic"),
        _batches.c.partition == bindparam("partition"),
        _batches.c.base_offset >= func.coalesce(_CONTAINING, bindparam("offset")),
        _batches.c.last_offset >= bindparam("offset"),
        _batches.c.base_offset <= bindparam("last"),
        _batches.c.control.is_(None),
    )
    .order_by(_batches.c.base_offset)
)


def _stored(rows: Any) -> list[StoredBatch]:
    return [
        StoredBatch(base, last, control is not None, bool(aborted), bytes(payload))
        for base, last, control, aborted, payload in rows
    ]


async def batches_from(
    connection: AsyncConnection, topic: str, partition: int, offset: int, upper: int, limit: int
) -> list[StoredBatch]:
    """At most `limit` batches holding offsets from `offset` up to `upper`, markers and aborted
    batches included, in offset order."""
    params = {"topic": topic, "partition": partition, "offset": offset, "upper": upper}
    return _stored(await connection.execute(_FROM, {**params, "limit": limit}))


async def batches_covering(
    connection: AsyncConnection, topic: str, partition: int, first: int, last: int
) -> list[StoredBatch]:
    """The record batches (no markers) holding any offset of [first, last], in offset order."""
    params = {"topic": topic, "partition": partition, "offset": first, "last": last}
    return _stored(await connection.execute(_COVERING, params))


# -- offsets by time ----------------------------------------------------------------------------

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3


# Batches a ListOffsets by time reads at most before it answers none (the log start cuts through
# at most one batch, so two would do).
_LIST_OFFSET_BATCHES = 4


async def list_offset(
    db: Store, topic: str, partition: int, timestamp: int, *, read_committed: bool
) -> tuple[int, int]:
    """Kafka's ListOffsets for one partition: (offset, timestamp). LATEST is the high
    watermark (the LSO for read_committed), EARLIEST the log start offset; MAX_TIMESTAMP the
    first record holding the newest timestamp; a timestamp, the first record at least that
    old. The store indexes timestamps per batch: the batch is found by its newest timestamp,
    then its records are read for the exact one, as Kafka answers. -1 when there is none."""
    async with db.read() as session:
        return await list_offset_in(session, topic, partition, timestamp, read_committed)


async def list_offset_in(
    session: AsyncSession, topic: str, partition: int, timestamp: int, read_committed: bool
) -> tuple[int, int]:
    """`list_offset` in a unit of work."""
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
