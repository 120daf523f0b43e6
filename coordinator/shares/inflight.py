"""A share partition's state, as Kafka's SharePartition keeps it, as data with no I/O: the share
partition start offset (SPSO: every offset below it is done), the end offset (the first offset
never yet acquired), and between them the in-flight records, each Available, Acquired,
Acknowledged or Archived, with its delivery count.

An acquired record belongs to one member under a lock that runs out at a deadline, or, once a
transactional producer took its acknowledgement into a transaction, to that transaction until it
ends: a commit applies the acknowledgement, an abort releases the record. A released record (by
RELEASE, a lock that ran out, a member that left, an aborted transaction) is Available again, or
Archived once it was delivered as many times as the delivery-count limit allows.

The in-flight offsets are kept as spans of offsets that share one state, covering [start, end)
without a gap; the service loads them under the partition's row lock, applies these rules and
writes them back (`coordinator.shares.service`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from coordinator.shares.errors import InvalidRecordState

# Record states (Kafka's RecordState ids).
AVAILABLE = 0
ACQUIRED = 1
ACKNOWLEDGED = 2
ARCHIVED = 4
STATE_NAMES = {AVAILABLE: "Available", ACQUIRED: "Acquired", ACKNOWLEDGED: "Acknowledged"}
STATE_NAMES[ARCHIVED] = "Archived"
DONE = (ACKNOWLEDGED, ARCHIVED)

# Acknowledgement types (ShareFetch's and ShareAcknowledge's AcknowledgeTypes).
GAP = 0
ACCEPT = 1
RELEASE = 2
REJECT = 3
RENEW = 4
TYPE_NAMES = {GAP: "gap", ACCEPT: "accept", RELEASE: "release", REJECT: "reject", RENEW: "renew"}
TYPES = {name: code for code, name in TYPE_NAMES.items()}


@dataclass(slots=True)
class Span:
    """In-flight offsets [first, last] in one state. `member` and `deadline` while Acquired by a
    member; `txn` and `pending` (the acknowledgement type its commit applies) while held by a
    transaction, which has no deadline of its own (the transaction's timeout aborts it)."""

    first: int
    last: int
    state: int
    deliveries: int = 0
    member: str | None = None
    deadline: int | None = None
    txn: str | None = None
    pending: int | None = None

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    def like(self, other: Span) -> bool:
        return (
            self.state == other.state
            and self.deliveries == other.deliveries
            and self.member == other.member
            and self.deadline == other.deadline
            and self.txn == other.txn
            and self.pending == other.pending
        )

    def row(self) -> list[Any]:
        return [
            self.first,
            self.last,
            self.state,
            self.deliveries,
            self.member,
            self.deadline,
            self.txn,
            self.pending,
        ]

    @classmethod
    def of(cls, row: Sequence[Any]) -> Span:
        return cls(*row)


@dataclass(frozen=True, slots=True)
class Limits:
    """A share group's settings that the rules apply (its group configs)."""

    delivery_limit: int  # share.delivery.count.limit
    lock_ms: int  # share.record.lock.duration.ms
    max_in_flight: int  # share.partition.max.record.locks


@dataclass(frozen=True, slots=True)
class Acquired:
    """Offsets acquired by one fetch, with the delivery count they were delivered at."""

    first: int
    last: int
    deliveries: int


@dataclass(frozen=True, slots=True)
class LogBatch:
    """What acquisition needs of a stored batch: its offsets, and whether it may be delivered
    (not a control batch, nor an aborted transaction's under read_committed)."""

    base_offset: int
    last_offset: int
    deliverable: bool


@dataclass
class ShareState:
    start: int
    end: int
    spans: list[Span] = field(default_factory=list)

    # -- storage ------------------------------------------------------------------------------

    def rows(self) -> list[list[Any]]:
        return [span.row() for span in self.spans]

    @classmethod
    def of(cls, start: int, end: int, rows: Iterable[Sequence[Any]]) -> ShareState:
        return cls(start, end, [Span.of(row) for row in rows])

    def next_deadline(self) -> int | None:
        """The earliest lock deadline of a member's acquired records (the sweep's key)."""
        deadlines = [s.deadline for s in self.spans if s.deadline is not None]
        return min(deadlines) if deadlines else None

    # -- reading ------------------------------------------------------------------------------

    def counts(self) -> dict[int, int]:
        """How many in-flight offsets are in each state."""
        out = dict.fromkeys(STATE_NAMES, 0)
        for span in self.spans:
            out[span.state] += span.count
        return out

    def lag(self, upper: int) -> int:
        """Records from the start offset up to `upper` (the end of what may be read) not yet
        acknowledged or archived: what the group has left to process."""
        done = sum(s.count for s in self.spans if s.state in DONE and s.last < upper)
        return max(0, upper - self.start - done)

    def held_by(self, txn: str) -> bool:
        return any(s.txn == txn for s in self.spans)

    # -- the rules ----------------------------------------------------------------------------

    def reset(self, offset: int) -> None:
        """AlterShareGroupOffsets: start anew at `offset`, nothing in flight."""
        self.start = self.end = offset
        self.spans = []

    def trim(self, log_start: int) -> bool:
        """The log lost what is below `log_start` (retention, DeleteRecords): so does the share
        partition, whatever state those records were in."""
        if log_start <= self.start:
            return False
        self.spans = [s for s in self.spans if s.last >= log_start]
        if self.spans and self.spans[0].first < log_start:
            self.spans[0].first = log_start
        self.start = log_start
        self.end = max(self.end, log_start)
        return True

    def expire(self, now: int, limits: Limits) -> bool:
        """Locks whose deadline passed release their records."""
        changed = False
        for span in self.spans:
            if span.state == ACQUIRED and span.deadline is not None and span.deadline < now:
                self._release(span, limits)
                changed = True
        if changed:
            self._tidy()
        return changed

    def release_member(self, member: str, limits: Limits) -> bool:
        """The member left or closed its share session: what it holds is released (not what a
        transaction took from it)."""
        changed = False
        for span in self.spans:
            if span.state == ACQUIRED and span.member == member and span.txn is None:
                self._release(span, limits)
                changed = True
        if changed:
            self._tidy()
        return changed

    def acquire(
        self,
        member: str,
        batches: Sequence[LogBatch],
        max_records: int,
        now: int,
        limits: Limits,
        *,
        whole_batches: bool = True,
    ) -> list[Acquired]:
        """Acquire for `member`: first what is Available again (released or timed out), then new
        records from the end offset, from `batches` (the log's from there on, in order), while
        fewer than `max_records` were taken and the in-flight records stay within the limit.
        New records are taken a whole batch at a time (Kafka's batch-optimized mode, which may
        pass `max_records` to end on a batch's edge) unless not `whole_batches` (record-limit
        mode). Offsets that cannot be delivered (markers, aborted transactions under
        read_committed, gaps between batches) are archived as the end offset passes them."""
        deadline = now + limits.lock_ms
        taken: list[Acquired] = []
        count = 0
        # Available again, oldest first.
        index = 0
        while index < len(self.spans) and count < max_records:
            span = self.spans[index]
            if span.state != AVAILABLE:
                index += 1
                continue
            if span.count > max_records - count:
                self._split_at(span.first + (max_records - count))
                span = self.spans[index]
            span.state, span.member, span.deadline = ACQUIRED, member, deadline
            span.deliveries += 1
            taken.append(Acquired(span.first, span.last, span.deliveries))
            count += span.count
            index += 1
        # New records, from the end offset on.
        for batch in batches:
            if batch.last_offset < self.end:
                continue
            low = max(batch.base_offset, self.end)
            if low > self.end:
                self._append(Span(self.end, low - 1, ARCHIVED))  # no records there
            if not batch.deliverable:
                self._append(Span(low, batch.last_offset, ARCHIVED))
                continue
            if count >= max_records or self.end - self.start >= limits.max_in_flight:
                break
            high = batch.last_offset
            if not whole_batches:
                high = min(high, low + (max_records - count) - 1)
            self._append(Span(low, high, ACQUIRED, 1, member, deadline))
            taken.append(Acquired(low, high, 1))
            count += high - low + 1
        self._tidy()
        return _merged(taken)

    def acknowledge(
        self,
        member: str,
        first: int,
        last: int,
        types: Sequence[int],
        now: int,
        limits: Limits,
    ) -> None:
        """A member's acknowledgement of offsets [first, last]: one type for all of them, or one
        per offset. Every offset from the start offset on must be Acquired by `member` now (and
        not taken into a transaction), else INVALID_RECORD_STATE and nothing changes; offsets
        below the start offset are done, and their acknowledgement changes nothing (Kafka's
        answer too)."""
        per_offset = self._check_types(first, last, types)
        if first < self.start:
            # Below the start offset everything is done already: as Kafka, no error there.
            per_offset = per_offset[self.start - first :]
            first = self.start
            if last < first:
                return
        self._check_held(first, last, lambda s: s.member == member and s.txn is None, member)
        for offset, kind in _runs(first, last, per_offset):
            for span in self._slice(*offset):
                if kind == RENEW:
                    span.deadline = now + limits.lock_ms
                else:
                    self._settle(span, kind, limits)
        self._tidy()

    def hold(self, txn: str, member: str, first: int, last: int, types: Sequence[int]) -> None:
        """A transactional producer takes the member's acknowledgement of [first, last] into
        transaction `txn`: the records stay the member's, without a deadline, until it ends.
        The same checks as `acknowledge`; RENEW has no meaning here."""
        per_offset = self._check_types(first, last, types)
        if RENEW in per_offset:
            raise InvalidRecordState("a renewal cannot be part of a transaction")
        self._check_held(first, last, lambda s: s.member == member and s.txn is None, member)
        for offset, kind in _runs(first, last, per_offset):
            for span in self._slice(*offset):
                span.txn, span.pending, span.deadline = txn, kind, None
        self._tidy()

    def settle_transaction(self, txn: str, commit: bool, limits: Limits) -> bool:
        """Transaction `txn` ended: a commit applies the acknowledgements it held, an abort
        releases their records for delivery again."""
        changed = False
        for span in self.spans:
            if span.txn != txn:
                continue
            changed = True
            kind = span.pending if commit else RELEASE
            span.txn = span.pending = None
            assert kind is not None
            self._settle(span, kind, limits)
        if changed:
            self._tidy()
        return changed

    # -- the parts ----------------------------------------------------------------------------

    def _settle(self, span: Span, kind: int, limits: Limits) -> None:
        if kind == ACCEPT:
            span.state = ACKNOWLEDGED
        elif kind == RELEASE:
            self._release(span, limits)
            return
        else:  # REJECT, or GAP: offsets with no record
            span.state = ARCHIVED
        span.member = span.deadline = span.txn = span.pending = None

    @staticmethod
    def _release(span: Span, limits: Limits) -> None:
        span.state = ARCHIVED if span.deliveries >= limits.delivery_limit else AVAILABLE
        span.member = span.deadline = span.txn = span.pending = None

    @staticmethod
    def _check_types(first: int, last: int, types: Sequence[int]) -> list[int]:
        if first < 0 or last < first:
            raise InvalidRecordState(f"an acknowledgement of offsets {first} to {last}")
        if len(types) not in (1, last - first + 1):
            raise InvalidRecordState(
                f"{len(types)} acknowledgement types for offsets {first} to {last}: one, or "
                "one per offset"
            )
        unknown = [t for t in types if t not in TYPE_NAMES]
        if unknown:
            raise InvalidRecordState(f"unknown acknowledgement type {unknown[0]}")
        return list(types) * (last - first + 1) if len(types) == 1 else list(types)

    def _check_held(self, first: int, last: int, mine: Any, member: str) -> None:
        if first < self.start or last >= self.end:
            raise InvalidRecordState(
                f"offsets {first} to {last} are not in flight (the share partition holds "
                f"{self.start} to {self.end - 1})"
            )
        for span in self._overlapping(first, last):
            if span.state != ACQUIRED or not mine(span):
                where = f"offsets {max(first, span.first)} to {min(last, span.last)}"
                if span.txn is not None:
                    now = f"held by transaction {span.txn!r}, its acknowledgement pending there"
                elif span.state == ACQUIRED:
                    now = "acquired by another member"
                else:
                    now = STATE_NAMES[span.state]
                raise InvalidRecordState(f"{where} are {now}, not acquired by member {member!r}")

    def _index(self, offset: int) -> int:
        """The index of the span holding `offset` (which is in flight)."""
        firsts = [s.first for s in self.spans]
        return bisect.bisect_right(firsts, offset) - 1

    def _overlapping(self, first: int, last: int) -> list[Span]:
        index = self._index(first)
        out = []
        while index < len(self.spans) and self.spans[index].first <= last:
            out.append(self.spans[index])
            index += 1
        return out

    def _split_at(self, offset: int) -> None:
        """A span begins at `offset` (in flight, or the end)."""
        if offset >= self.end or offset <= self.start:
            return
        index = self._index(offset)
        span = self.spans[index]
        if span.first == offset:
            return
        tail = replace(span, first=offset)
        span.last = offset - 1
        self.spans.insert(index + 1, tail)

    def _slice(self, first: int, last: int) -> list[Span]:
        """The spans covering exactly [first, last], split where they cross its edges."""
        self._split_at(first)
        self._split_at(last + 1)
        return self._overlapping(first, last)

    def _append(self, span: Span) -> None:
        self.spans.append(span)
        self.end = span.last + 1

    def _tidy(self) -> None:
        """Neighbours in one state become one span; the start offset moves past what is done."""
        merged: list[Span] = []
        for span in self.spans:
            if merged and merged[-1].like(span) and merged[-1].last + 1 == span.first:
                merged[-1].last = span.last
            else:
                merged.append(span)
        while merged and merged[0].state in DONE:
            self.start = merged.pop(0).last + 1
        if not merged:
            self.start = max(self.start, self.end)
        self.spans = merged


def _runs(first: int, last: int, types: list[int]) -> list[tuple[tuple[int, int], int]]:
    """[first, last] cut where the acknowledgement type changes: ((first, last), type)s."""
    runs: list[tuple[tuple[int, int], int]] = []
    begin = first
    for offset in range(first + 1, last + 2):
        if offset > last or types[offset - first] != types[begin - first]:
            runs.append(((begin, offset - 1), types[begin - first]))
            begin = offset
    return runs


def _merged(taken: list[Acquired]) -> list[Acquired]:
    """Acquired ranges in offset order, neighbours at one delivery count joined."""
    out: list[Acquired] = []
    for range_ in sorted(taken, key=lambda a: a.first):
        if out and out[-1].last + 1 == range_.first and out[-1].deliveries == range_.deliveries:
            out[-1] = Acquired(out[-1].first, range_.last, range_.deliveries)
        else:
            out.append(range_)
    return out
