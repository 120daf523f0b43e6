"""A record batch at the edge, before any database work: a binary one proved well formed, not
inflating past its bounds and acceptable from a producer (`check_batch`); a JSON one built here
(`batch_from_json`). Large compressed batches are inflated on a worker thread."""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.core.errors import InvalidRequest
from coordinator.core.memory import request_memory
from coordinator.core.settings import Settings
from coordinator.log.errors import (
    CorruptMessage,
    InvalidRecord,
    RecordListTooLarge,
)
from coordinator.log.schemas import ProduceRequest
from sdk import recordbatch


@dataclass(frozen=True, slots=True)
class Appended:
    """A produce's answer: what both front doors need (Kafka's ProduceResponse included)."""

    base_offset: int
    last_offset: int
    duplicate: bool
    log_append_time: int  # the append time for a LogAppendTime topic, else -1
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class Append:
    """One checked batch to append to a partition."""

    topic: str
    partition: int
    data: bytes
    checked: recordbatch.Checked
    transactional_id: str | None
    # The producer's batch's size, where `data` was recompressed for its topic at the edge.
    sent_size: int = 0
    # The (broker id, leader epoch) a Kafka produce was taken under: written only if that broker
    # still leads the partition at that epoch (`epochs.leads`). None: no leader is asked (HTTP).
    leader: tuple[int, int] | None = None


def _decoder(encoding: str) -> Callable[[str], bytes]:
    if encoding == "utf8":
        return str.encode

    def from_base64(text: str) -> bytes:
        return base64.b64decode(text, validate=True)

    return from_base64


def batch_from_json(body: ProduceRequest, now: int) -> tuple[bytes, recordbatch.Checked]:
    """The request's records as one record batch (uncompressed), built at the edge, with what
    `recordbatch.check` would find in it; a value that is not valid in its encoding is 422
    naming it. Records without a timestamp get `now`."""
    to_bytes = _decoder(body.encoding)
    built: list[recordbatch.BuildRecord] = []
    has_null_key = False
    for i, record in enumerate(body.records):
        field_name = "key"
        try:
            key = None if record.key is None else to_bytes(record.key)
            field_name = "value"
            value = None if record.value is None else to_bytes(record.value)
            field_name = "headers"
            headers = [(name, to_bytes(v)) for name, v in record.headers.items()]
            for name, _ in headers:
                name.encode()
        except (UnicodeEncodeError, binascii.Error, ValueError) as exc:
            raise InvalidRequest(
                f"records.{i}.{field_name}: not valid {body.encoding} ({exc.__class__.__name__})"
            ) from None
        timestamp = now if record.timestamp is None else record.timestamp
        built.append((timestamp, key, value, headers))
        has_null_key = has_null_key or key is None
    data = recordbatch.build(
        built,
        producer_id=body.producer_id,
        producer_epoch=body.producer_epoch,
        base_sequence=body.base_sequence,
        transactional=body.transactional_id is not None,
    )
    header = recordbatch.read_header(data)
    return data, recordbatch.Checked(header, header.max_timestamp, has_null_key)


# Compressed batches at least this large are checked on a worker thread: inflating and walking
# them takes long enough that the event loop (every other client of the process) must not wait.
_CHECK_OFF_LOOP_BYTES = 16 * 1024
# Inflating up to this much is always allowed, whatever the ratio (small batches compress well).
_INFLATION_FLOOR_BYTES = 1024 * 1024


def inflation_limit(settings: Settings, size: int) -> int:
    """How far a compressed batch of `size` bytes may inflate: the absolute cap, and the ratio
    cap above a floor."""
    by_ratio = max(_INFLATION_FLOOR_BYTES, size * settings.max_compression_ratio)
    return min(settings.max_uncompressed_batch_bytes, by_ratio)


async def check_batch(
    settings: Settings, data: bytes, transactional_id: str | None
) -> recordbatch.Checked:
    """A batch's own checks, before any database work: well formed (CORRUPT_MESSAGE), not
    inflating past its bounds (RECORD_LIST_TOO_LARGE), then acceptable from a producer
    (INVALID_RECORD)."""
    return (await check_recoding(settings, data, transactional_id, None))[1]


async def check_recoding(
    settings: Settings, data: bytes, transactional_id: str | None, codec: int | None
) -> tuple[bytes, recordbatch.Checked]:
    """`check_batch`, and with `codec` (the codec its topic's compression.type asks for, where
    known) the batch recompressed in it in the same pass, inflated once: the bytes to append."""
    limit = inflation_limit(settings, len(data))
    try:
        header = recordbatch.read_header(data)
        recode_to = codec if codec is not None and codec != header.compression else None

        def check() -> tuple[bytes, recordbatch.Checked]:
            if recode_to is None:
                return data, recordbatch.check(data, limit)
            return recordbatch.check_recoded(data, recode_to, limit)

        if len(data) >= _CHECK_OFF_LOOP_BYTES and (header.compression or recode_to is not None):
            # Inflated on a worker thread, holding up to `limit` bytes: reserved first from the
            # process's request memory, so concurrent bombs inflate in turn, within the budget.
            async with request_memory().reserve(limit):
                stored, checked = await asyncio.to_thread(check)
        else:
            stored, checked = check()
    except recordbatch.InflatesTooFar as exc:
        raise RecordListTooLarge(
            f"{exc} (a {len(data)}-byte batch may inflate to {limit} bytes: "
            "COORDINATOR_MAX_UNCOMPRESSED_BATCH_BYTES, COORDINATOR_MAX_COMPRESSION_RATIO)"
        ) from None
    except recordbatch.CorruptBatch as exc:
        raise CorruptMessage(f"not a well-formed record batch: {exc}") from None
    acceptable(checked, transactional_id)
    return stored, checked


def acceptable(checked: recordbatch.Checked, transactional_id: str | None) -> None:
    header = checked.header
    if header.is_control:
        raise InvalidRecord("a producer may not send a control batch")
    if header.is_transactional and transactional_id is None:
        raise InvalidRecord("a transactional batch needs the transactional_id parameter")
    if transactional_id is not None and not header.is_transactional:
        raise InvalidRecord("transactional_id is given but the batch is not transactional")
    if header.producer_id < -1:
        raise InvalidRecord(f"producer id {header.producer_id}: -1 or a producer id")
    if header.producer_id >= 0 and (header.producer_epoch < 0 or header.base_sequence < 0):
        raise InvalidRecord("a batch with a producer id needs its epoch and base sequence")
    if header.producer_id < 0 and header.is_transactional:
        raise InvalidRecord("a transactional batch needs a producer id")
