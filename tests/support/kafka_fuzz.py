"""Kafka requests for fuzzing the listener: random well-formed requests of any served API and
version (built from kio's schemas, so every field of every version is covered), and mutants of
them: absurd counts and lengths written over a field, flipped bytes, truncations."""

from __future__ import annotations

import dataclasses
import datetime
import io
import random
import struct
import types
import typing
import uuid
from collections.abc import Iterator
from typing import Any

from kio.serial import entity_writer
from kio.static.constants import EntityType

from coordinator.groups.consumer_protocol import encode_subscription
from coordinator.kafka.wire import SUPPORTED, payload_type
from sdk import recordbatch

# Values that break assumptions: empty, control characters, a NUL, long and non-ASCII names.
_STRINGS = ["", "t", "fuzz", "pay-1", "g-1", "a" * 300, "\0", "ünï", "../x", " ", "__consumer"]
_INTS = [-1, 0, 1, 2, 3, -2, 7]
_EXTREMES = {
    "int8": [127, -128],
    "int16": [32767, -32768],
    "int32": [2**31 - 1, -(2**31)],
    "int64": [2**63 - 1, -(2**63)],
}


def _nullable(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    return origin in (types.UnionType, typing.Union) and type(None) in typing.get_args(annotation)


def _strip(annotation: Any) -> Any:
    if _nullable(annotation):
        (annotation,) = (a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


def _primitive(kind: str, rng: random.Random) -> Any:
    if kind == "bool":
        return rng.random() < 0.5
    if kind in _EXTREMES:
        return rng.choice(_EXTREMES[kind]) if rng.random() < 0.1 else rng.choice(_INTS)
    if kind == "uint16":  # a port (streams groups' endpoints)
        return rng.choice([0, 1, 7, 9092, 65535])
    if kind == "string":
        return rng.choice(_STRINGS)
    if kind in ("bytes", "records"):
        # Bytes the service reads inside a request: a record batch, a group member's
        # subscription (well-formed, or declaring an absurd count), or noise.
        choice = rng.randrange(4)
        if choice == 0:
            return recordbatch.build([(0, b"k", b"v", [])], producer_id=-1, producer_epoch=-1)
        if choice == 1:
            return encode_subscription(["t", "fuzz"])
        if choice == 2:
            return struct.pack(">hi", rng.randrange(4), 2**31 - 1) + rng.randbytes(4)
        return rng.randbytes(rng.randrange(0, 80))
    if kind == "uuid":
        return uuid.UUID(int=rng.getrandbits(128)) if rng.random() < 0.5 else uuid.UUID(int=0)
    if kind in ("timedelta_i32", "timedelta_i64"):
        # Short waits and timeouts: a fuzz request must never make the listener wait long.
        return datetime.timedelta(milliseconds=rng.choice([0, 1, 10, 100]))
    if kind == "datetime_i64":
        return datetime.datetime.fromtimestamp(rng.randrange(0, 2**31), datetime.UTC)
    if kind == "error_code":
        from kio.schema.errors import ErrorCode

        return ErrorCode.none
    if kind == "float64":
        return rng.random()
    raise AssertionError(kind)


def random_entity(entity: type, rng: random.Random, depth: int = 0) -> Any:
    values: dict[str, Any] = {}
    for field in dataclasses.fields(entity):
        annotation = field.type
        if _nullable(annotation) and rng.random() < 0.15:
            values[field.name] = None
            continue
        inner = _strip(annotation)
        kind = field.metadata.get("kafka_type", "")
        if typing.get_origin(inner) is tuple:
            element = typing.get_args(inner)[0]
            count = rng.choice([0, 1, 1, 2, 3]) if depth < 3 else 0
            if dataclasses.is_dataclass(element):
                make = typing.cast(type, element)
                values[field.name] = tuple(
                    random_entity(make, rng, depth + 1) for _ in range(count)
                )
            else:
                values[field.name] = tuple(_primitive(kind, rng) for _ in range(count))
        elif dataclasses.is_dataclass(inner):
            values[field.name] = random_entity(typing.cast(type, inner), rng, depth + 1)
        else:
            values[field.name] = _primitive(kind, rng)
    return entity(**values)


def encode_request(api_key: int, version: int, body: Any, correlation_id: int) -> bytes:
    """The request frame without its size prefix."""
    request_type = payload_type(api_key, version, EntityType.request)
    header_type = request_type.__header_schema__
    buffer = io.BytesIO()
    entity_writer(header_type)(
        buffer,
        header_type(
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=correlation_id,
            client_id="fuzz",
        ),
    )
    entity_writer(request_type)(buffer, body)
    return buffer.getvalue()


def random_request(api_key: int, version: int, rng: random.Random) -> bytes:
    request_type = payload_type(api_key, version, EntityType.request)
    return encode_request(api_key, version, random_entity(request_type, rng), rng.randrange(2**31))


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# Absurd lengths as each encoding writes them: compact (varint) counts of 2^32 and 2^31, legacy
# int32 and int16 counts at their maxima and just below zero.
_ABSURD = [
    _uvarint(2**32 + 1),
    _uvarint(2**32),
    _uvarint(2**31),
    _uvarint(2**28),
    struct.pack(">i", 2**31 - 1),
    struct.pack(">i", 2**30),
    struct.pack(">i", -2),
    struct.pack(">h", 32767),
    struct.pack(">h", -2),
    b"\xff\xff\xff\xff\xff\xff",  # a varint that never ends
]

_HEADER = 8  # api key, version, correlation id: kept, so the mutant reaches its API's decoder


def mutate(frame: bytes, rng: random.Random) -> bytes:
    """One mutant of a well-formed request frame (header's key and version kept)."""
    body = bytearray(frame)
    where = rng.randrange(_HEADER, max(len(body), _HEADER + 1))
    choice = rng.randrange(4)
    if choice == 0:  # an absurd length written over whatever is there
        absurd = rng.choice(_ABSURD)
        body[where : where + len(absurd)] = absurd
    elif choice == 1:  # an absurd length inserted
        body[where:where] = rng.choice(_ABSURD)
    elif choice == 2:  # flipped bytes
        for _ in range(rng.randrange(1, 4)):
            if len(body) > _HEADER:
                spot = rng.randrange(_HEADER, len(body))
                body[spot] = rng.randrange(256)
    else:  # truncated
        del body[where:]
    return bytes(body)


def served() -> Iterator[tuple[int, int]]:
    for api_key, (low, high) in SUPPORTED.items():
        for version in range(low, high + 1):
            yield api_key, version
