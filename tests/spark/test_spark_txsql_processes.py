"""txsql and `once` where the fault needs a process of its own: a driver SIGKILLed between its
tasks and its commit, then rerun; and a cluster where Spark really speculates (the mini
standalone cluster of jobs/cluster.py), with a task attempt killed and a straggler copied, for
txsql, for Spark's JDBC writer, and for a job paying a stand-in bank once per record."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from jobs.cluster import mini_cluster
from tests.support.spark_driver import ledger_rows, write_sql
from tests.support.spark_support import LOCAL_MASTER, SPARK_CONF, DriverProcess, Log, unique
from tests.support.sql_support import (
    commit_record,
    create_ledger,
    ids,
    jdbc_options,
    staged,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STARTUP_S = 240.0  # a JVM, a SparkSession and the first tasks, on a busy 2-core machine


def test_driver_killed_between_tasks_and_commit_then_rerun_writes_once_where_jdbc_doubles(
    spark: SparkSession, postgres_target: str, tmp_path: Path
) -> None:
    url, rows, partitions = postgres_target, 30, 3
    dbtable, job = unique("ledger").replace("-", "_"), unique("killed-driver")
    jdbc_table = create_ledger(url, unique("jdbc").replace("-", "_"))
    options = {"url": url, "dbtable": dbtable, "jobId": job}
    spec = {
        "master": LOCAL_MASTER,
        "conf": SPARK_CONF,
        "job": "steps",
        "steps": [
            {
                "format": "jdbc",
                "rows": rows,
                "partitions": partitions,
                "options": jdbc_options(url, jdbc_table),
            },
            {
                "format": "txsql",
                "rows": rows,
                "partitions": partitions,
                "options": {**options, "testing.pauseBeforeCommit": "600"},
            },
        ],
    }
    driver = DriverProcess(spec, tmp_path, "driver").start()
    try:
        driver.wait_until(
            lambda: "step done: jdbc" in driver.tail() and staged(url, dbtable) == rows,
            STARTUP_S,
            "every txsql task's rows staged",
        )
    finally:
        driver.kill()

    # Killed between the tasks and the commit: txsql's rows are all staged, none in the table;
    # the JDBC writer's tasks had committed theirs as they finished.
    assert staged(url, dbtable) == rows and ids(url, dbtable) == Counter()
    assert ids(url, jdbc_table) == Counter(range(rows))

    # The reruns, as a job that never recorded its completion runs again.
    write_sql(ledger_rows(spark, rows, partitions), "txsql", options)
    write_sql(ledger_rows(spark, rows, partitions), "jdbc", jdbc_options(url, jdbc_table))

    assert ids(url, dbtable) == Counter(range(rows))
    assert staged(url, dbtable) == 0  # the dead run's staged rows were dropped by the rerun
    assert commit_record(url, job)[:2] == (rows, 0)
    assert ids(url, jdbc_table) == Counter({i: 2 for i in range(rows)})


class Bank:
    """A stand-in outside service on 127.0.0.1: records every payment request it gets."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        lock = threading.Lock()
        calls = self.calls

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with lock:
                    calls.append((body["key"], body["token"]))
                answer = json.dumps({"transfer": f"t-{body['key']}"}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/pay"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def bank() -> Iterator[Bank]:
    stand_in = Bank()
    yield stand_in
    stand_in.close()


def task_ends_by_job(event_logs: Path) -> dict[str, list[dict[str, Any]]]:
    """Spark's own record of every finished task attempt, by the job description of its stage."""
    stages: dict[int, str] = {}
    ends: list[dict[str, Any]] = []
    for path in event_logs.iterdir():
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["Event"] == "SparkListenerStageSubmitted":
                described = (event.get("Properties") or {}).get("spark.job.description", "")
                stages[event["Stage Info"]["Stage ID"]] = described
            elif event["Event"] == "SparkListenerTaskEnd":
                ends.append(event)
    by_job: dict[str, list[dict[str, Any]]] = {}
    for end in ends:
        by_job.setdefault(stages.get(end["Stage ID"], ""), []).append(end)
    return by_job


def outcomes(ends: list[dict[str, Any]]) -> Counter[tuple[str, bool]]:
    return Counter((e["Task End Reason"]["Reason"], e["Task Info"]["Speculative"]) for e in ends)


def test_speculation_and_retries_on_a_cluster_txsql_once_jdbc_twice_and_each_payment_once(
    log: Log, bank: Bank, postgres_target: str, tmp_path: Path
) -> None:
    url, rows, partitions = postgres_target, 40, 4  # partition p holds ids 10p .. 10p+9
    dbtable, job = unique("ledger").replace("-", "_"), unique("speculated")
    jdbc_table = create_ledger(url, unique("jdbc").replace("-", "_"))
    prefix = unique("bank")
    event_logs = tmp_path / "events"
    event_logs.mkdir()
    # Partition 0's first attempt stalls after 3 rows in every job; Spark copies it to the other
    # worker (another host to Spark), the copy finishes first and the straggler is killed.
    straggler = {"partitions": [0], "attempts": [0], "after_records": 3, "seconds": 120}
    steps = [
        {
            "format": "txsql",
            "description": "txsql",
            "rows": rows,
            "partitions": partitions,
            # The copy waits for the straggler's 3 staged rows, as the JDBC step's does: on a busy
            # machine the copy could otherwise commit before the straggler staged any (seen once:
            # nothing discarded).
            "fault": {
                "kind": "none",
                "at": 3,
                "attempts": [0],
                "copies_wait_for": {"url": url, "txsql_job": job},
            },
            "options": {
                "url": url,
                "dbtable": dbtable,
                "jobId": job,
                "testing.delay": json.dumps(straggler),
            },
        },
        {
            "format": "jdbc",
            "description": "jdbc",
            "rows": rows,
            "partitions": partitions,
            # The copy waits for the straggler's 3 rows: on a busy machine the straggler's start
            # (its Python worker) can outlast the speculation threshold, and the copy win first.
            "fault": {
                "kind": "stall",
                "at": 3,
                "attempts": [0],
                "seconds": 120,
                "copies_wait_for": {"url": url, "table": jdbc_table},
            },
            "options": jdbc_options(url, jdbc_table, isolationLevel="NONE", batchsize="1"),
        },
        {
            "format": "effects",
            "description": "effects",
            "rows": rows,
            "partitions": partitions,
            "bank": bank.url,
            "coordinator": log.url,
            "prefix": prefix,
            "kill": [1, 0, 3],  # partition 1's first attempt dies after its 3rd payment
            "stall": [0, 0, 3, 120],
        },
    ]
    with mini_cluster(workdir=tmp_path / "cluster") as cluster:
        spec = {
            "master": cluster.master_url,
            "speculation": True,
            "conf": {
                **SPARK_CONF,
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": event_logs.as_uri(),
                "spark.eventLog.compress": "false",
                "spark.eventLog.rolling.enabled": "false",
            },
            "job": "steps",
            "steps": steps,
        }
        driver = DriverProcess(spec, tmp_path, "speculating").start()
        try:
            driver.wait(timeout=STARTUP_S + 120)
        finally:
            driver.kill()

    tasks = task_ends_by_job(event_logs)
    for name in ("txsql", "jdbc", "effects"):  # Spark's word: a speculative copy won each
        assert outcomes(tasks[name])[("Success", True)] >= 1, (name, outcomes(tasks[name]))
    failed = [e for e in tasks["effects"] if e["Task End Reason"]["Reason"] not in
              ("Success", "TaskKilled")]  # fmt: skip
    assert [e["Task Info"]["Index"] for e in failed] == [1]  # the killed attempt, retried

    # txsql: each row once; the straggler's 3 staged rows were thrown away at the commit.
    assert ids(url, dbtable) == Counter(range(rows))
    committed, discarded, winners = commit_record(url, job)
    assert (committed, discarded) == (rows, 3)
    assert any(w.split("/")[1].startswith("0.1.") for w in winners), winners
    # Spark's JDBC writer, committing as it goes: the straggler's 3 rows stay, twice.
    assert ids(url, jdbc_table) - Counter(range(rows)) == Counter(range(3))
    # The bank saw each payment once, despite the killed attempt and the speculative copy.
    assert Counter(key for key, _ in bank.calls) == Counter(f"{prefix}/{i}" for i in range(rows))
