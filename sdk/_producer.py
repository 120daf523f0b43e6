"""The Producer: confluent-kafka's surface (produce, poll, flush, transactions) over the HTTP API,
idempotent by default, so retries never duplicate or reorder records within a partition.

It is a thin facade over Kafka's three parts, which share the producer's one lock:
- the accumulator (`sdk._accumulator`): `produce()` appends the record to its partition's open
  batch on the caller's thread and returns; delivery reports wait there for `poll()`;
- the sender (`sdk._sender`): a thread that decides what goes out, and a small pool that builds,
  compresses and sends each batch outside the lock and applies its answer (retries, reordering,
  expiry, the KIP-360 reset);
- the transaction manager (`sdk._transaction_manager`): the producer id, epoch and sequences, and
  the transaction's state machine as one transition table; no I/O.

Delivery callbacks are queued and run on the caller's thread from `poll()`, `flush()` and the
transaction calls. Transaction calls (`init_transactions`, `commit_transaction`...) run their
requests on the caller's thread, except `commit_transaction_async()`, whose flush and EndTxn run
on a thread of their own while the caller begins and fills the next transaction. Batches travel
as Kafka record batches (`sdk.recordbatch`, the service's own codec), compressed with
`compression.type`. A transactional batch adds its partition to the transaction itself
(transaction version 2): there is no AddPartitions call.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Unpack

from sdk._accumulator import RECORD_OVERHEAD, Accumulator
from sdk._callbacks import Callbacks
from sdk._config import ProducerConfig, ProducerOptions, build_config
from sdk._errors import (
    IllegalStateError,
    KafkaException,
    KafkaTimeoutError,
    MessagePurged,
    UnknownTopicOrPartition,
)
from sdk._http import HttpClient
from sdk._lifecycle import Closeable
from sdk._partitioner import PartitionCounts, partition_for_key
from sdk._records import record_of
from sdk._sender import SENDER_POOL_SIZE, Sender
from sdk._share_consumer import ShareAcknowledgement, ShareGroupMetadata
from sdk._transaction_manager import Op, TransactionManager, TxnState
from sdk._transactions import TransactionCalls
from sdk._types import ConsumerGroupMetadata, DeliveryCallback, Headers, TopicPartition

__all__ = ["Producer"]


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
        self._http = HttpClient(c, max_connections=SENDER_POOL_SIZE + 2)
        self._partitions = PartitionCounts(self._http)
        self._cond = threading.Condition()  # the producer's lock: guards the three parts
        self._callbacks = Callbacks(c, "producer", self._statistics)
        self._accumulator = Accumulator(self._cond, c.batch_size, c.delivery_timeout_ms / 1000)
        self._manager = TransactionManager(self._tid is not None, c.enable_idempotence)
        self._sender = Sender(
            c, self._cond, self._accumulator, self._manager, self._http, self._callbacks
        )
        self._txn = TransactionCalls(
            self._tid,
            self._cond,
            self._accumulator,
            self._manager,
            self._sender,
            self._http,
            self._check,
        )
        self._committer: ThreadPoolExecutor | None = None  # commit_transaction_async()'s thread

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
        record, size = record_of(key, value, timestamp, headers, self.config.message_max_bytes)
        key_bytes = record[1]
        on_delivery = on_delivery or callback or self.config.on_delivery
        accumulator = self._accumulator
        # A topic seen before needs no metadata call, and the lock is taken once; before a call,
        # a producer that may not produce says so first.
        count = self._partitions.known(topic)
        if count is None:
            with self._cond:
                self._check_can_produce()
            count = self._partitions.of(topic)
        with self._cond:
            self._check_can_produce()
            if partition is not None and partition != -1 and not 0 <= partition < count:
                raise UnknownTopicOrPartition(f"{topic} has {count} partitions, not {partition}")
            if accumulator.outstanding >= self.config.queue_buffering_max_messages:
                raise BufferError(
                    f"{accumulator.outstanding} records wait for delivery"
                    " (queue.buffering.max.messages); call poll() to serve delivery reports"
                )
            if partition is None or partition == -1:
                if key_bytes is not None:
                    partition = partition_for_key(key_bytes, count)
                else:
                    partition = accumulator.sticky_partition(topic, count)
            accumulator.append((topic, partition), record, size + RECORD_OVERHEAD, on_delivery)

    def poll(self, timeout: float | None = None) -> int:
        """Serve delivery callbacks; wait up to `timeout` seconds (None: until one arrives, or
        nothing is outstanding) for the first. Returns how many callbacks ran. Exceptions raised
        by a callback propagate; the remaining reports are served by the next call."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._accumulator.reports and self._accumulator.outstanding:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._cond.wait(remaining)
        return self._accumulator.serve_reports() + self._callbacks.serve()

    def flush(self, timeout: float | None = None) -> int:
        """Send every queued record without lingering and wait (up to `timeout` seconds; None:
        until done, at most `delivery.timeout.ms`) until each is reported, serving callbacks.
        Returns the number of records still outstanding (0 when all were reported)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._accumulator.wait_outstanding(deadline)
        self._callbacks.serve()
        with self._cond:
            return self._accumulator.outstanding

    def __len__(self) -> int:
        """Records queued or in flight, plus delivery reports not yet served."""
        with self._cond:
            return self._accumulator.outstanding + len(self._accumulator.reports)

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
        self._txn.init(
            self._http.deadline(timeout), self.config.transaction_timeout_ms, keep_prepared
        )

    def begin_transaction(self) -> None:
        """Start a transaction (locally; the coordinator hears of it with the first record or
        offsets). Raises `IllegalStateError` unless `init_transactions()` ran and no transaction
        is open; the producer's fatal error once one occurred."""
        self._require_transactional()
        with self._cond:
            self._check(Op.BEGIN)
            self._manager.enter(Op.BEGIN)

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
        self._txn.send_offsets(offsets, group_metadata, self._http.deadline(timeout))

    def send_share_acknowledgements_to_transaction(
        self,
        acknowledgements: Iterable[ShareAcknowledgement],
        group_metadata: ShareGroupMetadata,
        timeout: float | None = None,
    ) -> None:
        """Acknowledge a share consumer's records (from `consumer.take_acknowledgements()`,
        for `consumer.share_group_metadata()`) with this transaction: they apply only if it
        commits, together with its output, and an abort releases the records for delivery
        again. Until it ends, the records stay the consumer's, with no lock to run out.

        Raises:
        - `KafkaTimeoutError` (retriable): not done within `timeout`; call again.
        - an error with `txn_requires_abort`, such as the coordinator's INVALID_RECORD_STATE
          (the consumer no longer holds a record: its lock ran out first): call
          `abort_transaction()`; the records go to whoever holds them now.
        - `TransactionTimedOut`: call `init_transactions()`, then start over.
        - a fatal error (`ProducerFenced`...): close the producer.
        - `IllegalStateError`: no transaction is open.
        """
        self._require_transactional()
        self._txn.send_share_acks(
            list(acknowledgements), group_metadata, self._http.deadline(timeout)
        )

    def prepare_transaction(self, timeout: float | None = None) -> None:
        """Flush, then prepare the transaction: no more records or offsets may join, and the
        coordinator's normal timeout no longer aborts it. Finish it with `commit_transaction()`
        or `abort_transaction()`, here or in a new producer that ran
        `init_transactions(keep_prepared=True)`.

        Raises as `commit_transaction()` does; `KafkaTimeoutError` may be retried by calling
        `prepare_transaction()` again.
        """
        self._require_transactional()
        self._txn.prepare(self._http.deadline(timeout))

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
        self._txn.await_commit(deadline)
        with self._cond:
            state = self._check(Op.COMMIT)
        if state is TxnState.IN_TRANSACTION:
            self._txn.flush(deadline)
        self._txn.end(Op.COMMIT, deadline)

    def commit_transaction_async(self, timeout: float | None = None) -> Future[None]:
        """Commit the transaction in the background and return at once: the next transaction
        may begin and fill while this one's records are flushed and its EndTxn runs, so a
        producing loop does not wait for either (Kafka's clients wait in `commitTransaction()`).

        Returns a `concurrent.futures.Future`: its `result()` is None once the transaction is
        committed, or raises what `commit_transaction()` would have raised. Its records get
        `delivery.timeout.ms` to be delivered; its EndTxn then gets `timeout` (None:
        `default.api.timeout.ms`).

        The next transaction's records are queued meanwhile, and sent (under the epoch the commit's
        answer gives) once it is committed; its `send_offsets_to_transaction()`, and every other
        transaction call but `begin_transaction()` and `produce()`, first waits for the commit (a
        `KafkaTimeoutError` if it is still under way after the call's `timeout`; call again). If the
        commit fails, the transaction begun after it fails with it: its records are dropped unsent
        (their delivery reports carry a record's error that failed the commit, or `_PURGE_QUEUE`
        when EndTxn failed), and the producer is where a failed `commit_transaction()` would have
        left it: `abort_transaction()` after an error with `txn_requires_abort`,
        `commit_transaction()` again after a `KafkaTimeoutError`, `init_transactions()` after
        `TransactionTimedOut`, `close()` after a fatal error. `close()` waits for the commit (up to
        its `timeout`); if it gives up, the commit fails with `MessagePurged` and nothing of it is
        committed (the coordinator aborts it on its timeout).

        Raises at once (and nothing is committed): `IllegalStateError` if no transaction is
        open; the transaction's error if it already failed; `KafkaTimeoutError` if the previous
        background commit is still under way after `timeout`.
        """
        self._require_transactional()
        self._txn.await_commit(self._http.deadline(timeout))
        with self._cond:
            self._check(Op.COMMIT_ASYNC)
            manager = self._manager
            manager.end_identity()
            manager.pending = self._accumulator.seal_generation()
            manager.enter(Op.COMMIT_ASYNC)
            if self._committer is None:
                self._committer = ThreadPoolExecutor(1, thread_name_prefix="sdk-producer-commit")
            return self._committer.submit(self._txn.commit_in_background, manager.pending, timeout)

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
        self._txn.abort(self._http.deadline(timeout))

    def _transaction_identity(self) -> tuple[int, int]:
        """(producer id, epoch) of the current transaction: what a commit-group names it by
        (sdk.spark hands a prepared transaction to the driver this way)."""
        with self._cond:
            return self._manager.producer_id, self._manager.epoch

    def close(self, timeout: float | None = None) -> None:
        """Flush (an idempotent producer) or abort the open transaction (a transactional one; a
        prepared transaction is left for someone to finish), then release threads and
        connections. Records still outstanding after `timeout` are reported as purged. A closed
        producer refuses every call; closing again does nothing."""
        self._close_once(lambda: self._release(timeout))

    def _release(self, timeout: float | None) -> None:
        try:
            with contextlib.suppress(KafkaTimeoutError):
                self._txn.await_commit(self._http.deadline(timeout))
            if self._tid is None:
                self.flush(timeout)
            elif self._manager.state is TxnState.IN_TRANSACTION and self._manager.fatal is None:
                # Best effort: the coordinator aborts it on its timeout anyway.
                with contextlib.suppress(KafkaException):
                    self.abort_transaction(timeout)
        finally:
            self._sender.stop(MessagePurged("dropped by close()"))
            if self._committer is not None:
                self._committer.shutdown(wait=True)
            self._http.close()
            self._closed = True
            self._accumulator.serve_reports()

    # -- checks -------------------------------------------------------------------------------

    def _require_transactional(self) -> None:
        self._check_open()
        if self._tid is None:
            raise IllegalStateError("this producer has no transactional.id")

    def _check(self, op: Op) -> TxnState:
        """Whether `op` may run now (under the lock): the state it starts from, or the error."""
        if self._closed or self._sender.stopping:
            raise IllegalStateError("the producer is closed")
        return self._manager.check(op)

    def _check_can_produce(self) -> None:
        if self._tid is not None:
            self._check(Op.PRODUCE)
            return
        if self._closed or self._sender.stopping:
            raise IllegalStateError("the producer is closed")
        if self._manager.fatal is not None:
            raise self._manager.fatal

    def _statistics(self) -> dict[str, Any]:
        with self._cond:
            return {
                "msg_cnt": self._accumulator.outstanding,
                "txn_state": self._manager.state.value,
            }
