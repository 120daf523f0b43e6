"""The `txlog` Python Data Source: `spark.read`/`readStream` over the coordinator's partition
logs and `df.write`/`writeStream` into them, exactly once, with the option and column names of
Spark's Kafka source and sink (`coordinator.url` in place of `kafka.bootstrap.servers`).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import Row, StructType

from sdk import recordbatch
from sdk._errors import ConfigError, KafkaError, KafkaException, KafkaTimeoutError
from sdk._http import RECORD_BATCH, api_path
from sdk.spark._offsets import (
    EARLIEST,
    LATEST,
    Offsets,
    client,
    parse_offsets,
    partitions_of,
)
from sdk.spark._protocol import (
    Committer,
    Fault,
    OutputRecord,
    TaskIdentity,
    TaskOutcome,
    WriteSettings,
    check_job_id,
    write_partition,
)

__all__ = ["SCHEMA", "TxlogDataSource", "TxlogMessage"]

SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, headers array<struct<key: string, value: binary>>"
)
FETCH_MAX_BYTES = 8 * 1024 * 1024
# How long a read waits for records below its end offset to become readable (an end offset
# given beyond the LSO, say) before it fails.
FETCH_WAIT_S = 60.0
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
GUARANTEES = ("exactly_once", "at_least_once")


def _required(options: Any, name: str) -> str:
    value = options.get(name)
    if not value:
        raise ConfigError(f"{name}: required option")
    return str(value)


def _int_option(options: Any, name: str, default: int) -> int:
    value = options.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{name}: {value!r} is not an integer") from None
    if number < 0:
        raise ConfigError(f"{name}: must not be negative")
    return number


def _seconds_option(options: Any, name: str) -> float:
    value = options.get(name)
    if value is None:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError(f"{name}: {value!r} is not a number of seconds") from None
    if not 0 <= seconds < float("inf"):
        raise ConfigError(f"{name}: must be a non-negative number of seconds")
    return seconds


# -- reading -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One Spark partition: offsets [start, end) of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int


def _bool_option(options: Any, name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ConfigError(f"{name}: {value!r} is neither true nor false")
    return text == "true"


def data_lost(topic: str, partition: int, asked: int, log_start: int) -> KafkaException:
    return KafkaException(
        KafkaError(
            KafkaError.OFFSET_OUT_OF_RANGE,
            f"{topic}/{partition}: offset {asked} was asked for, but the log now starts at "
            f"{log_start}: offsets {asked}..{log_start - 1} were deleted (retention, compaction "
            "or delete-records) and some data may have been lost. Set failOnDataLoss=false to "
            "go on from the log start instead.",
        )
    )


@dataclass(frozen=True)
class _ReadSettings:
    url: str
    token: str | None
    topics: tuple[str, ...]
    isolation_level: str
    # Spark's Kafka option: offsets asked for that were deleted fail the query (true), or the
    # read goes on from the log start (false).
    fail_on_data_loss: bool = True

    @classmethod
    def from_options(cls, options: Any) -> _ReadSettings:
        topics = tuple(t.strip() for t in _required(options, "subscribe").split(",") if t.strip())
        if not topics:
            raise ConfigError("subscribe: name at least one topic")
        level = options.get("isolation.level", "read_committed")
        if level not in ISOLATION_LEVELS:
            raise ConfigError(f"isolation.level: {level!r} is not one of {ISOLATION_LEVELS}")
        return cls(
            _required(options, "coordinator.url"),
            options.get("coordinator.token"),
            topics,
            level,
            _bool_option(options, "failOnDataLoss", True),
        )

    def bounds(self) -> dict[str, dict[int, tuple[int, int]]]:
        """(log start, end) of every partition, the end being the LSO under read_committed."""
        committed = self.isolation_level == "read_committed"
        field = "last_stable_offset" if committed else "high_watermark"
        http = client(self.url, self.token)
        try:
            described = partitions_of(http, self.topics)
        finally:
            http.close()
        return {
            t: {p["partition"]: (p["log_start_offset"], p[field]) for p in parts}
            for t, parts in described.items()
        }

    def resolve(
        self,
        spec: str,
        option: str,
        default_latest: bool,
        bounds: dict[str, dict[int, tuple[int, int]]] | None = None,
    ) -> Offsets:
        """`earliest`, `latest` or JSON, as absolute offsets of every subscribed partition
        (against `bounds`, or the partitions as they are now)."""
        bounds = bounds if bounds is not None else self.bounds()
        if spec in ("earliest", "latest"):
            explicit: Offsets = {}
            fill = EARLIEST if spec == "earliest" else LATEST
        else:
            explicit = parse_offsets(spec, option)
            unknown = set(explicit) - set(self.topics)
            if unknown:
                raise ConfigError(f"{option}: {sorted(unknown)} not among subscribe's topics")
            fill = LATEST if default_latest else EARLIEST
        result: Offsets = {}
        for topic, parts in bounds.items():
            for partition, (start, end) in parts.items():
                offset = explicit.get(topic, {}).get(partition, fill)
                if offset == EARLIEST:
                    offset = start
                elif offset == LATEST:
                    offset = end
                elif offset < start:
                    if self.fail_on_data_loss:
                        raise data_lost(topic, partition, offset, start)
                    offset = start
                result.setdefault(topic, {})[partition] = offset
        return result

    def read(self, part: OffsetRange) -> Iterator[tuple[Any, ...]]:
        """The records of [start, end) visible at this isolation level, in offset order, fetched
        as Kafka record batches."""
        http = client(self.url, self.token)
        path = api_path("topics", part.topic, "partitions", part.partition, "records")
        offset = part.start
        stalled_since: float | None = None
        try:
            while offset < part.end:
                params: dict[str, str | int] = {
                    "offset": offset,
                    "max_bytes": FETCH_MAX_BYTES,
                    "isolation_level": self.isolation_level,
                }
                try:
                    data, headers = http.call_binary(path, params, RECORD_BATCH)
                except KafkaException as exc:
                    if exc.code != KafkaError.OFFSET_OUT_OF_RANGE:
                        raise
                    offset = self._after_loss(http, part, offset, exc)
                    continue
                for pos, header in recordbatch.iter_batches(data):
                    for record in recordbatch.records(data, pos, header):
                        if record.offset < offset:
                            continue
                        if record.offset >= part.end:
                            return
                        yield _row(part, record)
                next_offset = int(headers["next-offset"])
                if next_offset > offset:
                    offset = next_offset
                    stalled_since = None
                    continue
                # Nothing readable yet below `end` (an open transaction holds the LSO back).
                now = time.monotonic()
                stalled_since = stalled_since or now
                if now - stalled_since > FETCH_WAIT_S:
                    raise KafkaTimeoutError(
                        f"{part.topic}/{part.partition}: offsets {offset}..{part.end} not "
                        f"readable ({self.isolation_level}) within {FETCH_WAIT_S:.0f} s"
                    )
                time.sleep(0.2)
        finally:
            http.close()

    def _after_loss(self, http: Any, part: OffsetRange, offset: int, error: KafkaException) -> int:
        """Where a read goes on when `offset` fell below the log start after the range was
        planned: failOnDataLoss says whether it may."""
        described = partitions_of(http, (part.topic,))[part.topic]
        log_start = int(
            next(p["log_start_offset"] for p in described if p["partition"] == part.partition)
        )
        if log_start <= offset:
            raise error  # out of range above the end: not data loss
        if self.fail_on_data_loss:
            raise data_lost(part.topic, part.partition, offset, log_start)
        return log_start


def _row(part: OffsetRange, record: recordbatch.Record) -> tuple[Any, ...]:
    return (
        record.key,
        record.value,
        part.topic,
        part.partition,
        record.offset,
        datetime.fromtimestamp(record.timestamp / 1000, tz=UTC),
        record.headers,
    )


def _ranges(start: Offsets, end: Offsets) -> list[OffsetRange]:
    return [
        OffsetRange(topic, partition, start.get(topic, {}).get(partition, 0), stop)
        for topic, parts in sorted(end.items())
        for partition, stop in sorted(parts.items())
        if stop > start.get(topic, {}).get(partition, 0)
    ]


class TxlogReader(DataSourceReader):
    def __init__(self, options: Any) -> None:
        self.settings = _ReadSettings.from_options(options)
        settings = self.settings
        bounds = settings.bounds()  # one look at the partitions for both ends
        start = settings.resolve(
            options.get("startingOffsets", "earliest"), "startingOffsets", False, bounds
        )
        end = settings.resolve(
            options.get("endingOffsets", "latest"), "endingOffsets", True, bounds
        )
        self.ranges = _ranges(start, end)

    def partitions(self) -> Sequence[InputPartition]:
        # Spark wants at least one partition; an empty range reads nothing.
        return self.ranges or [OffsetRange(self.settings.topics[0], 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, OffsetRange)
        return self.settings.read(partition)


def _as_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    return {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in sorted(offsets.items())}


def _from_json(doc: dict[str, dict[str, int]]) -> Offsets:
    return {t: {int(p): o for p, o in parts.items()} for t, parts in doc.items()}


class TxlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of offset ranges; Spark's checkpoint keeps the offsets, as with Kafka."""

    def __init__(self, options: Any) -> None:
        self.settings = _ReadSettings.from_options(options)
        self.starting = options.get("startingOffsets", "latest")
        limit = options.get("maxOffsetsPerTrigger")
        self.max_offsets = _int_option(options, "maxOffsetsPerTrigger", 0) if limit else 0
        self.pinned: Offsets | None = None  # Trigger.AvailableNow: where to stop

    def initialOffset(self) -> dict[str, Any]:
        return _as_json(self.settings.resolve(self.starting, "startingOffsets", True))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_offsets) if self.max_offsets else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.pinned = self.settings.resolve("latest", "endingOffsets", True)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = _from_json(start)
        end = self.pinned or self.settings.resolve("latest", "endingOffsets", True)
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        result: Offsets = {}
        for topic, parts in sorted(end.items()):
            for partition, stop in sorted(parts.items()):
                first = begin.get(topic, {}).get(partition, 0)
                stop = max(stop, first)
                if budget is not None:
                    # Share the budget in partition order; what is left waits for the next batch.
                    take = min(stop - first, budget)
                    budget -= take
                    stop = first + take
                result.setdefault(topic, {})[partition] = stop
        return _as_json(result)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return _ranges(_from_json(start), _from_json(end))

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, OffsetRange)
        return self.settings.read(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint (and, for a read-process-write
        job, in the consumer group the writer commits them to)."""


# -- writing -------------------------------------------------------------------------------------


@dataclass
class TxlogMessage(WriterCommitMessage):
    """A task attempt's prepared transaction, on its way to the driver's commit()."""

    outcome: TaskOutcome


def _outcomes(messages: Sequence[WriterCommitMessage | None]) -> list[TaskOutcome | None]:
    return [m.outcome if isinstance(m, TxlogMessage) else None for m in messages]


def _column_reader(schema: StructType) -> Any:
    names = set(schema.names)
    if "value" not in names:
        raise ConfigError("value: the DataFrame needs a `value` column (string or binary)")
    unknown = names - {"key", "value", "topic", "partition", "headers"}
    if unknown:
        raise ConfigError(
            f"columns {sorted(unknown)}: not written; keep key, value, topic, partition, headers"
        )
    has = {n: n in names for n in ("key", "topic", "partition", "headers")}

    def record(row: Row) -> OutputRecord:
        headers = row["headers"] if has["headers"] else None
        if headers is not None and not isinstance(headers, dict):
            headers = [(h[0], h[1]) for h in headers]
        return (
            row["topic"] if has["topic"] else None,
            _plain(row["key"]) if has["key"] else None,
            _plain(row["value"]),
            row["partition"] if has["partition"] else None,
            headers,
        )

    return record


def _plain(value: Any) -> bytes | str | None:
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value  # type: ignore[no-any-return]


def _write_settings(options: Any, schema: StructType) -> WriteSettings:
    guarantee = options.get("delivery.guarantee", "exactly_once")
    if guarantee not in GUARANTEES:
        raise ConfigError(f"delivery.guarantee: {guarantee!r} is not one of {GUARANTEES}")
    topic = options.get("topic")
    if topic is None and "topic" not in schema.names:
        raise ConfigError("topic: set the `topic` option or give the DataFrame a `topic` column")
    job_id = check_job_id(options.get("jobId")) if guarantee == "exactly_once" else None

    return WriteSettings(
        url=_required(options, "coordinator.url"),
        token=options.get("coordinator.token"),
        topic=topic,
        job_id=job_id,
        run=uuid.uuid4().hex[:12],
        transaction_timeout_ms=_int_option(options, "transaction.timeout.ms", 60_000),
        kill=Fault.from_option(options, "testing.kill"),
        delay=Fault.from_option(options, "testing.delay"),
    )


class _Writing:
    """What the batch and the streaming writer share: the task side and the options."""

    def __init__(self, options: Any, schema: StructType) -> None:
        self.settings = _write_settings(options, schema)
        self.record = _column_reader(schema)
        self.offsets_group = options.get("offsets.group")
        offsets = options.get("offsets")
        self.offsets = parse_offsets(offsets, "offsets") if offsets else None
        if (self.offsets is None) != (self.offsets_group is None):
            raise ConfigError("offsets, offsets.group: give both or neither")
        if self.offsets is not None and not self.settings.exactly_once:
            raise ConfigError(
                "offsets: committed with the output only by delivery.guarantee=exactly_once; "
                "an at-least-once job commits its offsets itself, after the write"
            )
        self.pause_before_commit = _seconds_option(options, "testing.pauseBeforeCommit")
        self.pause_after_commit = _seconds_option(options, "testing.pauseAfterCommit")

    def committer(self) -> Committer:
        assert self.settings.job_id is not None
        return Committer(self.settings.url, self.settings.token, self.settings.job_id)

    def abort_leftovers(self) -> tuple[int, int] | None:
        """Before writing: abort what an earlier crashed run of this job left open."""
        if not self.settings.exactly_once:
            return None
        with self.committer() as committer:
            _, driver = committer.abort_all()
        return driver

    def write(self, rows: Iterator[Row]) -> TxlogMessage:
        outcome = write_partition(
            self.settings, (self.record(row) for row in rows), TaskIdentity.current()
        )
        return TxlogMessage(outcome)

    def commit(
        self, messages: Sequence[WriterCommitMessage | None], batch: tuple[str, int] | None
    ) -> None:
        if not self.settings.exactly_once:
            return
        if self.pause_before_commit:
            time.sleep(self.pause_before_commit)
        with self.committer() as committer:
            committer.commit(
                _outcomes(messages),
                offsets_group=self.offsets_group,
                offsets=self.offsets,
                batch=batch,
            )
        if self.pause_after_commit:
            time.sleep(self.pause_after_commit)

    def abort(self) -> None:
        if self.settings.exactly_once:
            with self.committer() as committer:
                committer.abort_all()


class TxlogWriter(DataSourceWriter):
    def __init__(self, options: Any, schema: StructType) -> None:
        self.writing = _Writing(options, schema)
        batch_id = options.get("batchId")
        self.batch: tuple[str, int] | None = None
        if batch_id is not None:
            if self.writing.settings.topic is None:
                raise ConfigError("batchId: needs the `topic` option (partition 0 keeps the mark)")
            self.batch = (self.writing.settings.topic, _int_option(options, "batchId", 0))
        driver = self.writing.abort_leftovers()
        # Tasks that prepare after the driver moved on abort themselves (late speculation).
        settings = self.writing.settings
        self.writing.settings = dataclasses.replace(settings, driver=driver, marker=self.batch)

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return self.writing.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.writing.commit(messages, self.batch)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.writing.abort()


class TxlogStreamWriter(DataSourceStreamWriter):
    """Every micro-batch commits as one, marked with its id: a batch replayed from the
    checkpoint after a crash is recognised and its new output aborted, not written twice."""

    def __init__(self, options: Any, schema: StructType) -> None:
        self.writing = _Writing(options, schema)
        settings = self.writing.settings
        if settings.exactly_once and settings.topic is None:
            raise ConfigError("topic: a streaming write needs the `topic` option")
        if settings.exactly_once and settings.topic is not None:
            # Tasks learn their micro-batch from Spark (a local property of the task).
            self.writing.settings = dataclasses.replace(settings, marker=(settings.topic, None))
        # No abort_leftovers() here: Spark creates the streaming writer anew for every
        # micro-batch's commit() and abort(), so it would abort the very batch about to be
        # committed. What a crashed run left open is aborted by the first commit's
        # commit-group (abort_others_with_prefix) instead.

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return self.writing.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        topic = self.writing.settings.topic
        self.writing.commit(messages, (topic, batchId) if topic is not None else None)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.writing.abort()


class TxlogDataSource(DataSource):
    """`format("txlog")`: see sdk.spark for the options."""

    @classmethod
    def name(cls) -> str:
        return "txlog"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return TxlogReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TxlogStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ConfigError("mode: a log is only appended to; use mode('append')")
        return TxlogWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return TxlogStreamWriter(self.options, schema)
