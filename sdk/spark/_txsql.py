"""The `txsql` Python Data Source: `df.write.format("txsql")` into a SQL table exactly once, with
the option names of Spark's JDBC writer (`url`, `dbtable`, `batchsize`), plus `jobId` and the
input offsets committed with the rows (`offsets.group`, `offsets`, as the txlog writer takes
them). How it stays exactly once without two-phase commit: see `sdk.spark._sql`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)
from sqlalchemy import types as sql
from sqlalchemy.types import TypeEngine

from sdk._errors import ConfigError
from sdk.spark._offsets import parse_offsets
from sdk.spark._protocol import Fault, TaskIdentity, check_job_id
from sdk.spark._source import _int_option, _required, _seconds_option
from sdk.spark._sql import AttemptOutcome, SqlCommit, SqlTarget, Stager, stage_batches

__all__ = ["TxsqlDataSource", "TxsqlMessage"]

# Rows per staging transaction; Spark's JDBC writer sends 1000 per batch, but COPY likes more.
DEFAULT_BATCH = 100_000


def _sql_type(spark_type: DataType, name: str) -> TypeEngine[Any]:
    """The column type a missing target table gets, as Spark's JDBC writer would choose it."""
    if isinstance(spark_type, DecimalType):
        return sql.Numeric(spark_type.precision, spark_type.scale)
    simple: dict[type[DataType], TypeEngine[Any]] = {
        StringType: sql.Text(),
        LongType: sql.BigInteger(),
        IntegerType: sql.Integer(),
        ShortType: sql.SmallInteger(),
        ByteType: sql.SmallInteger(),
        DoubleType: sql.Double(),
        FloatType: sql.Float(),
        BooleanType: sql.Boolean(),
        TimestampType: sql.DateTime(timezone=True),
        TimestampNTZType: sql.DateTime(),
        DateType: sql.Date(),
        BinaryType: sql.LargeBinary(),
    }
    found = simple.get(type(spark_type))
    if found is None:
        raise ConfigError(f"column {name!r}: no SQL type for {spark_type.simpleString()}")
    return found


@dataclass
class TxsqlMessage(WriterCommitMessage):
    """A task attempt's staged rows, on their way to the driver's commit()."""

    outcome: AttemptOutcome


@dataclass(frozen=True)
class _Faults:
    """The demo's and tests' faults: the staged rows so far are committed, then the attempt dies
    as a lost executor would (no cleanup), or stalls as a straggler."""

    kill: Fault | None
    delay: Fault | None

    def hook(self, task: TaskIdentity) -> tuple[set[int], Callable[[int, Stager], None]]:
        """The row counts at which a fault of this attempt strikes, and the strike."""
        kill = self.kill if self.kill is not None and self.kill.matches(task) else None
        delay = self.delay if self.delay is not None and self.delay.matches(task) else None
        stops = {f.after_records for f in (kill, delay) if f is not None}

        def strike(written: int, stager: Stager) -> None:
            if kill is not None and written == kill.after_records:
                stager.flush()
                os._exit(1)
            if delay is not None and written == delay.after_records:
                stager.flush()
                time.sleep(delay.seconds)

        return stops, strike


class TxsqlWriter(DataSourceArrowWriter):
    """Takes Arrow batches (no Row object per row): Postgres gets them as CSV through COPY."""

    def __init__(self, options: Any, schema: StructType) -> None:
        self.job_id = check_job_id(options.get("jobId"))
        self.batch = _int_option(options, "batchsize", DEFAULT_BATCH) or DEFAULT_BATCH
        self.offsets_group = options.get("offsets.group")
        offsets = options.get("offsets")
        self.offsets = parse_offsets(offsets, "offsets") if offsets else None
        if (self.offsets is None) != (self.offsets_group is None):
            raise ConfigError("offsets, offsets.group: give both or neither")
        batch_id = options.get("batchId")
        self.batch_id = _int_option(options, "batchId", 0) if batch_id is not None else None
        self.faults = _Faults(
            Fault.from_option(options, "testing.kill"), Fault.from_option(options, "testing.delay")
        )
        self.pause_before_commit = _seconds_option(options, "testing.pauseBeforeCommit")
        create = [(f.name, _sql_type(f.dataType, f.name)) for f in schema.fields]
        self.target = SqlTarget.prepare(
            _required(options, "url"),
            _required(options, "dbtable"),
            self.job_id,
            schema.names,
            create,
        )
        self.result: SqlCommit | None = None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        task = TaskIdentity.current()
        attempt = self.target.attempt_id(task.partition, task.attempt, task.task_attempt_id)
        stops, strike = self.faults.hook(task)
        outcome = stage_batches(
            self.target, attempt, task.partition, iterator, self.batch, stops, strike
        )
        return TxsqlMessage(outcome)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        if self.pause_before_commit:
            time.sleep(self.pause_before_commit)
        self.result = self.target.commit(
            [m.outcome if isinstance(m, TxsqlMessage) else None for m in messages],
            offsets_group=self.offsets_group,
            offsets=self.offsets,
            batch_id=self.batch_id,
        )

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        self.target.abort()


class TxsqlDataSource(DataSource):
    """`format("txsql")`: see sdk.spark for the options."""

    @classmethod
    def name(cls) -> str:
        return "txsql"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ConfigError("mode: txsql appends rows; use mode('append')")
        return TxsqlWriter(self.options, schema)
