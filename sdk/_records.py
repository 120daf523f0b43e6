"""A record as `Producer.produce()` takes it: key, value and headers as bytes, its timestamp,
and its size against `message.max.bytes`, checked on the caller's thread before it is queued."""

from __future__ import annotations

import time
from collections.abc import Mapping

from sdk._errors import MessageSizeTooLarge
from sdk._types import Headers

__all__ = ["Record", "record_of"]

# (timestamp, key, value, headers): one record of a batch, as the record batch codec builds it.
Record = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]]]


def as_bytes(data: object, what: str) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"{what} must be bytes or str, not {type(data).__name__}")


def header_pairs(headers: Headers | None) -> list[tuple[str, bytes]]:
    if not headers:
        return []
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    result: list[tuple[str, bytes]] = []
    seen: set[str] = set()
    for name, value in pairs:
        if not isinstance(name, str):
            raise TypeError(f"header names must be str, not {type(name).__name__}")
        if name in seen:
            raise ValueError(f"header {name!r} appears twice; the API keeps one value per name")
        seen.add(name)
        raw = as_bytes(value, f"header {name!r}")
        if raw is None:
            raise TypeError(f"header {name!r} has no value; the API needs bytes or str")
        result.append((name, raw))
    return result


def record_of(
    key: object, value: object, timestamp: int, headers: Headers | None, max_bytes: int
) -> tuple[Record, int]:
    """The record and its size (keys, values and headers), or the error that refuses it:
    `timestamp` in milliseconds since the epoch (0: now), at most `max_bytes`."""
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise ValueError(f"timestamp: milliseconds since the epoch, not {timestamp!r}")
    key_bytes = as_bytes(key, "key")
    value_bytes = as_bytes(value, "value")
    pairs = header_pairs(headers)
    size = len(key_bytes or b"") + len(value_bytes or b"")
    if pairs:
        size += sum(len(n) + len(v) for n, v in pairs)
    if size > max_bytes:
        raise MessageSizeTooLarge(
            f"the record holds {size} bytes; message.max.bytes is {max_bytes}"
        )
    return (timestamp or time.time_ns() // 1_000_000, key_bytes, value_bytes, pairs), size
