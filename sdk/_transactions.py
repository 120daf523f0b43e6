"""The transactional producer's requests (`sdk.Producer`'s transaction calls): InitPid, the
transaction's offsets, prepare and EndTxn through the coordinator's transaction endpoints, each
refusal applied to the transaction manager's state, and the commit that runs in the background
(`commit_transaction_async()`). It shares the producer's lock with the other parts."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sdk._accumulator import Accumulator
from sdk._errors import (
    InvalidTxnState,
    KafkaException,
    KafkaTimeoutError,
    MessagePurged,
    TransactionTimedOut,
)
from sdk._http import HttpClient, api_path
from sdk._sender import Sender
from sdk._share_consumer import ShareAcknowledgement, ShareGroupMetadata
from sdk._transaction_manager import Op, TransactionManager, TxnState
from sdk._types import ConsumerGroupMetadata, TopicPartition

__all__ = ["TransactionCalls", "end_body"]


def end_body(producer_id: int, epoch: int, commit: bool) -> dict[str, Any]:
    """EndTxn's request: the transaction's identity, and whether it commits."""
    return {"producer_id": producer_id, "producer_epoch": epoch, "commit": commit}


class TransactionCalls:
    """The transaction's requests of one producer, under its lock `cond`."""

    def __init__(
        self,
        transactional_id: str | None,
        cond: threading.Condition,
        accumulator: Accumulator,
        manager: TransactionManager,
        sender: Sender,
        http: HttpClient,
        check: Callable[[Op], TxnState],
    ) -> None:
        self._tid = transactional_id
        # Whether an operation may run now (under the lock): the producer's check.
        self._check = check
        self._cond = cond
        self._accumulator = accumulator
        self._manager = manager
        self._sender = sender
        self._http = http

    def init(self, deadline: float, timeout_ms: int, keep_prepared: bool) -> None:
        """`Producer.init_transactions()`."""
        self.await_commit(deadline)
        with self._cond:
            self._check(Op.INIT)
        body = {
            "transactional_id": self._tid,
            "transaction_timeout_ms": timeout_ms,
            "keep_prepared": keep_prepared,
        }
        answer = self.call(Op.INIT, "POST", api_path("init-pid"), body, deadline)
        prepared = False
        if keep_prepared:
            described = self.call(None, "GET", self.path(), None, deadline)
            prepared = described.get("state") == "Prepared"
        with self._cond:
            self._manager.start_epoch(answer["producer_id"], answer["producer_epoch"])
            self._manager.enter(Op.INIT)
            if prepared:
                # An older instance's prepared transaction is this producer's to finish.
                self._manager.state = TxnState.PREPARED
                self._manager.touched = True

    def send_offsets(
        self,
        offsets: Iterable[TopicPartition],
        group_metadata: ConsumerGroupMetadata | str,
        deadline: float,
    ) -> None:
        """`Producer.send_offsets_to_transaction()`."""
        self.await_commit(deadline)
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
        self.call(Op.SEND_OFFSETS, "POST", self.path("offsets"), body, deadline)

    def send_share_acks(
        self, acks: Sequence[ShareAcknowledgement], metadata: ShareGroupMetadata, deadline: float
    ) -> None:
        """`Producer.send_share_acknowledgements_to_transaction()`."""
        self.await_commit(deadline)
        with self._cond:
            self._check(Op.SEND_OFFSETS)
            if not acks:
                return
            self._manager.touched = True
            pid, epoch = self._manager.producer_id, self._manager.epoch
        body: dict[str, Any] = {"producer_id": pid, "producer_epoch": epoch}
        body |= {"group_id": metadata.group_id, "member_id": metadata.member_id}
        body["acknowledgements"] = [a.body() for a in acks]
        self.call(Op.SEND_OFFSETS, "POST", self.path("share-acknowledgements"), body, deadline)

    def prepare(self, deadline: float) -> None:
        """`Producer.prepare_transaction()`."""
        self.await_commit(deadline)
        with self._cond:
            self._check(Op.PREPARE)
        self.flush(deadline)
        with self._cond:
            self._check(Op.PREPARE)
            self._manager.touched = True
            pid, epoch = self._manager.producer_id, self._manager.epoch
        body = {"producer_id": pid, "producer_epoch": epoch}
        try:
            self.call(Op.PREPARE, "POST", self.path("prepare"), body, deadline)
        except InvalidTxnState:
            # A retried prepare whose first attempt was applied: check that it is ours.
            described = self.call(None, "GET", self.path(), None, deadline)
            if (described.get("state"), described.get("producer_epoch")) != ("Prepared", epoch):
                raise
        with self._cond:
            self._manager.enter(Op.PREPARE)

    def abort(self, deadline: float) -> None:
        """`Producer.abort_transaction()`."""
        self.await_commit(deadline)
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
        self.end(Op.ABORT, deadline)

    def path(self, *suffix: str) -> str:
        return api_path("transactions", self._tid or "", *suffix)

    def flush(self, deadline: float) -> None:
        if not self._accumulator.wait_outstanding(deadline):
            raise KafkaTimeoutError("records still undelivered; call again to keep waiting")
        with self._cond:
            self.check_delivered()

    def check_delivered(self) -> None:
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

    def end(self, op: Op, deadline: float) -> None:
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
            answer = self.call(op, "POST", self.path("end"), end_body(pid, epoch, commit), deadline)
        except InvalidTxnState:
            if commit:
                raise
            # Nothing open at our epoch (no batch of it was ever written): nothing to abort.
            answer = {"producer_id": pid, "producer_epoch": epoch}
        with self._cond:
            manager.start_epoch(answer["producer_id"], answer["producer_epoch"])
            manager.enter(Op.ENDED)

    def call(
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
                failed = self.failed(op, exc)
            raise failed from exc.__cause__

    def failed(self, op: Op | None, exc: KafkaException) -> KafkaException:
        """What a refused request of `op` does to the producer (under the lock); returns what
        the caller raises."""
        if exc.fatal:
            self._sender.set_fatal(exc)
        elif isinstance(exc, TransactionTimedOut):
            self._sender.timed_out(exc)
        elif op is not None:
            exc = self._manager.refused(op, exc)
        return exc

    def await_commit(self, deadline: float) -> None:
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

    def commit_in_background(self, generation: int, timeout: float | None) -> None:
        """commit_transaction_async()'s work: wait until every batch of `generation` is
        reported, then EndTxn; the next generation's batches are sent after its answer."""
        manager = self._manager
        try:
            with self._cond:
                # Its batches are sealed and go without lingering; each is delivered, or fails
                # the transaction, within delivery.timeout.ms (close() purges them).
                while self._accumulator.holds(generation) and manager.error is None:
                    self._cond.wait()
                self.check_delivered()
                pid, epoch = manager.end_identity()
                if not manager.touched:
                    # The coordinator never heard of this transaction: nothing to end there.
                    self.committed(pid, epoch)
                    return
            body = end_body(pid, epoch, commit=True)
            deadline = self._http.deadline(timeout)
            answer = self._http.call("POST", self.path("end"), body=body, deadline=deadline)
        except KafkaException as exc:
            with self._cond:
                failed = self.background_commit_failed(exc)
            raise failed from exc.__cause__
        with self._cond:
            self.committed(answer["producer_id"], answer["producer_epoch"])

    def committed(self, producer_id: int, epoch: int) -> None:
        """The background commit is done (under the lock): the next transaction's batches go
        under the new epoch."""
        self._manager.pending = None
        self._manager.start_epoch(producer_id, epoch)
        self._cond.notify_all()

    def background_commit_failed(self, exc: KafkaException) -> KafkaException:
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
                exc = self.failed(Op.COMMIT, exc)
        self._cond.notify_all()
        return exc
