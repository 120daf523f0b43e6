"""The Spark jobs of the tests that kill a driver or need a cluster: run as
`python tests/support/spark_driver.py '<spec JSON>'` in a process of its own (a test SIGKILLs
it, or its SparkContext must not meet the test session's). A rerun in the test process calls the
same functions, so it is the same job.

Spec: `{"master": ..., "speculation": false, "conf": {...}, "job": "batch", "stream", "mirror"
or "steps", ...}` with, for "batch", `rows`, `partitions`, `options` (the txlog writer's) and
`copies_wait_for` (see `numbers`), for "stream", `source`, `checkpoint` and `options`, for
"mirror" those of `run_mirror`, and for "steps" a list of `steps`, run in order, each a write
into a SQL table (`format` "txsql" or "jdbc", `options`, `rows`, `partitions`, `fault`: see
`ledger_rows`) or `format` "effects" (see `pay_each`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery


def numbers(
    spark: SparkSession, rows: int, partitions: int, copies_wait_for: dict[str, Any] | None = None
) -> DataFrame:
    """Values "0".."rows-1" in `partitions` Spark partitions of consecutive ranges; each row
    goes to the output partition numbered as its Spark partition, so every task attempt writes
    one output partition of its own. With `copies_wait_for` `{"url": coordinator_url, "topic":
    name, "partition": p, "records": n, "attempts": [0]}` the other attempts of Spark partition p
    (a speculative copy) first wait until the coordinator's log holds n records in that output
    partition (the straggler's, not yet committed): a copy never wins, and gets the straggler
    killed, before the straggler wrote them, however long its Python worker took to start."""
    df = spark.range(rows, numPartitions=partitions)
    if copies_wait_for is None:
        return df.selectExpr("cast(id as string) as value", "spark_partition_id() as partition")
    from pyspark.sql import functions as F

    wait = copies_wait_for
    first = wait["partition"] * rows // partitions
    listed = tuple(wait.get("attempts", [0]))

    @F.udf("string", useArrow=False)  # pandas is not installed; plain rows will do
    def guard(value: int) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        if value == first and context is not None and context.attemptNumber() not in listed:
            _wait_for_records(wait["url"], wait["topic"], wait["partition"], wait["records"])
        return ""

    # The guard's (empty) answer is part of the value, so Spark cannot prune the UDF away.
    return df.select(
        F.concat(F.col("id").cast("string"), guard("id")).alias("value"),
        F.spark_partition_id().alias("partition"),
    )


def _wait_for_records(
    url: str, topic: str, partition: int, records: int, deadline_s: float = 120.0
) -> None:
    """Until the partition's high watermark reaches `records`."""
    import httpx

    with httpx.Client(base_url=url, timeout=10) as http:

        def reached() -> bool:
            answer = http.get(f"/v1/topics/{topic}")
            answer.raise_for_status()
            return bool(answer.json()["partitions"][partition]["high_watermark"] >= records)

        _poll(reached, f"{topic}[{partition}] did not reach {records} records", deadline_s)


def _poll(done: Callable[[], bool], failure: str, deadline_s: float) -> None:
    """Ask `done` every 0.1 s until it holds; TimeoutError(`failure`) past the deadline."""
    import time

    deadline = time.monotonic() + deadline_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{failure} in {deadline_s} s")
        time.sleep(0.1)


def write_batch(df: DataFrame, options: dict[str, str]) -> None:
    df.write.format("txlog").options(**options).mode("append").save()


def start_stream(
    spark: SparkSession, source: dict[str, str], checkpoint: str, options: dict[str, str]
) -> StreamingQuery:
    """Every record of the source's topics, copied (key, value) to the output topic, in
    micro-batches until nothing is left (Trigger.AvailableNow)."""
    df = spark.readStream.format("txlog").options(**source).load().select("key", "value")
    return (
        df.writeStream.format("txlog")
        .options(**options)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


# A fault the JVM itself raises or sits out at one row, so that a JVM writer (Spark's JDBC) has
# written the rows before it when the attempt fails or stalls; a Python UDF decides (only it
# knows the attempt number) and the JVM acts, row by row, in the write task.
JVM_FAULT = (
    "CASE fault WHEN 'fail' THEN reflect('java.lang.Integer', 'parseInt', 'injected failure') "
    "WHEN 'stall' THEN reflect('java.lang.Thread', 'sleep', cast({ms} as bigint)) END"
)


def ledger_rows(
    spark: SparkSession, rows: int, partitions: int, fault: dict[str, Any] | None = None
) -> DataFrame:
    """Rows (id, value) 0..rows-1 in `partitions` Spark partitions of consecutive ids. `fault`
    `{"kind": "fail" or "stall", "at": id, "attempts": [0], "seconds": 120}`: the attempts
    listed fail (or stall) when they reach row `id`, after writing the rows before it. With
    `"after": {"url": postgresql_url, "table": name, "rows": n}` an attempt first waits (a poll
    with a deadline) until that table holds n rows: the other tasks' commits, which a failing
    task would otherwise race (the job is aborted, and its running tasks killed, at the last
    failure). With `"copies_wait_for": {"url": postgresql_url, "table": name}` the other attempts of
    the partition holding `at` (a speculative copy, a retry) first wait until that table holds the
    rows the listed attempts write before `at`: a copy never finishes, and gets the straggler
    killed, before the straggler wrote them, however long its start took. `"txsql_job": job_id`
    in place of `"table"` waits on that txsql job's staging table (the straggler's rows are
    staged there), and kind `"none"` injects nothing else."""
    df = spark.range(rows, numPartitions=partitions)
    if fault is None:
        return df.selectExpr("id", "cast(id as string) as value")
    from pyspark.sql import functions as F

    kind, at, attempts = fault["kind"], fault["at"], tuple(fault.get("attempts", [0]))
    after, copies = fault.get("after"), fault.get("copies_wait_for")
    # spark.range's partition p holds ids p * rows // partitions up to the next one's first.
    first = max(f for f in (p * rows // partitions for p in range(partitions)) if f <= at)

    @F.udf("string", useArrow=False)  # pandas is not installed; plain rows will do
    def decide(value: int) -> str | None:
        from pyspark import TaskContext

        context = TaskContext.get()
        listed = context is not None and context.attemptNumber() in attempts
        if copies is not None and value == first and not listed:
            where = f"id >= {first} AND id < {at}"
            table = copies.get("table") or _staging_of(copies["url"], copies["txsql_job"])
            _wait_for_rows(copies["url"], table, at - first, where)
        hit = value == at and listed
        if hit and after is not None:
            _wait_for_rows(after["url"], after["table"], after["rows"])
        return kind if hit else None

    action = JVM_FAULT.format(ms=int(fault.get("seconds", 120) * 1000))
    return df.withColumn("fault", decide("id")).selectExpr(
        "id", f"concat(cast(id as string), coalesce({action}, '')) as value"
    )


def _staging_of(url: str, job_id: str) -> str:
    """The staging table of a txsql job's current run (made by the driver before its tasks)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(
            "SELECT staging FROM txsql_jobs WHERE job_id = %s", (job_id,)
        ).fetchone()
    if row is None or row[0] is None:
        raise RuntimeError(f"txsql job {job_id!r} has no staging table")
    return str(row[0])


def _wait_for_rows(
    url: str, table: str, rows: int, where: str = "true", deadline_s: float = 120.0
) -> None:
    import psycopg

    query = f"SELECT count(*) FROM {table} WHERE {where}"
    with psycopg.connect(url, autocommit=True) as connection:

        def reached() -> bool:
            return bool(connection.execute(query).fetchone()[0] >= rows)  # type: ignore[index]

        _poll(reached, f"{table} did not reach {rows} rows", deadline_s)


def write_sql(df: DataFrame, fmt: str, options: dict[str, str]) -> None:
    df.write.format(fmt).options(**options).mode("append").save()


def pay_each(spark: SparkSession, step: dict[str, Any]) -> None:
    """A job that pays each of `rows` records once at a stand-in bank (`bank` URL) through
    `EffectsClient.once`, keys `{prefix}/{id}`; `kill` [partition, attempt, n] ends that attempt
    (os._exit) after its n-th payment, `stall` [partition, attempt, n, seconds] makes it sleep."""
    bank, url, prefix = step["bank"], step["coordinator"], step["prefix"]
    kill, stall = step.get("kill"), step.get("stall")

    def pay(rows: Any) -> None:
        import os
        import time

        import httpx
        from pyspark import TaskContext

        from sdk import EffectsClient

        context = TaskContext.get()
        where = [context.partitionId(), context.attemptNumber()]
        with EffectsClient({"coordinator.url": url}) as effects, httpx.Client() as http:
            for n, row in enumerate(rows, start=1):
                key = f"{prefix}/{row.id}"

                def call(token: int, key: str = key) -> Any:
                    answer = http.post(bank, json={"key": key, "token": token}, timeout=30)
                    answer.raise_for_status()
                    return answer.json()

                effects.once(key, call, lease_ms=30_000, timeout=120)
                if kill is not None and [*where, n] == kill:
                    os._exit(1)
                if stall is not None and [*where, n] == stall[:3]:
                    time.sleep(stall[3])

    spark.range(step["rows"], numPartitions=step["partitions"]).foreachPartition(pay)


def run_steps(spark: SparkSession, steps: list[dict[str, Any]]) -> None:
    for step in steps:
        spark.sparkContext.setJobDescription(step.get("description", step["format"]))
        if step["format"] == "effects":
            pay_each(spark, step)
        else:
            df = ledger_rows(spark, step["rows"], step["partitions"], step.get("fault"))
            write_sql(df, step["format"], step["options"])
        print(f"step done: {step.get('description', step['format'])}", flush=True)


def run_mirror(spark: SparkSession, spec: dict[str, Any]) -> None:
    """`jobs.mirror`'s stream: `route` (Route's fields), `checkpoint`, `processing_time`,
    `writer_options`, `reader_options`; the value upper-cased on the way."""
    from jobs.mirror import Route, Transform, run_stream

    run_stream(
        spark,
        Route(**spec["route"]),
        Transform(value="upper(value)"),
        spec["checkpoint"],
        processing_time=spec.get("processing_time"),
        writer_options=spec.get("writer_options"),
        reader_options=spec.get("reader_options"),
    )


def main(spec: dict[str, Any]) -> None:
    from jobs.cluster import session
    from sdk.spark import register

    spark = session(
        "txlog-test-driver",
        spec["master"],
        speculation=spec.get("speculation", False),
        conf=spec.get("conf", {}),
    )
    register(spark)
    try:
        if spec["job"] == "batch":
            df = numbers(spark, spec["rows"], spec["partitions"], spec.get("copies_wait_for"))
            write_batch(df, spec["options"])
        elif spec["job"] == "steps":
            run_steps(spark, spec["steps"])
        elif spec["job"] == "mirror":
            run_mirror(spark, spec)
        else:
            query = start_stream(spark, spec["source"], spec["checkpoint"], spec["options"])
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(f"the streaming query failed: {query.exception()}")
    finally:
        spark.stop()
    print("driver done", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
