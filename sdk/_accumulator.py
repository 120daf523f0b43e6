"""The producer's accumulator, as Kafka's `RecordAccumulator`: records appended on the caller's
thread into per-partition queues of batches (sticky partitioning for keyless records), and the
delivery reports that batches give back once the sender settled them. It sends nothing.

A record is kept as the tuple the codec takes, `(timestamp, key, value, headers)`, and its
delivery callback beside it: nothing else is allocated per record. Every method runs under the
producer's lock (`cond`) unless it says it takes the lock itself.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator

from sdk._errors import KafkaError, KafkaException
from sdk._partitioner import StickyPartitioner
from sdk._types import TIMESTAMP_CREATE_TIME, DeliveryCallback, Message

__all__ = ["RECORD_OVERHEAD", "Accumulator", "Batch", "PartitionQueue", "Record", "TopicKey"]

RECORD_OVERHEAD = 16  # bytes counted per record besides key, value and headers

TopicKey = tuple[str, int]
Record = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]]]


class Batch:
    """Records of one partition that travel together. The accumulator fills it until it is
    sealed; the sender then owns it (its sequence, its built body, its attempts)."""

    __slots__ = ("acked", "attempts", "base_offset", "body", "callbacks", "created", "deadline",
                 "generation", "in_doubt", "inflight", "needs_send", "records", "retry_at",
                 "sealed", "sent_as_head", "sequence", "size", "tp")  # fmt: skip

    def __init__(self, tp: TopicKey, now: float, deadline: float, generation: int = 0) -> None:
        self.tp = tp
        self.generation = generation  # the accumulator's generation (its transaction) at birth
        self.records: list[Record] = []
        self.callbacks: list[DeliveryCallback | None] = []
        self.size = 0
        self.created = now
        self.deadline = deadline
        self.sealed = False  # no more records join
        self.sequence: int | None = None  # base sequence, assigned at the first send
        self.body: bytes | None = None  # the record batch, resent as is on retries
        self.inflight = False
        self.needs_send = False  # sent before and must be sent again (when it is the head)
        self.in_doubt = False  # an attempt got no answer: it may have been written
        self.sent_as_head = False  # every earlier batch was acknowledged when it was sent
        self.attempts = 0
        self.retry_at = 0.0
        self.acked = False
        self.base_offset = -1


class PartitionQueue:
    """A partition's unacknowledged batches, in produce order."""

    __slots__ = ("inflight", "queue", "recovering")

    def __init__(self) -> None:
        self.queue: deque[Batch] = deque()
        self.inflight = 0
        # After a failed attempt (no answer, or a retriable one): send nothing new until the
        # in-flight answers are in, then resend what needs it, in order, one at a time.
        self.recovering = False

    def head_unacked(self) -> Batch | None:
        return next((b for b in self.queue if not b.acked), None)

    def before(self, batch: Batch) -> Iterator[Batch]:
        """The batches queued ahead of `batch`."""
        for b in self.queue:
            if b is batch:
                return
            yield b


class Accumulator:
    def __init__(self, cond: threading.Condition, batch_size: int, delivery_timeout: float) -> None:
        self.cond = cond
        self.partitions: dict[TopicKey, PartitionQueue] = {}
        self.reports: deque[tuple[DeliveryCallback, KafkaError | None, Message]] = deque()
        self.outstanding = 0  # records appended and not yet reported
        self.flushing = 0  # callers waiting in flush(): batches go without lingering
        # Bumped when a transaction commits in the background: the next one's records start
        # new batches, so no batch holds records of two transactions.
        self.generation = 0
        self._batch_size = batch_size
        self._delivery_timeout = delivery_timeout
        self._partitioner = StickyPartitioner()
        self._sticky_batch: dict[str, Batch] = {}

    def sticky_partition(self, topic: str, count: int) -> int:
        """The partition a keyless record of `topic` joins: the one whose batch is filling."""
        batch = self._sticky_batch.get(topic)
        if batch is None:
            return self._partitioner.partition(topic, count)
        if not batch.sealed and batch.sequence is None:
            return batch.tp[1]
        return self._partitioner.on_new_batch(topic, count, batch.tp[1])

    def append(
        self, tp: TopicKey, record: Record, size: int, callback: DeliveryCallback | None
    ) -> None:
        """Add `record` (`size` bytes as counted against batch.size) to `tp`'s open batch, or
        to a new one when there is none or it is full or already sent."""
        part = self.partitions.get(tp)
        if part is None:
            part = self.partitions[tp] = PartitionQueue()
        batch = part.queue[-1] if part.queue else None
        limit = self._batch_size
        if (
            batch is None
            or batch.sealed
            or batch.sequence is not None
            or batch.generation != self.generation
            or (batch.records and batch.size + size > limit)
        ):
            if batch is not None:
                batch.sealed = True
            now = time.monotonic()
            batch = Batch(tp, now, now + self._delivery_timeout, self.generation)
            part.queue.append(batch)
            self.cond.notify_all()
        batch.records.append(record)
        batch.callbacks.append(callback)
        batch.size += size
        self.outstanding += 1
        if batch.size >= limit:
            batch.sealed = True
            self.cond.notify_all()
        if record[1] is None:
            self._sticky_batch[tp[0]] = batch

    def seal_generation(self) -> int:
        """Seal every batch filling now, so that records appended from now on start new ones of
        the next generation; returns the generation sealed."""
        for part in self.partitions.values():
            if part.queue:
                part.queue[-1].sealed = True
        self._sticky_batch.clear()
        self.generation += 1
        self.cond.notify_all()
        return self.generation - 1

    def holds(self, generation: int) -> bool:
        """Whether a batch of `generation` (or older) is still unreported."""
        return any(
            part.queue and part.queue[0].generation <= generation
            for part in self.partitions.values()
        )

    def report(self, batch: Batch, error: KafkaException | None) -> None:
        """Queue the delivery reports of `batch`'s records."""
        topic, partition = batch.tp
        err = None if error is None else error.error
        for i, callback in enumerate(batch.callbacks):
            if callback is not None:
                timestamp, key, value, headers = batch.records[i]
                offset = batch.base_offset + i if error is None else None
                message = Message(
                    topic,
                    partition,
                    offset,
                    key,
                    value,
                    list(headers),
                    err,
                    timestamp,
                    TIMESTAMP_CREATE_TIME,
                )
                self.reports.append((callback, err, message))
        self.outstanding -= len(batch.records)
        self.cond.notify_all()

    def complete(self, part: PartitionQueue) -> None:
        """Report the acknowledged batches at the head of `part`'s queue, in order."""
        while part.queue and part.queue[0].acked:
            self.report(part.queue.popleft(), None)

    def drop(self, part: PartitionQueue, batch: Batch, error: KafkaException) -> None:
        """Report `batch` failed and take it off its queue."""
        part.queue.remove(batch)
        self.report(batch, error)
        self.complete(part)

    def purge(self, error: KafkaException) -> None:
        """Fail every batch not in flight and not written; a written one waiting behind one in
        flight is reported when that one settles."""
        for part in self.partitions.values():
            for batch in [b for b in part.queue if not b.inflight and not b.acked]:
                part.queue.remove(batch)
                self.report(batch, error)
            self.complete(part)
            if not any(b.inflight for b in part.queue):
                part.recovering = False
        self._sticky_batch.clear()

    def serve_reports(self) -> int:
        """Run the queued delivery callbacks on the caller's thread (takes the lock itself)."""
        served = 0
        while True:
            with self.cond:
                if not self.reports:
                    return served
                callback, err, message = self.reports.popleft()
            callback(err, message)
            served += 1

    def wait_outstanding(self, deadline: float | None) -> bool:
        """Flush: serve reports until every record is reported (True) or `deadline` passes
        (False). Takes the lock itself."""
        with self.cond:
            self.flushing += 1
            self.cond.notify_all()
        try:
            while True:
                self.serve_reports()
                with self.cond:
                    if not self.outstanding and not self.reports:
                        return True
                    if self.reports:
                        continue
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self.cond.wait(remaining)
        finally:
            with self.cond:
                self.flushing -= 1
