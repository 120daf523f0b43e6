"""The record-batch codec (sdk.recordbatch) on its own: what it builds is Kafka's
format (kafka-python, an independent implementation, reads it, and the other way round), with
every codec; what it refuses, it refuses as CorruptBatch; its rewrites keep the batch valid."""

from __future__ import annotations

import struct
import zlib

import cramjam
import pytest
from kafka.codec import snappy_encode
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from sdk import recordbatch as rb

CODECS = sorted(rb.CODECS.items(), key=lambda item: item[1])
RECORDS: list[rb.BuildRecord] = [
    (1_700_000_000_000 + i, None if i % 3 == 0 else b"k%d" % i, bytes(range(i % 256)) * 3, hs)
    for i, hs in enumerate(
        [[], [("h", b"x")], [("n", None), ("zürich", b"\xff\x00")], [], [("", b"")]] * 8
    )
]
RECORDS[5] = (RECORDS[5][0], b"k5", None, [])  # a tombstone


def plain(
    batch: bytes,
) -> list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in rb.records(batch)]


def expected(
    base_offset: int = 0,
) -> list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    return [(base_offset + i, t, k, v, list(h)) for i, (t, k, v, h) in enumerate(RECORDS)]


@pytest.mark.parametrize(("name", "codec"), CODECS)
def test_built_batches_round_trip_and_kafka_python_reads_them(name: str, codec: int) -> None:
    data = rb.build(
        RECORDS,
        compression=codec,
        producer_id=42,
        producer_epoch=3,
        base_sequence=7,
        transactional=True,
    )
    checked = rb.check(data)
    assert checked.header.record_count == len(RECORDS)
    assert checked.header.compression == codec
    assert checked.max_timestamp == max(t for t, *_ in RECORDS)
    assert checked.has_null_key
    assert plain(data) == expected()
    theirs = DefaultRecordBatch(bytearray(data))
    assert theirs.validate_crc()
    assert (theirs.producer_id, theirs.producer_epoch, theirs.base_sequence) == (42, 3, 7)
    assert theirs.is_transactional and not theirs.is_control_batch
    assert [
        (r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in theirs
    ] == [(o, t, k, v, [tuple(h) for h in hs]) for o, t, k, v, hs in expected()]


@pytest.mark.parametrize(("name", "codec"), CODECS)
def test_batches_kafka_python_builds_pass_the_check_and_read_back(name: str, codec: int) -> None:
    builder = DefaultRecordBatchBuilder(2, codec, False, 9, 0, 0, 10**8)
    for i, (t, k, v, h) in enumerate(RECORDS):
        builder.append(i, t, k, v, h)
    data = bytes(builder.build())
    checked = rb.check(data)
    assert (checked.header.producer_id, checked.header.record_count) == (9, len(RECORDS))
    assert plain(data) == expected()


def test_snappy_is_read_raw_and_xerial_framed() -> None:
    section = rb.build(RECORDS)[rb.HEADER_SIZE :]
    for compressed in (
        bytes(cramjam.snappy.compress_raw(section)),
        snappy_encode(section, xerial_compatible=True, xerial_blocksize=64),  # many blocks
    ):
        data = _with_section(rb.build(RECORDS), compressed, rb.COMPRESSION_SNAPPY)
        assert plain(data) == expected()


def _with_section(template: bytes, section: bytes, codec: int) -> bytes:
    """`template`'s header over another records section, length, codec and CRC made right."""
    header = bytearray(template[: rb.HEADER_SIZE])
    struct.pack_into(">i", header, 8, rb.HEADER_SIZE - 12 + len(section))
    (attributes,) = struct.unpack_from(">h", header, 21)
    struct.pack_into(">h", header, 21, (attributes & ~7) | codec)
    out = header + section
    from crc32c import crc32c

    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


def _corrupt(data: bytes, offset: int, value: bytes) -> bytes:
    out = bytearray(data)
    out[offset : offset + len(value)] = value
    return bytes(out)


GOOD = rb.build(RECORDS[:4], producer_id=1, producer_epoch=0, base_sequence=0)
SECTION = GOOD[rb.HEADER_SIZE :]


@pytest.mark.parametrize(
    ("data", "says"),
    [
        pytest.param(b"", "header", id="empty"),
        pytest.param(GOOD[:40], "header", id="short-header"),
        pytest.param(GOOD[:-1], "length", id="truncated"),
        pytest.param(GOOD + b"\x00", "length", id="trailing-byte"),
        pytest.param(GOOD + GOOD, "length", id="two-batches"),
        pytest.param(_corrupt(GOOD, 16, b"\x01"), "magic", id="magic-1"),
        pytest.param(_corrupt(GOOD, 70, b"\xee"), "CRC", id="flipped-record-byte"),
        pytest.param(_corrupt(GOOD, 17, b"\x00\x00\x00\x00"), "CRC", id="crc-zeroed"),
        pytest.param(_with_section(GOOD, SECTION, 5), "codec", id="codec-5"),
        pytest.param(_with_section(GOOD, SECTION, 7), "codec", id="codec-7"),
        pytest.param(_with_section(GOOD, SECTION[:-3], 0), "record", id="records-cut"),
        pytest.param(_with_section(GOOD, SECTION + b"\x02\x00", 0), "after", id="extra-record"),
        pytest.param(_with_section(GOOD, b"", 0), "record", id="no-records"),
        pytest.param(
            _with_section(GOOD, b"garbage!", rb.COMPRESSION_GZIP), "decompress", id="gzip-garbage"
        ),
        pytest.param(
            _with_section(GOOD, b"garbage!", rb.COMPRESSION_LZ4), "decompress", id="lz4-garbage"
        ),
        pytest.param(
            _with_section(GOOD, b"garbage!", rb.COMPRESSION_ZSTD), "decompress", id="zstd-garbage"
        ),
        pytest.param(
            _with_section(GOOD, b"\xff\xff\xff", rb.COMPRESSION_SNAPPY),
            "decompress",
            id="snappy-garbage",
        ),
        pytest.param(
            _with_section(GOOD, zlib.compress(SECTION)[:-6], rb.COMPRESSION_GZIP),
            "truncated",
            id="gzip-cut",
        ),
    ],
)
def test_malformed_batches_are_refused_saying_why(data: bytes, says: str) -> None:
    with pytest.raises(rb.CorruptBatch, match=says):
        rb.check(data)


def test_header_count_must_match_the_records() -> None:
    for count in (3, 5, 0, -1):
        header = bytearray(GOOD[: rb.HEADER_SIZE])
        struct.pack_into(">i", header, 57, count)
        struct.pack_into(">i", header, 23, max(count - 1, 0))  # keep last offset delta in step
        data = _with_section(bytes(header), SECTION, 0)
        with pytest.raises(rb.CorruptBatch):
            rb.check(data)


def test_offset_deltas_must_run_from_zero() -> None:
    skewed = rb.build(RECORDS[:3], offset_deltas=[0, 2, 3], last_offset_delta=2)
    with pytest.raises(rb.CorruptBatch, match="offset delta"):
        rb.check(skewed)
    lying = rb.build(RECORDS[:3], last_offset_delta=5)
    with pytest.raises(rb.CorruptBatch, match="last offset delta"):
        rb.check(lying)


def test_a_decompression_bomb_fails_at_the_bound() -> None:
    section = rb.build([(0, None, b"\x00" * 3_000_000, [])])[rb.HEADER_SIZE :]
    for codec in (
        rb.COMPRESSION_GZIP,
        rb.COMPRESSION_ZSTD,
        rb.COMPRESSION_LZ4,
        rb.COMPRESSION_SNAPPY,
    ):
        compressed = rb.compress(codec, section)
        data = _with_section(rb.build([(0, None, b"x", [])]), compressed, codec)

        # Every codec inflates in pieces now, so each tells a bomb from a broken stream.
        with pytest.raises(rb.InflatesTooFar):
            rb.check(data, max_uncompressed=1_000_000)
        assert rb.check(data, max_uncompressed=4_000_000).header.record_count == 1


def test_a_builder_with_explicit_offset_deltas_keeps_them_as_compaction_needs() -> None:
    kept = [RECORDS[1], RECORDS[4]]
    data = rb.build(
        kept,
        base_offset=100,
        offset_deltas=[1, 4],
        last_offset_delta=9,
        base_timestamp=RECORDS[0][0],
        producer_id=5,
        producer_epoch=1,
        base_sequence=10,
    )
    header = rb.read_header(data)
    assert (header.base_offset, header.last_offset, header.record_count) == (100, 109, 2)
    assert [r.offset for r in rb.records(data)] == [101, 104]
    assert [r.timestamp for r in rb.records(data)] == [RECORDS[1][0], RECORDS[4][0]]
    assert DefaultRecordBatch(bytearray(data)).validate_crc()


def test_rewrites_keep_the_batch_valid() -> None:
    data = rb.build(RECORDS, compression=rb.COMPRESSION_LZ4)
    moved = rb.with_base_offset(data, 1234)
    assert rb.check(moved).header.base_offset == 1234
    assert [r.offset for r in rb.records(moved)] == [1234 + i for i in range(len(RECORDS))]
    stamped = rb.with_log_append_time(moved, 1_800_000_000_000)
    header = rb.check(stamped).header
    assert header.log_append_time and header.max_timestamp == 1_800_000_000_000
    assert {r.timestamp for r in rb.records(stamped)} == {1_800_000_000_000}
    theirs = DefaultRecordBatch(bytearray(stamped))
    assert theirs.validate_crc() and theirs.timestamp_type == 1
    assert {r.timestamp for r in theirs} == {1_800_000_000_000}


@pytest.mark.parametrize("commit", [True, False])
def test_control_batches_are_kafkas_end_transaction_markers(commit: bool) -> None:
    data = rb.build_control(commit, producer_id=77, producer_epoch=4, timestamp=5, base_offset=9)
    header = rb.check(data).header
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 4, -1)
    assert rb.control_type(data) == (rb.CONTROL_COMMIT if commit else rb.CONTROL_ABORT)
    (record,) = rb.records(data)
    assert record.key == struct.pack(">hh", 0, 1 if commit else 0)
    assert record.value == struct.pack(">hi", 0, 0)
    theirs = DefaultRecordBatch(bytearray(data))
    assert theirs.is_control_batch and theirs.is_transactional


def test_iter_batches_walks_a_fetch_answer_and_verifies_crcs() -> None:
    first = rb.with_base_offset(rb.build(RECORDS[:2]), 0)
    second = rb.with_base_offset(rb.build(RECORDS[:3], compression=rb.COMPRESSION_GZIP), 2)
    found = [
        (pos, h.base_offset, h.record_count) for pos, h in rb.iter_batches(first + second, True)
    ]
    assert found == [(0, 0, 2), (len(first), 2, 3)]
    with pytest.raises(rb.CorruptBatch, match="CRC"):
        list(rb.iter_batches(first + _corrupt(second, 80, b"\x00"), verify=True))
    with pytest.raises(rb.CorruptBatch, match="past the end"):
        list(rb.iter_batches(first + second[:-1]))


def test_a_fetch_answer_carries_the_leader_epoch_in_each_batch_and_stays_valid() -> None:
    first = rb.with_base_offset(rb.build(RECORDS[:2]), 0)
    second = rb.with_base_offset(rb.build(RECORDS[:3], compression=rb.COMPRESSION_GZIP), 2)
    joined = rb.joined_with_leader_epoch([first, second], 5)
    found = [(h.base_offset, h.partition_leader_epoch) for _, h in rb.iter_batches(joined, True)]
    assert found == [(0, 5), (2, 5)]  # the CRCs still hold: the epoch is outside them
    assert first[12:16] == second[12:16] == b"\xff\xff\xff\xff"  # the stored bytes are unchanged
