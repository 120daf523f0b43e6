"""Exactly-once writes from Spark (`local[2,3]`: a failed task is retried): the txlog sink and
`TransactionalJob` under injected task failures, reruns and replays. Each test shows its fault
happened (the lost attempt's records in the log under read_uncommitted, its transaction
aborted in the admin view) and that read_committed sees each record once.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, SparkSession

from sdk.spark import TransactionalJob, committed_offsets, latest_offsets, offsets_json
from sdk.spark._protocol import TaskIdentity, WriteSettings, write_partition
from tests.support.spark_driver import numbers, write_batch
from tests.support.spark_support import Log, unique, wait_until

pytestmark = pytest.mark.slow

ROWS, PARTITIONS = 60, 3  # Spark partition p holds the values 20p .. 20p+19
KILLED_AFTER = 7


def strings(values: range) -> list[str]:
    return [str(i) for i in values]


def kill(attempts: list[int], partition: int = 1) -> str:
    return json.dumps(
        {"partitions": [partition], "attempts": attempts, "after_records": KILLED_AFTER}
    )


def states(log: Log, job: str) -> list[tuple[int, int, str]]:
    return [(a.partition, a.attempt, a.state) for a in log.attempts(job)]


def test_a_task_killed_after_writing_is_retried_and_leaves_one_copy(
    spark: SparkSession, log: Log
) -> None:
    topic = log.create_topic(unique("out"), PARTITIONS)
    job = unique("retried")
    options = {"coordinator.url": log.url, "topic": topic, "jobId": job}
    write_batch(numbers(spark, ROWS, PARTITIONS), {**options, "testing.kill": kill([0])})

    assert sorted(log.values(topic), key=int) == strings(range(ROWS))
    # The first attempt of partition 1 wrote 7 records and died; they are in the log, aborted.
    extra = Counter(log.values(topic, "read_uncommitted")) - Counter(strings(range(ROWS)))
    assert extra == Counter(strings(range(20, 20 + KILLED_AFTER)))
    assert states(log, job) == [
        (0, 0, "CompleteCommit"),
        (1, 0, "CompleteAbort"),
        (1, 1, "CompleteCommit"),
        (2, 0, "CompleteCommit"),
    ]
    read = spark.read.format("txlog").options(**{"coordinator.url": log.url, "subscribe": topic})
    values = [bytes(r.value).decode() for r in read.load().select("value").collect()]
    assert sorted(values, key=int) == strings(range(ROWS))


def test_at_least_once_duplicates_what_a_killed_attempt_wrote(
    spark: SparkSession, log: Log
) -> None:
    """The same failure as above without transactions: the exactly-once tests are not vacuous."""
    topic = log.create_topic(unique("out"), PARTITIONS)
    options = {
        "coordinator.url": log.url,
        "topic": topic,
        "delivery.guarantee": "at_least_once",
        "testing.kill": kill([0]),
    }
    write_batch(numbers(spark, ROWS, PARTITIONS), options)

    written = Counter(log.values(topic))
    assert written - Counter(strings(range(ROWS))) == Counter(strings(range(20, 20 + KILLED_AFTER)))
    assert set(written) == set(strings(range(ROWS)))


def test_a_job_whose_task_keeps_failing_leaves_nothing_visible(
    spark: SparkSession, log: Log
) -> None:
    topic = log.create_topic(unique("out"), PARTITIONS)
    job = unique("failing")
    options = {
        "coordinator.url": log.url,
        "topic": topic,
        "jobId": job,
        "testing.kill": kill([0, 1, 2]),  # local[2,3]: three attempts, then the job fails
        "transaction.timeout.ms": "10000",
    }
    with pytest.raises(Py4JJavaError, match="failed 3 times"):
        write_batch(numbers(spark, ROWS, PARTITIONS), options)

    assert log.values(topic) == []
    uncommitted = Counter(log.values(topic, "read_uncommitted"))
    assert all(uncommitted[str(i)] == 3 for i in range(20, 20 + KILLED_AFTER))
    assert [(a.partition, a.attempt) for a in log.attempts(job) if a.partition == 1] == [
        (1, 0),
        (1, 1),
        (1, 2),
    ]
    # Spark's abort() aborted the job's transactions; an attempt it cancelled midway is
    # aborted by its timeout at the latest. Nothing is ever committed; no LSO stays pinned.
    wait_until(
        lambda: all(a.state == "CompleteAbort" for a in log.attempts(job)),
        60,
        "every attempt aborted",
    )
    assert all(p["last_stable_offset"] == p["high_watermark"] for p in log.partitions(topic))
    assert log.values(topic) == []


def test_read_process_write_reruns_resume_where_the_last_commit_ended(
    spark: SparkSession, log: Log
) -> None:
    from sdk import Producer

    source = log.create_topic(unique("in"), 2)
    topic = log.create_topic(unique("out"), 2)
    job = group = unique("rpw")
    log.append(source, 0, [f"a{i}" for i in range(10)])
    log.append(source, 1, [f"a{i}" for i in range(10, 20)])
    # A transaction still open on partition 0: the first run must stop before it.
    pending = Producer(
        {"coordinator.url": log.url, "transactional.id": unique("pending"), "linger.ms": 1}
    )
    pending.init_transactions()
    pending.begin_transaction()
    for i in range(3):
        pending.produce(source, value=f"t{i}", partition=0)
    pending.flush(30)

    def run() -> tuple[dict[str, dict[int, int]], dict[str, dict[int, int]]]:
        start = committed_offsets(log.url, group, [source])
        end = latest_offsets(log.url, [source])
        df = (
            spark.read.format("txlog")
            .option("coordinator.url", log.url)
            .option("subscribe", source)
            .option("startingOffsets", offsets_json(start))
            .option("endingOffsets", offsets_json(end))
            .load()
        )
        out = df.selectExpr("key", "concat('out-', cast(value as string)) as value")
        options = {"coordinator.url": log.url, "topic": topic, "jobId": job}
        write_batch(out, {**options, "offsets.group": group, "offsets": offsets_json(end)})
        return start, end

    start, end = run()
    assert start == {source: {0: -2, 1: -2}} and end == {source: {0: 10, 1: 10}}
    assert Counter(log.values(topic)) == Counter(f"out-a{i}" for i in range(20))
    assert committed_offsets(log.url, group, [source]) == end

    pending.commit_transaction()
    pending.close()
    log.append(source, 1, [f"b{i}" for i in range(5)])
    start, end = run()
    assert start == {source: {0: 10, 1: 10}}  # where the first run's commit ended
    assert committed_offsets(log.url, group, [source]) == end
    start, end = run()  # nothing new: reads nothing, writes nothing
    assert start == end

    expected = [f"out-{p}{i}" for p, n in (("a", 20), ("t", 3), ("b", 5)) for i in range(n)]
    assert Counter(log.values(topic)) == Counter(expected)
    assert Counter(log.values(topic, "read_uncommitted")) == Counter(expected)
    assert {a.state for a in log.attempts(job)} == {"CompleteCommit"}


def test_a_replayed_foreach_batch_writes_nothing(
    spark: SparkSession, log: Log, tmp_path: Path
) -> None:
    """foreachBatch with `batchId`: Spark replays batch 0 after its commit log entry is lost
    (a crash after the function returned); the second write of it is aborted, not committed."""
    source = log.create_topic(unique("in"))
    topic = log.create_topic(unique("out"))
    job = unique("foreach")
    checkpoint = tmp_path / "checkpoint"
    calls: list[int] = []

    def each_batch(df: DataFrame, batch_id: int) -> None:
        calls.append(batch_id)
        options = {"coordinator.url": log.url, "topic": topic, "jobId": job}
        write_batch(df.select("key", "value"), {**options, "batchId": str(batch_id)})

    def run_stream() -> None:
        query = (
            spark.readStream.format("txlog")
            .option("coordinator.url", log.url)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.foreachBatch(each_batch)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(timeout=120)
        assert not query.isActive and query.exception() is None

    log.append(source, 0, [f"a{i}" for i in range(10)])
    run_stream()
    # Lose batch 0's commit log entry, as a crash right after the function returned would.
    for entry in (checkpoint / "commits").iterdir():
        entry.unlink()
    log.append(source, 0, [f"b{i}" for i in range(5)])
    run_stream()

    assert calls == [0, 0, 1]
    expected = [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(5)]
    assert log.values(topic) == expected
    assert Counter(log.values(topic, "read_uncommitted")) == Counter(
        expected + [f"a{i}" for i in range(10)]
    )
    assert log.group_offsets(f"{job}/batches", topic) == {0: 2}
    runs: dict[str, set[str]] = {}
    for attempt in log.attempts(job):
        runs.setdefault(attempt.run, set()).add(attempt.state)
    assert sorted(sorted(s) for s in runs.values()) == [
        ["CompleteAbort"],
        ["CompleteCommit"],
        ["CompleteCommit"],
    ]


def _dies_once(url: str, topic: str) -> Any:
    """A `partition_writer` function: each Spark partition's ids to the output partition of the
    same number; partition 1's first attempt dies (os._exit) once 7 of its records are in the
    log. Self-contained, so it pickles by value to the Python workers."""

    def write(rows: Any, out: Any) -> None:
        import os
        import time

        import httpx
        from pyspark import TaskContext

        context = TaskContext.get()
        partition, attempt = context.partitionId(), context.attemptNumber()
        for n, row in enumerate(rows, start=1):
            out.produce(topic, value=str(row.id), partition=partition)
            if (partition, attempt, n) == (1, 0, 7):
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    doc = httpx.get(f"{url}/v1/topics/{topic}").json()
                    if doc["partitions"][1]["high_watermark"] >= n:
                        break
                    time.sleep(0.02)
                os._exit(1)

    return write


def test_transactional_job_commits_one_copy_despite_a_retried_task_with_its_offsets(
    spark: SparkSession, log: Log
) -> None:
    source = log.create_topic(unique("in"))
    topic = log.create_topic(unique("out"), PARTITIONS)
    job, group = unique("foreach-partition"), unique("group")
    log.append(source, 0, ["input"] * ROWS)

    run = TransactionalJob(spark, job_id=job, coordinator_url=log.url)
    spark.range(ROWS, numPartitions=PARTITIONS).foreachPartition(
        run.partition_writer(_dies_once(log.url, topic))
    )
    assert sorted((o.partition, o.attempt) for o in run.outcomes) == [(0, 0), (1, 1), (2, 0)]
    result = run.commit(offsets_group=group, offsets={source: {0: ROWS}})

    assert sorted(log.values(topic), key=int) == strings(range(ROWS))
    assert log.group_offsets(group, source) == {0: ROWS}
    # Partition 1 holds the dead attempt's 7 records (aborted), then the retry's 20.
    in_log = [r for r in log.values(topic, "read_uncommitted") if 20 <= int(r) < 40]
    assert in_log == strings(range(20, 20 + KILLED_AFTER)) + strings(range(20, 40))
    assert states(log, job) == [
        (0, 0, "CompleteCommit"),
        (1, 0, "CompleteAbort"),
        (1, 1, "CompleteCommit"),
        (2, 0, "CompleteCommit"),
    ]
    lost = next(a.tid for a in log.attempts(job) if a.state == "CompleteAbort")
    assert result.aborted == [lost] and len(result.committed) == PARTITIONS


def test_transactional_job_abort_leaves_nothing_visible(spark: SparkSession, log: Log) -> None:
    topic = log.create_topic(unique("out"))
    job = unique("aborted")
    run = TransactionalJob(spark, job_id=job, coordinator_url=log.url)

    def write(rows: Any, out: Any) -> None:
        for row in rows:
            out.produce(topic, value=str(row.id))

    spark.range(20, numPartitions=2).foreachPartition(run.partition_writer(write))
    result = run.abort()

    assert log.values(topic) == []
    assert sorted(log.values(topic, "read_uncommitted"), key=int) == strings(range(20))
    assert [s for _, _, s in states(log, job)] == ["CompleteAbort"] * 2
    assert sorted(result.aborted) == [a.tid for a in log.attempts(job)]
    assert (
        log.partitions(topic)[0]["last_stable_offset"] == log.partitions(topic)[0]["high_watermark"]
    )
    with pytest.raises(RuntimeError, match="already committed or aborted"):
        run.commit()


def test_a_new_transactional_job_aborts_what_a_crashed_run_left_open(
    spark: SparkSession, log: Log
) -> None:
    topic = log.create_topic(unique("out"))
    job = unique("rerun")
    # A crashed run's task: prepared, never committed (its driver died).
    crashed = WriteSettings(url=log.url, token=None, topic=topic, job_id=job, run="crashed")
    write_partition(crashed, [(None, None, "lost", None, None)], TaskIdentity(0, 0, 1))
    assert states(log, job) == [(0, 0, "Prepared")]
    assert log.partitions(topic)[0]["last_stable_offset"] == 0

    TransactionalJob(spark, job_id=job, coordinator_url=log.url)

    assert states(log, job) == [(0, 0, "CompleteAbort")]
    assert log.partitions(topic)[0]["last_stable_offset"] == 2  # the record and its abort marker
    assert log.values(topic) == []
