"""The record batch's codecs: gzip (zlib), snappy raw and xerial-framed, lz4 frames and zstd
(cramjam), inflated within a bound so a decompression bomb fails at it (`sdk.recordbatch`'s
docstring says why these libraries)."""

from __future__ import annotations

import zlib

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


def decompress(codec: int, data: memoryview, limit: int) -> bytes | bytearray:
    if codec == COMPRESSION_GZIP:
        # In steps of a bounded size, so a bomb is refused having held at most `limit` bytes
        # (one call with the limit as its bound holds the output twice while it grows).
        # Into one growing buffer, not a list of parts joined at the end: a join holds the
        # records twice at its peak.
        inflater = zlib.decompressobj(47)  # gzip or zlib header, detected
        out = bytearray()
        pending: bytes | memoryview = data
        while not inflater.eof:
            part = inflater.decompress(pending, INFLATE_STEP)
            if len(out) + len(part) > limit:
                raise InflatesTooFar(f"the records inflate past {limit} bytes")
            out += part
            pending = inflater.unconsumed_tail
            if not part and not pending:
                raise CorruptBatch("the gzip stream is truncated")
        return out
    if codec == COMPRESSION_SNAPPY:
        if bytes(data[:8]) == XERIAL_MAGIC:
            return xerial(data, limit)
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


def xerial(data: memoryview, limit: int) -> bytes:
    """Snappy in xerial's framing: a 16-byte header, then blocks of (i32 length, raw snappy)."""
    parts = []
    total = 0
    pos = XERIAL_HEADER_SIZE
    end = len(data)
    while pos < end:
        if end - pos < 4:
            raise CorruptBatch("a xerial snappy block length is truncated")
        (length,) = XERIAL_BLOCK.unpack_from(data, pos)
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
