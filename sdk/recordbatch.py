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

import contextlib
import struct
from collections.abc import Iterator

from crc32c import crc32c

from sdk._batch_layout import (
    ATTRIBUTES_AND_MAX,
    CODEC_MASK,
    CODEC_NAMES,
    CODECS,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    CONTROL_ABORT,
    CONTROL_COMMIT,
    CONTROL_KEY,
    CRC,
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MAX_UNCOMPRESSED_BYTES,
    Checked,
    CorruptBatch,
    Header,
    InflatesTooFar,
    Record,
)
from sdk._batch_writing import (
    BuildRecord,
    build,
    build_control,
    joined_with_leader_epoch,
    with_base_offset,
    with_log_append_time,
)
from sdk._compression import compress, decompress, inflate, recode
from sdk._walking import Walking
from sdk._walking import varint as _varint

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
    "BuildRecord",
    "Checked",
    "CorruptBatch",
    "Header",
    "InflatesTooFar",
    "Record",
    "build",
    "build_control",
    "check",
    "check_recoded",
    "compress",
    "control_type",
    "inflate_payload",
    "iter_batches",
    "joined_with_leader_epoch",
    "read_header",
    "records",
    "with_base_offset",
    "with_codec",
    "with_log_append_time",
]


# -- reading ------------------------------------------------------------------------------------


def read_header(data: bytes | bytearray | memoryview, pos: int = 0) -> Header:
    """The header of the batch at `pos` (no check beyond its size)."""
    if len(data) - pos < HEADER_SIZE:
        raise CorruptBatch(
            f"a record batch needs a {HEADER_SIZE}-byte header; only {len(data) - pos} bytes left"
        )
    return Header._make(HEADER.unpack_from(data, pos))


def check(data: bytes, max_uncompressed: int = MAX_UNCOMPRESSED_BYTES) -> Checked:
    """Check that `data` is exactly one well-formed batch: its length field, magic 2, CRC-32C,
    a known codec, and a records section (decompressed) holding exactly the records the header
    counts, each well formed, with offset deltas 0..count-1. Builds no per-record object.
    Raises `CorruptBatch` saying what is wrong."""
    return _check(data, max_uncompressed, None)[1]


def check_recoded(
    data: bytes, codec: int, max_uncompressed: int = MAX_UNCOMPRESSED_BYTES
) -> tuple[bytes, Checked]:
    """`check`, and the batch in `codec` as `with_codec` makes it, from the one inflation."""
    return _check(data, max_uncompressed, codec)


def _check(data: bytes, max_uncompressed: int, codec: int | None) -> tuple[bytes, Checked]:
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
    walking = Walking(header.record_count)
    pieces = walking.through(_inflated(data, 0, header, max_uncompressed))
    if codec is None or codec == header.compression:
        for _ in pieces:
            pass
    else:
        data = _in_codec(data, header, codec, recode(codec, pieces))
    max_delta, has_null_key = walking.found()
    return data, Checked(header, header.base_timestamp + max_delta, has_null_key)


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
    if header.compression not in CODEC_NAMES:
        raise CorruptBatch(f"unknown compression codec {header.compression}")


def _records_section(
    data: bytes | bytearray | memoryview, pos: int, header: Header, max_uncompressed: int
) -> bytes | bytearray | memoryview:
    """The records section of the batch at `pos`, inflated whole."""
    start, end = pos + HEADER_SIZE, pos + header.size
    codec = header.compression
    view = memoryview(data)[start:end]
    if codec == COMPRESSION_NONE:
        return view
    with _as_corrupt(codec):
        return decompress(codec, view, max_uncompressed)


def _inflated(
    data: bytes | bytearray | memoryview, pos: int, header: Header, max_uncompressed: int
) -> Iterator[bytes | bytearray | memoryview]:
    """The records section of the batch at `pos`, in pieces as it inflates."""
    view = memoryview(data)[pos + HEADER_SIZE : pos + header.size]
    with _as_corrupt(header.compression):
        yield from inflate(header.compression, view, max_uncompressed)


def inflate_payload(codec: int, data: bytes, max_uncompressed: int) -> bytes:
    """Bytes compressed with one of the batch's codecs outside a batch (a client's pushed
    metrics, KIP-714), inflated within `max_uncompressed`: `InflatesTooFar` past it,
    `CorruptBatch` when they do not inflate."""
    if codec not in CODEC_NAMES:
        raise CorruptBatch(f"unknown compression codec {codec}")
    with _as_corrupt(codec):
        return bytes(decompress(codec, memoryview(data), max_uncompressed))


@contextlib.contextmanager
def _as_corrupt(codec: int) -> Iterator[None]:
    """Each codec's own error, raised as `CorruptBatch`."""
    try:
        yield
    except CorruptBatch:
        raise
    except Exception as exc:  # each codec raises its own kind
        raise CorruptBatch(
            f"the {CODEC_NAMES[codec]} records section does not decompress: {exc}"
        ) from None


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
    kind: int = CONTROL_KEY.unpack_from(record.key)[1]
    return kind


_LENGTH = struct.Struct(">i")


def with_codec(data: bytes, codec: int, max_uncompressed: int = MAX_UNCOMPRESSED_BYTES) -> bytes:
    """The batch with its records section in `codec`, as Kafka's broker recompresses for a
    topic whose `compression.type` is not the producer's: the records' bytes are the same,
    only their compression, the codec bits, the length and the CRC change (producer id, epoch,
    sequences, offsets and timestamps are kept)."""
    header = read_header(data)
    if header.compression == codec:
        return data
    section = recode(codec, _inflated(data, 0, header, max_uncompressed))
    return _in_codec(data, header, codec, section)


def _in_codec(data: bytes, header: Header, codec: int, section: bytes) -> bytes:
    """The batch with `section`, its records in `codec`, for its own."""
    out = bytearray(data[:HEADER_SIZE])
    out += section
    _LENGTH.pack_into(out, 8, len(out) - LOG_OVERHEAD)
    ATTRIBUTES_AND_MAX.pack_into(out, 21, (header.attributes & ~CODEC_MASK) | codec)
    CRC.pack_into(out, 17, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)
