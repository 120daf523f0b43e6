"""The run: payments produced, the settlement job run in waves on a Spark mini cluster with
speculation, payouts made, and what happened gathered."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from jobs.demo.bank import StandInBank, payout_faults
from jobs.demo.common import (
    GROUP,
    JOB_ID,
    LOCAL_STRAGGLER_SECONDS,
    PAYMENTS,
    REJECTED,
    SETTLEMENTS,
    STRAGGLER_SECONDS,
    WRITE_TASKS,
    Options,
    say,
)
from jobs.demo.evidence import JobTransactions, SparkTasks, SqlCommits
from jobs.demo.network import DroppingTransport
from jobs.demo.payments import generate_payments, waves
from jobs.demo.reconcile import reconcile
from jobs.demo.report import Findings
from jobs.demo.service import embedded_coordinator, read_topic
from jobs.payouts import committed_settlements
from jobs.settlement import (
    BatchRun,
    Payment,
    Settlement,
    Source,
    settle,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


# -- the run -----------------------------------------------------------------------------------


def produce_payments(url: str, payments: Sequence[Payment], transport: DroppingTransport) -> None:
    """Send `payments` through an idempotent producer over `transport`; every one must be
    delivered (the retries are the producer's own)."""
    from sdk import Producer

    failures: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(err)

    def reported(_err: Any) -> None:
        # Each answer the transport loses is a transport error the producer reports (and
        # retries): counted for the report, not logged as a warning.
        transport.errors_reported += 1

    config = {
        "coordinator.url": url,
        "enable.idempotence": True,
        "linger.ms": 5,
        # Small batches: many requests, so that some answers get lost.
        "batch.size": 1024,
        "retry.backoff.ms": 20,
        "on_delivery": delivered,
        "error_cb": reported,
    }
    with Producer(config, transport=transport) as producer:
        for payment in payments:
            producer.produce(PAYMENTS, payment.to_json(), key=payment.merchant)
            producer.poll(0)
        remaining = producer.flush(60)
    if remaining or failures:
        raise RuntimeError(f"payments not delivered: {remaining} left, errors {failures[:3]}")


def write_tasks_of(spark: SparkSession, merchants: Sequence[str]) -> dict[int, int]:
    """How many settlement records each write task will get: Spark's own hash of `merchant`
    (the settlement job's repartition), computed by Spark on these merchants."""
    from pyspark.sql import functions as F

    frame = spark.createDataFrame([(m,) for m in sorted(set(merchants))], "merchant string")
    rows = (
        frame.repartition(WRITE_TASKS, "merchant")
        .groupBy(F.spark_partition_id().alias("task"))
        .count()
        .collect()
    )
    return {row["task"]: row["count"] for row in rows}


def faults_for(tasks: dict[int, int], straggler_seconds: float) -> tuple[dict[str, str], list[str]]:
    """`testing.kill` for the busiest write task's first attempt (it dies after half its
    records), `testing.delay` for the next busiest (it stalls after half of its own); and a
    sentence for each."""
    busiest = sorted(((n, task) for task, n in tasks.items() if n > 0), key=lambda t: (-t[0], t[1]))
    options: dict[str, str] = {}
    said: list[str] = []
    if busiest:
        count, task = busiest[0]
        after = max(1, count // 2)
        options["testing.kill"] = json.dumps(
            {"partitions": [task], "attempts": [0], "after_records": after}
        )
        said.append(f"task {task} attempt 0 dies after writing {after} of its {count} records")
    if len(busiest) > 1:
        count, task = busiest[1]
        after = max(1, count // 2)
        options["testing.delay"] = json.dumps(
            {
                "partitions": [task],
                "attempts": [0],
                "after_records": after,
                "seconds": straggler_seconds,
            }
        )
        said.append(
            f"task {task} attempt 0 stalls {straggler_seconds:.0f} s after writing {after} of "
            f"its {count} records"
        )
    return options, said


@contextlib.contextmanager
def spark_for(options: Options, workdir: Path) -> Iterator[tuple[SparkSession, str, bool]]:
    """The SparkSession the demo runs on: the mini cluster with speculation, or `master`.
    Yields the session, a description, and whether Spark can speculate there."""
    from jobs.cluster import mini_cluster, session

    events = workdir / "spark-events"
    events.mkdir(exist_ok=True)
    conf = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": events.as_uri(),
        # One plain JSON Lines file (Spark 4 defaults to rolling, zstd-compressed logs).
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }
    with contextlib.ExitStack() as stack:
        if options.master is None:
            cluster = stack.enter_context(mini_cluster(workdir=workdir / "cluster"))
            master = cluster.master_url
            where = f"{master}: 2 workers (127.0.0.2, 127.0.0.3), 1 core each, speculation on"
            speculates = True
        else:
            master = options.master
            speculates = not master.startswith("local")
            where = master + ("" if speculates else " (Spark never speculates in local mode)")
        spark = session("coordinator-demo", master, speculation=True, conf=conf, log_dir=workdir)
        stack.callback(spark.stop)
        # The task failures are injected and reported from the event log; in local mode their
        # stack traces would bury the report. A failed job still raises here.
        spark.sparkContext.setLogLevel("FATAL")
        yield spark, where, speculates


def run(options: Options) -> dict[str, Any]:
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="txlog-demo-"))
    try:
        return _run(options, workdir, started)
    finally:
        if options.keep:
            kept = "coordinator.db, ledger.db, coordinator.log, spark-events, cluster logs"
            say(f"kept: {workdir} ({kept})")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _run(options: Options, workdir: Path, started: float) -> dict[str, Any]:
    from jobs.payouts import pay_settlements
    from jobs.settlement import run_batch
    from sdk import AdminClient, NewTopic
    from sdk.spark import register

    payments = generate_payments(options.events, options.merchants, options.seed)
    say("coordinator demo: payments settled by Spark, exactly once, through lost answers,")
    say("failed task attempts and speculative copies")
    say()
    with embedded_coordinator(workdir) as (url, service):
        say(f"coordinator  {url} (pid {service.pid}), SQLite {workdir / 'coordinator.db'}")
        with AdminClient({"coordinator.url": url}) as admin:
            for future in admin.create_topics(
                [NewTopic(PAYMENTS, 3), NewTopic(SETTLEMENTS, 2), NewTopic(REJECTED, 1)]
            ).values():
                future.result()
        transport = DroppingTransport(options.drop_rate, options.seed)
        expected: list[Settlement] = []
        runs: list[BatchRun] = []
        sql_url = f"sqlite:///{workdir / 'ledger.db'}" if options.output == "sql" else None
        source = Source(url, PAYMENTS, SETTLEMENTS, JOB_ID, GROUP, sql_url=sql_url)
        table = f"table settlements in {workdir / 'ledger.db'}, through txsql"
        say(f"settlements  {table if sql_url else 'topic ' + SETTLEMENTS + ', through txlog'}")
        with StandInBank() as bank, spark_for(options, workdir) as (spark, where, speculates):
            register(spark)
            say(f"spark        {where}")
            say(f"bank         {bank.url} (a stand-in that counts every call)")
            straggle = STRAGGLER_SECONDS if speculates else LOCAL_STRAGGLER_SECONDS
            for number, wave in enumerate(waves(payments, options.rounds), start=1):
                say()
                say(
                    f"round {number}: {len(wave)} payments -> {PAYMENTS} (answers lost at "
                    f"{options.drop_rate:.0%})"
                )
                before = (transport.requests, transport.dropped, transport.duplicates)
                produce_payments(url, wave, transport)
                say(
                    f"  produce requests {transport.requests - before[0]}, answers lost "
                    f"{transport.dropped - before[1]}, retries answered duplicate "
                    f"{transport.duplicates - before[2]}"
                )
                writer_options, faults = faults_for(
                    write_tasks_of(spark, [p.merchant for p in wave]), straggle
                )
                for fault in faults or ["no faults: no settlement task has output"]:
                    say(f"  fault: {fault}")
                round_started = time.monotonic()
                batch = run_batch(
                    spark, source, partitions=WRITE_TASKS, writer_options=writer_options
                )
                runs.append(batch)
                expected.extend(settle(wave, batch.batch))
                say(
                    f"  settled {batch.batch} in {time.monotonic() - round_started:.1f} s; "
                    f"offsets committed for group {GROUP!r}" + (" with the rows" if sql_url else "")
                )
                paying_faults, said = payout_faults(straggle)
                for fault in said:
                    say(f"  fault: {fault}")
                paid_before = len(bank.calls)
                payouts = pay_settlements(
                    spark, source, bank.url, partitions=WRITE_TASKS, faults=paying_faults
                )
                say(
                    f"  payouts: {payouts} settlements committed so far, bank calls this round "
                    f"{len(bank.calls) - paid_before}"
                )
        if sql_url is None:
            with httpx.Client(base_url=url, timeout=30) as http:
                committed = http.get(f"/v1/groups/{GROUP}/offsets").json()["offsets"]
        else:
            from sdk.spark import sql_committed_offsets

            stored = sql_committed_offsets(sql_url, GROUP).get(PAYMENTS, {})
            committed = [
                {"topic": PAYMENTS, "partition": p, "offset": o} for p, o in stored.items()
            ]
        findings = Findings(
            payments=payments,
            in_log=[Payment.from_json(v) for v in read_topic(url, PAYMENTS)],
            transport=transport,
            tasks=SparkTasks.from_event_log(workdir / "spark-events"),
            txns=JobTransactions.of(url, JOB_ID),
            sql=SqlCommits.of(sql_url, JOB_ID) if sql_url else None,
            check=reconcile(
                expected,
                committed_settlements(None, source)
                if sql_url
                else [Settlement.from_json(v) for v in read_topic(url, SETTLEMENTS)],
            ),
            bank=bank,
            runs=runs,
            expected=len(expected),
            committed={e["partition"]: e["offset"] for e in committed if e["topic"] == PAYMENTS},
        )
    return findings.report(options, started)
