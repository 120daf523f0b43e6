"""The SDK producer's sequencing, retries and recovery, and its transaction states, without a
service: the coordinator is a fake behind an httpx transport (as Kafka's SenderTest puts a mock
client under its sender), which applies the HTTP API's idempotence rules to the batches it gets and
answers what a test scripts (a retriable refusal, a lost answer, a lost producer state).

The end-to-end tests against the service are in test_sdk_producer and test_sdk_transactions.
"""

from __future__ import annotations

import re
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

import sdk
from sdk import recordbatch
from sdk._transaction_manager import (
    SEQUENCE_MODULUS,
    TRANSITIONS,
    Op,
    TransactionManager,
    TxnState,
)

# What the fake answers a produce call instead of applying it, or how it loses the answer.
UNAVAILABLE = "unavailable"  # 503 COORDINATOR_NOT_AVAILABLE, retriable: nothing written
LOST = "lost"  # the batch is applied, the answer never arrives
UNKNOWN_PRODUCER = "unknown producer"  # 409 UNKNOWN_PRODUCER_ID: the state is gone
INVALID = "invalid"  # 400 INVALID_RECORD: the batch's own fault, not retriable


@dataclass
class Written:
    producer_id: int
    epoch: int
    base_sequence: int
    values: list[bytes]


@dataclass
class FakeCoordinator:
    """A topic `t` of `partitions` partitions, the producer ids it hands out, and the ends of
    transactions (KIP-890: each raises the producer's epoch)."""

    partitions: int = 1
    faults: deque[str] = field(default_factory=deque)
    logs: dict[int, list[Written]] = field(default_factory=dict)
    produce_calls: list[tuple[int, int, int]] = field(default_factory=list)  # pid, part, seq
    epochs: list[int] = field(default_factory=list)  # each produce call's epoch
    init_pid_calls: int = 0
    ends: list[bool] = field(default_factory=list)  # each EndTxn's commit
    # The first produce call waits for this before the fake reads it, as a request slow on its
    # connection: the next one gets there first.
    held: threading.Event | None = None
    _transactional: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> pid, epoch
    _first_held: bool = False
    _next_pid: int = 1000
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self._answer)

    def producer(self, **config: Any) -> sdk.Producer:
        settings = {"coordinator.url": "http://fake", "retry.backoff.ms": 1, **config}
        return sdk.Producer(settings, transport=self.transport())

    def values(self, partition: int = 0) -> list[bytes]:
        return [v for written in self.logs.get(partition, []) for v in written.values]

    def _answer(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if self.held is not None and path.endswith("/records"):
            with self._lock:
                hold, self._first_held = not self._first_held, True
            if hold and not self.held.wait(5):
                return _problem(500, "HELD", "the test never released the first call")
        with self._lock:
            if path == "/v1/init-pid":
                self.init_pid_calls += 1
                return _json(self._init_pid(orjson.loads(request.content)["transactional_id"]))
            if path == "/v1/transactions/tx/end":
                body = orjson.loads(request.content)
                self.ends.append(body["commit"])
                pid, epoch = self._transactional["tx"]
                self._transactional["tx"] = (pid, epoch + 1)
                state = "CompleteCommit" if body["commit"] else "CompleteAbort"
                return _json({"state": state, "producer_id": pid, "producer_epoch": epoch + 1})
            if path == "/v1/topics/t" and request.method == "GET":
                return _json({"name": "t", "partitions": [{} for _ in range(self.partitions)]})
            prefix = "/v1/topics/t/partitions/"
            if path.startswith(prefix) and path.endswith("/records"):
                partition = int(path[len(prefix) : -len("/records")])
                return self._produce(partition, request.content)
        return _problem(404, "NOT_FOUND", f"the fake does not answer {request.method} {path}")

    def _init_pid(self, transactional_id: str | None) -> dict[str, int]:
        if transactional_id is None or transactional_id not in self._transactional:
            self._next_pid += 1
            pid, epoch = self._next_pid, 0
        else:
            pid, epoch = self._transactional[transactional_id]
            epoch += 1
        if transactional_id is not None:
            self._transactional[transactional_id] = (pid, epoch)
        return {"producer_id": pid, "producer_epoch": epoch}

    def _produce(self, partition: int, body: bytes) -> httpx.Response:
        header = recordbatch.read_header(body)
        pid, epoch, sequence = header.producer_id, header.producer_epoch, header.base_sequence
        self.produce_calls.append((pid, partition, sequence))
        self.epochs.append(epoch)
        fault = self.faults.popleft() if self.faults else None
        if fault == UNAVAILABLE:
            return _problem(503, "COORDINATOR_NOT_AVAILABLE", "try again", retriable=True)
        if fault == UNKNOWN_PRODUCER:
            return _problem(409, "UNKNOWN_PRODUCER_ID", "the producer's state is gone")
        if fault == INVALID:
            return _problem(400, "INVALID_RECORD", "the fake refuses this batch")
        values = [r.value or b"" for r in recordbatch.records(body)]
        log = self.logs.setdefault(partition, [])
        offset = sum(len(w.values) for w in log)
        mine = [w for w in log if (w.producer_id, w.epoch) == (pid, epoch)]
        answer: dict[str, Any]
        original = next((w for w in mine if w.base_sequence == sequence), None)
        if original is not None:  # a retry of a written batch
            before = sum(len(w.values) for w in log[: log.index(original)])
            answer = {"base_offset": before, "last_offset": before + len(values) - 1}
            answer["duplicate"] = True
        else:
            expected = 0 if not mine else mine[-1].base_sequence + len(mine[-1].values)
            if sequence != expected:
                detail = f"expected sequence {expected}, got {sequence}"
                return _problem(409, "OUT_OF_ORDER_SEQUENCE_NUMBER", detail)
            log.append(Written(pid, epoch, sequence, values))
            answer = {"base_offset": offset, "last_offset": offset + len(values) - 1}
            answer["duplicate"] = False
        if fault == LOST:
            raise httpx.ReadError("the answer was lost")
        return _json(answer)


def _json(body: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, content=orjson.dumps(body))


def _problem(status: int, code: str, detail: str, retriable: bool = False) -> httpx.Response:
    doc = {"title": code, "status": status, "detail": detail, "code": code}
    return httpx.Response(status, content=orjson.dumps({**doc, "retriable": retriable}))


Reports = list[tuple[sdk.KafkaError | None, bytes | None]]


def reporting(reports: Reports) -> Callable[[Any, Any], None]:
    def on_delivery(error: Any, message: Any) -> None:
        reports.append((error, message.value()))

    return on_delivery


def test_batches_of_a_partition_carry_consecutive_sequences() -> None:
    fake = FakeCoordinator()
    reports: Reports = []
    with fake.producer(**{"linger.ms": 0}) as producer:
        for value in (b"a", b"b", b"c"):
            producer.produce("t", value, partition=0, on_delivery=reporting(reports))
            producer.flush(5)

    assert reports == [(None, b"a"), (None, b"b"), (None, b"c")]
    assert fake.values() == [b"a", b"b", b"c"]
    assert [sequence for _, _, sequence in fake.produce_calls] == [0, 1, 2]


def test_a_retriable_refusal_is_sent_again_as_it_was() -> None:
    fake = FakeCoordinator(faults=deque([UNAVAILABLE, UNAVAILABLE]))
    reports: Reports = []
    with fake.producer() as producer:
        producer.produce("t", b"a", partition=0, on_delivery=reporting(reports))
        producer.produce("t", b"b", partition=0, on_delivery=reporting(reports))
        producer.flush(5)

    assert reports == [(None, b"a"), (None, b"b")]
    assert fake.values() == [b"a", b"b"]
    pids = {pid for pid, _, _ in fake.produce_calls}
    assert len(pids) == 1 and fake.init_pid_calls == 1  # the same producer, the same batch


def test_a_lost_answer_is_retried_and_found_a_duplicate() -> None:
    fake = FakeCoordinator(faults=deque([LOST]))
    reports: Reports = []
    with fake.producer() as producer:
        producer.produce("t", b"a", partition=0, on_delivery=reporting(reports))
        producer.flush(5)
        producer.produce("t", b"b", partition=0, on_delivery=reporting(reports))
        producer.flush(5)

    assert reports == [(None, b"a"), (None, b"b")]
    assert fake.values() == [b"a", b"b"]  # written once, though sent twice
    assert [sequence for _, _, sequence in fake.produce_calls] == [0, 0, 1]


def test_a_batch_that_overtook_its_predecessor_holds_back_the_partition_until_it_goes_again() -> (
    None
):
    """Batch 1 reaches the coordinator before batch 0 and is refused out of order; the service
    writes nothing past that gap, so nothing produced after it is sent before it goes again."""
    fake = FakeCoordinator(held=threading.Event())
    refused, planned_behind = threading.Event(), threading.Event()
    reports: Reports = []
    config = {"linger.ms": 0, "batch.size": 1}  # a batch per record, sent at once
    with fake.producer(**config) as producer:
        sender, partitions = producer._sender, producer._accumulator.partitions
        plan = sender._plan

        def watched(now: float) -> Any:
            planned = plan(now)
            queue = partitions[("t", 0)].queue if ("t", 0) in partitions else []
            if any(batch.needs_send for batch in queue):
                refused.set()
                if len(queue) == 4:  # c and d were there to send: batch 0 may go on
                    planned_behind.set()
                    fake.held.set()  # type: ignore[union-attr]
            return planned

        sender._plan = watched  # type: ignore[method-assign]
        for value in (b"a", b"b"):
            producer.produce("t", value, partition=0, on_delivery=reporting(reports))
        assert refused.wait(5)
        for value in (b"c", b"d"):
            producer.produce("t", value, partition=0, on_delivery=reporting(reports))
        assert planned_behind.wait(5)
        producer.flush(5)

    assert reports == [(None, v) for v in (b"a", b"b", b"c", b"d")]
    assert fake.values() == [b"a", b"b", b"c", b"d"]
    sequences = [sequence for _, _, sequence in fake.produce_calls]
    assert sequences[:2] == [1, 0]  # b came first and was refused
    resent = sequences.index(1, 1)
    assert sequences.index(2) > resent and sequences.index(3) > resent


def test_a_lost_producer_state_takes_a_new_producer_id_and_numbers_again_from_zero() -> None:
    """KIP-360: UNKNOWN_PRODUCER_ID for an idempotent producer is not the records' failure."""
    fake = FakeCoordinator()
    reports: Reports = []
    with fake.producer() as producer:
        producer.produce("t", b"a", partition=0, on_delivery=reporting(reports))
        producer.flush(5)
        fake.faults.append(UNKNOWN_PRODUCER)
        producer.produce("t", b"b", partition=0, on_delivery=reporting(reports))
        producer.flush(5)

    assert reports == [(None, b"a"), (None, b"b")]
    assert fake.values() == [b"a", b"b"]
    first, refused, again = fake.produce_calls
    assert fake.init_pid_calls == 2
    assert refused[0] == first[0] and refused[2] == 1
    assert again[0] != first[0] and again[2] == 0


def test_retries_exhausted_fail_the_records_and_the_next_batch_starts_a_new_producer_id() -> None:
    fake = FakeCoordinator(faults=deque([UNAVAILABLE] * 3))
    reports: Reports = []
    with fake.producer(retries=2) as producer:
        producer.produce("t", b"a", partition=0, on_delivery=reporting(reports))
        producer.flush(5)
        producer.produce("t", b"b", partition=0, on_delivery=reporting(reports))
        producer.flush(5)

    (error, value), delivered = reports
    assert value == b"a" and error is not None and error.name() == "COORDINATOR_NOT_AVAILABLE"
    assert delivered == (None, b"b")
    assert fake.values() == [b"b"]
    # A hole in the sequence cannot be sent over: "b" went under a new producer id, from 0.
    assert fake.init_pid_calls == 2
    assert fake.produce_calls[-1][2] == 0 and fake.produce_calls[-1][0] != fake.produce_calls[0][0]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda p: p.begin_transaction(), "begin_transaction() is not allowed uninitialized"),
        (lambda p: p.commit_transaction(1), "commit_transaction() is not allowed uninitialized"),
        (lambda p: p.abort_transaction(1), "abort_transaction() is not allowed uninitialized"),
        (lambda p: p.produce("t", b"v", partition=0), "produce() is not allowed uninitialized"),
    ],
)
def test_a_transactional_producer_before_init_refuses_every_transaction_call(
    call: Callable[[sdk.Producer], Any], message: str
) -> None:
    fake = FakeCoordinator()
    refused = pytest.raises(sdk.IllegalStateError, match=re.escape(message))
    with fake.producer(**{"transactional.id": "tx"}) as producer, refused:
        call(producer)
    assert fake.produce_calls == [] and fake.init_pid_calls == 0


def test_each_transaction_commits_and_the_next_runs_at_the_epoch_its_end_gave() -> None:
    fake = FakeCoordinator()
    reports: Reports = []
    with fake.producer(**{"transactional.id": "tx"}) as producer:
        producer.init_transactions(5)
        for value in (b"a", b"b"):
            producer.begin_transaction()
            producer.produce("t", value, partition=0, on_delivery=reporting(reports))
            producer.commit_transaction(5)

    assert reports == [(None, b"a"), (None, b"b")]
    assert fake.ends == [True, True]
    # One producer id; each transaction at its own epoch, its sequences from 0.
    assert len({pid for pid, _, _ in fake.produce_calls}) == 1
    assert fake.epochs == [0, 1]
    assert [sequence for _, _, sequence in fake.produce_calls] == [0, 0]


def test_a_record_the_coordinator_refuses_fails_the_transaction_until_it_is_aborted() -> None:
    fake = FakeCoordinator(faults=deque([INVALID]))
    reports: Reports = []
    with fake.producer(**{"transactional.id": "tx"}) as producer:
        producer.init_transactions(5)
        producer.begin_transaction()
        producer.produce("t", b"a", partition=0, on_delivery=reporting(reports))
        with pytest.raises(sdk.KafkaException) as failed:
            producer.commit_transaction(5)
        assert failed.value.args[0].txn_requires_abort()
        assert failed.value.args[0].name() == "INVALID_RECORD"
        producer.abort_transaction(5)
        producer.begin_transaction()  # the next transaction may start
        producer.produce("t", b"b", partition=0, on_delivery=reporting(reports))
        producer.commit_transaction(5)

    assert [(e is None, v) for e, v in reports] == [(False, b"a"), (True, b"b")]
    assert fake.ends == [False, True]
    assert fake.values() == [b"b"]


def test_produce_never_waits_for_a_batch_being_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building and compressing a batch happens outside the producer's lock: while one is being
    built (held here until the test lets it go), produce() still queues records at once."""
    from sdk import recordbatch

    building, release = threading.Event(), threading.Event()
    build = recordbatch.build

    def held(*args: Any, **kwargs: Any) -> bytes:
        building.set()
        release.wait()
        return build(*args, **kwargs)

    monkeypatch.setattr(recordbatch, "build", held)
    fake = FakeCoordinator()
    reports: Reports = []
    with fake.producer(**{"linger.ms": 0}) as producer:
        producer.produce("t", b"a", partition=0, on_delivery=reporting(reports))
        assert building.wait(10)
        queued = threading.Thread(
            target=producer.produce, args=("t", b"b"), kwargs={"partition": 0}
        )
        queued.start()
        queued.join(10)
        blocked = queued.is_alive()
        release.set()
        queued.join()
        producer.flush(5)

    assert not blocked
    assert reports == [(None, b"a")]
    assert fake.values() == [b"a", b"b"]


# -- the transaction manager: its table, without a producer ------------------------------------


@pytest.mark.parametrize("op", list(Op))
@pytest.mark.parametrize("state", list(TxnState))
def test_each_call_runs_where_the_table_allows_it_and_lands_where_it_says(
    state: TxnState, op: Op
) -> None:
    manager = TransactionManager(transactional=True, idempotent=True)
    manager.state = state
    target = TRANSITIONS[op].get(state)
    if target is None:
        with pytest.raises(sdk.IllegalStateError, match=re.escape(f"{op.value} is not allowed")):
            manager.check(op)
        return
    assert manager.check(op) is state
    manager.enter(op)
    assert manager.state is target


@pytest.mark.parametrize("op", [Op.PRODUCE, Op.SEND_OFFSETS, Op.PREPARE, Op.COMMIT])
def test_a_failed_transaction_refuses_every_call_but_the_abort_with_its_error(op: Op) -> None:
    manager = TransactionManager(transactional=True, idempotent=True)
    manager.state = TxnState.IN_TRANSACTION
    failed = manager.record_failed(sdk.KafkaException("a record was refused"))
    assert failed is not None and failed.txn_requires_abort

    with pytest.raises(sdk.KafkaException) as raised:
        manager.check(op)
    assert raised.value is failed
    assert manager.check(Op.ABORT) is TxnState.IN_TRANSACTION


def test_a_refused_end_fails_the_transaction_and_a_refused_abort_does_not() -> None:
    manager = TransactionManager(transactional=True, idempotent=True)
    manager.state = TxnState.COMMITTING
    refusal = sdk.InvalidTxnState("not open")

    assert manager.refused(Op.COMMIT, refusal).txn_requires_abort
    assert (manager.state, manager.error is not None) == (TxnState.IN_TRANSACTION, True)

    manager.state, manager.error = TxnState.ABORTING, None
    assert not manager.refused(Op.ABORT, refusal).txn_requires_abort
    assert (manager.state, manager.error) == (TxnState.ABORTING, None)


def test_a_timed_out_transaction_leaves_only_init_transactions() -> None:
    manager = TransactionManager(transactional=True, idempotent=True)
    manager.state = TxnState.IN_TRANSACTION
    timeout = sdk.TransactionTimedOut("aborted on its timeout")
    manager.record_failed(timeout)

    for op in (Op.PRODUCE, Op.COMMIT, Op.ABORT, Op.SEND_OFFSETS):
        with pytest.raises(sdk.TransactionTimedOut):
            manager.check(op)
    assert manager.check(Op.INIT) is TxnState.NEEDS_INIT


def test_sequences_run_per_partition_from_0_in_each_epoch_and_wrap() -> None:
    manager = TransactionManager(transactional=False, idempotent=True)
    manager.start_epoch(7, 0)
    assert [manager.next_sequence(("t", 0), 3) for _ in range(2)] == [0, 3]
    assert manager.next_sequence(("t", 1), 5) == 0
    manager.start_epoch(7, 1)
    assert manager.next_sequence(("t", 0), 1) == 0
    manager._sequences[("t", 0)] = SEQUENCE_MODULUS - 1
    assert manager.next_sequence(("t", 0), 2) == SEQUENCE_MODULUS - 1
    assert manager.next_sequence(("t", 0), 1) == 1
    assert (
        TransactionManager(transactional=False, idempotent=False).next_sequence(("t", 0), 2) == -1
    )
