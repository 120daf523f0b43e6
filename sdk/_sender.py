"""The producer's sender, as Kafka's `Sender`: one thread decides, under the producer's lock,
which batches go out (full, `linger.ms` old, or flushed) and which expire; a small pool sends
them on one pooled httpx client and applies each answer under the same lock: acknowledgement,
retry, reordering, failure, and the KIP-360 reset of an idempotent producer.

Ordering: a batch's sequence numbers are assigned once, at its first send, in queue order, and
never change within a (producer id, epoch): a retry resends the same body, which the service
answers with the original offsets if it had written it. The body is built (and compressed)
outside the lock, in the send job, so `produce()` never waits on it. Several batches of a
partition may be in flight, and concurrent requests race to the service: a batch sent while an
earlier one was unacknowledged that is refused as OUT_OF_ORDER_SEQUENCE_NUMBER or
UNKNOWN_PRODUCER_ID overtook its predecessor, and is resent as soon as that one is acknowledged;
nothing after it in the partition is sent before it (the service writes nothing past a gap).
After a failed attempt (no answer, or a retriable one) the partition "recovers": nothing new is
sent, in-flight answers are awaited, then unacknowledged batches are resent in order, one at a
time. The same answer for a batch sent with every predecessor acknowledged is real: an idempotent
producer then takes a new producer id and renumbers what is unacknowledged (KIP-360) once no
batch is left in doubt (sent, answer lost) that could still be written; a transactional producer
must abort (EndTxn raises the epoch).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from sdk import recordbatch
from sdk._accumulator import Accumulator, Batch, PartitionQueue
from sdk._callbacks import Callbacks
from sdk._config import ProducerConfig
from sdk._errors import KafkaError, KafkaException, MessageTimedOut, TransportError
from sdk._http import RECORD_BATCH, HttpClient, api_path
from sdk._transaction_manager import TransactionManager

__all__ = ["SENDER_POOL_SIZE", "Sender"]

SENDER_POOL_SIZE = 8
_REORDER_CODES = (KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.UNKNOWN_PRODUCER_ID)

Job = Callable[[], None]


class Sender:
    def __init__(
        self,
        config: ProducerConfig,
        cond: threading.Condition,
        accumulator: Accumulator,
        manager: TransactionManager,
        http: HttpClient,
        callbacks: Callbacks,
    ) -> None:
        self._config = config
        self._cond = cond
        self._accumulator = accumulator
        self._manager = manager
        self._http = http
        self._callbacks = callbacks
        self._compression = recordbatch.CODECS[config.compression_type]
        tid = config.transactional_id
        self._produce_params = {"transactional_id": tid} if tid else None
        self._linger = config.linger_ms / 1000
        self.inflight = 0  # requests the pool is running (produce, InitPid)
        self.stopping = False
        self._pid_inflight = False
        self._pid_attempts = 0
        self._pid_retry_at = 0.0
        self._reset_pending = False  # KIP-360: take a new producer id once nothing is in doubt
        self._pool = ThreadPoolExecutor(SENDER_POOL_SIZE, thread_name_prefix="sdk-producer-io")
        self._thread = threading.Thread(target=self._run, name="sdk-producer-sender", daemon=True)
        self._thread.start()

    def stop(self, error: KafkaException) -> None:
        """Purge what was not sent with `error`, let the requests in flight finish, and stop."""
        with self._cond:
            self.stopping = True
            self._accumulator.purge(error)
            self._cond.notify_all()
        self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def set_fatal(self, error: KafkaException) -> None:
        """The producer can do nothing more: fail everything unsent (under the lock)."""
        if self._manager.fatal is None:
            self._callbacks.error(error.error)
            self._manager.fatal = error
            self._accumulator.purge(error)
            self._cond.notify_all()

    def timed_out(self, error: KafkaException) -> None:
        """The coordinator aborted the transaction on its timeout (under the lock)."""
        self._manager.timed_out(error)
        self._accumulator.purge(error)

    # -- what to send ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            with self._cond:
                while not self.stopping:
                    jobs, wake_at = self._plan(time.monotonic())
                    for job in jobs:
                        self._pool.submit(job)
                    if not jobs:
                        now = time.monotonic()
                        self._cond.wait(None if wake_at is None else max(0.0, wake_at - now))
        except Exception as exc:  # a bug: fail every caller loudly rather than leave them waiting
            self._callbacks.log.exception("the producer's sender thread failed")
            with self._cond:
                self.set_fatal(KafkaException(f"the sender thread failed: {exc!r}", fatal=True))

    def _plan(self, now: float) -> tuple[list[Job], float | None]:
        """What to send now, and when to look again (under the lock)."""
        jobs: list[Job] = []
        wake: list[float] = []
        manager = self._manager
        if manager.fatal is not None:
            self._accumulator.purge(manager.fatal)
            return jobs, None
        self._expire(now, wake)
        if not manager.may_send():
            return jobs, _earliest(wake)
        if (
            not manager.transactional
            and manager.idempotent
            and (manager.producer_id < 0 or self._reset_pending)
            and self._plan_producer_id(now, jobs, wake)
        ):
            return jobs, _earliest(wake)
        for part in self._accumulator.partitions.values():
            self._plan_partition(part, now, jobs, wake)
        return jobs, _earliest(wake)

    def _plan_producer_id(self, now: float, jobs: list[Job], wake: list[float]) -> bool:
        """Idempotent producer: get a producer id when it has none, or (KIP-360) a new one once
        no request is in flight and no batch in doubt could still be written under the old one.
        Returns True when nothing may be sent yet."""
        partitions = self._accumulator.partitions.values()
        if self._manager.producer_id >= 0:
            # Reset pending: first settle every batch in doubt at the head of its partition (a
            # later one cannot have been written while the head was not), under the old id.
            unsettled = False
            for part in partitions:
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
            if unsettled or self.inflight:
                return True
        if self._pid_inflight or not any(p.queue for p in partitions):
            return True
        if self._pid_retry_at > now:
            wake.append(self._pid_retry_at)
            return True
        self._pid_inflight = True
        self.inflight += 1
        jobs.append(self._init_pid_job)
        return True

    def _plan_partition(
        self, part: PartitionQueue, now: float, jobs: list[Job], wake: list[float]
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
        limit = self._config.max_in_flight_requests_per_connection
        head = part.head_unacked()
        if head is not None and head.needs_send and part.inflight < limit:
            # It overtook a predecessor that is now acknowledged: it goes through this time.
            jobs.append(self._send(part, head))
        for batch in part.queue:
            if part.inflight >= limit:
                return
            if batch.needs_send:
                # It overtook a predecessor and waits for it: the service writes nothing past
                # that gap, so a batch sent behind it now would only be refused as well.
                return
            if batch.sequence is not None or batch.acked:
                continue
            if self._manager.holds_back(batch.generation):
                return  # it waits for the epoch of the commit under way
            ready_at = batch.created + self._linger
            if not (batch.sealed or self._accumulator.flushing or ready_at <= now):
                wake.append(ready_at)
                return
            jobs.append(self._send(part, batch))

    def _send(self, part: PartitionQueue, batch: Batch) -> Job:
        """Mark `batch` sent and return the job that sends it. Its first send seals it and
        takes its sequence here, under the lock; the job builds (and compresses) its body
        outside the lock, once, and keeps it for retries, so produce() never waits on it."""
        build: Callable[[], bytes] | None = None
        manager = self._manager
        if batch.sequence is None:
            batch.sealed = True
            batch.sequence = manager.next_sequence(batch.tp, len(batch.records))
            producer_id, epoch = manager.batch_identity()
            build = partial(
                recordbatch.build,
                batch.records,
                compression=self._compression,
                producer_id=producer_id,
                producer_epoch=epoch,
                base_sequence=batch.sequence,
                transactional=manager.transactional,
            )
            if manager.transactional:
                # The coordinator may hold an open transaction of ours from now on.
                manager.touched = True
        batch.sent_as_head = all(b.acked for b in part.before(batch))
        batch.inflight = True
        batch.needs_send = False
        part.inflight += 1
        self.inflight += 1
        return lambda: self._produce_job(part, batch, build)

    def _expire(self, now: float, wake: list[float]) -> None:
        for part in self._accumulator.partitions.values():
            for batch in [b for b in part.queue if not b.inflight and not b.acked]:
                if batch.deadline > now:
                    wake.append(batch.deadline)
                    continue
                doubt = "; it may have been written" if batch.in_doubt else ""
                error = MessageTimedOut(
                    f"not delivered within delivery.timeout.ms "
                    f"({self._config.delivery_timeout_ms} ms){doubt}"
                )
                self._fail(part, batch, error)

    # -- sending, and the answers (run in the pool, applied under the lock) ----------------------

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

    def _produce_job(
        self, part: PartitionQueue, batch: Batch, build: Callable[[], bytes] | None
    ) -> None:
        topic, partition = batch.tp
        if build is not None:
            # A sealed batch in flight: no other thread touches its records or its body.
            batch.body = build()
        assert batch.body is not None
        path = api_path("topics", topic, "partitions", partition, "records")
        outcome = self._request("POST", path, batch.body, self._produce_params)
        with self._cond:
            self.inflight -= 1
            part.inflight -= 1
            batch.inflight = False
            self._on_produce(part, batch, outcome)
            self._cond.notify_all()

    def _on_produce(
        self, part: PartitionQueue, batch: Batch, outcome: dict[str, Any] | KafkaException
    ) -> None:
        if isinstance(outcome, dict):
            batch.acked = True
            batch.in_doubt = False
            batch.base_offset = outcome["base_offset"]
            self._accumulator.complete(part)
            return
        error = outcome
        if error.retriable:
            batch.in_doubt = batch.in_doubt or isinstance(error, TransportError)
            batch.attempts += 1
            if batch.attempts > self._config.retries:
                self._fail(part, batch, error)
                return
            batch.needs_send = True
            batch.retry_at = time.monotonic() + self._http.backoff(batch.attempts - 1)
            part.recovering = True
            return
        if error.code in _REORDER_CODES and not batch.sent_as_head:
            # It overtook an unacknowledged predecessor: send it again once that one is
            # acknowledged. Concurrent requests race to the service, so this happens; nothing
            # later in the partition is sent before it goes again (the service writes nothing
            # past a gap, so each would be refused too).
            batch.needs_send = True
            return
        if error.fatal:
            self._fail(part, batch, error)
            self.set_fatal(error)
            return
        manager = self._manager
        if not manager.transactional and manager.idempotent and error.code in _REORDER_CODES:
            # KIP-360: the service lost this producer's state on the partition. Nothing later
            # can be written under the old id either, so renumber under a new one.
            batch.in_doubt = False
            batch.needs_send = False
            self._reset_pending = True
            return
        self._fail(part, batch, error)

    def _fail(self, part: PartitionQueue, batch: Batch, error: KafkaException) -> None:
        """Report `batch` failed and drop it; a hole in the sequence (or the transaction) must
        then be dealt with: a new producer id, or the transaction's abort."""
        self._accumulator.drop(part, batch, error)
        manager = self._manager
        if manager.transactional:
            purge_with = manager.record_failed(error)
            if purge_with is not None:
                self._accumulator.purge(purge_with)
        elif manager.idempotent and batch.sequence is not None:
            self._reset_pending = True

    def _init_pid_job(self) -> None:
        outcome = self._request("POST", api_path("init-pid"), {"transactional_id": None})
        with self._cond:
            self.inflight -= 1
            self._pid_inflight = False
            if isinstance(outcome, dict):
                self._manager.start_epoch(outcome["producer_id"], outcome["producer_epoch"])
                self._pid_attempts = 0
                self._reset_pending = False
                for part in self._accumulator.partitions.values():
                    part.recovering = False
                    for batch in part.queue:
                        batch.sequence = batch.body = None
                        batch.needs_send = batch.in_doubt = False
            elif outcome.retriable:
                self._pid_retry_at = time.monotonic() + self._http.backoff(self._pid_attempts)
                self._pid_attempts += 1
            else:
                self.set_fatal(outcome)
            self._cond.notify_all()


def _earliest(times: Sequence[float]) -> float | None:
    return min(times) if times else None
