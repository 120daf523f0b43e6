"""Topics, produce and fetch: the rules of API.md's Topics and Records sections.

Appends to a partition are serial: the unit of work first locks the partition's counter row
(`SELECT ... FOR UPDATE`; on SQLite the write unit already holds the database lock), then reads
producer state in a later statement, so it always sees the state the previous append committed.
Different partitions never wait for each other.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.clock import now_ms
from coordinator.core.database import Database
from coordinator.core.errors import InvalidRequest
from coordinator.core.schemas import INT32_MAX
from coordinator.log import appends, codec
from coordinator.log.errors import (
    InvalidProducerEpoch,
    OutOfOrderSequenceNumber,
    RecordListTooLarge,
    TopicAlreadyExists,
    UnknownProducerId,
    UnknownTopicOrPartition,
)
from coordinator.log.models import Batch, Partition, ProducerState, Topic
from coordinator.log.schemas import (
    CreateTopic,
    PartitionInfo,
    ProduceRequest,
    ProduceResponse,
    TopicDescription,
    TopicList,
    TopicSummary,
)
from coordinator.producers.models import ProducerId
from coordinator.transactions.errors import InvalidTxnState, TransactionalIdNotFound
from coordinator.transactions.models import Transaction, TransactionPartition
from coordinator.transactions.service import check_caller
from coordinator.transactions.states import Op, transition

# Batches read per query while filling a fetch.
FETCH_CHUNK = 64


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
    try:
        async with db.write() as session:
            exists = await session.scalar(select(Topic.name).where(Topic.name == body.name))
            if exists is not None:
                raise TopicAlreadyExists(f"topic {body.name!r} already exists")
            session.add(
                Topic(name=body.name, partitions=body.partitions, created_at=datetime.now(UTC))
            )
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
    return TopicSummary(name=body.name, partitions=body.partitions)


async def list_topics(db: Database) -> TopicList:
    async with db.read() as session:
        rows = (await session.execute(select(Topic.name, Topic.partitions))).all()
    # Sorted here, by code point: a database's collation would make the order differ by store.
    return TopicList(topics=[TopicSummary(name=n, partitions=p) for n, p in sorted(rows)])


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


# -- produce ------------------------------------------------------------------------------------


def _decoder(encoding: str) -> Any:
    if encoding == "utf8":
        return str.encode

    def from_base64(text: str) -> bytes:
        return base64.b64decode(text, validate=True)

    return from_base64


def decode_records(body: ProduceRequest) -> list[codec.Record]:
    """The request's records as bytes; a value that is not valid in its encoding is 422."""
    to_bytes = _decoder(body.encoding)
    records = []
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
        records.append(codec.Record(key, value, headers))
    return records


@dataclass(frozen=True, slots=True)
class _Duplicate:
    base_offset: int
    last_offset: int


async def _check_sequence(
    session: AsyncSession, topic: str, partition: int, body: ProduceRequest, count: int
) -> _Duplicate | None:
    """Apply the idempotence rules; return the original offsets when the batch is a duplicate."""
    pid, epoch, base_seq = body.producer_id, body.producer_epoch, body.base_sequence
    connection = await session.connection()
    row = (
        await connection.execute(
            appends.PRODUCER_STATE, {"topic": topic, "partition": partition, "producer_id": pid}
        )
    ).first()
    if row is None:
        raise UnknownProducerId(f"producer id {pid} was never issued; call init-pid")
    current_epoch, state_epoch, last_seq, open_txn_offset = row
    if epoch < current_epoch:
        raise InvalidProducerEpoch(
            f"producer {pid} epoch {epoch} is older than its current epoch {current_epoch}"
        )
    if epoch > current_epoch:
        raise InvalidProducerEpoch(
            f"producer {pid} epoch {epoch} is newer than its current epoch {current_epoch}"
        )
    if body.transactional_id is None and open_txn_offset is not None:
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
        return _Duplicate(original.base_offset, original.last_offset)
    raise OutOfOrderSequenceNumber(
        f"producer {pid} on {topic}-{partition}: expected sequence {expected}, got {base_seq}"
    )


async def verify_transaction(
    session: AsyncSession, topic: str, partition: int, body: ProduceRequest
) -> None:
    """A transactional batch: the transaction's identity checks, in API.md's order, then the
    partition must be in its Ongoing transaction. Nothing is written otherwise, so no batch can
    open a transaction the coordinator does not know about (no hanging transactions)."""
    assert body.transactional_id is not None
    tid = body.transactional_id
    row = (
        await session.execute(
            select(Transaction, ProducerId.producer_epoch)
            .join(ProducerId, ProducerId.producer_id == Transaction.producer_id)
            .where(Transaction.transactional_id == tid)
        )
    ).first()
    if row is None:
        raise TransactionalIdNotFound(f"transactional id {tid!r} is not known")
    txn, current_epoch = row
    await check_caller(session, txn, current_epoch, body.producer_id, body.producer_epoch)
    transition(txn.state, Op.PRODUCE, tid)
    joined = await session.scalar(
        select(TransactionPartition.producer_id).where(
            TransactionPartition.transactional_id == tid,
            TransactionPartition.topic == topic,
            TransactionPartition.partition == partition,
        )
    )
    if joined is None:
        raise InvalidTxnState(
            f"{topic}-{partition} is not in the transaction of {tid!r}; add it first"
        )


async def produce(
    db: Database, topic: str, partition: int, body: ProduceRequest, max_batch_bytes: int
) -> ProduceResponse:
    records = decode_records(body)
    payload = codec.encode(records)
    if len(payload) > max_batch_bytes:
        raise RecordListTooLarge(
            f"the batch holds {len(payload)} bytes of records; the limit is {max_batch_bytes}"
        )
    count = len(records)
    async with db.write() as session:
        connection = await session.connection()
        high_watermark = (
            await connection.execute(
                appends.LOCK_PARTITION, {"topic": topic, "partition": partition}
            )
        ).scalar_one_or_none()
        if high_watermark is None:
            raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
        idempotent = body.producer_id >= 0
        if body.transactional_id is not None:
            await verify_transaction(session, topic, partition, body)
        if idempotent:
            duplicate = await _check_sequence(session, topic, partition, body, count)
            if duplicate is not None:
                return ProduceResponse(
                    base_offset=duplicate.base_offset,
                    last_offset=duplicate.last_offset,
                    duplicate=True,
                )
        base_offset = high_watermark
        last_offset = high_watermark + count - 1
        timestamp = now_ms()
        last_seq = last_sequence_of(body.base_sequence, count) if idempotent else -1
        batch = {
            "topic": topic,
            "partition": partition,
            "base_offset": base_offset,
            "last_offset": last_offset,
            "producer_id": body.producer_id,
            "producer_epoch": body.producer_epoch,
            "base_sequence": body.base_sequence,
            "last_sequence": last_seq,
            "timestamp": timestamp,
            "is_transactional": body.transactional_id is not None,
            "control": None,
            "aborted": False,
            "record_count": count,
            "payload": payload,
        }
        state = None
        if idempotent:
            state = {
                "topic": topic,
                "partition": partition,
                "producer_id": body.producer_id,
                "producer_epoch": body.producer_epoch,
                "last_sequence": last_seq,
                "last_offset": last_offset,
                "last_timestamp": timestamp,
                # Pins the LSO from the transaction's first batch here until its marker.
                "current_txn_first_offset": (
                    base_offset if body.transactional_id is not None else None
                ),
            }
        await appends.append(connection, batch, state)
    return ProduceResponse(base_offset=base_offset, last_offset=last_offset, duplicate=False)


# -- fetch --------------------------------------------------------------------------------------


def _text_of(raw: bytes, offset: int) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise InvalidRequest(
            f"the record at offset {offset} is not valid UTF-8; fetch it with encoding=base64"
        ) from None


def _base64_of(raw: bytes, _: int) -> str:
    return base64.b64encode(raw).decode("ascii")


async def _records_from(
    session: AsyncSession, start: int, conditions: list[Any]
) -> AsyncGenerator[tuple[int, int, codec.Record]]:
    """(offset, timestamp, record) of every batch matching `conditions` from `start` on."""
    cursor = start
    while True:
        rows = (
            await session.execute(
                select(Batch.base_offset, Batch.timestamp, Batch.payload)
                .where(Batch.base_offset >= cursor, *conditions)
                .order_by(Batch.base_offset)
                .limit(FETCH_CHUNK)
            )
        ).all()
        for base_offset, timestamp, payload in rows:
            for i, record in enumerate(codec.decode(payload)):
                yield base_offset + i, timestamp, record
        if len(rows) < FETCH_CHUNK:
            return
        cursor = rows[-1].base_offset + 1


async def fetch(
    db: Database,
    topic: str,
    partition: int,
    offset: int,
    max_records: int,
    read_committed: bool,
    encoding: str,
    max_bytes: int,
) -> dict[str, Any]:
    async with db.read() as session:
        high_watermark = await session.scalar(
            select(Partition.high_watermark).where(
                Partition.topic == topic, Partition.partition == partition
            )
        )
        if high_watermark is None:
            raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
        pinned = await session.scalar(
            select(func.min(ProducerState.current_txn_first_offset)).where(
                ProducerState.topic == topic, ProducerState.partition == partition
            )
        )
        stable = stable_offset(high_watermark, pinned)
        upper = stable if read_committed else high_watermark
        records: list[dict[str, Any]] = []
        next_offset = offset
        text = _text_of if encoding == "utf8" else _base64_of
        if offset < upper:
            containing = await session.scalar(
                select(func.max(Batch.base_offset)).where(
                    Batch.topic == topic, Batch.partition == partition, Batch.base_offset <= offset
                )
            )
            conditions = [
                Batch.topic == topic,
                Batch.partition == partition,
                Batch.base_offset < upper,
                Batch.control.is_(None),
            ]
            if read_committed:
                conditions.append(Batch.aborted.is_(False))
            start = offset if containing is None else containing
            size = 0
            async with aclosing(_records_from(session, start, conditions)) as stream:
                async for record_offset, timestamp, (key, value, headers) in stream:
                    if record_offset < offset:
                        continue
                    records.append(
                        {
                            "offset": record_offset,
                            "key": None if key is None else text(key, record_offset),
                            "value": None if value is None else text(value, record_offset),
                            "headers": {k: text(v, record_offset) for k, v in headers},
                            "timestamp": timestamp,
                        }
                    )
                    size += len(key or b"") + len(value or b"")
                    if len(records) >= max_records or size >= max_bytes:
                        next_offset = record_offset + 1
                        break
                else:
                    # Everything below `upper` was read: markers and aborted batches are skipped.
                    next_offset = upper
    return {
        "records": records,
        "next_offset": next_offset,
        "high_watermark": high_watermark,
        "last_stable_offset": stable,
    }
