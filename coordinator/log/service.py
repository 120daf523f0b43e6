"""Topics, their configs, produce and fetch: the rules of API.md's Topics and Records sections,
for every front door (HTTP JSON, HTTP record batches, and Kafka's protocol).

Produce takes one record batch in Kafka's format (`produce_batch`); JSON produce builds one at
the edge and calls the same function. Fetch returns stored batches (`fetch_batches`), with the
options each door needs; JSON fetch reads their records. Appends to a partition are serial: the
unit of work locks the partition's counter row (`SELECT ... FOR UPDATE`, which also reads the
topic's configs; on SQLite the write unit already holds the database lock), after the
transactional id's row for a transactional batch (the fixed lock order), then reads producer
state in a later statement, so it always sees what the previous append committed. Different
partitions never wait for each other.

The append path is written for speed: prebuilt statements (`appends`), the batch checked by
`recordbatch.check` without building a record object, the stored bytes the producer's with
only the base offset (and, for LogAppendTime, the timestamps and CRC) rewritten.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.clock import now_ms
from coordinator.core.database import Database
from coordinator.core.errors import InvalidRequest
from coordinator.core.schemas import INT32_MAX
from coordinator.core.settings import Settings
from coordinator.groups.models import GroupOffset
from coordinator.log import appends, configs, recordbatch
from coordinator.log.errors import (
    CorruptMessage,
    InvalidConfig,
    InvalidPartitions,
    InvalidProducerEpoch,
    InvalidRecord,
    OffsetOutOfRange,
    OutOfOrderSequenceNumber,
    RecordListTooLarge,
    TopicAlreadyExists,
    UnknownProducerId,
    UnknownTopicOrPartition,
)
from coordinator.log.markers import lock_partitions
from coordinator.log.models import CONTROL_ABORT, Batch, Partition, ProducerState, Topic
from coordinator.log.schemas import (
    MAX_PARTITIONS,
    AlterConfigs,
    ConfigEntry,
    ConfigList,
    CreateTopic,
    DeletedRecords,
    DeletedTopic,
    DeleteRecords,
    LogStart,
    PartitionInfo,
    ProduceRequest,
    TopicDescription,
    TopicList,
    TopicSummary,
)
from coordinator.transactions.errors import ConcurrentTransactions, InvalidTxnState
from coordinator.transactions.models import TransactionOffset
from coordinator.transactions.service import (
    BY_ADMIN,
    Joining,
    abort_and_fence,
    check_produce,
    join_from_produce,
    lock_for_produce,
    lock_including,
    partitions_of,
)

# Most batches read per query while filling a fetch; the first query reads FIRST_CHUNK, later
# ones as many as the batches seen so far say will fill `max_bytes` (so a fetch does not read
# many more rows from the store than it returns).
FETCH_CHUNK = 64
FIRST_CHUNK = 4


def next_sequence(sequence: int) -> int:
    """Sequences wrap from 2**31-1 to 0, as in Kafka."""
    return 0 if sequence == INT32_MAX else sequence + 1


def last_sequence_of(base_sequence: int, count: int) -> int:
    return (base_sequence + count - 1) % (INT32_MAX + 1)


def stable_offset(high_watermark: int, first_open_offset: int | None) -> int:
    """The LSO: the first offset of the oldest open transaction, else the high watermark."""
    return high_watermark if first_open_offset is None else min(first_open_offset, high_watermark)


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
        partitions = (
            await session.execute(
                select(Partition.partition, Partition.log_start_offset, Partition.high_watermark)
                .where(Partition.topic == name)
                .order_by(Partition.partition)
            )
        ).all()
        if not partitions:
            raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
        pinned: dict[int, int | None] = dict(
            (
                await session.execute(
                    select(
                        ProducerState.partition, func.min(ProducerState.current_txn_first_offset)
                    )
                    .where(ProducerState.topic == name)
                    .group_by(ProducerState.partition)
                )
            ).all()
        )
    return TopicDescription(
        name=name,
        partitions=[
            PartitionInfo(
                partition=p,
                log_start_offset=start,
                high_watermark=hw,
                last_stable_offset=stable_offset(hw, pinned.get(p)),
            )
            for p, start, hw in partitions
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


class _TransactionJoined(Exception):
    """A transaction took a partition of the topic being deleted before its locks were held."""


async def delete_topic(db: Database, name: str) -> DeletedTopic:
    """Delete a topic with its partitions, records, producer state and group offsets, in one
    step; an open transaction including one of its partitions is aborted first, in the same
    step, and its producer fenced (the operator's abort). Pending transactional offsets of the
    topic are dropped with it."""
    for _ in range(_DELETE_ATTEMPTS):
        try:
            async with db.write() as session:
                exists = await session.scalar(select(Topic.name).where(Topic.name == name))
                if exists is None:
                    raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
                now = now_ms()
                # The fixed lock order: transactional ids, then partitions in order.
                including = await lock_including(session, name)
                own = await session.execute(
                    select(Partition.topic, Partition.partition).where(Partition.topic == name)
                )
                keys = [(t, p) for t, p in own] + await partitions_of(session, including)
                await lock_partitions(session, keys)
                joined = {
                    locked.txn.transactional_id for locked in await lock_including(session, name)
                }
                if joined - {locked.txn.transactional_id for locked in including}:
                    raise _TransactionJoined
                for locked in including:
                    await abort_and_fence(session, locked, BY_ADMIN, now)
                for model in (GroupOffset, TransactionOffset, Batch, ProducerState, Partition):
                    await session.execute(delete(model).where(model.topic == name))
                await session.execute(delete(Topic).where(Topic.name == name))
            return DeletedTopic(name=name)
        except _TransactionJoined:
            continue
    raise ConcurrentTransactions(
        f"transactions kept joining {name!r} while it was being deleted; try again"
    )


# A deletion retries when a transaction joins the topic between its lookup and its locks.
_DELETE_ATTEMPTS = 5


# -- produce ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Appended:
    """A produce's answer: what both front doors need (Kafka's ProduceResponse included)."""

    base_offset: int
    last_offset: int
    duplicate: bool
    log_append_time: int  # the append time for a LogAppendTime topic, else -1
    log_start_offset: int


def _decoder(encoding: str) -> Callable[[str], bytes]:
    if encoding == "utf8":
        return str.encode

    def from_base64(text: str) -> bytes:
        return base64.b64decode(text, validate=True)

    return from_base64


def batch_from_json(body: ProduceRequest, now: int) -> tuple[bytes, recordbatch.Checked]:
    """The request's records as one record batch (uncompressed), built at the edge, with what
    `recordbatch.check` would find in it; a value that is not valid in its encoding is 422
    naming it. Records without a timestamp get `now`."""
    to_bytes = _decoder(body.encoding)
    built: list[recordbatch.BuildRecord] = []
    has_null_key = False
    for i, record in enumerate(body.records):
        field = "key"
        try:
            key = None if record.key is None else to_bytes(record.key)
            field = "value"
            value = None if record.value is None else to_bytes(record.value)
            field = "headers"
            headers = [(name, to_bytes(v)) for name, v in record.headers.items()]
            for name, _ in headers:
                name.encode()
        except (UnicodeEncodeError, binascii.Error, ValueError) as exc:
            raise InvalidRequest(
                f"records.{i}.{field}: not valid {body.encoding} ({exc.__class__.__name__})"
            ) from None
        timestamp = now if record.timestamp is None else record.timestamp
        built.append((timestamp, key, value, headers))
        has_null_key = has_null_key or key is None
    data = recordbatch.build(
        built,
        producer_id=body.producer_id,
        producer_epoch=body.producer_epoch,
        base_sequence=body.base_sequence,
        transactional=body.transactional_id is not None,
    )
    header = recordbatch.read_header(data)
    return data, recordbatch.Checked(header, header.max_timestamp, has_null_key)


async def produce_json(
    db: Database, settings: Settings, topic: str, partition: int, body: ProduceRequest
) -> Appended:
    """JSON produce: a batch built at the edge, appended as a binary one is (it skips only the
    walk over its records, which it has just written)."""
    data, checked = batch_from_json(body, now_ms())
    _acceptable(checked, body.transactional_id)
    return await _append(db, settings, topic, partition, data, checked, body.transactional_id)


# Compressed batches at least this large are checked on a worker thread: inflating and walking
# them takes long enough that the event loop (every other client of the process) must not wait.
_CHECK_OFF_LOOP_BYTES = 16 * 1024
# Inflating up to this much is always allowed, whatever the ratio (small batches compress well).
_INFLATION_FLOOR_BYTES = 1024 * 1024


# At most this many large batches are inflated at once per process, so concurrent bombs hold at
# most this many times COORDINATOR_MAX_UNCOMPRESSED_BATCH_BYTES (the others wait their turn on
# their worker thread, not on the event loop).
_INFLATION_SLOTS = threading.BoundedSemaphore(2)


def _check_inflating(data: bytes, limit: int) -> recordbatch.Checked:
    with _INFLATION_SLOTS:
        return recordbatch.check(data, limit)


def inflation_limit(settings: Settings, size: int) -> int:
    """How far a compressed batch of `size` bytes may inflate: the absolute cap, and the ratio
    cap above a floor."""
    by_ratio = max(_INFLATION_FLOOR_BYTES, size * settings.max_compression_ratio)
    return min(settings.max_uncompressed_batch_bytes, by_ratio)


async def check_batch(
    settings: Settings, data: bytes, transactional_id: str | None
) -> recordbatch.Checked:
    """A batch's own checks, before any database work: well formed (CORRUPT_MESSAGE), not
    inflating past its bounds (RECORD_LIST_TOO_LARGE), then acceptable from a producer
    (INVALID_RECORD)."""
    limit = inflation_limit(settings, len(data))
    try:
        if len(data) >= _CHECK_OFF_LOOP_BYTES and recordbatch.read_header(data).compression:
            checked = await asyncio.to_thread(_check_inflating, data, limit)
        else:
            checked = recordbatch.check(data, limit)
    except recordbatch.InflatesTooFar as exc:
        raise RecordListTooLarge(
            f"{exc} (a {len(data)}-byte batch may inflate to {limit} bytes: "
            "COORDINATOR_MAX_UNCOMPRESSED_BATCH_BYTES, COORDINATOR_MAX_COMPRESSION_RATIO)"
        ) from None
    except recordbatch.CorruptBatch as exc:
        raise CorruptMessage(f"not a well-formed record batch: {exc}") from None
    _acceptable(checked, transactional_id)
    return checked


def _acceptable(checked: recordbatch.Checked, transactional_id: str | None) -> None:
    header = checked.header
    if header.is_control:
        raise InvalidRecord("a producer may not send a control batch")
    if header.is_transactional and transactional_id is None:
        raise InvalidRecord("a transactional batch needs the transactional_id parameter")
    if transactional_id is not None and not header.is_transactional:
        raise InvalidRecord("transactional_id is given but the batch is not transactional")
    if header.producer_id < -1:
        raise InvalidRecord(f"producer id {header.producer_id}: -1 or a producer id")
    if header.producer_id >= 0 and (header.producer_epoch < 0 or header.base_sequence < 0):
        raise InvalidRecord("a batch with a producer id needs its epoch and base sequence")
    if header.producer_id < 0 and header.is_transactional:
        raise InvalidRecord("a transactional batch needs a producer id")


async def produce_batch(
    db: Database,
    settings: Settings,
    topic: str,
    partition: int,
    data: bytes,
    transactional_id: str | None,
) -> Appended:
    """Append one record batch, as API.md's Records section says, for every front door."""
    checked = await check_batch(settings, data, transactional_id)
    return await _append(db, settings, topic, partition, data, checked, transactional_id)


async def _append(
    db: Database,
    settings: Settings,
    topic: str,
    partition: int,
    data: bytes,
    checked: recordbatch.Checked,
    transactional_id: str | None,
) -> Appended:
    header = checked.header
    pid, epoch, base_seq = header.producer_id, header.producer_epoch, header.base_sequence
    count = header.record_count
    async with db.write() as session:
        connection = await session.connection()
        joining: Joining | None = None
        if transactional_id is not None:
            joining = await lock_for_produce(session, transactional_id, topic, partition)
        locked = (
            await connection.execute(
                appends.LOCK_PARTITION, {"topic": topic, "partition": partition}
            )
        ).first()
        if locked is None:
            raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
        high_watermark, log_start, stored_configs = locked
        topic_settings = configs.produce_settings(stored_configs, settings.max_request_bytes)
        if len(data) > topic_settings.max_message_bytes:
            raise RecordListTooLarge(
                f"the batch is {len(data)} bytes; {topic}'s max.message.bytes is "
                f"{topic_settings.max_message_bytes}"
            )
        if topic_settings.compacted and checked.has_null_key:
            # Which records, as Kafka names them (KIP-467): a client fails just those with
            # INVALID_RECORD and may send the others again.
            keyless = [i for i, r in enumerate(recordbatch.records(data)) if r.key is None]
            raise InvalidRecord(
                f"{topic} is compacted: every record needs a key", {"record_errors": keyless}
            )
        if transactional_id is not None:
            await check_produce(session, joining, transactional_id, pid, epoch)
        if pid >= 0:
            original = await _check_sequence(
                session,
                topic,
                partition,
                pid,
                epoch,
                base_seq,
                count,
                transactional_id,
            )
            if original is not None:
                return Appended(original[0], original[1], True, -1, log_start)
        now = now_ms()
        joins, join_params = (
            ([], {}) if joining is None else join_from_produce(joining, topic, partition, now)
        )
        base_offset = high_watermark
        last_offset = high_watermark + count - 1
        if topic_settings.codec is not None:
            # The topic's compression.type, as Kafka's broker recompresses (the records' bytes
            # were checked already; only their compression changes).
            data = recordbatch.with_codec(
                data, topic_settings.codec, inflation_limit(settings, len(data))
            )
        payload = recordbatch.with_base_offset(data, base_offset)
        max_timestamp = checked.max_timestamp
        append_time = -1
        if topic_settings.log_append_time:
            payload = recordbatch.with_log_append_time(payload, now)
            max_timestamp = append_time = now
        last_seq = last_sequence_of(base_seq, count) if pid >= 0 else -1
        batch = {
            "topic": topic,
            "partition": partition,
            "base_offset": base_offset,
            "last_offset": last_offset,
            "producer_id": pid,
            "producer_epoch": epoch,
            "base_sequence": base_seq,
            "last_sequence": last_seq,
            "timestamp": now,
            "max_timestamp": max_timestamp,
            "size": len(payload),
            "is_transactional": transactional_id is not None,
            "control": None,
            "aborted": False,
            "first_offset": None,
            "record_count": count,
            "payload": payload,
        }
        state = None
        if pid >= 0:
            state = {
                "topic": topic,
                "partition": partition,
                "producer_id": pid,
                "producer_epoch": epoch,
                "last_sequence": last_seq,
                "last_offset": last_offset,
                "last_timestamp": now,
                # Pins the LSO from the transaction's first batch here until its marker.
                "current_txn_first_offset": (base_offset if transactional_id is not None else None),
            }
        await appends.append(connection, batch, state, joins, join_params)
    return Appended(base_offset, last_offset, False, append_time, log_start)


async def _check_sequence(
    session: AsyncSession,
    topic: str,
    partition: int,
    pid: int,
    epoch: int,
    base_seq: int,
    count: int,
    transactional_id: str | None,
) -> tuple[int, int] | None:
    """Apply the idempotence rules; the original (base, last) offsets when it is a duplicate."""
    connection = await session.connection()
    row = (
        await connection.execute(
            appends.PRODUCER_STATE,
            {"topic": topic, "partition": partition, "producer_id": pid, "producer_epoch": epoch},
        )
    ).first()
    if row is None:
        raise UnknownProducerId(f"producer id {pid} was never issued; call init-pid")
    current_epoch, state_epoch, last_seq, open_txn_offset, *first = row
    if epoch < current_epoch:
        raise InvalidProducerEpoch(
            f"producer {pid} epoch {epoch} is older than its current epoch {current_epoch}"
        )
    if epoch > current_epoch:
        raise InvalidProducerEpoch(
            f"producer {pid} epoch {epoch} is newer than its current epoch {current_epoch}"
        )
    if transactional_id is None and open_txn_offset is not None:
        raise InvalidTxnState(
            f"producer {pid} has a transaction open on {topic}-{partition} since offset "
            f"{open_txn_offset}; a non-transactional batch may not join it"
        )
    if state_epoch is None:
        if base_seq != 0:
            raise UnknownProducerId(
                f"producer {pid} has no state on {topic}-{partition}, so its first batch must "
                f"start at sequence 0, not {base_seq}; re-initialise the producer"
            )
        if first[0] is not None:
            # The state expired while the log still holds this epoch's batch 0: a retry of it
            # is a duplicate; another batch 0 cannot be told from one (the producer must
            # re-initialise, as KIP-360 says).
            if first[2] == last_sequence_of(0, count):
                return first[0], first[1]
            raise UnknownProducerId(
                f"producer {pid}'s state on {topic}-{partition} expired and epoch {epoch} "
                "already used sequence 0 there; re-initialise the producer"
            )
        return None
    if state_epoch < epoch:
        if base_seq != 0:
            raise OutOfOrderSequenceNumber(
                f"the first batch of epoch {epoch} must start at sequence 0, not {base_seq}"
            )
        return None
    expected = next_sequence(last_seq)
    if base_seq == expected:
        return None
    # Any batch of the current epoch is recognised, not only the last five as in Kafka.
    original = (
        await connection.execute(
            appends.ORIGINAL_BATCH,
            {
                "topic": topic,
                "partition": partition,
                "producer_id": pid,
                "producer_epoch": epoch,
                "base_sequence": base_seq,
            },
        )
    ).first()
    if original is not None and original.last_sequence == last_sequence_of(base_seq, count):
        return original.base_offset, original.last_offset
    raise OutOfOrderSequenceNumber(
        f"producer {pid} on {topic}-{partition}: expected sequence {expected}, got {base_seq}"
    )


# -- fetch --------------------------------------------------------------------------------------

_batches = cast(Table, Batch.__table__)
_partitions = cast(Table, Partition.__table__)
_states = cast(Table, ProducerState.__table__)

# The partition's bounds in one statement: high watermark, log start, first open offset
# (fetch, and the log cleaner).
BOUNDS = select(
    _partitions.c.high_watermark,
    _partitions.c.log_start_offset,
    select(func.min(_states.c.current_txn_first_offset))
    .where(
        _states.c.topic == bindparam("topic"),
        _states.c.partition == bindparam("partition"),
    )
    .scalar_subquery(),
).where(
    _partitions.c.topic == bindparam("topic"), _partitions.c.partition == bindparam("partition")
)
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
        bounds = (await connection.execute(BOUNDS, params)).first()
        if bounds is None:
            raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
        high_watermark, log_start, first_open = bounds
        if not log_start <= offset <= high_watermark:
            raise OffsetOutOfRange(
                f"offset {offset} is outside {topic}-{partition}'s log: the log start offset is "
                f"{log_start} and the high watermark {high_watermark}"
            )
        stable = stable_offset(high_watermark, first_open)
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
        params = {"topic": topic, "partition": partition}
        bounds = (await connection.execute(BOUNDS, params)).first()
        if bounds is None:
            raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
        high_watermark, log_start, first_open = bounds
        if timestamp == LATEST:
            end = stable_offset(high_watermark, first_open) if read_committed else high_watermark
            return end, -1
        if timestamp == EARLIEST:
            return log_start, -1
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
                if record.offset >= log_start and record.timestamp >= wanted:
                    return record.offset, record.timestamp
        return -1, -1
