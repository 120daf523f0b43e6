"""Log compaction's decisions, apart from the store (docs/pages/http-api.md, "Topic configs"): which
records of a cleanable range stay, and the batches rebuilt around them with their offsets unchanged,
as Kafka's log cleaner does.

Two passes over the range, oldest first: `newest_offsets` finds the newest offset of every key
among committed records; `Compactor` then visits each batch and says whether it stays as it is,
is rebuilt with fewer records, or goes. The range holds only finished transactions (it lies below
the LSO), so whether a batch was aborted is final.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sdk import recordbatch


@dataclass(frozen=True, slots=True)
class Stored:
    """A stored batch row, what compaction needs of it."""

    base_offset: int
    producer_id: int
    is_transactional: bool
    control: int | None
    aborted: bool
    timestamp: int  # the append time: a tombstone's age is measured from it
    payload: bytes

    @property
    def committed_data(self) -> bool:
        return self.control is None and not self.aborted


def note_keys(newest: dict[bytes, int], batch: Stored) -> None:
    """Pass one, a batch at a time in offset order: the newest offset of every key among the
    committed records of the range."""
    if not batch.committed_data:
        return
    for record in recordbatch.records(batch.payload):
        if record.key is not None:
            newest[record.key] = record.offset


def newest_offsets(batches: Iterable[Stored]) -> dict[bytes, int]:
    newest: dict[bytes, int] = {}
    for batch in batches:
        note_keys(newest, batch)
    return newest


@dataclass(slots=True)
class Plan:
    """What pass two decided: rows to delete, rows to rewrite (base offset, payload, record
    count), the bytes that go, and when a tombstone kept now may go (None: none kept)."""

    deleted: list[int] = field(default_factory=list)
    rewritten: list[tuple[int, bytes, int]] = field(default_factory=list)
    removed_bytes: int = 0
    clean_again_at: int | None = None


class Compactor:
    """Pass two: visit the range's batches in offset order, then read `plan`.

    A record stays if it is the newest of its key, unless it is a tombstone (null value)
    appended more than `delete_retention_ms` ago. Records of aborted transactions go, and so do
    records without a key (a topic made compacted after they were written; Kafka's cleaner drops
    them too). A control marker stays while a record of its transaction stays on the partition:
    a transaction's records lie between its first offset and its marker, so one flag per
    producer, set by a kept transactional batch and cleared by the producer's next marker,
    says it."""

    def __init__(self, newest: dict[bytes, int], now: int, delete_retention_ms: int) -> None:
        self.newest = newest
        self.tombstone_horizon = now - delete_retention_ms
        self.delete_retention_ms = delete_retention_ms
        self.plan = Plan()
        self._live: dict[int, bool] = {}

    def visit(self, batch: Stored) -> None:
        if batch.control is not None:
            if not self._live.pop(batch.producer_id, False):
                self._delete(batch)
            return
        if batch.aborted:
            self._delete(batch)
            return
        header = recordbatch.read_header(batch.payload)
        kept: list[recordbatch.Record] = []
        for record in recordbatch.records(batch.payload, header=header):
            if record.key is None or self.newest.get(record.key) != record.offset:
                continue
            if record.value is None:
                if batch.timestamp <= self.tombstone_horizon:
                    continue
                self._again_at(batch.timestamp + self.delete_retention_ms)
            kept.append(record)
        if not kept:
            self._delete(batch)
            return
        if batch.is_transactional:
            self._live[batch.producer_id] = True
        if len(kept) == header.record_count:
            return
        payload = rebuilt(header, kept)
        self.plan.rewritten.append((batch.base_offset, payload, len(kept)))
        self.plan.removed_bytes += len(batch.payload) - len(payload)

    def _delete(self, batch: Stored) -> None:
        self.plan.deleted.append(batch.base_offset)
        self.plan.removed_bytes += len(batch.payload)

    def _again_at(self, at: int) -> None:
        current = self.plan.clean_again_at
        self.plan.clean_again_at = at if current is None else min(current, at)


def rebuilt(header: recordbatch.Header, kept: list[recordbatch.Record]) -> bytes:
    """The batch holding only `kept`: same base offset, offset deltas, last offset delta,
    producer fields, codec and timestamp type, so every surviving offset is unchanged."""
    base = header.base_offset
    return recordbatch.build(
        [(r.timestamp, r.key, r.value, r.headers) for r in kept],
        compression=header.compression,
        base_offset=base,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        transactional=header.is_transactional,
        log_append_time=header.log_append_time,
        offset_deltas=[r.offset - base for r in kept],
        last_offset_delta=header.last_offset_delta,
        base_timestamp=header.base_timestamp,
        partition_leader_epoch=header.partition_leader_epoch,
    )
