"""Spark jobs whose driver is killed, or that run on a cluster where Spark really speculates: the
driver runs in a child process (`tests/support/spark_driver.py`), SIGKILLed at the moment the
admin view or the consumer group shows; the rerun runs in the test session's SparkSession.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from jobs.cluster import mini_cluster
from tests.support.spark_driver import numbers, start_stream, write_batch
from tests.support.spark_support import LOCAL_MASTER, SPARK_CONF, DriverProcess, Log, unique

# A cluster, JVMs and SparkSessions started per test: more than the default 300 s on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

Drivers = Callable[[dict[str, Any], str], DriverProcess]

# Long enough that only the test's SIGKILL ends the pause.
PAUSE_S = "600"
STARTUP_S = 240.0  # a JVM, a SparkSession and the first tasks, on a busy 2-core machine


def test_driver_killed_between_prepares_and_commit_then_rerun_leaves_one_copy(
    spark: SparkSession, log: Log, driver_processes: Drivers
) -> None:
    rows, partitions = 30, 3
    topic = log.create_topic(unique("out"), partitions)
    job = unique("killed-driver")
    options = {"coordinator.url": log.url, "topic": topic, "jobId": job}
    spec = {
        "master": LOCAL_MASTER,
        "conf": SPARK_CONF,
        "job": "batch",
        "rows": rows,
        "partitions": partitions,
        "options": {**options, "testing.pauseBeforeCommit": PAUSE_S},
    }
    driver = driver_processes(spec, "driver")
    driver.wait_until(
        lambda: [a.state for a in log.attempts(job)] == ["Prepared"] * partitions,
        STARTUP_S,
        "every task's transaction Prepared",
    )
    driver.kill()

    # Killed between the prepares and the commit: everything is in the log, nothing visible,
    # and the prepared transactions hold every partition's LSO at the start.
    old = log.attempts(job)
    assert [a.state for a in old] == ["Prepared"] * partitions
    assert log.values(topic) == []
    assert sorted(log.values(topic, "read_uncommitted"), key=int) == [str(i) for i in range(rows)]
    assert all(p["last_stable_offset"] == 0 for p in log.partitions(topic))

    write_batch(numbers(spark, rows, partitions), options)  # the rerun

    assert sorted(log.values(topic), key=int) == [str(i) for i in range(rows)]
    states = {a.tid: a.state for a in log.attempts(job)}
    assert all(states[a.tid] == "CompleteAbort" for a in old)
    new = [a for a in log.attempts(job) if a.run != old[0].run]
    assert [(a.partition, a.state) for a in new] == [
        (p, "CompleteCommit") for p in range(partitions)
    ]
    # The rerun aborted the old transactions before its tasks wrote: on every partition the
    # old run's records, then its abort marker (one offset), then the rerun's records.
    per_partition = rows // partitions
    for p in range(partitions):
        old_offsets = list(range(per_partition))
        new_offsets = list(range(per_partition + 1, 2 * per_partition + 1))
        assert log.offsets(topic, p, "read_uncommitted") == old_offsets + new_offsets
        assert log.offsets(topic, p, "read_committed") == new_offsets


def test_streaming_query_killed_after_its_commit_restarts_from_checkpoint_without_duplicates(
    spark: SparkSession, log: Log, driver_processes: Drivers, tmp_path: Path
) -> None:
    source = log.create_topic(unique("in"), 2)
    topic = log.create_topic(unique("out"))
    job = unique("stream")
    first = [f"a{i}" for i in range(20)]
    log.append(source, 0, first[:10])
    log.append(source, 1, first[10:])
    checkpoint = str(tmp_path / "checkpoint")
    read = {"coordinator.url": log.url, "subscribe": source, "startingOffsets": "earliest"}
    options = {"coordinator.url": log.url, "topic": topic, "jobId": job}
    spec = {
        "master": LOCAL_MASTER,
        "conf": SPARK_CONF,
        "job": "stream",
        "source": read,
        "checkpoint": checkpoint,
        "options": {**options, "testing.pauseAfterCommit": PAUSE_S},
    }
    driver = driver_processes(spec, "stream")
    batches = f"{job}/batches"
    driver.wait_until(
        lambda: log.group_offsets(batches, topic) == {0: 1}, STARTUP_S, "batch 0 committed"
    )
    driver.kill()

    # Killed between the coordinator's commit and Spark's commit log: batch 0 is planned in
    # the checkpoint's offsets log but not marked done, so a restart runs it again.
    assert (Path(checkpoint) / "offsets" / "0").exists()
    assert not (Path(checkpoint) / "commits" / "0").exists()
    assert sorted(log.values(topic)) == sorted(first)

    second = [f"b{i}" for i in range(10)]
    log.append(source, 0, second[:5])
    log.append(source, 1, second[5:])
    query = start_stream(spark, read, checkpoint, options)  # the restart
    query.awaitTermination(timeout=STARTUP_S)
    assert not query.isActive and query.exception() is None

    assert Counter(log.values(topic)) == Counter(first + second)
    assert log.group_offsets(batches, topic) == {0: 2}
    # Batch 0 really ran again: its second output is in the log, aborted.
    uncommitted = Counter(log.values(topic, "read_uncommitted"))
    assert uncommitted == Counter(first * 2 + second)
    # One attempt per source partition: batch 0 and batch 1 committed, batch 0 again aborted.
    assert Counter(a.state for a in log.attempts(job)) == {
        "CompleteCommit": 4,
        "CompleteAbort": 2,
    }


def _task_ends(event_logs: Path) -> list[dict[str, Any]]:
    """Spark's own record of every finished task attempt (the event log's TaskEnd events)."""
    ends = []
    for path in event_logs.iterdir():
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["Event"] == "SparkListenerTaskEnd":
                ends.append(event)
    return ends


def test_a_speculative_duplicate_attempt_leaves_one_copy(
    log: Log, driver_processes: Drivers, tmp_path: Path
) -> None:
    rows, partitions = 40, 4
    topic = log.create_topic(unique("out"), partitions)
    job = unique("speculated")
    event_logs = tmp_path / "events"
    event_logs.mkdir()
    # Partition 0's first attempt writes 3 records, then stalls; Spark copies it to the other
    # worker (another host to Spark), the copy finishes first and is the one committed.
    straggler = {"partitions": [0], "attempts": [0], "after_records": 3, "seconds": 120}
    options = {"coordinator.url": log.url, "topic": topic, "jobId": job}
    with mini_cluster(workdir=tmp_path / "cluster") as cluster:
        spec = {
            "master": cluster.master_url,
            "speculation": True,
            "conf": {
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": event_logs.as_uri(),
                "spark.eventLog.compress": "false",
                "spark.eventLog.rolling.enabled": "false",
            },
            "job": "batch",
            "rows": rows,
            "partitions": partitions,
            # No copy wins before the straggler has written its 3 records: on a loaded machine
            # its Python worker can take seconds just to start, and a copy that won before the
            # straggler wrote anything would leave no fault to check.
            "copies_wait_for": {"url": log.url, "topic": topic, "partition": 0, "records": 3},
            "options": {**options, "testing.delay": json.dumps(straggler)},
        }
        driver_processes(spec, "speculating").wait(timeout=STARTUP_S)

    successes = {
        (e["Task Info"]["Index"], e["Task Info"]["Attempt"]): e["Task Info"]["Speculative"]
        for e in _task_ends(event_logs)
        if e["Task End Reason"]["Reason"] == "Success"
    }
    assert successes.get((0, 1)) is True, successes  # Spark's word: a speculative copy won

    assert sorted(log.values(topic), key=int) == [str(i) for i in range(rows)]
    attempts = {(a.partition, a.attempt): a.state for a in log.attempts(job)}
    # Exactly the attempts Spark counted as successful were committed, one per partition.
    committed = {key for key, state in attempts.items() if state == "CompleteCommit"}
    assert committed == set(successes)
    assert sorted(p for p, _ in committed) == list(range(partitions))
    assert attempts[(0, 0)] == "CompleteAbort"
    # The straggler had written before it stalled: its records are in the log, aborted.
    per_partition = rows // partitions
    uncommitted = log.records(topic, 0, "read_uncommitted")
    assert len(uncommitted) == 3 + per_partition
