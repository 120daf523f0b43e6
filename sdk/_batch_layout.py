"""The record batch's layout (magic 2, as Kafka's protocol guide defines `RecordBatch`): its
sizes, offsets and attribute bits, the struct formats of its header's fields, and what reading
one answers. `sdk.recordbatch` is the public codec."""

from __future__ import annotations

import struct
from typing import NamedTuple

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
CODEC_NAMES = {v: k for k, v in CODECS.items()}

CODEC_MASK = 0x07
LOG_APPEND_TIME = 0x08
TRANSACTIONAL = 0x10
CONTROL = 0x20

CONTROL_ABORT = 0
CONTROL_COMMIT = 1

# gzip inflates in steps of this many bytes (see decompress).
INFLATE_STEP = 1024 * 1024
# A compressed batch that would inflate past this is refused (a decompression bomb).
MAX_UNCOMPRESSED_BYTES = 256 * 1024 * 1024

HEADER = struct.Struct(">qiibIhiqqqhii")
BASE_OFFSET = struct.Struct(">q")
LEADER_EPOCH = struct.Struct(">i")
CRC = struct.Struct(">I")
ATTRIBUTES_AND_MAX = struct.Struct(">h")
MAX_TIMESTAMP = struct.Struct(">q")
CONTROL_KEY = struct.Struct(">hh")
CONTROL_VALUE = struct.Struct(">hi")
XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER_SIZE = 16
XERIAL_BLOCK = struct.Struct(">i")


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
