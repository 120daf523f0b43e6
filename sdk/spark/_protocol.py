"""The exactly-once protocol of a Spark job, free of Spark's classes: a task attempt writes in
its own transaction and prepares it; the driver commits the winners and aborts everything else
under the job's prefix, in one commit-group.

Transactional ids: `{job_id}/driver` for the driver, `{job_id}/{run}/{partition}.{attempt}.{task}`
for a task attempt. The `/` cannot appear in a job id, so one job's prefix never covers another's.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from sdk._errors import ConfigError, KafkaError, KafkaException, TransactionalIdNotFound
from sdk._http import HttpClient, api_path
from sdk._producer import Producer
from sdk._types import Headers
from sdk.spark._offsets import Offsets, client

__all__ = [
    "BATCH_GROUP_SUFFIX",
    "CommitResult",
    "Committer",
    "Fault",
    "OutputRecord",
    "TaskIdentity",
    "TaskOutcome",
    "TaskWriter",
    "WriteSettings",
    "check_job_id",
    "write_partition",
]

JOB_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
# The group whose committed offset on (marker topic, 0) is the next micro-batch id to commit.
BATCH_GROUP_SUFFIX = "/batches"

# (topic or None for the `topic` option, key, value, partition or None, headers)
OutputRecord = tuple[str | None, bytes | str | None, bytes | str | None, int | None, Headers | None]


def check_job_id(job_id: str | None) -> str:
    if job_id is None:
        raise ConfigError(
            "jobId: required for exactly-once writes: a stable name of this job, the same for "
            "every rerun, unique among jobs running at the same time ([A-Za-z0-9._-]{1,128}); "
            "or set delivery.guarantee=at_least_once"
        )
    if not JOB_ID.fullmatch(job_id):
        raise ConfigError(f"jobId: {job_id!r} must match [A-Za-z0-9._-]{{1,128}}")
    return job_id


@dataclass(frozen=True)
class Fault:
    """A fault injected into matching task attempts, for demos and tests."""

    after_records: int
    partitions: frozenset[int] | None = None
    attempts: frozenset[int] | None = None
    seconds: float = 0.0

    @classmethod
    def from_option(cls, options: Any, option: str) -> Fault | None:
        """The fault a data source option (JSON) names, or None when the option is not set."""
        text = options.get(option)
        if text is None:
            return None
        try:
            return cls.parse(orjson.loads(text), option)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"{option}: not JSON ({exc})") from None

    @classmethod
    def parse(cls, doc: Any, option: str) -> Fault:
        if not isinstance(doc, dict) or type(doc.get("after_records", 0)) is not int:
            raise ConfigError(f'{option}: expected {{"after_records": n, "partitions": [...]}}')

        def ints(name: str) -> frozenset[int] | None:
            value = doc.get(name)
            if value is None:
                return None
            if not isinstance(value, list) or not all(type(v) is int for v in value):
                raise ConfigError(f"{option}: {name} must be a list of integers")
            return frozenset(value)

        seconds = doc.get("seconds", 0.0)
        if not isinstance(seconds, int | float) or seconds < 0:
            raise ConfigError(f"{option}: seconds must be a non-negative number")
        return cls(doc.get("after_records", 0), ints("partitions"), ints("attempts"), seconds)

    def matches(self, task: TaskIdentity) -> bool:
        return (self.partitions is None or task.partition in self.partitions) and (
            self.attempts is None or task.attempt in self.attempts
        )


@dataclass(frozen=True)
class WriteSettings:
    """Everything a task attempt needs to write; pickled from the driver to the executors."""

    url: str
    token: str | None
    topic: str | None
    job_id: str | None  # None: at-least-once, plain appends
    run: str = ""
    transaction_timeout_ms: int = 60_000
    linger_ms: int = 20
    batch_size: int = 1_000_000
    # The driver's (producer id, epoch) when the run started: a task that prepares after the
    # driver moved on (committed, aborted, or a new run) aborts its own transaction. None: no
    # such check (streaming, where one writer serves every micro-batch).
    driver: tuple[int, int] | None = None
    # Micro-batches: (marker topic, batch id, or None for the task's own micro-batch). A task
    # that prepares after its batch was committed (a late speculative copy, or a batch Spark
    # replays from its checkpoint) aborts its transaction: the batch's output is already in.
    marker: tuple[str, int | None] | None = None
    kill: Fault | None = None
    delay: Fault | None = None

    @property
    def exactly_once(self) -> bool:
        return self.job_id is not None


@dataclass(frozen=True)
class TaskIdentity:
    partition: int
    attempt: int
    task_attempt_id: int
    batch_id: int | None = None  # the streaming micro-batch the task belongs to

    @classmethod
    def current(cls) -> TaskIdentity:
        """The running Spark task's identity (TaskContext), or a unique stand-in outside Spark."""
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            return cls(0, 0, int.from_bytes(os.urandom(6), "big"))
        batch = ctx.getLocalProperty("streaming.sql.batchId")  # set by Spark's MicroBatchExecution
        return cls(
            ctx.partitionId(),
            ctx.attemptNumber(),
            ctx.taskAttemptId(),
            int(batch) if batch is not None else None,
        )


@dataclass(frozen=True)
class TaskOutcome:
    """What a task attempt reports to the driver: its prepared transaction (None if it wrote
    nothing, or wrote plain appends)."""

    partition: int
    attempt: int
    records: int
    transactional_id: str | None = None
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass
class CommitResult:
    committed: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    skipped: bool = False  # the micro-batch was committed before: its output was aborted


def _task_tid(settings: WriteSettings, task: TaskIdentity) -> str:
    return (
        f"{settings.job_id}/{settings.run}/{task.partition}.{task.attempt}.{task.task_attempt_id}"
    )


def _inject(settings: WriteSettings, task: TaskIdentity, written: int, producer: Producer) -> None:
    """The demo's and tests' faults: the records so far are flushed (in the log, in the open
    transaction), then the attempt dies as a lost executor would, or stalls as a straggler."""
    kill, delay = settings.kill, settings.delay
    if kill is not None and written == kill.after_records and kill.matches(task):
        producer.flush()
        os._exit(1)  # no abort, no cleanup: the records stay in the log, their txn open
    if delay is not None and written == delay.after_records and delay.matches(task):
        producer.flush()
        time.sleep(delay.seconds)


class TaskWriter:
    """One task attempt's output. Exactly-once: a transaction of its own, begun with the first
    record and prepared by `finish()`, so the driver can commit it (or throw it away) with the
    job's others. `close()` (or leaving the `with`) aborts it unless it was prepared."""

    def __init__(self, settings: WriteSettings, task: TaskIdentity) -> None:
        self.settings, self.task = settings, task
        config: dict[str, object] = {
            "coordinator.url": settings.url,
            "linger.ms": settings.linger_ms,
            "batch.size": settings.batch_size,
            "client.id": f"txlog-task-{task.partition}.{task.attempt}",
        }
        if settings.token:
            config["coordinator.token"] = settings.token
        self.tid: str | None = None
        if settings.exactly_once:
            self.tid = _task_tid(settings, task)
            config["transactional.id"] = self.tid
            config["transaction.timeout.ms"] = settings.transaction_timeout_ms
        else:
            config["enable.idempotence"] = False
        self._failures: list[KafkaError] = []
        config["on_delivery"] = self._on_delivery
        self._producer = Producer(config)
        self.written = 0

    def _on_delivery(self, err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            self._failures.append(err)

    def produce(
        self,
        topic: str | None,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Headers | None = None,
    ) -> None:
        topic = topic or self.settings.topic
        if topic is None:
            raise ConfigError("topic: set the `topic` option or give a `topic` column")
        if self.written == 0 and self.tid is not None:
            self._producer.init_transactions()
            self._producer.begin_transaction()
        while True:
            try:
                self._producer.produce(
                    topic, value=value, key=key, partition=partition, headers=headers
                )
                break
            except BufferError:
                self._producer.poll(0.05)
        self.written += 1
        _inject(self.settings, self.task, self.written, self._producer)

    def finish(self) -> TaskOutcome:
        """Flush; prepare the transaction. The outcome names it for the driver's commit."""
        task, producer = self.task, self._producer
        if self.tid is None or self.written == 0:
            producer.flush()
            if self._failures:
                raise KafkaException(self._failures[0])
            return TaskOutcome(task.partition, task.attempt, self.written)
        producer.prepare_transaction()
        producer_id, epoch = producer._transaction_identity()
        if self.settings.driver is not None and _driver_moved_on(self.settings):
            # Prepared after the driver committed (or gave up on) this run: a late speculative
            # attempt. Nobody would ever commit it; abort it rather than let it pin the LSO.
            producer.abort_transaction()
            raise RuntimeError(f"{self.tid}: the job's run ended before this attempt prepared")
        if self._batch_committed():
            producer.abort_transaction()
            return TaskOutcome(task.partition, task.attempt, 0)
        return TaskOutcome(task.partition, task.attempt, self.written, self.tid, producer_id, epoch)

    def _batch_committed(self) -> bool:
        marker = self.settings.marker
        if marker is None or self.settings.job_id is None:
            return False
        batch = marker[1] if marker[1] is not None else self.task.batch_id
        if batch is None:
            return False
        http = client(self.settings.url, self.settings.token)
        try:
            return committed_batch(http, self.settings.job_id, marker[0]) > batch
        finally:
            http.close()

    def close(self) -> None:
        # An attempt that fails midway aborts what it wrote at once (close() does), rather
        # than leave it to pin the partitions' LSO until the driver's commit or the timeout.
        self._producer.close(timeout=5.0)

    def __enter__(self) -> TaskWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def write_partition(
    settings: WriteSettings, records: Iterable[OutputRecord], task: TaskIdentity
) -> TaskOutcome:
    """Write one task attempt's records and prepare them (see TaskWriter)."""
    with TaskWriter(settings, task) as writer:
        for topic, key, value, partition, headers in records:
            writer.produce(topic, value, key, partition, headers)
        return writer.finish()


def _driver_moved_on(settings: WriteSettings) -> bool:
    assert settings.job_id is not None and settings.driver is not None
    http = client(settings.url, settings.token)
    try:
        doc = http.call("GET", api_path("transactions", driver_tid(settings.job_id)))
    except TransactionalIdNotFound:
        return True
    finally:
        http.close()
    return (doc["producer_id"], doc["producer_epoch"]) != settings.driver


def committed_batch(http: HttpClient, job_id: str, topic: str) -> int:
    """The next micro-batch id the job will commit, from its marker group (0 if none yet).
    Waits out a commit in progress (require_stable)."""
    doc = http.call(
        "GET",
        api_path("groups", job_id + BATCH_GROUP_SUFFIX, "offsets"),
        params={"topic": topic, "require_stable": "true"},
    )
    return max((e["offset"] for e in doc["offsets"] if e["partition"] == 0), default=0)


def driver_tid(job_id: str) -> str:
    return f"{job_id}/driver"


def share_tid(job_id: str) -> str:
    """The transaction in which a `txshare` source holds its micro-batch's acknowledgements."""
    return f"{job_id}/share"


class Committer:
    """The driver's side: commits a run's winning attempts as one and aborts the rest."""

    def __init__(self, url: str, token: str | None, job_id: str) -> None:
        self.job_id = check_job_id(job_id)
        self.prefix = f"{job_id}/"
        self.tid = driver_tid(job_id)
        self._path = api_path("transactions", self.tid)
        self._http: HttpClient = client(url, token)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Committer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def abort_all(self) -> tuple[CommitResult, tuple[int, int]]:
        """Abort every open transaction under the job's prefix (an earlier crashed run's, or
        this run's after a failure). Returns them and the driver's identity afterwards."""
        producer_id, epoch = self._init()
        self._prepare(producer_id, epoch)
        return self._commit_group([], (producer_id, epoch))

    def commit(
        self,
        outcomes: Sequence[TaskOutcome | None],
        *,
        offsets_group: str | None = None,
        offsets: Offsets | None = None,
        batch: tuple[str, int] | None = None,
    ) -> CommitResult:
        """Commit the winners' prepared transactions, the input `offsets` for `offsets_group`,
        and (with `batch` = (marker topic, batch id)) the micro-batch marker, all as one; abort
        every other open transaction under the prefix. A batch committed before is not
        committed again: its new output is aborted instead."""
        producer_id, epoch = self._init()  # fences any other driver of this job
        if batch is not None and committed_batch(self._http, self.job_id, batch[0]) > batch[1]:
            self._prepare(producer_id, epoch)
            result, _ = self._commit_group([], (producer_id, epoch))
            result.skipped = True
            return result
        caller = {"producer_id": producer_id, "producer_epoch": epoch}
        if offsets_group is not None and offsets:
            entries = [
                {"topic": t, "partition": p, "offset": o}
                for t, parts in sorted(offsets.items())
                for p, o in sorted(parts.items())
                if o >= 0
            ]
            if entries:
                body = {**caller, "group_id": offsets_group, "offsets": entries}
                self._http.call("POST", f"{self._path}/offsets", body=body)
        if batch is not None:
            marker = [{"topic": batch[0], "partition": 0, "offset": batch[1] + 1}]
            body = {**caller, "group_id": self.job_id + BATCH_GROUP_SUFFIX, "offsets": marker}
            self._http.call("POST", f"{self._path}/offsets", body=body)
        self._prepare(producer_id, epoch)
        members = [o for o in outcomes if o is not None and o.transactional_id is not None]
        result, _ = self._commit_group(members, (producer_id, epoch), self._share_acks())
        return result

    def _share_acks(self) -> Mapping[str, Any] | None:
        """The job's `txshare` source's acknowledgements of the batch, prepared: committed with
        the output (`sdk.spark._shares`). None: the job reads no share group now."""
        try:
            described = self._http.call("GET", api_path("transactions", share_tid(self.job_id)))
        except TransactionalIdNotFound:
            return None
        if described["state"] != "Prepared":
            return None
        return {
            "transactional_id": described["transactional_id"],
            "producer_id": described["producer_id"],
            "producer_epoch": described["producer_epoch"],
        }

    def _init(self) -> tuple[int, int]:
        answer = self._http.call(
            "POST",
            api_path("init-pid"),
            body={"transactional_id": self.tid, "keep_prepared": False},
        )
        return answer["producer_id"], answer["producer_epoch"]

    def _prepare(self, producer_id: int, epoch: int) -> None:
        body = {"producer_id": producer_id, "producer_epoch": epoch}
        self._http.call("POST", f"{self._path}/prepare", body=body)

    def _commit_group(
        self,
        members: Sequence[TaskOutcome],
        driver: tuple[int, int],
        also: Mapping[str, Any] | None = None,
    ) -> tuple[CommitResult, tuple[int, int]]:
        transactions: list[Mapping[str, Any]] = [
            {
                "transactional_id": m.transactional_id,
                "producer_id": m.producer_id,
                "producer_epoch": m.producer_epoch,
            }
            for m in members
        ]
        transactions.append(
            {"transactional_id": self.tid, "producer_id": driver[0], "producer_epoch": driver[1]}
        )
        if also is not None:
            transactions.append(also)
        answer = self._http.call(
            "POST",
            api_path("transactions", "commit-group"),
            body={"transactions": transactions, "abort_others_with_prefix": self.prefix},
        )
        after = next(c for c in answer["committed"] if c["transactional_id"] == self.tid)
        share = None if also is None else also["transactional_id"]
        result = CommitResult(
            committed=[
                c["transactional_id"]
                for c in answer["committed"]
                if c is not after and c["transactional_id"] != share
            ],
            aborted=list(answer["aborted"]),
        )
        return result, (after["producer_id"], after["producer_epoch"])
