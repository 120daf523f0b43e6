"""Every length a request declares, checked against the bytes left in its frame before kio reads
it: kio's native decoder reserves an array's declared count up front, so one compact array of
2^32 elements would ask for 34 GB and abort the process. Kafka's own parser refuses any count or
size larger than what remains; this walk does the same, and refuses null where the field is not
nullable (kio would hand a handler `None`), as Kafka's generated readers do.

A plan is built once per request type from kio's schema (the dataclasses' `kafka_type`
metadata), so a request costs one walk over its lengths, never a decode.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
import types
import typing
from collections.abc import Callable
from typing import Any

from kio.serial import entity_reader
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
)

# A step reads one field at `pos` of `buf` (which ends at `end`) and returns where it ends.
Step = Callable[[bytes, int, int], int]


class Malformed(Exception):
    """A length, count or null that the request's schema does not allow."""


_FIXED = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "float64": 8,
    "uuid": 16,
}
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
# Lengths in compact form are unsigned varints of at most five bytes (Kafka's readUnsignedVarint).
_MAX_VARINT_BYTES = 5


def check(request_type: type, frame: bytes) -> int:
    """Where the request of `request_type` in `frame` (header first) ends; `Malformed` if a
    declared length does not fit what is left or a non-nullable field is null."""
    try:
        pos = _header(frame, bool(request_type.__header_schema__.__flexible__))  # type: ignore[attr-defined]
        return _plan(request_type)(frame, pos, len(frame))
    except (IndexError, struct.error):
        raise Malformed("the request ends inside a field") from None


def read(entity: type, data: bytes, pos: int = 0) -> tuple[Any, int]:
    """kio's reading of the `entity` encoded at `pos` of `data`, once its lengths are checked:
    for payloads inside a request that kio is asked to read (a group member's subscription)."""
    try:
        _plan(entity)(data, pos, len(data))
    except (IndexError, struct.error):
        raise Malformed(f"{entity.__name__} ends inside a field") from None
    result: tuple[Any, int] = entity_reader(entity)(data, pos)
    return result


def _header(frame: bytes, flexible: bool) -> int:
    """Past the request header: key, version and correlation id, a client id that is a legacy
    nullable string in every header version, then (header v2) tagged fields."""
    pos = _client_id(frame, 8, len(frame))
    return _tagged_fields(frame, pos, len(frame)) if flexible else pos


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    for _ in range(_MAX_VARINT_BYTES):
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise Malformed("a varint longer than five bytes")


def _length(flexible: bool, wide: bool) -> Callable[[bytes, int], tuple[int, int]]:
    """The reader of a length prefix: -1 for null. Compact lengths are varints holding n + 1;
    legacy strings take an int16, legacy bytes and arrays an int32."""
    if flexible:

        def compact(buf: bytes, pos: int) -> tuple[int, int]:
            value, pos = _uvarint(buf, pos)
            return value - 1, pos

        return compact
    legacy = _INT32 if wide else _INT16

    def fixed(buf: bytes, pos: int) -> tuple[int, int]:
        return legacy.unpack_from(buf, pos)[0], pos + legacy.size

    return fixed


def _sized(kind: str, flexible: bool, nullable: bool, name: str) -> Step:
    """A string, bytes or records field: its size must fit what is left."""
    read = _length(flexible, wide=kind != "string")

    def step(buf: bytes, pos: int, end: int) -> int:
        size, pos = read(buf, pos)
        if size < 0:
            if size == -1 and nullable:
                return pos
            raise Malformed(f"{name}: a null or negative length ({size}) where none is allowed")
        if size > end - pos:
            raise Malformed(f"{name}: {size} bytes declared, {end - pos} left")
        return pos + size

    return step


def _fixed(size: int) -> Step:
    def step(buf: bytes, pos: int, end: int) -> int:
        return pos + size

    return step


def _array(element: Step, flexible: bool, nullable: bool, name: str) -> Step:
    read = _length(flexible, wide=True)

    def step(buf: bytes, pos: int, end: int) -> int:
        count, pos = read(buf, pos)
        if count < 0:
            if count == -1 and nullable:
                return pos
            raise Malformed(f"{name}: a null or negative count ({count}) where none is allowed")
        # Every element takes at least one byte, so a count above the bytes left is a lie.
        if count > end - pos:
            raise Malformed(f"{name}: {count} elements declared, {end - pos} bytes left")
        for _ in range(count):
            pos = element(buf, pos, end)
        return pos

    return step


def _tagged_fields(buf: bytes, pos: int, end: int) -> int:
    count, pos = _uvarint(buf, pos)
    if count > end - pos:
        raise Malformed(f"{count} tagged fields declared, {end - pos} bytes left")
    for _ in range(count):
        _, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        if size > end - pos:
            raise Malformed(f"a tagged field of {size} bytes, {end - pos} left")
        pos += size
    return pos


def _nullable_struct(struct_step: Step, name: str) -> Step:
    """A nullable struct (KIP-893: DescribeTopicPartitions' cursor): an int8 marker, -1 for null
    and 1 for a struct that follows; any other marker is refused."""

    def step(buf: bytes, pos: int, end: int) -> int:
        marker = struct.unpack_from(">b", buf, pos)[0]
        if marker == -1:
            return pos + 1
        if marker != 1:
            raise Malformed(f"{name}: a nullable struct's marker is {marker}, not -1 or 1")
        return struct_step(buf, pos + 1, end)

    return step


def _nullable(annotation: object) -> bool:
    return typing.get_origin(annotation) in (types.UnionType, typing.Union) and type(
        None
    ) in typing.get_args(annotation)


def _element_annotation(annotation: object) -> object:
    if _nullable(annotation):
        (annotation,) = (a for a in typing.get_args(annotation) if a is not type(None))
    return typing.get_args(annotation)[0]


def _primitive(kind: str, flexible: bool, nullable: bool, name: str) -> Step:
    if kind in _FIXED:
        return _fixed(_FIXED[kind])
    if kind in ("string", "bytes", "records"):
        return _sized(kind, flexible, nullable, name)
    raise AssertionError(f"{name}: no length check for Kafka type {kind!r}")


_client_id = _sized("string", flexible=False, nullable=True, name="client_id")


@functools.cache
def _plan(entity: type) -> Step:
    flexible = bool(entity.__flexible__)  # type: ignore[attr-defined]
    steps: list[Step] = []
    for field in dataclasses.fields(entity):
        if "tag" in field.metadata:
            continue  # tagged fields travel in the tagged section, read below
        annotation = field.type
        nullable = _nullable(annotation)
        kind = field.metadata.get("kafka_type", "")
        shape = classify_field(field)
        if isinstance(shape, EntityTupleField):
            steps.append(_array(_plan(shape.type_), flexible, nullable, field.name))
        elif isinstance(shape, EntityField):
            inner = _plan(shape.type_)
            steps.append(_nullable_struct(inner, field.name) if nullable else inner)
        elif isinstance(shape, PrimitiveTupleField):
            element_nullable = _nullable(_element_annotation(annotation))
            element = _primitive(kind, flexible, element_nullable, field.name)
            steps.append(_array(element, flexible, nullable, field.name))
        else:
            steps.append(_primitive(kind, flexible, nullable, field.name))
    if flexible:
        steps.append(_tagged_fields)
    sequence = tuple(steps)

    def walk(buf: bytes, pos: int, end: int) -> int:
        for step in sequence:
            pos = step(buf, pos, end)
        return pos

    return walk
