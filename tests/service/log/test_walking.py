"""The check of a records section in pieces as it inflates (issue 49, item 2): the compiled walk
(sdk/_walk.c) and the pure-Python one (sdk/_walking.py) find the same in every batch however it
is cut, refuse the same malformed ones, and the codecs inflate in bounded pieces, refuse a
truncated stream, and recompress a section one piece at a time."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import cramjam
import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdk import _compression, _walking
from sdk import recordbatch as rb

ROOT = Path(__file__).resolve().parents[3]
WALKERS = {"compiled": _walking.COMPILED, "python": _walking.PyWalker}


def test_this_install_has_the_compiled_walk() -> None:
    # The README's set-up builds it; a test run without it would test the fallback alone.
    assert _walking.COMPILED is not None
    assert _walking.Walker is _walking.COMPILED


def _section(batch: bytes) -> bytes:
    return batch[rb.HEADER_SIZE :]


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def _outcome(walker: type[_walking.Walk], pieces: list[bytes], count: int) -> object:
    try:
        return _walking.walk(pieces, count, walker)
    except rb.CorruptBatch:
        return "refused"


_records = st.lists(
    st.tuples(
        st.integers(-(2**40), 2**40),
        st.one_of(st.none(), st.binary(max_size=40)),
        st.one_of(st.none(), st.binary(max_size=300)),
        st.lists(
            st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))),
            max_size=3,
        ),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=_records, cuts=st.lists(st.integers(0, 10_000), max_size=6))
def test_both_walks_find_what_the_batch_holds_however_it_is_cut(
    records: list[rb.BuildRecord], cuts: list[int]
) -> None:
    base = min(r[0] for r in records)
    batch = rb.build(records, base_timestamp=base)
    found = (max(r[0] for r in records) - base, any(r[1] is None for r in records))
    pieces = _cut(_section(batch), cuts)
    for walker in WALKERS.values():
        assert _outcome(walker, pieces, len(records)) == found  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=_records,
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=3),
    cut_at=st.one_of(st.none(), st.integers(0, 10_000)),
    extra=st.binary(max_size=3),
    count_delta=st.sampled_from([0, 0, -1, 1]),
    cuts=st.lists(st.integers(0, 10_000), max_size=4),
)
def test_both_walks_refuse_the_same_malformed_sections(
    records: list[rb.BuildRecord],
    edits: list[tuple[int, int]],
    cut_at: int | None,
    extra: bytes,
    count_delta: int,
    cuts: list[int],
) -> None:
    section = bytearray(_section(rb.build(records)))
    for at, byte in edits:
        section[at % len(section)] = byte
    if cut_at is not None:
        del section[cut_at % len(section) :]
    section += extra
    count = max(1, len(records) + count_delta)
    pieces = _cut(bytes(section), cuts)
    outcomes = {name: _outcome(w, pieces, count) for name, w in WALKERS.items()}  # type: ignore[arg-type]
    assert outcomes["compiled"] == outcomes["python"]
    # Cut otherwise, or not at all, the answer is the same.
    assert _outcome(_walking.PyWalker, [bytes(section)], count) == outcomes["python"]


@pytest.mark.parametrize("name", WALKERS)
@pytest.mark.parametrize(
    ("section", "says"),
    [
        (b"\x04" + b"\x00" * 2, "length 2 does not fit the batch"),
        (b"\x0c\x00\x00\x02\x01\x01\x00", "offset delta 1"),
        (b"\x0c\x00\x00\x00\x03\x01\x00", "key length -2"),
        (b"\x14\x00\x00\x00\x01\x01\x02\x04\xff\xfe\x01", "a header name is not UTF-8"),
        (b"\x14\x00\x00\x00\x01\x01\x02\x04\xed\xa0\x01", "a header name is not UTF-8"),
        (b"\x0e\x00\x00\x00\x01\x01\x00\x00", "its fields take 6 bytes, its length says 7"),
        (b"\x0c\x00\x00\x00\x01\x01\x00\x00\x00", "holds 2 bytes after the 1 records"),
        (b"\x0c\x00\x00\x00\x01", "record 0: length 6 does not fit the batch"),
        (b"\xff" * 12, "longer than 10 bytes"),
        (b"", "ends inside a record"),
    ],
)
def test_what_is_wrong_is_said_alike_by_both_walks(name: str, section: bytes, says: str) -> None:
    walker = WALKERS[name]
    for pieces in ([section], [section[i : i + 1] for i in range(len(section))]):
        with pytest.raises(rb.CorruptBatch, match=says):
            _walking.walk(pieces, 1, walker)  # type: ignore[arg-type]


def _compressed(codec: int, data: bytes) -> bytes:
    return rb.compress(codec, data)


@pytest.mark.parametrize("codec", [c for c in rb.CODECS.values() if c])
def test_a_section_inflates_in_bounded_pieces_and_a_truncated_one_is_refused(codec: int) -> None:
    section = bytes(range(256)) * 20_000  # 5 MB: several pieces
    compressed = memoryview(_compressed(codec, section))
    pieces = list(_compression.inflate(codec, compressed, len(section)))
    assert b"".join(pieces) == section
    if codec != rb.COMPRESSION_SNAPPY:  # raw snappy is one block, inflated whole
        assert len(pieces) > 1
        assert max(len(p) for p in pieces) <= _compression.INFLATE_STEP
    with pytest.raises(rb.InflatesTooFar):
        list(_compression.inflate(codec, compressed, len(section) - 1))
    with pytest.raises(Exception):  # noqa: B017 (each codec's own error, or CorruptBatch)
        list(_compression.inflate(codec, compressed[: len(compressed) // 2], len(section)))


@pytest.mark.parametrize("codec", [rb.COMPRESSION_GZIP, rb.COMPRESSION_LZ4, rb.COMPRESSION_ZSTD])
def test_streams_in_several_members_or_frames_inflate_whole(codec: int) -> None:
    twice = memoryview(_compressed(codec, b"one") + _compressed(codec, b"two"))
    assert b"".join(_compression.inflate(codec, twice, 100)) == b"onetwo"


def test_a_truncated_gzip_batch_is_corrupt_to_the_check() -> None:
    section = _section(rb.build([(1, None, b"x" * 100_000, [])]))
    deflater = zlib.compressobj(6, zlib.DEFLATED, 31)
    truncated = (deflater.compress(section) + deflater.flush())[:-20]
    batch = rb.build([(1, None, b"x", [])])
    forged = rb.with_base_offset(batch, 0)[: rb.HEADER_SIZE] + truncated
    forged = _fixed(forged, rb.COMPRESSION_GZIP)
    with pytest.raises(rb.CorruptBatch, match=r"truncated|ends inside"):
        rb.check(forged)


def _fixed(batch: bytes, codec: int) -> bytes:
    """The batch's length, codec bits and CRC made to fit its bytes."""
    out = bytearray(batch)
    struct.pack_into(">i", out, 8, len(out) - 12)
    attributes = struct.unpack_from(">h", out, 21)[0]
    struct.pack_into(">h", out, 21, (attributes & ~0x07) | codec)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


@pytest.mark.parametrize("source", [c for c in rb.CODECS.values()])
@pytest.mark.parametrize("target", [c for c in rb.CODECS.values()])
def test_recompressing_for_a_topic_keeps_every_record(source: int, target: int) -> None:
    records: list[rb.BuildRecord] = [(7, b"k", bytes(range(256)) * 500, [("h", b"v")])] * 40
    batch = rb.build(records, compression=source, producer_id=3, base_sequence=9)
    recoded = rb.with_codec(batch, target)
    assert rb.read_header(recoded).compression == target
    assert rb.check(recoded).header.record_count == 40
    assert [r.value for r in rb.records(recoded)] == [r[2] for r in records]
    if target == rb.COMPRESSION_SNAPPY and source != target:
        # In xerial's framing, as Kafka's broker recompresses: blocks of 32 KiB.
        assert recoded[rb.HEADER_SIZE : rb.HEADER_SIZE + 8] == b"\x82SNAPPY\x00"
        raw = rb.HEADER_SIZE + 16
        (first,) = struct.unpack_from(">i", recoded, raw)
        assert len(cramjam.snappy.decompress_raw(recoded[raw + 4 : raw + 4 + first])) == 32768


_PIP = [sys.executable, "-m", "pip", "-q"]


def test_the_package_installs_and_checks_batches_without_a_compiler(tmp_path: Path) -> None:
    # `pip install` where no compiler is: the walk is sdk/_walking.py's, and it works.
    # From the package's sources alone: an editable install leaves its build beside them.
    source = tmp_path / "source"
    skip = shutil.ignore_patterns("*.so", "__pycache__")
    for package in ("coordinator", "migrations", "sdk", "jobs"):
        shutil.copytree(ROOT / package, source / package, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    env = {**os.environ, "CC": "false", "CXX": "false"}
    built = subprocess.run(
        [
            *_PIP,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "wheel"),
            source,
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    subprocess.run(
        [*_PIP, "install", "--no-deps", "--target", str(tmp_path / "site"), str(wheel)],
        check=True,
        capture_output=True,
    )
    assert not list((tmp_path / "site" / "sdk").glob("_walk*.so"))
    script = (
        "import sdk._walking as w, sdk.recordbatch as rb\n"
        "assert w.COMPILED is None and w.Walker is w.PyWalker, w.Walker\n"
        "batch = rb.build([(5, None, b'v' * 70000, [('h', b'x')])] * 30, compression=1)\n"
        "assert rb.check(batch).has_null_key\n"
        "print(rb.__file__)\n"
    )
    # Without site's start-up (-S): the editable install of this checkout, a .pth file, is not
    # read, and the wheel's sdk is the one imported; its dependencies are where cramjam is.
    clean = {k: v for k, v in os.environ.items() if k != "TXN_SDK_PURE_PYTHON"}
    path = os.pathsep.join([str(tmp_path / "site"), str(Path(cramjam.__file__).parents[1])])
    ran = subprocess.run(
        [sys.executable, "-S", "-c", script],
        env={**clean, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith(str(tmp_path / "site"))
