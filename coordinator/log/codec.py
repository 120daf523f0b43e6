"""The binary form of a batch's records, stored in one column per batch.

Hand-written rather than JSON or msgpack because it sits on every produce and fetch, holds raw
bytes without base64's third more, and needs nothing installed. Layout, little-endian, per record:
key length (i32, -1 for null), value length (i32, -1 for null), header count (u16), key, value,
then per header: name length (u16), value length (i32), name (UTF-8), value.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import NamedTuple

_RECORD = struct.Struct("<iiH")
_HEADER = struct.Struct("<Hi")


class Record(NamedTuple):
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]


def encode(records: Sequence[Record]) -> bytes:
    out = bytearray()
    pack_record = _RECORD.pack
    pack_header = _HEADER.pack
    for key, value, headers in records:
        out += pack_record(
            -1 if key is None else len(key), -1 if value is None else len(value), len(headers)
        )
        if key:
            out += key
        if value:
            out += value
        for name, hvalue in headers:
            raw_name = name.encode()
            out += pack_header(len(raw_name), len(hvalue))
            out += raw_name
            out += hvalue
    return bytes(out)


def decode(payload: bytes) -> Iterator[Record]:
    view = memoryview(payload)
    pos = 0
    end = len(payload)
    unpack_record = _RECORD.unpack_from
    unpack_header = _HEADER.unpack_from
    while pos < end:
        key_len, value_len, header_count = unpack_record(view, pos)
        pos += _RECORD.size
        key = None
        if key_len >= 0:
            key = payload[pos : pos + key_len]
            pos += key_len
        value = None
        if value_len >= 0:
            value = payload[pos : pos + value_len]
            pos += value_len
        headers = []
        for _ in range(header_count):
            name_len, hvalue_len = unpack_header(view, pos)
            pos += _HEADER.size
            name = payload[pos : pos + name_len].decode()
            pos += name_len
            headers.append((name, payload[pos : pos + hvalue_len]))
            pos += hvalue_len
        yield Record(key, value, headers)
