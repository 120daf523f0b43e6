"""`df.write.format("txsql")` under task retries, failed jobs and reruns (`local[2,3]`: a failed
task is retried), against Spark's own JDBC writer under the same faults. Each test shows its
fault happened (the lost attempt's staged rows discarded, recorded in `txsql_commits`, or the
JDBC writer's duplicates) and that the table holds each row once. The killed-driver and
speculation cases, which need a driver process or a cluster, are in
test_spark_txsql_processes.py."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from sdk.spark import latest_offsets, offsets_json, sql_committed_offsets
from tests.support.spark_driver import ledger_rows, write_sql
from tests.support.spark_support import Log, unique
from tests.support.sql_support import (
    commit_record,
    create_ledger,
    ids,
    jdbc_options,
    query,
    staged,
)

pytestmark = pytest.mark.slow

ROWS, PARTITIONS = 60, 3  # Spark partition p holds ids 20p .. 20p+19
KILLED_AFTER = 7


@pytest.fixture(params=["postgres", "sqlite"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    url: str = request.getfixturevalue("postgres_target")
    return url


def test_txsql_keeps_one_copy_when_a_task_attempt_dies_after_staging_rows(
    spark: SparkSession, target: str
) -> None:
    dbtable, job = unique("ledger").replace("-", "_"), unique("retried")
    kill = {"partitions": [1], "attempts": [0], "after_records": KILLED_AFTER}
    options = {"url": target, "dbtable": dbtable, "jobId": job, "batchsize": "5"}
    write_sql(
        ledger_rows(spark, ROWS, PARTITIONS), "txsql", {**options, "testing.kill": json.dumps(kill)}
    )

    assert ids(target, dbtable) == Counter(range(ROWS))  # created from the schema, filled once
    rows, discarded, winners = commit_record(target, job)
    # The dead attempt had committed 7 rows into the staging table; the commit threw them away.
    assert (rows, discarded) == (ROWS, KILLED_AFTER)
    assert sorted(w.split("/")[1].rsplit(".", 1)[0] for w in winners) == ["0.0", "1.1", "2.0"]


def test_spark_jdbc_duplicates_the_rows_of_an_attempt_that_failed_midway(
    spark: SparkSession, postgres_target: str
) -> None:
    """The baseline: the same fault (partition 1's first attempt fails after 7 rows) with Spark's
    JDBC writer committing as it goes (isolationLevel NONE, as for a store without
    transactions): the retry writes those 7 rows again."""
    dbtable = create_ledger(postgres_target, unique("jdbc").replace("-", "_"))
    fault = {"kind": "fail", "at": 20 + KILLED_AFTER, "attempts": [0]}
    write_sql(
        ledger_rows(spark, ROWS, PARTITIONS, fault),
        "jdbc",
        jdbc_options(postgres_target, dbtable, isolationLevel="NONE", batchsize="1"),
    )
    written = ids(postgres_target, dbtable)
    assert written - Counter(range(ROWS)) == Counter(range(20, 20 + KILLED_AFTER))


def test_a_job_whose_task_keeps_failing_leaves_nothing_with_txsql_and_half_with_jdbc(
    spark: SparkSession, postgres_target: str
) -> None:
    """Retries exhausted: txsql leaves the table untouched and its rerun writes each row once;
    Spark's JDBC writer (default, transactional per task) leaves the other tasks' rows, and its
    rerun duplicates them."""
    url = postgres_target
    dbtable, job = create_ledger(url, unique("ledger").replace("-", "_")), unique("failing")
    kill = {"partitions": [1], "attempts": [0, 1, 2], "after_records": KILLED_AFTER}
    options = {"url": url, "dbtable": dbtable, "jobId": job, "batchsize": "5"}
    with pytest.raises(Py4JJavaError, match="failed 3 times"):
        write_sql(
            ledger_rows(spark, ROWS, PARTITIONS),
            "txsql",
            {**options, "testing.kill": json.dumps(kill)},
        )
    assert ids(url, dbtable) == Counter()
    assert staged(url, dbtable) == 0  # aborted: the run's staging table is gone
    write_sql(ledger_rows(spark, ROWS, PARTITIONS), "txsql", options)  # the rerun
    assert ids(url, dbtable) == Counter(range(ROWS))

    jdbc_table = create_ledger(url, unique("jdbc").replace("-", "_"))
    # The failing task fails once partitions 0 and 2 committed (with two cores, partition 2
    # may not even have started before partition 1's third failure aborts the job).
    fault = {
        "kind": "fail",
        "at": 20 + KILLED_AFTER,
        "attempts": [0, 1, 2],
        "after": {"url": url, "table": jdbc_table, "rows": 40},
    }
    with pytest.raises(Py4JJavaError, match="failed 3 times"):
        write_sql(
            ledger_rows(spark, ROWS, PARTITIONS, fault), "jdbc", jdbc_options(url, jdbc_table)
        )
    half = ids(url, jdbc_table)
    assert half == Counter([*range(20), *range(40, 60)])  # partitions 0 and 2 committed
    write_sql(ledger_rows(spark, ROWS, PARTITIONS), "jdbc", jdbc_options(url, jdbc_table))
    assert ids(url, jdbc_table) - Counter(range(ROWS)) == half


def test_read_process_write_into_sql_resumes_from_the_offsets_committed_with_the_rows(
    spark: SparkSession, log: Log, tmp_path: Path
) -> None:
    target = f"sqlite:///{tmp_path / 'ledger.db'}"
    source = log.create_topic(unique("in"), 2)
    job = group = unique("rpw-sql")
    log.append(source, 0, [f"a{i}" for i in range(10)])
    log.append(source, 1, [f"b{i}" for i in range(10)])

    def run() -> tuple[dict[str, dict[int, int]], dict[str, dict[int, int]]]:
        start = sql_committed_offsets(target, group)  # empty at first: from the earliest
        end = latest_offsets(log.url, [source])
        df = (
            spark.read.format("txlog")
            .option("coordinator.url", log.url)
            .option("subscribe", source)
            .option("startingOffsets", offsets_json(start) if start else "earliest")
            .option("endingOffsets", offsets_json(end))
            .load()
            .selectExpr("cast(value as string) as value", "partition", "offset")
        )
        options = {"url": target, "dbtable": "copies", "jobId": job}
        write_sql(df, "txsql", {**options, "offsets.group": group, "offsets": offsets_json(end)})
        return start, end

    start, end = run()
    assert start == {} and end == {source: {0: 10, 1: 10}}
    assert sql_committed_offsets(target, group) == end
    log.append(source, 1, [f"c{i}" for i in range(5)])
    start, end = run()
    assert start == {source: {0: 10, 1: 10}}  # where the first run's commit ended
    start, end = run()  # nothing new: reads and writes nothing
    assert start == end == {source: {0: 10, 1: 15}}

    values = Counter(str(r[0]) for r in query(target, "SELECT value FROM copies"))
    expected = [f"{p}{i}" for p, n in (("a", 10), ("b", 10), ("c", 5)) for i in range(n)]
    assert values == Counter(expected)
    assert query(target, f"SELECT count(*) FROM txsql_commits WHERE job_id = '{job}'") == [(3,)]
