"""Kafka's framing: a size-prefixed request in, its header and body decoded by kio (types
generated from Kafka's own message schemas, flexible versions and tagged fields included), and a
response built for exactly the version asked for and encoded the same way.

kio was chosen over kafka-python's protocol classes and hand-written codecs: it is generated from
the JSON schemas Kafka itself is built from (every version, every tagged field), its decoders are
native, and its messages are plain frozen dataclasses, so a handler reads a request as data and
builds its answer with `Reply`, which fills in what a given version has and drops what it lacks.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from coordinator.core import guard

# Every API the listener answers, by key, with the versions it answers (ApiVersions advertises
# exactly these). The ceilings keep to versions whose shape the domain can fill; each served
# version is held to Kafka's answers by the conformance corpus (docs/pages/conformance.md).
SUPPORTED: Mapping[int, tuple[int, int]] = {
    0: (3, 12),  # Produce (12: transaction version 2, KIP-890)
    1: (4, 17),  # Fetch
    2: (1, 7),  # ListOffsets
    3: (1, 12),  # Metadata
    8: (2, 8),  # OffsetCommit
    9: (1, 7),  # OffsetFetch
    10: (0, 4),  # FindCoordinator
    11: (0, 7),  # JoinGroup
    12: (0, 4),  # Heartbeat
    13: (0, 4),  # LeaveGroup
    14: (0, 5),  # SyncGroup (5: the protocol's type and name, KIP-559)
    15: (0, 5),  # DescribeGroups
    16: (0, 5),  # ListGroups
    17: (0, 1),  # SaslHandshake
    18: (0, 3),  # ApiVersions
    19: (2, 7),  # CreateTopics
    20: (1, 6),  # DeleteTopics
    21: (0, 2),  # DeleteRecords
    22: (0, 5),  # InitProducerId
    23: (2, 4),  # OffsetForLeaderEpoch (KIP-320; the log's one epoch, `log.epochs`)
    24: (0, 5),  # AddPartitionsToTxn (4 on: batched, verify_only)
    25: (0, 4),  # AddOffsetsToTxn
    26: (0, 5),  # EndTxn (5: the epoch raised at every end, KIP-890)
    27: (1, 1),  # WriteTxnMarkers (an abort marker: the operator's abort)
    28: (0, 5),  # TxnOffsetCommit (5: no AddOffsetsToTxn first)
    29: (1, 3),  # DescribeAcls
    30: (1, 3),  # CreateAcls
    31: (1, 3),  # DeleteAcls
    32: (1, 4),  # DescribeConfigs
    33: (0, 2),  # AlterConfigs
    35: (1, 4),  # DescribeLogDirs
    36: (0, 2),  # SaslAuthenticate
    38: (1, 3),  # CreateDelegationToken (3: for another owner)
    39: (1, 2),  # RenewDelegationToken
    40: (1, 2),  # ExpireDelegationToken
    41: (1, 3),  # DescribeDelegationToken
    37: (0, 3),  # CreatePartitions
    42: (0, 2),  # DeleteGroups
    43: (0, 2),  # ElectLeaders
    44: (0, 1),  # IncrementalAlterConfigs
    46: (0, 0),  # ListPartitionReassignments
    47: (0, 0),  # OffsetDelete
    48: (0, 1),  # DescribeClientQuotas
    49: (0, 1),  # AlterClientQuotas (a user's controller mutation rate)
    50: (0, 0),  # DescribeUserScramCredentials
    51: (0, 0),  # AlterUserScramCredentials
    60: (0, 1),  # DescribeCluster
    61: (0, 0),  # DescribeProducers
    65: (0, 0),  # DescribeTransactions
    66: (0, 1),  # ListTransactions
    68: (0, 1),  # ConsumerGroupHeartbeat (KIP-848)
    69: (0, 0),  # ConsumerGroupDescribe (KIP-848)
    71: (0, 0),  # GetTelemetrySubscriptions (KIP-714)
    72: (0, 0),  # PushTelemetry (KIP-714)
    74: (0, 1),  # ListConfigResources (0: ListClientMetricsResources)
    75: (0, 0),  # DescribeTopicPartitions (KIP-966)
    76: (1, 1),  # ShareGroupHeartbeat (KIP-932)
    77: (1, 1),  # ShareGroupDescribe (KIP-932)
    78: (1, 2),  # ShareFetch (KIP-932; 2: the acquire mode and renewals, KIP-1206, KIP-1222)
    79: (1, 2),  # ShareAcknowledge (KIP-932)
    88: (0, 0),  # StreamsGroupHeartbeat (KIP-1071)
    89: (0, 0),  # StreamsGroupDescribe (KIP-1071)
    90: (0, 1),  # DescribeShareGroupOffsets (KIP-932; 1: the lag)
    91: (0, 0),  # AlterShareGroupOffsets (KIP-932)
    92: (0, 0),  # DeleteShareGroupOffsets (KIP-932)
}

PRODUCE = 0
API_VERSIONS = 18

_SIZE = struct.Struct(">i")
_HEAD = struct.Struct(">hhi")


class BadRequest(Exception):
    """A frame that cannot be decoded or may not be served; the connection is closed, as
    Kafka's broker does. `reason` is the metric's label (`coordinator_connection_refusals`)."""

    def __init__(self, detail: str, reason: str = "malformed") -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass(slots=True)
class Request:
    api_key: int
    version: int
    correlation_id: int
    client_id: str
    body: Any
    reply: Reply


def peek_header(frame: bytes) -> tuple[int, int, int]:
    if len(frame) < _HEAD.size:
        raise BadRequest("a request shorter than its header")
    api_key, version, correlation_id = _HEAD.unpack_from(frame)
    return api_key, version, correlation_id


def decode(frame: bytes) -> Request:
    """The request in `frame` (without its size prefix), for a supported key and version."""
    api_key, version, _ = peek_header(frame)
    request_type = payload_type(api_key, version, EntityType.request)
    try:
        # Lengths first: kio would reserve whatever count a request declares (see guard).
        guard.check(request_type, frame)
        header, used = entity_reader(request_type.__header_schema__)(frame, 0)
        body, _ = entity_reader(request_type)(frame, used)
    except guard.Malformed as exc:
        raise BadRequest(f"malformed {request_type.__name__}: {exc}") from None
    except BaseException as exc:
        # kio raises assorted errors on truncated or invalid input, and a panic of its native
        # code arrives as pyo3's PanicException, which is not an Exception.
        if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
            raise
        raise BadRequest(f"undecodable {request_type.__name__}: {exc!r}") from None
    # Bytes after the body are ignored, as Kafka's broker ignores them (librdkafka 2.12+ sends
    # an all-topics Metadata v12 with a placeholder longer than the count it stands for).
    reply = Reply(api_key, version)
    return Request(api_key, version, header.correlation_id, header.client_id or "", body, reply)


@dataclass(frozen=True, slots=True)
class WithRecords:
    """A handler's response whose records fields hold `Spliced` placeholders."""

    response: Any
    spliced: list[Spliced]


class Spliced:
    """Record batches a response carries as they are stored, spliced into its frame after kio
    encodes the rest, so they are never joined or copied on the way out: a records field holds
    `placeholder` until then (`encode_parts`). Each batch goes as slices of its stored bytes,
    with `leader_epoch` written over the 4 bytes of its partition leader epoch (outside its
    CRC)."""

    __slots__ = ("batches", "leader_epoch", "placeholder")

    def __init__(self, batches: list[bytes], leader_epoch: int) -> None:
        self.batches = batches
        self.leader_epoch = leader_epoch
        self.placeholder = os.urandom(_PLACEHOLDER)

    @property
    def size(self) -> int:
        return sum(len(batch) for batch in self.batches)

    def pieces(self) -> list[bytes | memoryview]:
        epoch = _EPOCH.pack(self.leader_epoch)
        parts: list[bytes | memoryview] = []
        for batch in self.batches:
            view = memoryview(batch)
            parts += (view[:_EPOCH_AT], epoch, view[_EPOCH_AT + 4 :])
        return parts


_PLACEHOLDER = 16
_EPOCH = struct.Struct(">i")
_EPOCH_AT = 12  # the partition leader epoch: after the base offset and the batch length


def encode_parts(
    correlation_id: int, response: Any, spliced: Sequence[Spliced]
) -> list[bytes | memoryview]:
    """`encode`, with each of `spliced`'s batches in place of its placeholder: the frame as the
    pieces to write, in order. A records field is a length (an INT32 before flexible versions,
    an unsigned varint of length + 1 from them on) and the bytes."""
    frame = encode(correlation_id, response)
    if not spliced:
        return [frame]
    parts: list[bytes | memoryview] = []
    view = memoryview(frame)
    at, size = 4, len(frame) - 4
    for records in sorted(spliced, key=lambda r: frame.index(r.placeholder)):
        start = frame.index(records.placeholder, at)
        if frame[start - 1] == _PLACEHOLDER + 1:  # a compact length
            prefix_start, prefix = start - 1, _uvarint(records.size + 1)
        else:
            prefix_start, prefix = start - 4, _EPOCH.pack(records.size)
        parts += (view[at:prefix_start], prefix, *records.pieces())
        size += len(prefix) + records.size - (start + _PLACEHOLDER - prefix_start)
        at = start + _PLACEHOLDER
    parts.append(view[at:])
    return [_SIZE.pack(size), *parts]


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode(correlation_id: int, response: Any) -> bytes:
    """The size-prefixed response frame: its header (the version its type names), then it."""
    header_type = type(response).__header_schema__
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    entity_writer(header_type)(buffer, header_type(correlation_id=correlation_id))
    entity_writer(type(response))(buffer, response)
    data = buffer.getbuffer()
    _SIZE.pack_into(data, 0, len(data) - 4)
    del data
    return buffer.getvalue()


@functools.cache
def payload_module(
    api_key: int, version: int, kind: Literal[EntityType.request, EntityType.response]
) -> ModuleType:
    """kio's module of one API version's request or response, looked up once: kio resolves it
    by name through importlib on every call (2.7% of the service's CPU under small
    transactions, when each request's Reply looked it up)."""
    return load_payload_module(api_key, version, kind)


@functools.cache
def payload_type(
    api_key: int, version: int, kind: Literal[EntityType.request, EntityType.response]
) -> Any:
    """kio's request or response type of one API version (looked up once, then cached: every
    request needs both)."""
    module = payload_module(api_key, version, kind)
    for value in vars(module).values():
        if isinstance(value, type) and getattr(value, "__type__", None) is kind:
            return value
    raise AssertionError(f"{module.__name__} has no {kind.name}")


def _convert(field: dataclasses.Field[Any], value: Any) -> Any:
    kind = field.metadata.get("kafka_type")
    if kind in ("timedelta_i32", "timedelta_i64") and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    if kind == "datetime_i64" and isinstance(value, int):
        return datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
    if kind == "error_code" and not isinstance(value, ErrorCode):
        return ErrorCode(value)
    return value


class Reply:
    """Builds the response entities of one API version: `reply("Name", field=...)`, or
    `reply.body(...)` for the top-level response. Fields this version lacks are dropped (a
    handler fills the newest shape once); fields it has and that were not given take their
    schema defaults, or fail loudly when they have none (a bug, caught by the client tests)."""

    __slots__ = ("module", "response")

    def __init__(self, api_key: int, version: int) -> None:
        self.response = payload_type(api_key, version, EntityType.response)
        self.module = payload_module(api_key, version, EntityType.response)

    def __call__(self, entity: str, /, **values: Any) -> Any:
        return _build(getattr(self.module, entity), values)

    def body(self, **values: Any) -> Any:
        values.setdefault("throttle_time", 0)
        return _build(self.response, values)

    def same_code(
        self,
        topics: Iterable[tuple[str, Iterable[int]]],
        code: ErrorCode,
        topic_entity: str,
        partition_entity: str,
        partitions_field: str = "partitions",
        code_field: str = "error_code",
    ) -> tuple[Any, ...]:
        """Per-topic, per-partition results that all carry one code: the answer of calls that
        succeed or fail as a whole (AddPartitionsToTxn, TxnOffsetCommit, OffsetCommit)."""
        return tuple(
            self(
                topic_entity,
                name=name,
                **{
                    partitions_field: tuple(
                        self(partition_entity, partition_index=p, **{code_field: code})
                        for p in partitions
                    )
                },
            )
            for name, partitions in topics
        )

    def has(self, entity: str, field: str) -> bool:
        found = getattr(self.module, entity, None)
        return found is not None and field in _fields(found)


def _fields(entity: type) -> dict[str, dataclasses.Field[Any]]:
    cached: dict[str, dataclasses.Field[Any]] | None = _FIELDS.get(entity)
    if cached is None:
        cached = {f.name: f for f in dataclasses.fields(entity)}
        _FIELDS[entity] = cached
    return cached


_FIELDS: dict[type, dict[str, dataclasses.Field[Any]]] = {}


def _build(entity: type, values: Mapping[str, Any]) -> Any:
    known = _fields(entity)
    return entity(
        **{name: _convert(known[name], value) for name, value in values.items() if name in known}
    )


def read_frame_size(prefix: bytes, limit: int) -> int:
    """The size a frame declares, refused (before a byte of the frame is read) when it is not
    positive or exceeds `limit`."""
    size: int = _SIZE.unpack(prefix)[0]
    if not 0 < size <= limit:
        raise BadRequest(f"a request of {size} bytes (at most {limit} here)", "too_large")
    return size


def milliseconds(value: datetime.timedelta | int | None) -> int:
    if value is None:
        return -1
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)  # already milliseconds
