"""The settlement job (jobs/settlement.py, batch mode) written exactly once, against the same
job with plain appends (at-least-once, as Spark's Kafka sink), in one run on one machine; its
input read with the txlog source and with Spark's own Kafka source (`format("kafka")`,
read_committed, from the coordinator's Kafka listener).

What it measures:

1. setup: `coordinator serve` in a child process on a fresh store (a scratch Postgres database
   by default, or an SQLite file with `--sqlite`); `--events` payments for `--merchants`
   merchants are produced once into `payments` (`--partitions` partitions) by an idempotent SDK
   producer. Not measured.
2. runs: the settlement job over all of them, as `jobs.settlement.run_batch` runs it: read the
   group's committed offsets and the payments' last stable offsets, read the range with the txlog
   source, aggregate per merchant (one shuffle into `--write-tasks` tasks), write one settlement
   per merchant. `exactly_once`: each task writes in its own transaction and prepares it; the
   driver commits all of them with the input offsets in one commit-group. `at_least_once`: plain
   appends (`delivery.guarantee=at_least_once`), then a plain group offset commit. Each run uses
   a new consumer group, so every run settles all `--events` payments. Each of the four runs
   (reader txlog or kafka, times write exactly_once or at_least_once) gets one unmeasured
   warm-up (JVM, Python workers), then `--repeat` rounds alternating the order so drifts hit all
   alike. A run's time is the wall time of `run_batch`, offsets look-ups and commit included.
3. check: each exactly-once output, read back read_committed, holds one settlement per merchant
   per exactly-once run, and their totals match the payments.

Per reader, `ratio` = median exactly-once time / median at-least-once time. Goal: <= 1.15 (the
exactly-once write costs no more with Spark's Kafka source than with txlog).
`paired_ratio_median`: the median of each round's exactly-once / at-least-once, less disturbed
by load that comes and goes. The exactly-once cost is mostly fixed per job (a few coordinator
calls per task and the driver's commit-group), so the ratio falls as `--events` grows.
`kafka_vs_txlog`: the exactly-once job's median time reading with Spark's Kafka source over its
time reading with txlog.

The Kafka source needs Spark's connector: the jars the README's test command resolves
(tests/clients/spark/target/lib, `--kafka-jars`), else `spark.jars.packages` at pyspark's version.

Run (needs pyspark and Java; Postgres reachable unless `--sqlite`):

    python bench/spark_job.py
    python bench/spark_job.py --sqlite --events 100000 --merchants 5000 --repeat 5

A readable table goes to stdout; its last line is one JSON object with the figures. Progress
goes to stderr. Figures are noisy when other work shares the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _support import (
    DEFAULT_POSTGRES_URL,
    POSTGRES_ENV,
    admin,
    log,
    plain_url,
    positive_int,
    with_database,
)

from coordinator.launcher import free_port
from jobs.demo import embedded_coordinator, generate_payments, read_topic
from jobs.settlement import Settlement, Source, run_batch, settle

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PAYMENTS = "payments"
MODES = ("exactly_once", "at_least_once")
READERS = ("txlog", "kafka")
RUNS = tuple((reader, mode) for reader in READERS for mode in MODES)
CONNECTOR_LIB = Path(__file__).resolve().parents[1] / "tests/clients/spark/target/lib"


@contextlib.contextmanager
def store(args: argparse.Namespace, workdir: Path) -> Iterator[str | None]:
    """The database URL for the service: None for SQLite in `workdir`, else a scratch Postgres
    database, dropped on the way out."""
    if args.sqlite:
        yield None
        return
    server = plain_url(args.postgres_url)
    name = f"bench_spark_{os.urandom(6).hex()}"
    asyncio.run(admin(server, f'CREATE DATABASE "{name}"'))
    log(f"created database {name}")
    try:
        yield with_database(server, name)
    finally:
        asyncio.run(admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        log(f"dropped database {name}")


def produce(url: str, args: argparse.Namespace) -> list[Settlement]:
    """The payments, produced once; returns the settlement they call for (batch label '')."""
    from sdk import AdminClient, NewTopic, Producer

    with AdminClient({"coordinator.url": url}) as client:
        topics = [NewTopic(PAYMENTS, args.partitions)]
        topics += [NewTopic(output(*run), args.partitions) for run in RUNS]
        topics.append(NewTopic("payments-rejected", 1))
        for future in client.create_topics(topics).values():
            future.result()
    payments = generate_payments(args.events, args.merchants, seed=1)
    started = time.perf_counter()
    config = {"coordinator.url": url, "linger.ms": 20, "batch.size": 256_000}
    with Producer(config) as producer:
        for payment in payments:
            while True:
                try:
                    producer.produce(PAYMENTS, payment.to_json(), key=payment.merchant)
                    break
                except BufferError:
                    producer.poll(0.05)
        if producer.flush(300):
            raise RuntimeError("payments not delivered")
    log(f"produced {len(payments)} payments in {time.perf_counter() - started:.1f} s")
    return settle(payments, "")


def output(reader: str, mode: str) -> str:
    return f"settlements-{reader}-{mode}"


def run_once(
    spark: SparkSession,
    url: str,
    bootstrap: str,
    run: tuple[str, str],
    number: int,
    args: argparse.Namespace,
) -> float:
    reader, mode = run
    source = Source(
        url,
        PAYMENTS,
        output(reader, mode),
        job_id=f"bench-{reader}-{mode.replace('_', '-')}",
        group=f"bench-{reader}-{mode}-{number}",
        bootstrap=bootstrap if reader == "kafka" else None,
    )
    started = time.perf_counter()
    done = run_batch(spark, source, partitions=args.write_tasks, delivery_guarantee=mode)
    elapsed = time.perf_counter() - started
    if done.offsets != args.events:
        raise RuntimeError(f"{run} run {number} read {done.offsets} offsets, not {args.events}")
    log(f"{reader:<6} {mode:<14} run {number}: {elapsed:.2f} s")
    return elapsed


def check(url: str, topic: str, expected: list[Settlement], runs: int) -> None:
    """Exactly-once output: each merchant settled once per run (every run settles the same
    payments, under the same batch label), with the right totals."""
    settled = Counter(
        (s.merchant, s.currency, s.total_minor, s.count)
        for s in map(Settlement.from_json, read_topic(url, topic))
    )
    want = Counter({(s.merchant, s.currency, s.total_minor, s.count): runs for s in expected})
    if settled != want:
        extra, missing = settled - want, want - settled
        raise RuntimeError(
            f"{topic} differs from the payments: {sum(extra.values())} unexpected or "
            f"duplicated, {sum(missing.values())} missing"
        )


def connector_conf(args: argparse.Namespace) -> dict[str, str]:
    """Spark's Kafka connector on the session: the resolved jars, else the package to fetch."""
    from jobs.cluster import kafka_connector_package

    jars = sorted(str(jar) for jar in Path(args.kafka_jars).glob("*.jar"))
    if any("spark-sql-kafka" in jar for jar in jars):
        return {"spark.jars": ",".join(jars)}
    return {"spark.jars.packages": kafka_connector_package()}


def bench(args: argparse.Namespace) -> dict[str, Any]:
    from jobs.cluster import session
    from sdk.spark import register

    bootstrap = f"127.0.0.1:{free_port()}"
    with (
        tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp,
        store(args, Path(tmp)) as database_url,
        embedded_coordinator(Path(tmp), database_url, bootstrap) as (url, service),
    ):
        log(f"service pid {service.pid} on {url} and {bootstrap} ({database_url or 'SQLite'})")
        expected = produce(url, args)
        spark = session(
            "bench-spark-job", args.master, conf=connector_conf(args), log_dir=Path(tmp)
        )
        try:
            register(spark)
            for run in RUNS:  # warm-up (JVM, Python workers, code paths), not measured
                run_once(spark, url, bootstrap, run, 0, args)
            times: dict[tuple[str, str], list[float]] = {run: [] for run in RUNS}
            for number in range(1, args.repeat + 1):
                for run in RUNS if number % 2 else RUNS[::-1]:
                    times[run].append(run_once(spark, url, bootstrap, run, number, args))
        finally:
            spark.stop()
        for reader in READERS:  # the warm-up run settled them too
            check(url, output(reader, "exactly_once"), expected, args.repeat + 1)
    figures: dict[str, Any] = {
        "events": args.events,
        "merchants": args.merchants,
        "partitions": args.partitions,
        "write_tasks": args.write_tasks,
        "master": args.master,
        "store": "sqlite" if args.sqlite else "postgres",
        "repeat": args.repeat,
    }
    for reader in READERS:
        exactly_once = statistics.median(times[reader, "exactly_once"])
        at_least_once = statistics.median(times[reader, "at_least_once"])
        # Each round's runs ran back to back, under about the same load from elsewhere.
        paired = [
            e / a
            for e, a in zip(
                times[reader, "exactly_once"], times[reader, "at_least_once"], strict=True
            )
        ]
        figures[reader] = {
            "exactly_once_s": round(exactly_once, 3),
            "at_least_once_s": round(at_least_once, 3),
            "ratio": round(exactly_once / at_least_once, 3),
            "paired_ratio_median": round(statistics.median(paired), 3),
            "exactly_once_runs_s": [round(t, 3) for t in times[reader, "exactly_once"]],
            "at_least_once_runs_s": [round(t, 3) for t in times[reader, "at_least_once"]],
        }
    figures["kafka_vs_txlog"] = round(
        figures["kafka"]["exactly_once_s"] / figures["txlog"]["exactly_once_s"], 3
    )
    return figures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="The settlement Spark job written exactly once vs at-least-once (plain "
        "appends), in the same run; last line one JSON object with both times and `ratio`.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--events", type=positive_int, default=100_000, help="payments")
    parser.add_argument(
        "--merchants", type=positive_int, default=5_000, help="merchants: settlements per run"
    )
    parser.add_argument("--partitions", type=positive_int, default=4, help="partitions per topic")
    parser.add_argument("--write-tasks", type=positive_int, default=4, help="write tasks per run")
    parser.add_argument("--repeat", type=positive_int, default=5, help="measured runs per mode")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument("--sqlite", action="store_true", help="an SQLite store, not Postgres")
    parser.add_argument(
        "--kafka-jars",
        default=str(CONNECTOR_LIB),
        help="a folder holding Spark's Kafka connector and its jars (else spark.jars.packages)",
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(POSTGRES_ENV, DEFAULT_POSTGRES_URL),
        help=f"Postgres server to create the benchmark database on (${POSTGRES_ENV})",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    figures = bench(args)
    print(f"settlement job over {figures['events']} payments, {figures['merchants']} merchants")
    print(f"  {'reader':<6} {'mode':<14} {'median s':>9}   runs")
    for reader in READERS:
        for mode in MODES:
            runs = ", ".join(f"{t:.2f}" for t in figures[reader][f"{mode}_runs_s"])
            print(f"  {reader:<6} {mode:<14} {figures[reader][f'{mode}_s']:>9.3f}   {runs}")
    for reader in READERS:
        print(
            f"  {reader}: ratio {figures[reader]['ratio']:.3f} (goal <= 1.15), median of paired "
            f"rounds {figures[reader]['paired_ratio_median']:.3f}"
        )
    print(f"  exactly once, Spark's Kafka source / txlog: {figures['kafka_vs_txlog']:.3f}")
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
