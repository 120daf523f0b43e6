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
    InvalidTxnState,
    KafkaException,
    KafkaTimeoutError,
    MessagePurged,
    MessageSizeTooLarge,
    TransactionTimedOut,
    UnknownTopicOrPartition,
)
from sdk._http import HttpClient, api_path
from sdk._lifecycle import Closeable
from sdk._partitioner import partition_for_key
from sdk._sender import SENDER_POOL_SIZE, Sender
from sdk._transaction_manager import Op, TransactionManager, TxnState
from sdk._types import ConsumerGroupMetadata, DeliveryCallback, Headers, TopicPartition

__all__ = ["Producer"]


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


def _end_body(producer_id: int, epoch: int, commit: bool) -> dict[str, Any]:
    """EndTxn's request: the transaction's identity, and whether it commits."""
    return {"producer_id": producer_id, "producer_epoch": epoch, "commit": commit}


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
        self._metadata: dict[str, int] = {}
        self._metadata_lock = threading.Lock()
        self._cond = threading.Condition()  # the producer's lock: guards the three parts
        self._callbacks = Callbacks(c, "producer", self._statistics)
        self._accumulator = Accumulator(self._cond, c.batch_size, c.delivery_timeout_ms / 1000)
        self._manager = TransactionManager(self._tid is not None, c.enable_idempotence)
        self._sender = Sender(
            c, self._cond, self._accumulator, self._manager, self._http, self._callbacks
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
        if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
            raise ValueError(f"timestamp: milliseconds since the epoch, not {timestamp!r}")
        key_bytes = _as_bytes(key, "key")
        value_bytes = _as_bytes(value, "value")
        header_pairs = _headers(headers)
        size = len(key_bytes or b"") + len(value_bytes or b"")
        if header_pairs:
            size += sum(len(n) + len(v) for n, v in header_pairs)
        if size > self.config.message_max_bytes:
            raise MessageSizeTooLarge(
                f"the record holds {size} bytes; message.max.bytes is "
                f"{self.config.message_max_bytes}"
            )
        record = (timestamp or time.time_ns() // 1_000_000, key_bytes, value_bytes, header_pairs)
        on_delivery = on_delivery or callback or self.config.on_delivery
        accumulator = self._accumulator
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
        deadline = self._http.deadline(timeout)
        self._await_commit(deadline)
        with self._cond:
            self._check(Op.INIT)
        body = {
            "transactional_id": self._tid,
            "transaction_timeout_ms": self.config.transaction_timeout_ms,
            "keep_prepared": keep_prepared,
        }
        answer = self._txn_call(Op.INIT, "POST", api_path("init-pid"), body, deadline)
        prepared = False
        if keep_prepared:
            described = self._txn_call(None, "GET", self._txn_path(), None, deadline)
            prepared = described.get("state") == "Prepared"
        with self._cond:
            self._manager.start_epoch(answer["producer_id"], answer["producer_epoch"])
            self._manager.enter(Op.INIT)
            if prepared:
                # An older instance's prepared transaction is this producer's to finish.
                self._manager.state = TxnState.PREPARED
                self._manager.touched = True

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
        deadline = self._http.deadline(timeout)
        self._await_commit(deadline)
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
            self._check(Op.SEND_OFFSETS)
            if not entries:
                return
            self._manager.touched = True
            pid, epoch = self._manager.producer_id, self._manager.epoch
        body: dict[str, Any] = {"producer_id": pid, "producer_epoch": epoch, "group_id": group_id}
        body["offsets"] = entries
        if isinstance(group_metadata, ConsumerGroupMetadata) and group_metadata.member_id:
            # KIP-447: the coordinator refuses them if this member no longer owns the partitions.
            body["member_id"] = group_metadata.member_id
            body["member_epoch"] = group_metadata.member_epoch
        self._txn_call(Op.SEND_OFFSETS, "POST", self._txn_path("offsets"), body, deadline)

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
        self._await_commit(deadline)
        with self._cond:
            self._check(Op.PREPARE)
        self._flush_transaction(deadline)
        with self._cond:
            self._check(Op.PREPARE)
            self._manager.touched = True
            pid, epoch = self._manager.producer_id, self._manager.epoch
        body = {"producer_id": pid, "producer_epoch": epoch}
        try:
            self._txn_call(Op.PREPARE, "POST", self._txn_path("prepare"), body, deadline)
        except InvalidTxnState:
            # A retried prepare whose first attempt was applied: check that it is ours.
            described = self._txn_call(None, "GET", self._txn_path(), None, deadline)
            if (described.get("state"), described.get("producer_epoch")) != ("Prepared", epoch):
                raise
        with self._cond:
            self._manager.enter(Op.PREPARE)

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
        self._await_commit(deadline)
        with self._cond:
            state = self._check(Op.COMMIT)
        if state is TxnState.IN_TRANSACTION:
            self._flush_transaction(deadline)
        self._end_transaction(Op.COMMIT, deadline)

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
        self._await_commit(self._http.deadline(timeout))
        with self._cond:
            self._check(Op.COMMIT_ASYNC)
            manager = self._manager
            manager.end_identity()
            manager.pending = self._accumulator.seal_generation()
            manager.enter(Op.COMMIT_ASYNC)
            if self._committer is None:
                self._committer = ThreadPoolExecutor(1, thread_name_prefix="sdk-producer-commit")
            return self._committer.submit(self._commit_in_background, manager.pending, timeout)

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
        self._await_commit(deadline)
        purged = MessagePurged("dropped by abort_transaction()")
        with self._cond:
            self._check(Op.ABORT)
            self._manager.enter(Op.ABORT)
            self._accumulator.purge(purged)
            # Answers of requests in flight must be in before EndTxn, so none can join later.
            while self._sender.inflight and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            if self._sender.inflight:
                raise KafkaTimeoutError("requests still in flight; call abort_transaction() again")
            self._accumulator.purge(purged)
        self._accumulator.serve_reports()
        with self._cond:
            self._check(Op.ABORT)
        self._end_transaction(Op.ABORT, deadline)

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
                self._await_commit(self._http.deadline(timeout))
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

    # -- metadata -------------------------------------------------------------------------------

    def _partition_count(self, topic: str) -> int:
        with self._metadata_lock:
            count = self._metadata.get(topic)
        if count is None:
            if not isinstance(topic, str):
                raise TypeError(f"topic must be str, not {type(topic).__name__}")
            described = self._http.call("GET", api_path("topics", topic))
            count = len(described["partitions"])
            with self._metadata_lock:
                self._metadata[topic] = count
        return count

    # -- the transaction's requests ---------------------------------------------------------------

    def _txn_path(self, *suffix: str) -> str:
        return api_path("transactions", self._tid or "", *suffix)

    def _flush_transaction(self, deadline: float) -> None:
        if not self._accumulator.wait_outstanding(deadline):
            raise KafkaTimeoutError("records still undelivered; call again to keep waiting")
        with self._cond:
            self._check_delivered()

    def _check_delivered(self) -> None:
        """Once no record of the transaction is outstanding (under the lock): raise unless every
        one was delivered, so that a transaction missing a record is never ended as committed."""
        manager = self._manager
        if manager.fatal is not None:
            raise manager.fatal
        if manager.error is not None:
            raise manager.error
        if self._sender.stopping:
            # close() purged what was unsent.
            raise MessagePurged(
                "the producer was closed before the transaction's records were delivered; "
                "it was not committed"
            )

    def _end_transaction(self, op: Op, deadline: float) -> None:
        """EndTxn: `op` is Op.COMMIT or Op.ABORT (checked by the caller)."""
        manager = self._manager
        with self._cond:
            manager.enter(op)
            if not manager.touched:
                # The coordinator never heard of this transaction: nothing to end there.
                manager.start_epoch(manager.producer_id, manager.epoch)
                manager.enter(Op.ENDED)
                return
            pid, epoch = manager.end_identity()
        commit = op is Op.COMMIT
        try:
            answer = self._txn_call(
                op, "POST", self._txn_path("end"), _end_body(pid, epoch, commit), deadline
            )
        except InvalidTxnState:
            if commit:
                raise
            # Nothing open at our epoch (no batch of it was ever written): nothing to abort.
            answer = {"producer_id": pid, "producer_epoch": epoch}
        with self._cond:
            manager.start_epoch(answer["producer_id"], answer["producer_epoch"])
            manager.enter(Op.ENDED)

    def _txn_call(
        self, op: Op | None, method: str, path: str, body: dict[str, Any] | None, deadline: float
    ) -> Any:
        """A request of `op` (None: a read that fails nothing), with retries; its errors change
        the producer's state as they must."""
        try:
            return self._http.call(method, path, body=body, deadline=deadline)
        except KafkaTimeoutError:
            raise
        except KafkaException as exc:
            with self._cond:
                failed = self._txn_failed(op, exc)
            raise failed from exc.__cause__

    def _txn_failed(self, op: Op | None, exc: KafkaException) -> KafkaException:
        """What a refused request of `op` does to the producer (under the lock); returns what
        the caller raises."""
        if exc.fatal:
            self._sender.set_fatal(exc)
        elif isinstance(exc, TransactionTimedOut):
            self._sender.timed_out(exc)
        elif op is not None:
            exc = self._manager.refused(op, exc)
        return exc

    # -- the commit in the background ------------------------------------------------------------

    def _await_commit(self, deadline: float) -> None:
        """Wait until no commit runs in the background; what it left (an error, a new epoch) is
        then the producer's state."""
        with self._cond:
            while self._manager.pending is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise KafkaTimeoutError(
                        "the commit of commit_transaction_async() is still under way; call again"
                    )
                self._cond.wait(remaining)

    def _commit_in_background(self, generation: int, timeout: float | None) -> None:
        """commit_transaction_async()'s work: wait until every batch of `generation` is
        reported, then EndTxn; the next generation's batches are sent after its answer."""
        manager = self._manager
        try:
            with self._cond:
                # Its batches are sealed and go without lingering; each is delivered, or fails
                # the transaction, within delivery.timeout.ms (close() purges them).
                while self._accumulator.holds(generation) and manager.error is None:
                    self._cond.wait()
                self._check_delivered()
                pid, epoch = manager.end_identity()
                if not manager.touched:
                    # The coordinator never heard of this transaction: nothing to end there.
                    self._committed(pid, epoch)
                    return
            body = _end_body(pid, epoch, commit=True)
            deadline = self._http.deadline(timeout)
            answer = self._http.call("POST", self._txn_path("end"), body=body, deadline=deadline)
        except KafkaException as exc:
            with self._cond:
                failed = self._background_commit_failed(exc)
            raise failed from exc.__cause__
        with self._cond:
            self._committed(answer["producer_id"], answer["producer_epoch"])

    def _committed(self, producer_id: int, epoch: int) -> None:
        """The background commit is done (under the lock): the next transaction's batches go
        under the new epoch."""
        self._manager.pending = None
        self._manager.start_epoch(producer_id, epoch)
        self._cond.notify_all()

    def _background_commit_failed(self, exc: KafkaException) -> KafkaException:
        """The background commit failed (under the lock): the transaction begun after it fails
        too (none of its records was sent), and the producer is where a failed
        commit_transaction() leaves it. Returns what the future raises."""
        manager = self._manager
        manager.pending = None
        self._accumulator.purge(MessagePurged(f"dropped: the commit before failed: {exc}"))
        if exc is manager.fatal or (exc is manager.error and manager.state is TxnState.NEEDS_INIT):
            pass  # the producer is failed, or (TransactionTimedOut) needs init_transactions()
        elif exc is manager.error:
            # A record failed it: the transaction is open and can only be aborted.
            manager.state = TxnState.IN_TRANSACTION
        else:
            # EndTxn was refused or not answered in time: as commit_transaction()'s.
            manager.state = TxnState.COMMITTING
            manager.error = None
            if not isinstance(exc, KafkaTimeoutError):
                exc = self._txn_failed(Op.COMMIT, exc)
        self._cond.notify_all()
        return exc
