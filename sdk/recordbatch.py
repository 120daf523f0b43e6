"""Kafka's record batch (magic 2), exactly as Kafka's protocol guide defines `RecordBatch`: check,
read, build and rewrite the bytes that the log stores and every front door (HTTP, SDK, Kafka's
protocol) sends and receives.

The client's, and the service's through it: the SDK installs without the server, and the log,
the Kafka front door and log compaction import it from here, as Kafka's broker depends on its
clients' record classes and not the reverse. Hand-written rather than taken from
kafka-python or kio because it sits on every produce and fetch: the produce path checks a batch
(61-byte header, CRC-32C, codec, the records section holding exactly the counted records) while
building no per-record object, and rewrites a header in place; kafka-python's reader builds an
object per record and kio has no record codec. The tests prove it against kafka-python's
independent implementation, byte for byte and with every codec.

Libraries, and why:
- CRC-32C: the `crc32c` package (C, with SSE4.2/ARMv8 hardware paths): about 1 µs for a 100 KB
  batch, where a Python table loop takes milliseconds.
- gzip: the standard library's zlib (C).
- snappy, lz4, zstd: `cramjam` (Rust bindings of the reference codecs), chosen over `lz4` +
  `zstandard` + `python-snappy`: one maintained package with wheels for every platform instead
  of three (python-snappy is itself built on cramjam since 0.7); its `decompress_into` writes into
  a buffer of bounded size, so a decompression bomb fails at the bound instead of exhausting
  memory (the only bounded API the three alternatives have in common would be three different
  streaming APIs); and its zstd decoder reads streaming frames without a content size (what
  Kafka's Java client writes), which zstandard's one-shot `decompress` refuses.
Snappy is read both raw (librdkafka) and xerial-framed (Kafka's Java client, kafka-python), and
written raw; lz4 is the LZ4 frame format, as Kafka's magic-2 batches use it.

Layout (big-endian): base offset i64, batch length i32 (bytes after this field), partition
leader epoch i32, magic i8, CRC-32C u32 (of everything after it), attributes i16 (bits 0-2
codec, 3 LogAppendTime, 4 transactional, 5 control), last offset delta i32, base timestamp i64,
max timestamp i64, producer id i64, producer epoch i16, base sequence i32, record count i32,
then the records (compressed as a whole). A record: length, attributes i8, timestamp delta,
offset delta, key length, key, value length, value, header count, headers (name length, name,
value length, value), every length and delta a zigzag varint; -1 is null.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import cramjam
from crc32c import crc32c

__all__ = [
    "CODECS",
    "COMPRESSION_GZIP",
    "COMPRESSION_LZ4",
    "COMPRESSION_NONE",
    "COMPRESSION_SNAPPY",
    "COMPRESSION_ZSTD",
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "HEADER_SIZE",
    "MAX_UNCOMPRESSED_BYTES",
    "Checked",
    "CorruptBatch",
    "Header",
    "Record",
    "build",
    "build_control",
    "check",
    "control_type",
    "iter_batches",
    "joined_with_leader_epoch",
    "read_header",
    "records",
    "with_base_offset",
    "with_log_append_time",
]

HEADER_SIZE = 61
MAGIC = 2
# Bytes of the header before the batch length's count starts (base offset and length fields).
LOG_OVERHEAD = 12
CRC_START = 21

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
CODECS = {
    "none": COMPRESSION_NONE,
    "gzip": COMPRESSION_GZIP,
    "snappy": COMPRESSION_SNAPPY,
    "lz4": COMPRESSION_LZ4,
    "zstd": COMPRESSION_ZSTD,
}
_CODEC_NAMES = {v: k for k, v in CODECS.items()}

CODEC_MASK = 0x07
LOG_APPEND_TIME = 0x08
TRANSACTIONAL = 0x10
CONTROL = 0x20

CONTROL_ABORT = 0
CONTROL_COMMIT = 1

# gzip inflates in steps of this many bytes (see _decompress).
_INFLATE_STEP = 1024 * 1024
# A compressed batch that would inflate past this is refused (a decompression bomb).
MAX_UNCOMPRESSED_BYTES = 256 * 1024 * 1024

_HEADER = struct.Struct(">qiibIhiqqqhii")
_BASE_OFFSET = struct.Struct(">q")
_LEADER_EPOCH = struct.Struct(">i")
_CRC = struct.Struct(">I")
_ATTRIBUTES_AND_MAX = struct.Struct(">h")
_MAX_TIMESTAMP = struct.Struct(">q")
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16
_XERIAL_BLOCK = struct.Struct(">i")


class CorruptBatch(ValueError):
    """The bytes are not a well-formed record batch; the message says what is wrong."""


class InflatesTooFar(CorruptBatch):
    """A compressed records section that would inflate past the limit it was read with (a
    decompression bomb, or a batch too large to be held uncompressed)."""


class Header(NamedTuple):
    base_offset: int
    length: int  # bytes after the length field: the batch is `length + 12` bytes
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return self.length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> int:
        return self.attributes & CODEC_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL)

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & LOG_APPEND_TIME)


class Record(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


class Checked(NamedTuple):
    """What `check` found: the header, the newest record timestamp, whether any key is null."""

    header: Header
    max_timestamp: int
    has_null_key: bool


# -- reading ------------------------------------------------------------------------------------


def read_header(data: bytes | bytearray | memoryview, pos: int = 0) -> Header:
    """The header of the batch at `pos` (no check beyond its size)."""
    if len(data) - pos < HEADER_SIZE:
        raise CorruptBatch(
            f"a record batch needs a {HEADER_SIZE}-byte header; only {len(data) - pos} bytes left"
        )
    return Header._make(_HEADER.unpack_from(data, pos))


def check(data: bytes, max_uncompressed: int = MAX_UNCOMPRESSED_BYTES) -> Checked:
    """Check that `data` is exactly one well-formed batch: its length field, magic 2, CRC-32C,
    a known codec, and a records section (decompressed) holding exactly the records the header
    counts, each well formed, with offset deltas 0..count-1. Builds no per-record object.
    Raises `CorruptBatch` saying what is wrong."""
    header = read_header(data)
    if header.length + LOG_OVERHEAD != len(data):
        raise CorruptBatch(
            f"the batch length field says {header.length + LOG_OVERHEAD} bytes; "
            f"the body holds {len(data)} (one batch per request)"
        )
    _check_header(data, 0, header)
    if header.record_count <= 0:
        raise CorruptBatch(
            f"the batch counts {header.record_count} records; at least one is needed"
        )
    if header.last_offset_delta != header.record_count - 1:
        raise CorruptBatch(
            f"last offset delta {header.last_offset_delta} does not match the record count "
            f"{header.record_count}"
        )
    body = _records_section(data, 0, header, max_uncompressed)
    max_delta, has_null_key = _walk(body, header.record_count)
    return Checked(header, header.base_timestamp + max_delta, has_null_key)


def _check_header(data: bytes | bytearray | memoryview, pos: int, header: Header) -> None:
    if header.magic != MAGIC:
        raise CorruptBatch(f"magic {header.magic}: only record batches of magic 2 are accepted")
    if header.length < HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptBatch(f"batch length {header.length} is shorter than the header")
    end = pos + header.size
    if end > len(data):
        raise CorruptBatch(f"the batch at byte {pos} runs past the end of the data")
    actual = crc32c(memoryview(data)[pos + CRC_START : end])
    if actual != header.crc:
        raise CorruptBatch(
            f"CRC-32C mismatch: the header says {header.crc}, the bytes give {actual}"
        )
    if header.compression not in _CODEC_NAMES:
        raise CorruptBatch(f"unknown compression codec {header.compression}")


def _records_section(
    data: bytes | bytearray | memoryview, pos: int, header: Header, max_uncompressed: int
) -> bytes | bytearray | memoryview:
    start, end = pos + HEADER_SIZE, pos + header.size
    codec = header.compression
    view = memoryview(data)[start:end]
    if codec == COMPRESSION_NONE:
        return view
    try:
        return _decompress(codec, view, max_uncompressed)
    except CorruptBatch:
        raise
    except Exception as exc:  # each codec raises its own kind
        raise CorruptBatch(
            f"the {_CODEC_NAMES[codec]} records section does not decompress: {exc}"
        ) from None


def _decompress(codec: int, data: memoryview, limit: int) -> bytes | bytearray:
    if codec == COMPRESSION_GZIP:
        # In steps of a bounded size, so a bomb is refused having held at most `limit` bytes
        # (one call with the limit as its bound holds the output twice while it grows).
        # Into one growing buffer, not a list of parts joined at the end: a join holds the
        # records twice at its peak.
        inflater = zlib.decompressobj(47)  # gzip or zlib header, detected
        out = bytearray()
        pending: bytes | memoryview = data
        while not inflater.eof:
            part = inflater.decompress(pending, _INFLATE_STEP)
            if len(out) + len(part) > limit:
                raise InflatesTooFar(f"the records inflate past {limit} bytes")
            out += part
            pending = inflater.unconsumed_tail
            if not part and not pending:
                raise CorruptBatch("the gzip stream is truncated")
        return out
    if codec == COMPRESSION_SNAPPY:
        if bytes(data[:8]) == _XERIAL_MAGIC:
            return _xerial(data, limit)
        if cramjam.snappy.decompress_raw_len(data) > limit:
            raise InflatesTooFar(f"the records inflate past {limit} bytes")
        return bytes(cramjam.snappy.decompress_raw(data))
    decompress_into = cramjam.lz4.decompress_into
    if codec == COMPRESSION_ZSTD:
        decompress_into = cramjam.zstd.decompress_into
    # Into a bounded buffer, growing it while the output does not fit.
    size = min(limit, max(64 * 1024, 8 * len(data)))
    while True:
        buffer = bytearray(size)
        try:
            written = decompress_into(data, buffer)
        except cramjam.DecompressionError:
            if size >= limit:
                # Past the limit or not a stream at all: either way it is refused (as corrupt:
                # the codec cannot tell which).
                raise
            size = min(limit, size * 4)
            continue
        if written == size and size < limit:
            size = min(limit, size * 4)  # it may have stopped at the end of the buffer
            continue
        if written == size:
            raise InflatesTooFar(f"the records inflate to {limit} bytes or more")
        return bytes(memoryview(buffer)[:written])


def _xerial(data: memoryview, limit: int) -> bytes:
    """Snappy in xerial's framing: a 16-byte header, then blocks of (i32 length, raw snappy)."""
    parts = []
    total = 0
    pos = _XERIAL_HEADER_SIZE
    end = len(data)
    while pos < end:
        if end - pos < 4:
            raise CorruptBatch("a xerial snappy block length is truncated")
        (length,) = _XERIAL_BLOCK.unpack_from(data, pos)
        pos += 4
        if length < 0 or pos + length > end:
            raise CorruptBatch("a xerial snappy block runs past the end of the records")
        block = data[pos : pos + length]
        total += cramjam.snappy.decompress_raw_len(block)
        if total > limit:
            raise InflatesTooFar(f"the records inflate past {limit} bytes")
        parts.append(bytes(cramjam.snappy.decompress_raw(block)))
        pos += length
    return b"".join(parts)


def _varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """A zigzag varint (up to 64 bits) at `pos`: (value, position after it)."""
    raw = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptBatch("a varint is longer than 10 bytes")


def _walk(body: bytes | bytearray | memoryview, count: int) -> tuple[int, bool]:
    """Check the records section holds exactly `count` well-formed records with offset deltas
    0..count-1; returns (largest timestamp delta, whether any key is null). Single-byte varints
    (nearly all of them) are decoded inline: this loop is on every produce."""
    varint = _varint
    end = len(body)
    pos = 0
    max_delta = None
    has_null_key = False
    try:
        for index in range(count):
            b = body[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                length, pos = varint(body, pos)
            stop = pos + length
            if length < 6 or stop > end:  # at least attributes and five one-byte varints
                raise CorruptBatch(f"record {index}: length {length} does not fit the batch")
            pos += 1  # attributes
            b = body[pos]
            if b < 0x80:
                delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                delta, pos = varint(body, pos)
            b = body[pos]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                offset_delta, pos = varint(body, pos)
            if offset_delta != index:
                raise CorruptBatch(f"record {index} has offset delta {offset_delta}")
            b = body[pos]
            if b < 0x80:
                size = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                size, pos = varint(body, pos)
            if size >= 0:
                pos += size
            elif size == -1:
                has_null_key = True
            else:
                raise CorruptBatch(f"record {index}: key length {size}")
            b = body[pos]
            if b < 0x80:
                size = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                size, pos = varint(body, pos)
            if size >= 0:
                pos += size
            elif size != -1:
                raise CorruptBatch(f"record {index}: value length {size}")
            b = body[pos]
            if b < 0x80:
                headers = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                headers, pos = varint(body, pos)
            if headers:
                pos = _skip_headers(body, pos, headers, index)
            if pos != stop:
                raise CorruptBatch(
                    f"record {index}: its fields take {pos - stop + length} bytes, "
                    f"its length says {length}"
                )
            if max_delta is None or delta > max_delta:
                max_delta = delta
    except IndexError:
        raise CorruptBatch("the records section ends inside a record") from None
    if pos != end:
        raise CorruptBatch(
            f"the records section holds {end - pos} bytes after the {count} records it counts"
        )
    return (0 if max_delta is None else max_delta), has_null_key


def _skip_headers(body: bytes | bytearray | memoryview, pos: int, count: int, index: int) -> int:
    if count < 0:
        raise CorruptBatch(f"record {index}: header count {count}")
    for _ in range(count):
        size, pos = _varint(body, pos)
        if size < 0:
            raise CorruptBatch(f"record {index}: header name length {size}")
        try:
            bytes(body[pos : pos + size]).decode()
        except UnicodeDecodeError:
            raise CorruptBatch(f"record {index}: a header name is not UTF-8") from None
        pos += size
        size, pos = _varint(body, pos)
        if size >= 0:
            pos += size
        elif size != -1:
            raise CorruptBatch(f"record {index}: header value length {size}")
    return pos


def iter_batches(
    data: bytes | bytearray | memoryview, verify: bool = False
) -> Iterator[tuple[int, Header]]:
    """(position, header) of each batch in `data`, batches back to back (a fetch answer).
    `verify`: check each one's magic, size and CRC-32C as well."""
    pos = 0
    end = len(data)
    while pos < end:
        header = read_header(data, pos)
        if header.length < HEADER_SIZE - LOG_OVERHEAD or pos + header.size > end:
            raise CorruptBatch(f"the batch at byte {pos} runs past the end of the data")
        if verify:
            _check_header(data, pos, header)
        yield pos, header
        pos += header.size


def records(
    data: bytes | bytearray | memoryview,
    pos: int = 0,
    header: Header | None = None,
    max_uncompressed: int = MAX_UNCOMPRESSED_BYTES,
) -> Iterator[Record]:
    """The records of the batch at `pos`, lazily, decompressed where needed: offset (base offset
    + delta), timestamp (the batch's max timestamp under LogAppendTime), key, value, headers."""
    if header is None:
        header = read_header(data, pos)
    body = _records_section(data, pos, header, max_uncompressed)
    if not isinstance(body, bytes):
        body = bytes(body)  # each record's key and value: bytes of their own
    base_offset = header.base_offset
    base_ts = header.base_timestamp
    append_time = header.max_timestamp if header.log_append_time else None
    varint = _varint
    at = 0
    try:
        for _ in range(header.record_count):
            _, at = varint(body, at)
            at += 1
            delta, at = varint(body, at)
            offset_delta, at = varint(body, at)
            size, at = varint(body, at)
            key = None
            if size >= 0:
                key = body[at : at + size]
                at += size
            size, at = varint(body, at)
            value = None
            if size >= 0:
                value = body[at : at + size]
                at += size
            count, at = varint(body, at)
            headers: list[tuple[str, bytes | None]] = []
            for _ in range(count):
                size, at = varint(body, at)
                name = body[at : at + size].decode()
                at += size
                size, at = varint(body, at)
                hvalue = None
                if size >= 0:
                    hvalue = body[at : at + size]
                    at += size
                headers.append((name, hvalue))
            timestamp = base_ts + delta if append_time is None else append_time
            yield Record(base_offset + offset_delta, timestamp, key, value, headers)
    except (IndexError, UnicodeDecodeError):
        raise CorruptBatch(f"the batch at offset {base_offset} holds a malformed record") from None


def control_type(data: bytes | bytearray | memoryview, pos: int = 0) -> int:
    """The type of a control batch's record: CONTROL_ABORT or CONTROL_COMMIT."""
    record = next(records(data, pos))
    if record.key is None or len(record.key) < 4:
        raise CorruptBatch("a control record without its key")
    kind: int = _CONTROL_KEY.unpack_from(record.key)[1]
    return kind


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
    if compression not in _CODEC_NAMES:
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
    section = _compress(compression, b"".join(parts))
    attributes = compression
    if log_append_time:
        attributes |= LOG_APPEND_TIME
    if transactional:
        attributes |= TRANSACTIONAL
    if control:
        attributes |= CONTROL
    header = bytearray(
        _HEADER.pack(
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
    _CRC.pack_into(header, 17, crc32c(memoryview(header)[CRC_START:]))
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


def _compress(codec: int, data: bytes) -> bytes:
    if codec == COMPRESSION_NONE:
        return data
    if codec == COMPRESSION_GZIP:
        deflater = zlib.compressobj(6, zlib.DEFLATED, 31)
        return deflater.compress(data) + deflater.flush()
    if codec == COMPRESSION_SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == COMPRESSION_LZ4:
        return bytes(cramjam.lz4.compress(data))
    return bytes(cramjam.zstd.compress(data))


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
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _CONTROL_VALUE.pack(0, coordinator_epoch)
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
    return _BASE_OFFSET.pack(base_offset) + data[8:]


def joined_with_leader_epoch(batches: Sequence[bytes], partition_leader_epoch: int) -> bytearray:
    """Whole batches back to back, each with its partition leader epoch set (outside the CRC),
    as a Kafka leader's fetch answer carries them; one copy, the join's."""
    out = bytearray().join(batches)
    at = 0
    for batch in batches:
        _LEADER_EPOCH.pack_into(out, at + 12, partition_leader_epoch)
        at += len(batch)
    return out


def with_log_append_time(data: bytes, timestamp: int) -> bytes:
    """The batch stamped with the log's append time, as Kafka's broker does for a
    `LogAppendTime` topic: the timestamp-type attribute set, the max timestamp (which readers
    then give every record) set to `timestamp`, the CRC recomputed."""
    out = bytearray(data)
    (attributes,) = _ATTRIBUTES_AND_MAX.unpack_from(out, 21)
    _ATTRIBUTES_AND_MAX.pack_into(out, 21, attributes | LOG_APPEND_TIME)
    _MAX_TIMESTAMP.pack_into(out, 35, timestamp)
    _CRC.pack_into(out, 17, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)


_LENGTH = struct.Struct(">i")


def with_codec(data: bytes, codec: int, max_uncompressed: int = MAX_UNCOMPRESSED_BYTES) -> bytes:
    """The batch with its records section in `codec`, as Kafka's broker recompresses for a
    topic whose `compression.type` is not the producer's: the records' bytes are the same,
    only their compression, the codec bits, the length and the CRC change (producer id, epoch,
    sequences, offsets and timestamps are kept)."""
    header = read_header(data)
    if header.compression == codec:
        return data
    section = bytes(_records_section(data, 0, header, max_uncompressed))
    if codec != COMPRESSION_NONE:
        section = _compress(codec, section)
    out = bytearray(data[:HEADER_SIZE])
    out += section
    _LENGTH.pack_into(out, 8, len(out) - LOG_OVERHEAD)
    _ATTRIBUTES_AND_MAX.pack_into(out, 21, (header.attributes & ~CODEC_MASK) | codec)
    _CRC.pack_into(out, 17, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)
