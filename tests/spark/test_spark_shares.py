"""Spark jobs draining one queue (a share group, KIP-932) exactly once with the `txshare` source
and the txlog sink, the acknowledgements of each micro-batch committed with its output:
`jobs.mirror --share-group`. A first mirror's driver (a child process) is SIGKILLed mid-batch,
its output prepared and not committed; a second mirror drains the rest of the queue meanwhile,
never getting the records the killed batch holds; the first mirror's rerun replays its batch
from the checkpoint and commits it. Every source record is in the copy once."""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from pyspark.sql import SparkSession

from jobs.mirror import Route, Transform, run_stream
from tests.support.spark_support import LOCAL_MASTER, SPARK_CONF, DriverProcess, Log, unique

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

Drivers = Callable[[dict[str, Any], str], DriverProcess]
STARTUP_S = 240.0  # a JVM, a SparkSession and the first tasks, on a busy 2-core machine


def test_two_mirrors_drain_one_queue_exactly_once_through_a_kill_mid_batch(
    spark: SparkSession, log: Log, driver_processes: Drivers, tmp_path: Path
) -> None:
    # One partition, which the share group gives every member (the killed mirror's member stays
    # in the group until its session runs out, and keeps its assignment).
    source, target = log.create_topic(unique("queue"), 1), log.create_topic(unique("copy"), 1)
    group = unique("queue-group")
    configured = log.http.patch(
        f"/v1/groups/{group}/configs", json={"set": {"share.auto.offset.reset": "earliest"}}
    )
    assert configured.status_code == 200, configured.text
    sent = [f"q-{i}" for i in range(40)]
    log.append(source, 0, sent)
    first_job, second_job = unique("drain-a"), unique("drain-b")

    def route(job: str) -> dict[str, Any]:
        return {"url": log.url, "source": source, "target": target, "job_id": job, "group": job}

    checkpoint = str(tmp_path / "first")
    spec = {
        "master": LOCAL_MASTER,
        "conf": SPARK_CONF,
        "job": "mirror",
        "route": {**route(first_job), "share_group": group},
        "checkpoint": checkpoint,
        "processing_time": "300 milliseconds",
        # A micro-batch of 7 records, held until the SIGKILL ends its pause.
        "reader_options": {"maxRecordsPerTrigger": "7"},
        "writer_options": {"testing.pauseBeforeCommit": "600"},
    }
    share_txn = f"/v1/transactions/{quote(first_job + '/share', safe='')}"

    def batch_prepared() -> bool:
        held = log.http.get(share_txn)
        return (
            held.status_code == 200
            and held.json()["state"] == "Prepared"
            and bool(log.values(target, "read_uncommitted"))
        )

    first = driver_processes(spec, "first")
    first.wait_until(batch_prepared, STARTUP_S, "a micro-batch prepared, its output written")
    first.kill()
    held = len(log.values(target, "read_uncommitted"))
    assert held == 7 and log.values(target) == []

    # The second mirror drains the queue: every record but those the killed batch holds. (Its
    # committed copies stay behind the killed batch's open transaction, the target's LSO.)
    second = Route(**route(second_job), share_group=group)
    run_stream(spark, second, Transform(value="upper(value)"), str(tmp_path / "second"))
    assert len(log.values(target, "read_uncommitted")) == len(sent)

    # The first mirror's rerun replays the killed batch from its checkpoint and commits it.
    first_rerun = Route(**route(first_job), share_group=group)
    run_stream(spark, first_rerun, Transform(value="upper(value)"), checkpoint)
    copied = log.records(target, 0)
    values = [base64.b64decode(r["value"]).decode() for r in copied]
    assert Counter(values) == Counter(v.upper() for v in sent)
    origins = [base64.b64decode(r["headers"]["mirror.source"]).decode() for r in copied]
    assert len(set(origins)) == len(sent)
    offsets = log.http.get(f"/v1/share-groups/{group}").json()["offsets"]
    assert {o["lag"] for o in offsets} == {0}
