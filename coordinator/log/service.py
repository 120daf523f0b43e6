"""Topics, their configs and fetch: the rules of API.md's Topics and Records sections, for every
front door (HTTP JSON, HTTP record batches, and Kafka's protocol). Produce is
`coordinator.log.produce`.

Fetch returns stored batches (`fetch_batches`), with the options each door needs; JSON fetch
reads their records. Appends to a partition are serial: their unit of work locks the partition's
counter row (`SELECT ... FOR UPDATE`; on SQLite the write unit already holds the database lock),
so a fetch reads a partition's bounds and batches as the last committed append left them.
Different partitions never wait for each other.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import astuple, dataclass
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.database import Database
from coordinator.core.errors import InvalidRequest
from coordinator.core.settings import Settings
from coordinator.log import configs, recordbatch
from coordinator.log.bounds import all_bounds, partition_bounds
from coordinator.log.errors import (
    InvalidConfig,
    InvalidPartitions,
    OffsetOutOfRange,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from coordinator.log.models import CONTROL_ABORT, Batch, Partition, ProducerState, Topic
from coordinator.log.schemas import (
    MAX_PARTITIONS,
    AlterConfigs,
    ConfigEntry,
    ConfigList,
    CreateTopic,
    DeletedRecords,
    DeleteRecords,
    LogStart,
    PartitionInfo,
    TopicDescription,
    TopicList,
    TopicSummary,
)

# Most batches read per query while filling a fetch; the first query reads FIRST_CHUNK, later
# ones as many as the batches seen so far say will fill `max_bytes` (so a fetch does not read
# many more rows from the store than it returns).
FETCH_CHUNK = 64
FIRST_CHUNK = 4


# -- topics -------------------------------------------------------------------------------------


async def create_topic(db: Database, body: CreateTopic) -> TopicSummary:
    topic_configs = configs.encode(configs.validated(body.configs or {}))
    try:
        async with db.write() as session:
            exists = await session.scalar(select(Topic.name).where(Topic.name == body.name))
            if exists is not None:
                raise TopicAlreadyExists(f"topic {body.name!r} already exists")
            topic = Topic(
                name=body.name,
                partitions=body.partitions,
                created_at=datetime.now(UTC),
                configs=topic_configs,
                topic_id=uuid.uuid4(),
            )
            session.add(topic)
            await session.flush()
            await session.execute(
                insert(Partition),
                [
                    {"topic": body.name, "partition": p, "log_start_offset": 0, "high_watermark": 0}
                    for p in range(body.partitions)
                ],
            )
    except IntegrityError:
        # Another process created it between our check and our insert.
        raise TopicAlreadyExists(f"topic {body.name!r} already exists") from None
    return TopicSummary(name=body.name, partitions=body.partitions, topic_id=topic.topic_id)


async def grow_topic(db: Database, name: str, count: int, *, validate_only: bool = False) -> int:
    """Kafka's CreatePartitions: the topic's partition count raised to `count` (it never
    shrinks), the new partitions empty. Producers see them in the topic's description; a group
    subscribed to the topic rebalances over them at its next heartbeat (its count changed).
    Returns how many partitions were added."""
    async with db.write() as session:
        current = await session.scalar(
            select(Topic.partitions).where(Topic.name == name).with_for_update()
        )
        if current is None:
            raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
        if count <= current:
            raise InvalidPartitions(
                f"topic {name!r} has {current} partitions; a count only grows (asked {count})"
            )
        if count > MAX_PARTITIONS:
            raise InvalidPartitions(f"{count} partitions: at most {MAX_PARTITIONS}")
        if validate_only:
            return count - current
        await session.execute(update(Topic).where(Topic.name == name).values(partitions=count))
        await session.execute(
            insert(Partition),
            [
                {"topic": name, "partition": p, "log_start_offset": 0, "high_watermark": 0}
                for p in range(current, count)
            ],
        )
        return count - current


async def list_topics(db: Database) -> TopicList:
    async with db.read() as session:
        rows = (await session.execute(select(Topic.name, Topic.partitions, Topic.topic_id))).all()
    # Sorted here, by code point: a database's collation would make the order differ by store.
    return TopicList(
        topics=[TopicSummary(name=n, partitions=p, topic_id=i) for n, p, i in sorted(rows)]
    )


async def describe_topic(db: Database, name: str) -> TopicDescription:
    async with db.read() as session:
        bounds = await all_bounds(session, name)
    if not bounds:
        raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
    return TopicDescription(
        name=name,
        partitions=[
            PartitionInfo(
                partition=p,
                log_start_offset=b.log_start_offset,
                high_watermark=b.high_watermark,
                last_stable_offset=b.last_stable_offset,
            )
            for (_, p), b in bounds.items()
        ],
    )


def _config_list(stored: str, settings: Settings) -> ConfigList:
    return ConfigList(
        configs=[
            ConfigEntry.model_validate(e)
            for e in configs.describe(configs.decode(stored), settings)
        ]
    )


async def describe_configs(db: Database, settings: Settings, name: str) -> ConfigList:
    async with db.read() as session:
        stored = await session.scalar(select(Topic.configs).where(Topic.name == name))
    if stored is None:
        raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
    return _config_list(stored, settings)


async def alter_configs(
    db: Database, settings: Settings, name: str, body: AlterConfigs
) -> ConfigList:
    """Set and delete (back to the default) configs, all or nothing."""
    changes = configs.validated(body.set)
    removed = configs.known(body.delete)
    both = sorted(set(changes) & set(removed))
    if both:
        raise InvalidConfig(f"{both[0]!r} is both set and deleted")
    async with db.write() as session:
        stored = await session.scalar(
            select(Topic.configs).where(Topic.name == name).with_for_update()
        )
        if stored is None:
            raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
        current = configs.decode(stored)
        current.update(changes)
        for config in removed:
            current.pop(config, None)
        updated = configs.encode(current)
        await session.execute(update(Topic).where(Topic.name == name).values(configs=updated))
    return _config_list(updated, settings)


async def delete_records(db: Database, name: str, body: DeleteRecords) -> DeletedRecords:
    """Kafka's DeleteRecords: move each partition's log start offset up to the offset asked
    (-1: the high watermark), deleting the batches wholly below it; all or nothing."""
    wanted: dict[int, int] = {}
    for entry in body.partitions:
        if entry.partition in wanted:
            raise InvalidRequest(f"body.partitions: partition {entry.partition} is named twice")
        wanted[entry.partition] = entry.offset
    async with db.write() as session:
        rows = (
            await session.execute(
                select(Partition.partition, Partition.log_start_offset, Partition.high_watermark)
                .where(Partition.topic == name, Partition.partition.in_(sorted(wanted)))
                .order_by(Partition.partition)
                .with_for_update()
            )
        ).all()
        found = {p: (start, hw) for p, start, hw in rows}
        missing = sorted(set(wanted) - set(found))
        if missing:
            exists = await session.scalar(select(Topic.name).where(Topic.name == name))
            if exists is None:
                raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
            raise UnknownTopicOrPartition(f"{name}-{missing[0]} does not exist")
        starts: dict[int, int] = {}
        for p, offset in wanted.items():
            start, hw = found[p]
            target = hw if offset == -1 else offset
            if target > hw:
                raise OffsetOutOfRange(
                    f"{name}-{p}: offset {offset} is above the high watermark {hw}"
                )
            # The log start never moves down.
            starts[p] = max(start, target)
        for p, start in starts.items():
            if start > found[p][0]:
                await move_log_start(session, name, p, start)
    return DeletedRecords(
        partitions=[LogStart(partition=p, log_start_offset=starts[p]) for p in sorted(starts)]
    )


async def move_log_start(
    session: AsyncSession, topic: str, partition: int, start: int
) -> tuple[int, int]:
    """Delete the batches wholly below `start` and move the log start offset up to it (never
    down); the caller holds the partition's lock. Returns the batches and bytes removed."""
    where = (Batch.topic == topic, Batch.partition == partition, Batch.last_offset < start)
    batches, size = (
        await session.execute(
            select(func.count(), func.coalesce(func.sum(Batch.size), 0)).where(*where)
        )
    ).one()
    if batches:
        await session.execute(delete(Batch).where(*where))
    await session.execute(
        update(Partition)
        .where(
            Partition.topic == topic,
            Partition.partition == partition,
            Partition.log_start_offset < start,
        )
        .values(log_start_offset=start)
    )
    return batches, size


# -- fetch --------------------------------------------------------------------------------------

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
