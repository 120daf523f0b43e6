"""The Producer: confluent-kafka's surface (produce, poll, flush, transactions) over the HTTP API,
idempotent by default, so retries never duplicate or reorder records within a partition.

Threads: `produce()` only appends to a per-partition queue of batches. One sender thread decides,
under a single lock, which batches go out (full, or `linger.ms` old, or flushed); a small pool
sends them on one pooled httpx client and applies each answer under the same lock. Delivery
callbacks are queued and run on the caller's thread from `poll()`, `flush()` and the transaction
calls. Transaction calls (`init_transactions`, `commit_transaction`...) run on the caller's thread.

Batches travel as Kafka record batches (`coordinator.log.recordbatch`, the service's own codec),
compressed with `compression.type`. A transactional batch adds its partition to the transaction
itself (transaction version 2): there is no AddPartitions call.

Ordering: a batch's sequence numbers are assigned once, at its first send, in queue order, and
never change within a (producer id, epoch): a retry resends the same body, which the service
answers with the original offsets if it had written it. Several batches of a partition may be in
flight, and concurrent requests race to the service: a batch sent while an earlier one was
unacknowledged that is refused as OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID overtook its
predecessor, and is resent as soon as that one is acknowledged. After a failed attempt (no answer,
or a retriable one) the partition "recovers": nothing new is sent, in-flight answers are awaited,
then unacknowledged batches are resent in order, one at a time. The same answer for a batch
sent with every predecessor acknowledged is real: an idempotent producer then takes a new producer
id and renumbers what is unacknowledged (KIP-360) once no batch is left in doubt (sent, answer
lost) that could still be written; a transactional producer must abort (EndTxn raises the epoch).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Unpack
from urllib.parse import quote

from coordinator.log import recordbatch
from sdk._callbacks import Callbacks
from sdk._config import ProducerConfig, ProducerOptions, build_config
from sdk._errors import (
    IllegalStateError,
    InvalidTxnState,
    KafkaError,
    KafkaException,
    KafkaTimeoutError,
    MessagePurged,
    MessageSizeTooLarge,
    MessageTimedOut,
    TransactionTimedOut,
    TransportError,
    UnknownTopicOrPartition,
)
from sdk._http import RECORD_BATCH, HttpClient
from sdk._lifecycle import Closeable
from sdk._partitioner import StickyPartitioner, partition_for_key
from sdk._types import (
    TIMESTAMP_CREATE_TIME,
    ConsumerGroupMetadata,
    DeliveryCallback,
    Headers,
    Message,
    TopicPartition,
)

__all__ = ["Producer"]

log = logging.getLogger("sdk")

SEQUENCE_MODULUS = 2**31
RECORD_OVERHEAD = 16  # bytes counted per record besides key, value and headers
SENDER_POOL_SIZE = 8
_REORDER_CODES = (KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.UNKNOWN_PRODUCER_ID)

TopicKey = tuple[str, int]


class _TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized"  # transactional, before init_transactions()
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    PREPARED = "prepared"
    COMMITTING = "committing"  # EndTxn(commit) sent, answer not yet seen
    ABORTING = "aborting"
    NEEDS_INIT = "needs init_transactions()"  # the coordinator aborted us on timeout


class _Record:
    __slots__ = ("callback", "headers", "key", "size", "timestamp", "value")

    def __init__(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]],
        callback: DeliveryCallback | None,
        timestamp: int,
    ) -> None:
        self.key = key
        self.value = value
        self.headers = headers
        self.callback = callback
        self.timestamp = timestamp
        self.size = (
            len(key or b"")
            + len(value or b"")
            + sum(len(n) + len(v) for n, v in headers)
            + RECORD_OVERHEAD
        )


class _Batch:
    __slots__ = ("acked", "attempts", "base_offset", "body", "created", "deadline", "in_doubt",
                 "inflight", "needs_send", "records", "retry_at", "sealed", "sent_as_head",
                 "sequence", "size", "tp")  # fmt: skip

    def __init__(self, tp: TopicKey, now: float, deadline: float) -> None:
        self.tp = tp
        self.records: list[_Record] = []
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


class _Partition:
    __slots__ = ("inflight", "next_sequence", "queue", "recovering")

    def __init__(self) -> None:
        self.queue: deque[_Batch] = deque()  # unacknowledged batches, in produce order
        self.next_sequence = 0
        self.inflight = 0
        # After a failed attempt (no answer, or a retriable one): send nothing new until the
        # in-flight answers are in, then resend what needs it, in order, one at a time.
        self.recovering = False

    def head_unacked(self) -> _Batch | None:
        return next((b for b in self.queue if not b.acked), None)


def _as_bytes(data: object, what: str) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"{what} must be bytes or str, not {type(data).__name__}")


def _headers(headers: Headers | None) -> list[tuple[str, bytes]]:
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
        raw = _as_bytes(value, f"header {name!r}")
        if raw is None:
            raise TypeError(f"header {name!r} has no value; the API needs bytes or str")
        result.append((name, raw))
    return result


class Producer(Closeable):
    """Writes records to the coordinator, batched per partition; idempotent by default and
    transactional with `transactional.id`.

        Producer({"coordinator.url": "http://127.0.0.1:8080", "transactional.id": "etl-0"})
        Producer(coordinator_url="http://127.0.0.1:8080", linger_ms=20)

    Every method raises `IllegalStateError` after `close()`, and the producer's fatal error
    (`e.fatal`, e.g. `ProducerFenced`) once one occurred: then close it; a new producer may take
    over (with the same transactional.id it fences this one).
    """

    _what = "the producer"

    def __init__(
        self,
        config: Mapping[str, object] | ProducerConfig | None = None,
        /,
        **options: Unpack[ProducerOptions],
    ) -> None:
        self.config: ProducerConfig = build_config(ProducerConfig, config, options)
        c = self.config
        self._tid = c.transactional_id
        # Path form of the id: any printable character may appear in it.
        self._tid_path = quote(self._tid, safe="") if self._tid else ""
        self._compression = recordbatch.CODECS[c.compression_type]
        self._produce_params = {"transactional_id": self._tid} if self._tid else None
        self._idempotent = c.enable_idempotence
        self._linger = c.linger_ms / 1000
        self._delivery_timeout = c.delivery_timeout_ms / 1000
        self._http = HttpClient(c, max_connections=SENDER_POOL_SIZE + 2)
        self._partitioner = StickyPartitioner()
        self._metadata: dict[str, int] = {}
        self._metadata_lock = threading.Lock()

        self._cond = threading.Condition()
        self._partitions: dict[TopicKey, _Partition] = {}
        self._sticky_batch: dict[str, _Batch] = {}
        self._reports: deque[tuple[DeliveryCallback, KafkaError | None, Message]] = deque()
        self._outstanding = 0  # records produced and not yet reported
        self._inflight = 0  # requests the pool is running (produce, InitPid)
        self._flushing = 0  # callers waiting in flush(): send batches without lingering
        self._producer_id = -1
        self._epoch = -1
        self._pid_inflight = False
        self._pid_attempts = 0
        self._pid_retry_at = 0.0
        self._reset_pending = False  # KIP-360: take a new producer id once nothing is in doubt
        self._fatal: KafkaException | None = None
        self._state = _TxnState.UNINITIALIZED if self._tid else _TxnState.READY
        self._txn_error: KafkaException | None = None  # what fails the current transaction
        self._txn_touched = False  # the coordinator may hold an open transaction of ours
        self._ending: tuple[int, int] | None = None  # (pid, epoch) an EndTxn was sent with
        self._stopping = False
        self._closed = False
        self._callbacks = Callbacks(c, "producer", self._statistics)

        self._pool = ThreadPoolExecutor(SENDER_POOL_SIZE, thread_name_prefix="sdk-producer-io")
        self._sender = threading.Thread(target=self._run, name="sdk-producer-sender", daemon=True)
        self._sender.start()

    # -- the caller's API ---------------------------------------------------------------------

    def produce(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        partition: int | None = None,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Headers | None = None,
        *,
        callback: DeliveryCallback | None = None,
    ) -> None:
        """Queue a record and return at once; its delivery report comes from `poll()`/`flush()`.
        `timestamp` (ms since the epoch; 0: now) is the record's CreateTime.

        `partition` None (or -1) lets the partitioner choose: murmur2 of the key, sticky for
        null keys. `on_delivery(err, msg)` (alias `callback`) gets err None and the record's
        offset in `msg.offset()` once written, or the KafkaError that failed it.

        Raises, and the record is not queued:
        - `BufferError`: `queue.buffering.max.messages` records wait already; call `poll()`
          to serve delivery reports, then produce again.
        - `MessageSizeTooLarge`: the record is over `message.max.bytes`; send a smaller one.
        - `UnknownTopicOrPartition`: no such topic or partition; create it or fix the name.
        - `TypeError`/`ValueError`: a key, value or header of the wrong type; a timestamp.
        - `IllegalStateError`: closed, or a transactional producer outside a transaction
          (call `begin_transaction()` first).
        - a `KafkaException` with `txn_requires_abort`: the transaction already failed; call
          `abort_transaction()`. With `fatal`: close the producer.
        """
        if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
            raise ValueError(f"timestamp: milliseconds since the epoch, not {timestamp!r}")
        record = _Record(
            _as_bytes(key, "key"),
            _as_bytes(value, "value"),
            _headers(headers),
            on_delivery or callback or self.config.on_delivery,
            timestamp or time.time_ns() // 1_000_000,
        )
        if record.size - RECORD_OVERHEAD > self.config.message_max_bytes:
            raise MessageSizeTooLarge(
                f"the record holds {record.size - RECORD_OVERHEAD} bytes; message.max.bytes is "
                f"{self.config.message_max_bytes}"
            )
        # A topic seen before needs no metadata call, and the lock is taken once; before a call,
        # a producer that may not produce says so first.
        count = self._metadata.get(topic) if isinstance(topic, str) else None
        if count is None:
            with self._cond:
                self._check_can_produce()
            count = self._partition_count(topic)
        with self._cond:
            self._check_can_produce()
            if partition is not None and partition != -1 and not 0 <= partition < count:
                raise UnknownTopicOrPartition(f"{topic} has {count} partitions, not {partition}")
            if self._outstanding >= self.config.queue_buffering_max_messages:
                raise BufferError(
                    f"{self._outstanding} records wait for delivery (queue.buffering.max.messages);"
                    " call poll() to serve delivery reports"
                )
            if partition is None or partition == -1:
                if record.key is not None:
                    partition = partition_for_key(record.key, count)
                else:
                    partition = self._sticky_partition(topic, count)
            batch = self._append((topic, partition), record)
            if record.key is None:
                self._sticky_batch[topic] = batch

    def poll(self, timeout: float | None = None) -> int:
        """Serve delivery callbacks; wait up to `timeout` seconds (None: until one arrives, or
        nothing is outstanding) for the first. Returns how many callbacks ran. Exceptions raised
        by a callback propagate; the remaining reports are served by the next call."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._reports and self._outstanding:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._cond.wait(remaining)
        return self._serve_reports() + self._callbacks.serve()

    def flush(self, timeout: float | None = None) -> int:
        """Send every queued record without lingering and wait (up to `timeout` seconds; None:
        until done, at most `delivery.timeout.ms`) until each is reported, serving callbacks.
        Returns the number of records still outstanding (0 when all were reported)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wait_outstanding(deadline)
        self._callbacks.serve()
        with self._cond:
            return self._outstanding

    def __len__(self) -> int:
        """Records queued or in flight, plus delivery reports not yet served."""
        with self._cond:
            return self._outstanding + len(self._reports)

    def init_transactions(
        self, timeout: float | None = None, *, keep_prepared: bool = False
    ) -> None:
        """Register `transactional.id` with the coordinator (InitPid): fences every older
        instance with this id and aborts its open transaction. Call once, before the first
        `begin_transaction()`, and again after `TransactionTimedOut`. With `keep_prepared`, a
        transaction an older instance left `Prepared` stays prepared and becomes this producer's
        to finish with `commit_transaction()` or `abort_transaction()`.

        Raises:
        - `KafkaTimeoutError` (retriable): not done within `timeout` (None:
          `default.api.timeout.ms`); call again.
        - `InvalidTransactionTimeout`: `transaction.timeout.ms` is above the service's maximum.
        - a fatal error (e.g. `TransactionalIdAuthorizationFailed`): close the producer.
        - `IllegalStateError`: no transactional.id, or a transaction is open.
        """
        self._require_transactional()
        with self._cond:
            self._check_not_fatal()
            if self._state not in (_TxnState.UNINITIALIZED, _TxnState.READY, _TxnState.NEEDS_INIT):
                raise IllegalStateError(f"init_transactions() is not allowed {self._state.value}")
        deadline = self._http.deadline(timeout)
        body = {
            "transactional_id": self._tid,
            "transaction_timeout_ms": self.config.transaction_timeout_ms,
            "keep_prepared": keep_prepared,
        }
        answer = self._txn_call("POST", "/v1/init-pid", body, deadline)
        prepared = False
        if keep_prepared:
            described = self._txn_call("GET", self._txn_path(""), None, deadline)
            prepared = described.get("state") == "Prepared"
        with self._cond:
            self._start_epoch(answer["producer_id"], answer["producer_epoch"])
            self._state = _TxnState.PREPARED if prepared else _TxnState.READY
            self._txn_touched = prepared

    def begin_transaction(self) -> None:
        """Start a transaction (locally; the coordinator hears of it with the first record or
        offsets). Raises `IllegalStateError` unless `init_transactions()` ran and no transaction
        is open; the producer's fatal error once one occurred."""
        self._require_transactional()
        with self._cond:
            self._check_not_fatal()
            if self._state is not _TxnState.READY:
                raise IllegalStateError(f"begin_transaction() is not allowed {self._state.value}")
            self._state = _TxnState.IN_TRANSACTION
            self._txn_error = None

    def send_offsets_to_transaction(
        self,
        offsets: Iterable[TopicPartition],
        group_metadata: ConsumerGroupMetadata | str,
        timeout: float | None = None,
    ) -> None:
        """Commit the consumer's `offsets` (the positions to resume from, e.g.
        `consumer.position(consumer.assignment())`) for `group_metadata` (from
        `consumer.consumer_group_metadata()`, or a group id) with this transaction: they become
        the group's committed offsets only if it commits. Negative (unknown) offsets are skipped.

        Raises:
        - `KafkaTimeoutError` (retriable): not done within `timeout`; call again.
        - an error with `txn_requires_abort`: call `abort_transaction()`, rewind the consumer
          to its committed offsets, and start a new transaction. `UnknownMemberId` and
          `FencedMemberEpoch` say the consumer of `group_metadata` lost these partitions to
          another member (KIP-447): its next `poll()` runs `on_lost`/`on_revoke`.
        - `TransactionTimedOut`: call `init_transactions()`, then start over.
        - a fatal error (`ProducerFenced`...): close the producer.
        - `IllegalStateError`: no transaction is open.
        """
        self._require_transactional()
        group_id = (
            group_metadata.group_id
            if isinstance(group_metadata, ConsumerGroupMetadata)
            else group_metadata
        )
        entries = []
        for tp in offsets:
            if tp.offset < 0:
                continue
            entry: dict[str, Any] = {"topic": tp.topic, "partition": tp.partition}
            entry["offset"] = tp.offset
            if tp.metadata is not None:
                entry["metadata"] = tp.metadata
            entries.append(entry)
        with self._cond:
            self._check_in_transaction("send_offsets_to_transaction()")
            if not entries:
                return
            self._txn_touched = True
            pid, epoch = self._producer_id, self._epoch
        body: dict[str, Any] = {"producer_id": pid, "producer_epoch": epoch, "group_id": group_id}
        body["offsets"] = entries
        if isinstance(group_metadata, ConsumerGroupMetadata) and group_metadata.member_id:
            # KIP-447: the coordinator refuses them if this member no longer owns the partitions.
            body["member_id"] = group_metadata.member_id
            body["member_epoch"] = group_metadata.member_epoch
        self._txn_call("POST", self._txn_path("/offsets"), body, self._http.deadline(timeout))

    def prepare_transaction(self, timeout: float | None = None) -> None:
        """Flush, then prepare the transaction: no more records or offsets may join, and the
        coordinator's normal timeout no longer aborts it. Finish it with `commit_transaction()`
        or `abort_transaction()`, here or in a new producer that ran
        `init_transactions(keep_prepared=True)`.

        Raises as `commit_transaction()` does; `KafkaTimeoutError` may be retried by calling
        `prepare_transaction()` again.
        """
        self._require_transactional()
        deadline = self._http.deadline(timeout)
        with self._cond:
            self._check_in_transaction("prepare_transaction()")
        self._flush_transaction(deadline)
        with self._cond:
            self._check_in_transaction("prepare_transaction()")
            self._txn_touched = True
            pid, epoch = self._producer_id, self._epoch
        body = {"producer_id": pid, "producer_epoch": epoch}
        try:
            self._txn_call("POST", self._txn_path("/prepare"), body, deadline)
        except InvalidTxnState:
            # A retried prepare whose first attempt was applied: check that it is ours.
            described = self._txn_call("GET", self._txn_path(""), None, deadline)
            if (described.get("state"), described.get("producer_epoch")) != ("Prepared", epoch):
                raise
        with self._cond:
            self._state = _TxnState.PREPARED

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush every record of the transaction, then commit it (EndTxn): its records become
        visible to read_committed consumers and its offsets become the group's, all at once.

        Raises:
        - `KafkaTimeoutError` (retriable): not done within `timeout` (None:
          `default.api.timeout.ms`); call `commit_transaction()` again: a commit whose answer
          was lost is retried with the same epoch and answered by the idempotent EndTxn.
        - an error with `txn_requires_abort` (a record failed): call `abort_transaction()`,
          rewind the input to the last committed offsets, and start a new transaction.
        - `TransactionTimedOut`: the coordinator aborted it; call `init_transactions()`.
        - a fatal error (`ProducerFenced`...): close the producer. After a commit whose answer
          was lost, `ProducerFenced` does not say the transaction was aborted: a newer instance
          may have fenced the retry after the first attempt committed. Its outcome is unknown to
          this producer; the newer instance resumes from the committed offsets either way.
        - `IllegalStateError`: no transaction is open.
        """
        self._require_transactional()
        deadline = self._http.deadline(timeout)
        with self._cond:
            self._check_not_fatal()
            self._check_timed_out()
            state = self._state
            if state is _TxnState.IN_TRANSACTION and self._txn_error is not None:
                raise self._txn_error
            if state not in (_TxnState.IN_TRANSACTION, _TxnState.PREPARED, _TxnState.COMMITTING):
                raise IllegalStateError(f"commit_transaction() is not allowed {state.value}")
        if state is _TxnState.IN_TRANSACTION:
            self._flush_transaction(deadline)
        self._end_transaction(True, deadline)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the transaction: records not yet sent are dropped (their delivery reports say
        `_PURGE_QUEUE`), records written are never shown to read_committed consumers, and its
        offsets are not committed. Then `begin_transaction()` may start the next one.

        Raises:
        - `KafkaTimeoutError` (retriable): call `abort_transaction()` again.
        - `TransactionTimedOut`: the coordinator had aborted it already; call
          `init_transactions()` before the next transaction.
        - a fatal error (`ProducerFenced`...): close the producer.
        - `IllegalStateError`: no transaction is open, or a commit is under way (call
          `commit_transaction()` again instead).
        """
        self._require_transactional()
        deadline = self._http.deadline(timeout)
        purged = MessagePurged("dropped by abort_transaction()")
        with self._cond:
            self._check_not_fatal()
            self._check_timed_out()
            if self._state not in (
                _TxnState.IN_TRANSACTION,
                _TxnState.PREPARED,
                _TxnState.ABORTING,
            ):
                raise IllegalStateError(f"abort_transaction() is not allowed {self._state.value}")
            self._state = _TxnState.ABORTING
            self._purge(purged)
            # Answers of requests in flight must be in before EndTxn, so none can join later.
            while self._inflight and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            if self._inflight:
                raise KafkaTimeoutError("requests still in flight; call abort_transaction() again")
            self._purge(purged)
        self._serve_reports()
        with self._cond:
            self._check_not_fatal()
            self._check_timed_out()
        self._end_transaction(False, deadline)

    def _transaction_identity(self) -> tuple[int, int]:
        """(producer id, epoch) of the current transaction: what a commit-group names it by
        (sdk.spark hands a prepared transaction to the driver this way)."""
        with self._cond:
            return self._producer_id, self._epoch

    def close(self, timeout: float | None = None) -> None:
        """Flush (an idempotent producer) or abort the open transaction (a transactional one; a
        prepared transaction is left for someone to finish), then release threads and
        connections. Records still outstanding after `timeout` are reported as purged. A closed
        producer refuses every call; closing again does nothing."""
        self._close_once(lambda: self._release(timeout))

    def _release(self, timeout: float | None) -> None:
        try:
            if self._tid is None:
                self.flush(timeout)
            elif self._state is _TxnState.IN_TRANSACTION and self._fatal is None:
                # Best effort: the coordinator aborts it on its timeout anyway.
                with contextlib.suppress(KafkaException):
                    self.abort_transaction(timeout)
        finally:
            with self._cond:
                self._stopping = True
                self._purge(MessagePurged("dropped by close()"))
                self._cond.notify_all()
            self._sender.join()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._http.close()
            self._closed = True
            self._serve_reports()

    # -- checks -------------------------------------------------------------------------------

    def _require_transactional(self) -> None:
        self._check_open()
        if self._tid is None:
            raise IllegalStateError("this producer has no transactional.id")

    def _check_not_fatal(self) -> None:
        if self._closed or self._stopping:
            raise IllegalStateError("the producer is closed")
        if self._fatal is not None:
            raise self._fatal

    def _check_in_transaction(self, call: str) -> None:
        self._check_not_fatal()
        self._check_timed_out()
        if self._state is not _TxnState.IN_TRANSACTION:
            raise IllegalStateError(f"{call} is not allowed {self._state.value}")
        if self._txn_error is not None:
            raise self._txn_error

    def _check_timed_out(self) -> None:
        if self._state is _TxnState.NEEDS_INIT and self._txn_error is not None:
            raise self._txn_error

    def _check_can_produce(self) -> None:
        if self._tid is None:
            self._check_not_fatal()
        else:
            self._check_in_transaction("produce()")

    # -- metadata and partitioning -------------------------------------------------------------

    def _partition_count(self, topic: str) -> int:
        with self._metadata_lock:
            count = self._metadata.get(topic)
        if count is None:
            if not isinstance(topic, str):
                raise TypeError(f"topic must be str, not {type(topic).__name__}")
            described = self._http.call("GET", f"/v1/topics/{topic}")
            count = len(described["partitions"])
            with self._metadata_lock:
                self._metadata[topic] = count
        return count

    def _sticky_partition(self, topic: str, count: int) -> int:
        batch = self._sticky_batch.get(topic)
        if batch is None:
            return self._partitioner.partition(topic, count)
        if not batch.sealed and batch.sequence is None:
            return batch.tp[1]
        return self._partitioner.on_new_batch(topic, count, batch.tp[1])

    def _append(self, tp: TopicKey, record: _Record) -> _Batch:
        part = self._partitions.get(tp)
        if part is None:
            part = self._partitions[tp] = _Partition()
        batch = part.queue[-1] if part.queue else None
        limit = self.config.batch_size
        if (
            batch is None
            or batch.sealed
            or batch.sequence is not None
            or (batch.records and batch.size + record.size > limit)
        ):
            if batch is not None:
                batch.sealed = True
            now = time.monotonic()
            batch = _Batch(tp, now, now + self._delivery_timeout)
            part.queue.append(batch)
            self._cond.notify_all()
        batch.records.append(record)
        batch.size += record.size
        self._outstanding += 1
        if batch.size >= limit:
            batch.sealed = True
            self._cond.notify_all()
        return batch

    # -- delivery reports -----------------------------------------------------------------------

    def _report(self, batch: _Batch, error: KafkaException | None) -> None:
        """Queue the delivery reports of `batch`'s records (under the lock)."""
        topic, partition = batch.tp
        err = None if error is None else error.error
        for i, record in enumerate(batch.records):
            if record.callback is not None:
                offset = batch.base_offset + i if error is None else None
                message = Message(
                    topic,
                    partition,
                    offset,
                    record.key,
                    record.value,
                    list(record.headers),
                    err,
                    record.timestamp,
                    TIMESTAMP_CREATE_TIME,
                )
                self._reports.append((record.callback, err, message))
        self._outstanding -= len(batch.records)
        self._cond.notify_all()

    def _serve_reports(self) -> int:
        served = 0
        while True:
            with self._cond:
                if not self._reports:
                    return served
                callback, err, message = self._reports.popleft()
            callback(err, message)
            served += 1

    def _wait_outstanding(self, deadline: float | None) -> bool:
        """Flush: wait until every record is reported (True) or `deadline` passes (False)."""
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
        try:
            while True:
                self._serve_reports()
                with self._cond:
                    if not self._outstanding and not self._reports:
                        return True
                    if self._reports:
                        continue
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._cond.wait(remaining)
        finally:
            with self._cond:
                self._flushing -= 1

    def _statistics(self) -> dict[str, Any]:
        with self._cond:
            return {"msg_cnt": self._outstanding, "txn_state": self._state.value}

    # -- transactions ----------------------------------------------------------------------------

    def _txn_path(self, suffix: str) -> str:
        return f"/v1/transactions/{self._tid_path}{suffix}"

    def _start_epoch(self, producer_id: int, epoch: int) -> None:
        """A new (producer id, epoch): every partition's sequences start again at 0."""
        self._producer_id, self._epoch = producer_id, epoch
        for part in self._partitions.values():
            part.next_sequence = 0
        self._txn_touched = False
        self._txn_error = None
        self._ending = None

    def _flush_transaction(self, deadline: float) -> None:
        if not self._wait_outstanding(deadline):
            raise KafkaTimeoutError("records still undelivered; call again to keep waiting")
        with self._cond:
            if self._txn_error is not None:
                raise self._txn_error

    def _end_transaction(self, commit: bool, deadline: float) -> None:
        with self._cond:
            self._state = _TxnState.COMMITTING if commit else _TxnState.ABORTING
            if not self._txn_touched:
                # The coordinator never heard of this transaction: nothing to end there.
                self._start_epoch(self._producer_id, self._epoch)
                self._state = _TxnState.READY
                return
            if self._ending is None:
                # A retry after a lost answer must carry the epoch the transaction ends with.
                self._ending = (self._producer_id, self._epoch)
            pid, epoch = self._ending
        body = {"producer_id": pid, "producer_epoch": epoch, "commit": commit}
        try:
            answer = self._txn_call("POST", self._txn_path("/end"), body, deadline)
        except InvalidTxnState:
            if commit:
                raise
            # Nothing open at our epoch (no batch of it was ever written): nothing to abort.
            answer = {"producer_id": pid, "producer_epoch": epoch}
        with self._cond:
            self._start_epoch(answer["producer_id"], answer["producer_epoch"])
            self._state = _TxnState.READY

    def _txn_call(
        self, method: str, path: str, body: dict[str, Any] | None, deadline: float
    ) -> Any:
        """A transaction RPC with retries; its errors change the producer's state as they must."""
        try:
            return self._http.call(method, path, body=body, deadline=deadline)
        except KafkaTimeoutError:
            raise
        except KafkaException as exc:
            with self._cond:
                if exc.fatal:
                    self._set_fatal(exc)
                elif isinstance(exc, TransactionTimedOut):
                    self._timed_out(exc)
                elif self._state in (
                    _TxnState.IN_TRANSACTION,
                    _TxnState.COMMITTING,
                    _TxnState.PREPARED,
                ) and path.endswith(("/offsets", "/prepare", "/end")):
                    exc = exc.with_abort_required()
                    self._txn_error = exc
                    self._state = _TxnState.IN_TRANSACTION
            raise exc from exc.__cause__

    # -- the sender ------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            with self._cond:
                while not self._stopping:
                    jobs, wake_at = self._plan(time.monotonic())
                    for job in jobs:
                        self._pool.submit(job)
                    if not jobs:
                        now = time.monotonic()
                        self._cond.wait(None if wake_at is None else max(0.0, wake_at - now))
        except Exception as exc:  # a bug: fail every caller loudly rather than leave them waiting
            self._callbacks.log.exception("the producer's sender thread failed")
            with self._cond:
                self._set_fatal(KafkaException(f"the sender thread failed: {exc!r}", fatal=True))

    def _request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | bytes,
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any] | KafkaException:
        """One attempt from the pool: the answer, or the error it became. Never raises, so the
        state of a request in flight is always settled. Bytes go as a record batch."""
        content_type = RECORD_BATCH if isinstance(body, bytes) else None
        try:
            answer: dict[str, Any] = (
                self._http.send(method, path, body=body, params=params, content_type=content_type)
                or {}
            )
            return answer
        except KafkaException as exc:
            if isinstance(exc, TransportError):
                self._callbacks.error(exc.error)  # librdkafka tells error_cb of transport failures
            return exc
        except Exception as exc:  # unexpected: treat as an answer lost, which is always safe
            self._callbacks.log.exception("%s %s failed unexpectedly", method, path)
            return TransportError(f"{method} {path}: {exc!r}")

    def _plan(self, now: float) -> tuple[list[Callable[[], None]], float | None]:
        """What to send now, and when to look again (under the lock)."""
        jobs: list[Callable[[], None]] = []
        wake: list[float] = []
        if self._fatal is not None:
            self._purge(self._fatal)
            return jobs, None
        self._expire(now, wake)
        if self._tid is not None:
            if self._state is not _TxnState.IN_TRANSACTION or self._txn_error is not None:
                return jobs, _earliest(wake)
        elif (
            self._idempotent
            and (self._producer_id < 0 or self._reset_pending)
            and self._plan_producer_id(now, jobs, wake)
        ):
            return jobs, _earliest(wake)
        for part in self._partitions.values():
            self._plan_partition(part, now, jobs, wake)
        return jobs, _earliest(wake)

    def _plan_producer_id(
        self, now: float, jobs: list[Callable[[], None]], wake: list[float]
    ) -> bool:
        """Idempotent producer: get a producer id when it has none, or (KIP-360) a new one once
        no request is in flight and no batch in doubt could still be written under the old one.
        Returns True when nothing may be sent yet."""
        if self._producer_id >= 0:
            # Reset pending: first settle every batch in doubt at the head of its partition (a
            # later one cannot have been written while the head was not), under the old id.
            unsettled = False
            for part in self._partitions.values():
                head = part.head_unacked()
                if head is None or not head.in_doubt:
                    continue
                unsettled = True
                if part.inflight:
                    continue
                if head.retry_at <= now:
                    jobs.append(self._send(part, head))
                else:
                    wake.append(head.retry_at)
            if unsettled or self._inflight:
                return True
        if self._pid_inflight or not any(p.queue for p in self._partitions.values()):
            return True
        if self._pid_retry_at > now:
            wake.append(self._pid_retry_at)
            return True
        self._pid_inflight = True
        self._inflight += 1
        jobs.append(self._init_pid_job)
        return True

    def _plan_partition(
        self, part: _Partition, now: float, jobs: list[Callable[[], None]], wake: list[float]
    ) -> None:
        if part.recovering:
            if part.inflight:
                return
            retry = next((b for b in part.queue if b.needs_send), None)
            if retry is not None:
                if retry.retry_at <= now:
                    jobs.append(self._send(part, retry))
                else:
                    wake.append(retry.retry_at)
                return
            part.recovering = False
        if self._reset_pending:
            return
        limit = self.config.max_in_flight_requests_per_connection
        head = part.head_unacked()
        if head is not None and head.needs_send and part.inflight < limit:
            # It overtook a predecessor that is now acknowledged: it goes through this time.
            jobs.append(self._send(part, head))
        for batch in part.queue:
            if part.inflight >= limit:
                return
            if batch.sequence is not None or batch.acked:
                continue
            ready_at = batch.created + self._linger
            if not (batch.sealed or self._flushing or ready_at <= now):
                wake.append(ready_at)
                return
            jobs.append(self._send(part, batch))

    def _send(self, part: _Partition, batch: _Batch) -> Callable[[], None]:
        """Mark `batch` sent and return the job that sends it. Its first send seals it and
        takes its sequence here, under the lock; the job builds (and compresses) its body
        outside the lock, once, and keeps it for retries, so produce() never waits on it."""
        build: Callable[[], bytes] | None = None
        if batch.sequence is None:
            count = len(batch.records)
            batch.sealed = True
            if self._idempotent:
                batch.sequence = part.next_sequence
                part.next_sequence = (batch.sequence + count) % SEQUENCE_MODULUS
            else:
                batch.sequence = -1
            build = partial(
                _build,
                batch.records,
                compression=self._compression,
                producer_id=self._producer_id if self._idempotent else -1,
                producer_epoch=self._epoch if self._idempotent else -1,
                base_sequence=batch.sequence,
                transactional=self._tid is not None,
            )
            if self._tid is not None:
                # The coordinator may hold an open transaction of ours from now on.
                self._txn_touched = True
        batch.sent_as_head = all(b.acked for b in _before(part.queue, batch))
        batch.inflight = True
        batch.needs_send = False
        part.inflight += 1
        self._inflight += 1
        return lambda: self._produce_job(part, batch, build)

    def _expire(self, now: float, wake: list[float]) -> None:
        for part in self._partitions.values():
            for batch in [b for b in part.queue if not b.inflight and not b.acked]:
                if batch.deadline > now:
                    wake.append(batch.deadline)
                    continue
                doubt = "; it may have been written" if batch.in_doubt else ""
                error = MessageTimedOut(
                    f"not delivered within delivery.timeout.ms "
                    f"({self.config.delivery_timeout_ms} ms){doubt}"
                )
                self._fail(part, batch, error)

    # -- answers (run in the pool, applied under the lock) ---------------------------------------

    def _produce_job(
        self, part: _Partition, batch: _Batch, build: Callable[[], bytes] | None
    ) -> None:
        topic, partition = batch.tp
        if build is not None:
            # A sealed batch in flight: no other thread touches its records or its body.
            batch.body = build()
        assert batch.body is not None
        path = f"/v1/topics/{topic}/partitions/{partition}/records"
        outcome = self._request("POST", path, batch.body, self._produce_params)
        with self._cond:
            self._inflight -= 1
            part.inflight -= 1
            batch.inflight = False
            self._on_produce(part, batch, outcome)
            self._cond.notify_all()

    def _on_produce(
        self, part: _Partition, batch: _Batch, outcome: dict[str, Any] | KafkaException
    ) -> None:
        if isinstance(outcome, dict):
            batch.acked = True
            batch.in_doubt = False
            batch.base_offset = outcome["base_offset"]
            self._complete(part)
            return
        error = outcome
        now = time.monotonic()
        if error.retriable:
            batch.in_doubt = batch.in_doubt or isinstance(error, TransportError)
            batch.attempts += 1
            if batch.attempts > self.config.retries:
                self._fail(part, batch, error)
                return
            self._retry(part, batch, now + self._http.backoff(batch.attempts - 1))
            return
        if error.code in _REORDER_CODES and not batch.sent_as_head:
            # It overtook an unacknowledged predecessor: send it again once that one is
            # acknowledged. Concurrent requests race to the service, so this is routine; the
            # partition keeps sending meanwhile (the service never writes past a gap).
            batch.needs_send = True
            return
        if error.fatal:
            self._set_fatal(error)
            self._fail(part, batch, error)
            return
        if self._tid is None and self._idempotent and error.code in _REORDER_CODES:
            # KIP-360: the service lost this producer's state on the partition. Nothing later
            # can be written under the old id either, so renumber under a new one.
            batch.in_doubt = False
            batch.needs_send = False
            self._reset_pending = True
            return
        self._fail(part, batch, error)

    def _retry(self, part: _Partition, batch: _Batch, at: float) -> None:
        batch.needs_send = True
        batch.retry_at = at
        part.recovering = True

    def _fail(self, part: _Partition, batch: _Batch, error: KafkaException) -> None:
        """Report `batch` failed and drop it; a hole in the sequence (or the transaction) must
        then be dealt with: a new producer id, or the transaction's abort."""
        part.queue.remove(batch)
        self._report(batch, error)
        if self._tid is not None:
            self._fail_transaction(error)
        elif self._idempotent and batch.sequence is not None:
            self._reset_pending = True
        self._complete(part)

    def _fail_transaction(self, error: KafkaException) -> None:
        """A record failed: the transaction can only be aborted now."""
        if isinstance(error, TransactionTimedOut):
            self._timed_out(error)
        elif self._txn_error is None and not error.fatal:
            self._txn_error = error.with_abort_required()
            self._purge(self._txn_error)

    def _complete(self, part: _Partition) -> None:
        while part.queue and part.queue[0].acked:
            self._report(part.queue.popleft(), None)

    def _purge(self, error: KafkaException) -> None:
        """Fail every batch not in flight (under the lock)."""
        for part in self._partitions.values():
            for batch in [b for b in part.queue if not b.inflight]:
                part.queue.remove(batch)
                self._report(batch, error)
            self._complete(part)
            if not any(b.inflight for b in part.queue):
                part.recovering = False
        self._sticky_batch.clear()

    def _timed_out(self, error: KafkaException) -> None:
        """The coordinator aborted the transaction on its timeout: only InitPid helps now."""
        self._txn_error = error
        self._state = _TxnState.NEEDS_INIT
        self._purge(error)

    def _set_fatal(self, error: KafkaException) -> None:
        if self._fatal is None:
            self._callbacks.error(error.error)
            self._fatal = error
            self._purge(error)
            self._cond.notify_all()

    def _init_pid_job(self) -> None:
        outcome = self._request("POST", "/v1/init-pid", {"transactional_id": None})
        with self._cond:
            self._inflight -= 1
            self._pid_inflight = False
            if isinstance(outcome, dict):
                self._producer_id = outcome["producer_id"]
                self._epoch = outcome["producer_epoch"]
                self._pid_attempts = 0
                self._reset_pending = False
                for part in self._partitions.values():
                    part.next_sequence = 0
                    part.recovering = False
                    for batch in part.queue:
                        batch.sequence = batch.body = None
                        batch.needs_send = batch.in_doubt = False
            elif outcome.retriable:
                self._pid_retry_at = time.monotonic() + self._http.backoff(self._pid_attempts)
                self._pid_attempts += 1
            else:
                self._set_fatal(outcome)
            self._cond.notify_all()


def _build(records: Sequence[_Record], **header: Any) -> bytes:
    return recordbatch.build([(r.timestamp, r.key, r.value, r.headers) for r in records], **header)


def _before(queue: Iterable[_Batch], batch: _Batch) -> Iterable[_Batch]:
    for b in queue:
        if b is batch:
            return
        yield b


def _earliest(times: Sequence[float]) -> float | None:
    return min(times) if times else None
