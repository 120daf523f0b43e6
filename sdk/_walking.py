"""The check of a record batch's records section, as Kafka's LogValidator makes it: exactly the
records the header counts, each well formed (its length covering its fields exactly, key, value
and header lengths -1 or more, header names UTF-8), with offset deltas 0..count-1; what it finds
is the largest timestamp delta and whether any key is null.

The section is walked in pieces as it inflates (`feed`, then `finish`), so a compressed batch is
never held inflated whole. `Walker` is the compiled walk (sdk/_walk.c, a byte state machine that
holds nothing of the records) where the package was built with a compiler, else `PyWalker`: the
same rules in Python, which walks the whole records of each piece and carries a record cut by
a piece's end into the next (so it holds at most one record, besides the piece).

Both answer alike: `feed(piece)` is None or the message of what is wrong; `finish()` is
(largest timestamp delta, any null key) or the message. `walk` raises `CorruptBatch`."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Protocol

from sdk._batch_layout import CorruptBatch

Piece = bytes | bytearray | memoryview


class Walk(Protocol):
    def feed(self, piece: Piece, /) -> str | None: ...

    def finish(self) -> tuple[int, bool] | str: ...


def varint(buf: Piece, pos: int) -> tuple[int, int]:
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


class PyWalker:
    """The walk in Python (see the module's docstring)."""

    def __init__(self, count: int) -> None:
        self._count = count
        self._index = 0
        self._max_delta: int | None = None
        self._has_null_key = False
        self._carried: list[Piece] = []  # a record cut by the end of a piece, its bytes so far
        self._carried_size = 0
        self._wanted = 0  # how many bytes the carried record needs (its length, once known)
        self._length = -1  # the carried record's length, once read
        self._trailing = 0
        self._wrong: str | None = None

    def feed(self, piece: Piece) -> str | None:
        if self._wrong is None:
            try:
                self._feed(piece)
            except CorruptBatch as wrong:
                self._wrong = str(wrong)
        return self._wrong

    def finish(self) -> tuple[int, bool] | str:
        if self._wrong is None:
            if self._index < self._count:
                if self._length >= 0:
                    self._wrong = (
                        f"record {self._index}: length {self._length} does not fit the batch"
                    )
                else:
                    self._wrong = "the records section ends inside a record"
            elif self._trailing:
                self._wrong = (
                    f"the records section holds {self._trailing} bytes after the "
                    f"{self._count} records it counts"
                )
        if self._wrong is not None:
            return self._wrong
        return (0 if self._max_delta is None else self._max_delta), self._has_null_key

    def _feed(self, piece: Piece) -> None:
        if self._index >= self._count:
            self._trailing += len(piece)
            return
        if self._carried:
            self._carried.append(piece)
            self._carried_size += len(piece)
            if self._carried_size < self._wanted:
                return
            piece = b"".join(self._carried)
            self._carried, self._carried_size = [], 0
        pos = self._walk(piece)
        self._length = -1
        if pos == len(piece):
            return
        if self._index >= self._count:
            self._trailing += len(piece) - pos
            return
        rest = piece[pos:]  # a record the piece cuts: carried into the next
        self._carried, self._carried_size = [bytes(rest)], len(rest)
        try:
            length, at = varint(rest, 0)
            self._length, self._wanted = length, at + length
        except IndexError:
            self._length, self._wanted = -1, len(rest) + 1

    def _walk(self, body: Piece) -> int:
        """Walk the whole records of `body`: where the first one it cuts begins (or its end).
        Single-byte varints (nearly all of them) are decoded inline: this loop is on every
        produce where the package was built without a compiler."""
        varint_ = varint
        end = len(body)
        pos = 0
        index, count = self._index, self._count
        max_delta, has_null_key = self._max_delta, self._has_null_key
        try:
            while index < count and pos < end:
                start = pos
                b = body[pos]
                if b < 0x80:
                    length = (b >> 1) ^ -(b & 1)
                    pos += 1
                else:
                    try:
                        length, pos = varint_(body, pos)
                    except IndexError:
                        return start  # the length itself is cut
                stop = pos + length
                if length < 6:  # at least attributes and five one-byte varints
                    raise CorruptBatch(f"record {index}: length {length} does not fit the batch")
                if stop > end:
                    return start
                try:
                    pos += 1  # attributes
                    b = body[pos]
                    if b < 0x80:
                        delta = (b >> 1) ^ -(b & 1)
                        pos += 1
                    else:
                        delta, pos = varint_(body, pos)
                    b = body[pos]
                    if b < 0x80:
                        offset_delta = (b >> 1) ^ -(b & 1)
                        pos += 1
                    else:
                        offset_delta, pos = varint_(body, pos)
                    if offset_delta != index:
                        raise CorruptBatch(f"record {index} has offset delta {offset_delta}")
                    b = body[pos]
                    if b < 0x80:
                        size = (b >> 1) ^ -(b & 1)
                        pos += 1
                    else:
                        size, pos = varint_(body, pos)
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
                        size, pos = varint_(body, pos)
                    if size >= 0:
                        pos += size
                    elif size != -1:
                        raise CorruptBatch(f"record {index}: value length {size}")
                    b = body[pos]
                    if b < 0x80:
                        headers = (b >> 1) ^ -(b & 1)
                        pos += 1
                    else:
                        headers, pos = varint_(body, pos)
                    if headers:
                        pos = _skip_headers(body, pos, headers, index)
                except IndexError:
                    # Past the end of the piece, which the record's length does not reach.
                    pos = end + 1
                if pos != stop:
                    raise CorruptBatch(
                        f"record {index}: its fields take {pos - stop + length} bytes, "
                        f"its length says {length}"
                    )
                if max_delta is None or delta > max_delta:
                    max_delta = delta
                index += 1
        finally:
            self._index, self._max_delta, self._has_null_key = index, max_delta, has_null_key
        return pos


def _skip_headers(body: Piece, pos: int, count: int, index: int) -> int:
    if count < 0:
        raise CorruptBatch(f"record {index}: header count {count}")
    for _ in range(count):
        size, pos = varint(body, pos)
        if size < 0:
            raise CorruptBatch(f"record {index}: header name length {size}")
        try:
            bytes(body[pos : pos + size]).decode()
        except UnicodeDecodeError:
            raise CorruptBatch(f"record {index}: a header name is not UTF-8") from None
        pos += size
        size, pos = varint(body, pos)
        if size >= 0:
            pos += size
        elif size != -1:
            raise CorruptBatch(f"record {index}: header value length {size}")
    return pos


def _compiled() -> type[Walk] | None:
    if os.environ.get("TXN_SDK_PURE_PYTHON"):
        return None
    try:
        from sdk._walk import Walker as compiled
    except ImportError:
        return None
    return compiled  # type: ignore[no-any-return]


COMPILED: type[Walk] | None = _compiled()
Walker: type[Walk] = COMPILED or PyWalker


class Walking:
    """A walk of a records section that pieces go `through` on their way elsewhere (to a
    compressor), `found` once they have all passed."""

    def __init__(self, count: int, walker: type[Walk] | None = None) -> None:
        self._walking = (walker or Walker)(count)  # type: ignore[call-arg]

    def through(self, pieces: Iterable[Piece]) -> Iterator[Piece]:
        for piece in pieces:
            wrong = self._walking.feed(piece)
            if wrong is not None:
                raise CorruptBatch(wrong)
            yield piece

    def found(self) -> tuple[int, bool]:
        found = self._walking.finish()
        if isinstance(found, str):
            raise CorruptBatch(found)
        return found


def walk(pieces: Iterable[Piece], count: int, walker: type[Walk] | None = None) -> tuple[int, bool]:
    """Walk the records section given in `pieces` (see the module's docstring) with `walker`
    (`Walker` unless given): the largest timestamp delta, and whether any key is null. Raises
    `CorruptBatch` saying what is wrong."""
    walking = Walking(count, walker)
    for _ in walking.through(pieces):
        pass
    return walking.found()
