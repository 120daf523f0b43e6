"""The record batch's codecs: gzip (zlib), snappy raw and xerial-framed, lz4 frames and zstd
(cramjam), inflated within a bound so a decompression bomb fails at it (`sdk.recordbatch`'s
docstring says why these libraries).

`inflate` gives a records section in pieces of at most INFLATE_STEP bytes as it inflates (a
snappy block whole), and `recode` recompresses one piece at a time, so that neither holds the
records inflated whole: the service checks every compressed batch this way. Streaming lz4 and
zstd with a bound on each piece takes python-lz4 and the zstd of PEP 784 (`backports.zstd`
before Python 3.14), which the service installs; without them (an SDK-only install, which
only decodes what it fetches) a section inflates in one piece, still within its bound."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import cramjam

from sdk._batch_layout import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    INFLATE_STEP,
    XERIAL_BLOCK,
    XERIAL_HEADER_SIZE,
    XERIAL_MAGIC,
    CorruptBatch,
    InflatesTooFar,
)

Piece = bytes | bytearray | memoryview
# Kafka's Java client writes snappy in xerial's framing, in blocks of 32 KiB; so does `recode`.
XERIAL_BLOCK_SIZE = 32 * 1024
_XERIAL_VERSIONS = b"\x00\x00\x00\x01\x00\x00\x00\x01"


def _stream_decompressors() -> dict[int, Callable[[], Any]]:
    """The streaming decompressors installed: each has `decompress(data, max_length)`, `eof`,
    `needs_input` and `unused_data`, as the standard library's bz2 and lzma do."""
    found: dict[int, Callable[[], Any]] = {}
    with contextlib.suppress(ImportError):
        import lz4.frame

        found[COMPRESSION_LZ4] = lz4.frame.LZ4FrameDecompressor
    try:
        from compression.zstd import ZstdDecompressor  # type: ignore[import-not-found]
    except ImportError:
        try:
            from backports.zstd import ZstdDecompressor
        except ImportError:
            return found
    found[COMPRESSION_ZSTD] = ZstdDecompressor
    return found


STREAMING = _stream_decompressors()
_NAMES = {COMPRESSION_GZIP: "gzip", COMPRESSION_LZ4: "lz4", COMPRESSION_ZSTD: "zstd"}


def inflate(codec: int, data: memoryview, limit: int) -> Iterator[Piece]:
    """The records section `data`, compressed with `codec`, in pieces as it inflates, refused
    (`InflatesTooFar`) once they pass `limit` bytes in all; a stream that ends early, or is no
    stream of its codec, raises as it is found (`CorruptBatch`, or the codec's own error)."""
    if codec == COMPRESSION_NONE:
        yield data
        return
    total = 0
    for piece in _pieces(codec, data, limit):
        total += len(piece)
        if total > limit:
            raise InflatesTooFar(f"the records inflate past {limit} bytes")
        yield piece


def _pieces(codec: int, data: memoryview, limit: int) -> Iterator[Piece]:
    if codec == COMPRESSION_GZIP:
        yield from _gunzip(data)
    elif codec == COMPRESSION_SNAPPY:
        if bytes(data[:8]) == XERIAL_MAGIC:
            yield from _xerial_blocks(data, limit)
        else:
            yield _raw_snappy(data, limit)
    elif codec in STREAMING:
        yield from _frames(STREAMING[codec], _NAMES[codec], data)
    else:
        yield _decompress_into(codec, data, limit)


def _gunzip(data: memoryview) -> Iterator[Piece]:
    """gzip members one after another, as Java's GZIPInputStream reads them."""
    pending: bytes | memoryview = data
    while pending:
        inflater = zlib.decompressobj(47)  # gzip or zlib header, detected
        while not inflater.eof:
            piece = inflater.decompress(pending, INFLATE_STEP)
            pending = inflater.unconsumed_tail
            if piece:
                yield piece
            elif not pending:
                raise CorruptBatch("the gzip stream is truncated")
        pending = inflater.unused_data


def _frames(new: Callable[[], Any], name: str, data: memoryview) -> Iterator[Piece]:
    """lz4 or zstd frames one after another."""
    pending: bytes | memoryview = data
    while pending:
        inflater = new()
        while not inflater.eof:
            piece = inflater.decompress(pending, INFLATE_STEP)
            pending = b""
            if piece:
                yield piece
            elif inflater.needs_input:
                raise CorruptBatch(f"the {name} stream is truncated")
        pending = inflater.unused_data


def _raw_snappy(data: memoryview | bytes, limit: int) -> bytes:
    if cramjam.snappy.decompress_raw_len(data) > limit:
        raise InflatesTooFar(f"the records inflate past {limit} bytes")
    return bytes(cramjam.snappy.decompress_raw(data))


def _xerial_blocks(data: memoryview, limit: int) -> Iterator[bytes]:
    """Snappy in xerial's framing: a 16-byte header, then blocks of (i32 length, raw snappy)."""
    pos = XERIAL_HEADER_SIZE
    end = len(data)
    while pos < end:
        if end - pos < 4:
            raise CorruptBatch("a xerial snappy block length is truncated")
        (length,) = XERIAL_BLOCK.unpack_from(data, pos)
        pos += 4
        if length < 0 or pos + length > end:
            raise CorruptBatch("a xerial snappy block runs past the end of the records")
        yield _raw_snappy(data[pos : pos + length], limit)
        pos += length


def recode(codec: int, pieces: Iterator[Piece]) -> bytes:
    """The records section given in `pieces`, compressed with `codec` one piece at a time (snappy
    in xerial's framing, as Kafka's broker writes it)."""
    if codec == COMPRESSION_NONE:
        return b"".join(pieces)
    out = bytearray()
    if codec == COMPRESSION_SNAPPY:
        out += XERIAL_MAGIC + _XERIAL_VERSIONS
        for piece in pieces:
            view = memoryview(piece)
            for start in range(0, len(view), XERIAL_BLOCK_SIZE):
                block = cramjam.snappy.compress_raw(view[start : start + XERIAL_BLOCK_SIZE])
                out += XERIAL_BLOCK.pack(len(block))
                out += block
        return bytes(out)
    compressor: Any
    if codec == COMPRESSION_GZIP:
        compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
        for piece in pieces:
            out += compressor.compress(piece)
        out += compressor.flush()
        return bytes(out)
    compressor = (cramjam.lz4 if codec == COMPRESSION_LZ4 else cramjam.zstd).Compressor()
    for piece in pieces:
        compressor.compress(bytes(piece))
    return bytes(compressor.finish())


def decompress(codec: int, data: memoryview, limit: int) -> bytes | bytearray:
    """The records section inflated whole, within `limit` (the SDK reads its records' keys and
    values out of it): lz4 and zstd in one call, the others piece by piece into one growing
    buffer (a join of the pieces would hold the records twice at its peak)."""
    if codec in (COMPRESSION_LZ4, COMPRESSION_ZSTD):
        return _decompress_into(codec, data, limit)
    out = bytearray()
    for piece in inflate(codec, data, limit):
        out += piece
    return out


def _decompress_into(codec: int, data: memoryview, limit: int) -> bytes:
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


def compress(codec: int, data: bytes) -> bytes:
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
