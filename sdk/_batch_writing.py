"""Building record batches (the records encoded and compressed, the header and its CRC-32C) and
rewriting a stored batch's header in place (its base offset, leader epoch, append time, codec).
`sdk.recordbatch` is the public codec."""

from __future__ import annotations

from collections.abc import Sequence

from crc32c import crc32c

from sdk._batch_layout import (
    ATTRIBUTES_AND_MAX,
    BASE_OFFSET,
    CODEC_NAMES,
    COMPRESSION_NONE,
    CONTROL,
    CONTROL_ABORT,
    CONTROL_COMMIT,
    CONTROL_KEY,
    CONTROL_VALUE,
    CRC,
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LEADER_EPOCH,
    LOG_APPEND_TIME,
    LOG_OVERHEAD,
    MAGIC,
    MAX_TIMESTAMP,
    TRANSACTIONAL,
)
from sdk._compression import compress

# -- building -----------------------------------------------------------------------------------

# One byte of every zigzag varint from -64 to 63: nearly every length and delta of a batch.
_SMALL = {v: bytes([((v << 1) ^ (v >> 63)) & 0xFF]) for v in range(-64, 64)}


def _zigzag(value: int) -> bytes:
    small = _SMALL.get(value)
    if small is not None:
        return small
    raw = (value << 1) ^ (value >> 63)
    raw &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


#: A record to build: (timestamp, key, value, headers).
BuildRecord = tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]


def build(
    batch_records: Sequence[BuildRecord],
    *,
    compression: int = COMPRESSION_NONE,
    base_offset: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
    log_append_time: bool = False,
    offset_deltas: Sequence[int] | None = None,
    last_offset_delta: int | None = None,
    base_timestamp: int | None = None,
    partition_leader_epoch: int = -1,
) -> bytes:
    """A record batch of `batch_records`. Offset deltas are 0..n-1 unless given (log
    compaction keeps a subset's deltas and the batch's last offset delta, as Kafka's cleaner
    does); the base timestamp is the first record's unless given."""
    if compression not in CODEC_NAMES:
        raise ValueError(f"unknown compression codec {compression}")
    count = len(batch_records)
    if offset_deltas is not None and len(offset_deltas) != count:
        raise ValueError("offset_deltas must give one delta per record")
    if base_timestamp is None:
        base_timestamp = batch_records[0][0] if count else -1
    max_timestamp = max((r[0] for r in batch_records), default=base_timestamp)
    if last_offset_delta is None:
        last_offset_delta = (offset_deltas[-1] if offset_deltas else count - 1) if count else 0
    zigzag = _zigzag
    parts: list[bytes] = []
    append = parts.append
    for index, (timestamp, key, value, headers) in enumerate(batch_records):
        body = (
            b"\x00"  # attributes
            + zigzag(timestamp - base_timestamp)
            + zigzag(index if offset_deltas is None else offset_deltas[index])
            + (b"\x01" if key is None else zigzag(len(key)) + key)
            + (b"\x01" if value is None else zigzag(len(value)) + value)
            + (_headers_of(headers) if headers else b"\x00")
        )
        append(zigzag(len(body)))
        append(body)
    section = compress(compression, b"".join(parts))
    attributes = compression
    if log_append_time:
        attributes |= LOG_APPEND_TIME
    if transactional:
        attributes |= TRANSACTIONAL
    if control:
        attributes |= CONTROL
    header = bytearray(
        HEADER.pack(
            base_offset,
            HEADER_SIZE - LOG_OVERHEAD + len(section),
            partition_leader_epoch,
            MAGIC,
            0,
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
    )
    header += section
    CRC.pack_into(header, 17, crc32c(memoryview(header)[CRC_START:]))
    return bytes(header)


def _headers_of(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    out = bytearray(_zigzag(len(headers)))
    for name, hvalue in headers:
        raw = name.encode()
        out += _zigzag(len(raw))
        out += raw
        if hvalue is None:
            out += b"\x01"
        else:
            out += _zigzag(len(hvalue))
            out += hvalue
    return bytes(out)


def build_control(
    commit: bool,
    producer_id: int,
    producer_epoch: int,
    timestamp: int,
    coordinator_epoch: int = 0,
    base_offset: int = 0,
) -> bytes:
    """A control batch (Kafka's end-transaction marker): control and transactional attributes,
    one record with key (version 0, type: 0 abort, 1 commit) and value (version 0, coordinator
    epoch)."""
    key = CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = CONTROL_VALUE.pack(0, coordinator_epoch)
    return build(
        [(timestamp, key, value, ())],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        transactional=True,
        control=True,
    )


# -- rewriting in place -------------------------------------------------------------------------


def with_base_offset(data: bytes, base_offset: int) -> bytes:
    """The batch with its base offset set (outside the CRC: nothing else changes)."""
    return BASE_OFFSET.pack(base_offset) + data[8:]


def joined_with_leader_epoch(batches: Sequence[bytes], partition_leader_epoch: int) -> bytearray:
    """Whole batches back to back, each with its partition leader epoch set (outside the CRC),
    as a Kafka leader's fetch answer carries them; one copy, the join's."""
    out = bytearray().join(batches)
    at = 0
    for batch in batches:
        LEADER_EPOCH.pack_into(out, at + 12, partition_leader_epoch)
        at += len(batch)
    return out


def with_log_append_time(data: bytes, timestamp: int) -> bytes:
    """The batch stamped with the log's append time, as Kafka's broker does for a
    `LogAppendTime` topic: the timestamp-type attribute set, the max timestamp (which readers
    then give every record) set to `timestamp`, the CRC recomputed."""
    out = bytearray(data)
    (attributes,) = ATTRIBUTES_AND_MAX.unpack_from(out, 21)
    ATTRIBUTES_AND_MAX.pack_into(out, 21, attributes | LOG_APPEND_TIME)
    MAX_TIMESTAMP.pack_into(out, 35, timestamp)
    CRC.pack_into(out, 17, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)
