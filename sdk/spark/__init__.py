"""Spark integration: the `txlog` data source (`spark.read`, `readStream`, `df.write`,
`writeStream`) and a helper for `foreachPartition`, exactly once. Needs `pip install '.[spark]'`.

    from sdk.spark import register
    register(spark)
    df = (spark.read.format("txlog").option("coordinator.url", url)
          .option("subscribe", "payments").load())
    out.write.format("txlog").option("coordinator.url", url).option("topic", "settlements") \\
        .option("jobId", "settlement").mode("append").save()

Reader options (Spark's Kafka source names): `coordinator.url`, `coordinator.token`, `subscribe`,
`startingOffsets`/`endingOffsets` (`earliest`, `latest` or `{"topic": {"0": 12}}`, -2 earliest,
-1 latest), `isolation.level` (`read_committed`, the default, or `read_uncommitted`),
`maxOffsetsPerTrigger` (streaming). Columns: key, value (binary), topic, partition, offset,
timestamp, headers (array of (key, value)).

Writer options: `coordinator.url`, `coordinator.token`, `topic` (or a `topic` column); columns
`value`, optional `key`, `partition`, `headers`, `topic`. `jobId`: the job's stable name (its
transactional ids are `{jobId}/...`); `delivery.guarantee` (`exactly_once`, the default, or
`at_least_once`: plain appends, as Spark's Kafka sink); `offsets.group` + `offsets`: input offsets
committed with the output; `batchId`: an idempotent commit for `foreachBatch`;
`transaction.timeout.ms` of the task transactions (default 60000). `testing.kill`,
`testing.delay`, `testing.pauseBeforeCommit`, `testing.pauseAfterCommit` inject faults, for demos
and tests only (see docs/pages/spark.md).

`txshare` reads a share group (a queue) in micro-batches whose acknowledgements commit with the
txlog sink's output of the same `jobId`: `coordinator.url`, `shareGroup`, `subscribe`, `jobId`,
`maxRecordsPerTrigger` (see `sdk.spark._shares`). Several jobs drain one queue exactly once.

`txsql` writes into a SQL table exactly once (see `sdk.spark._sql` for how), with Spark's JDBC
option names: `url` (any SQLAlchemy URL; a plain postgresql:// gets psycopg), `dbtable`,
`batchsize` (rows per staging transaction, 100000); `jobId` (required); `offsets.group` +
`offsets`: input offsets committed in the same database transaction as the rows, read back with
`sql_committed_offsets(url, group)`; `batchId` for `foreachBatch`; `testing.kill`,
`testing.delay`, `testing.pauseBeforeCommit` as for txlog.

    out.write.format("txsql").option("url", "postgresql://etl@db/ledger")
        .option("dbtable", "settlements").option("jobId", "settlement").mode("append").save()
"""

# The names load on first use, as `sdk`'s do: a Python worker that unpickles the txlog writer
# does not import SQLAlchemy for txsql.

import typing as _typing

from sdk._lazy import exports as _exports
from sdk._lazy import public as _public

if _typing.TYPE_CHECKING:
    # Each name `as` itself: re-exported for type checkers, whose `__all__` this is not.
    from sdk.spark._job import TransactionalJob as TransactionalJob
    from sdk.spark._offsets import committed_offsets as committed_offsets
    from sdk.spark._offsets import latest_offsets as latest_offsets
    from sdk.spark._offsets import offsets_json as offsets_json
    from sdk.spark._protocol import CommitResult as CommitResult
    from sdk.spark._protocol import TaskOutcome as TaskOutcome
    from sdk.spark._protocol import TaskWriter as TaskWriter
    from sdk.spark._shares import TxshareDataSource as TxshareDataSource
    from sdk.spark._source import TxlogDataSource as TxlogDataSource
    from sdk.spark._sql import sql_committed_offsets as sql_committed_offsets
    from sdk.spark._txsql import TxsqlDataSource as TxsqlDataSource

_EXPORTS = {
    "sdk.spark._job": ("TransactionalJob",),
    "sdk.spark._offsets": ("committed_offsets", "latest_offsets", "offsets_json"),
    "sdk.spark._protocol": ("CommitResult", "TaskOutcome", "TaskWriter"),
    "sdk.spark._shares": ("TxshareDataSource",),
    "sdk.spark._source": ("TxlogDataSource",),
    "sdk.spark._sql": ("sql_committed_offsets",),
    "sdk.spark._txsql": ("TxsqlDataSource",),
}

__all__ = _public(_EXPORTS, "register")


def register(spark: object) -> None:
    """Make `format("txlog")`, `format("txshare")` and `format("txsql")` available in this
    Spark session."""
    from sdk.spark._shares import TxshareDataSource
    from sdk.spark._source import TxlogDataSource
    from sdk.spark._txsql import TxsqlDataSource

    spark.dataSource.register(TxlogDataSource)  # type: ignore[attr-defined]
    spark.dataSource.register(TxshareDataSource)  # type: ignore[attr-defined]
    spark.dataSource.register(TxsqlDataSource)  # type: ignore[attr-defined]


if not _typing.TYPE_CHECKING:
    __getattr__, __dir__ = _exports("sdk.spark", _EXPORTS, globals())
