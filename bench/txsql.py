"""Exactly once beyond the log, measured: the `txsql` writer against Spark's own JDBC writer for
the same rows into the same Postgres, and `once(key, fn)` against plain calls to the service.

What it measures:

1. setup: a scratch Postgres database (dropped afterwards), a `local[2]` SparkSession with
   Debian's Postgres JDBC driver, and `--rows` rows (id, merchant, amount_minor, note) in
   `--partitions` partitions, cached, so neither writer pays for producing them. Not measured.
2. writes: `df.write.format("txsql")` (task attempts COPY their rows into the staging table,
   the driver moves them into the table with the commit record in one transaction) and
   `df.write.format("jdbc")` (Spark's writer: each task INSERTs its rows in batches of 1000 and
   commits), each into an empty table of the same columns. One unmeasured warm-up per writer,
   then `--repeat` rounds alternating the order. A write's time is the wall time of `save()`.
   `ratio` = median txsql time / median JDBC time. Goal: <= 1.3.
3. once: a `coordinator serve` process on the same database; `--threads` threads make
   `--calls` calls in all of `EffectsClient.once(key, fn)` with a new key each (claim, fn,
   complete: two round trips, two database transactions), then the same keys again (done: one
   round trip, a read and no write), against as many plain calls (`GET /healthz` through the
   same client: a round trip that touches the store but changes nothing). `once_ratio` = once
   calls/s over plain calls/s.

    python bench/txsql.py
    python bench/txsql.py --rows 500000 --repeat 5

A readable table goes to stdout, its last line one JSON object of the figures; progress goes
to stderr. Figures are noisy when other work shares the machine.
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
import threading
import time
from collections.abc import Callable, Iterator
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

from jobs.demo import embedded_coordinator

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

JDBC_JAR = "/usr/share/java/postgresql.jar"
WRITERS = ("txsql", "jdbc")
COLUMNS = "id BIGINT, merchant TEXT, amount_minor BIGINT, note TEXT"


@contextlib.contextmanager
def scratch(server_url: str) -> Iterator[str]:
    server = plain_url(server_url)
    name = f"bench_txsql_{os.urandom(6).hex()}"
    asyncio.run(admin(server, f'CREATE DATABASE "{name}"'))
    log(f"created database {name}")
    try:
        yield with_database(server, name)
    finally:
        asyncio.run(admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        log(f"dropped database {name}")


def execute(url: str, *statements: str) -> Any:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        result = None
        for sql in statements:
            cursor = connection.execute(sql)
            result = cursor.fetchall() if cursor.description else None
        return result


def rows(spark: SparkSession, count: int, partitions: int) -> DataFrame:
    df = spark.range(count, numPartitions=partitions).selectExpr(
        "id",
        "concat('m-', cast(id % 5000 as string)) as merchant",
        "cast((id * 7919) % 100000 as long) as amount_minor",
        "concat('payout of batch ', cast(id div 1000 as string)) as note",
    )
    df.cache().count()
    return df


def write_once(
    writer: str, df: DataFrame, url: str, number: int, args: argparse.Namespace
) -> float:
    table = f"out_{writer}"
    execute(url, f"TRUNCATE {table}")
    if writer == "txsql":
        options = {"url": url, "dbtable": table, "jobId": f"bench-{number}"}
    else:
        server = url.partition("://")[2]
        user, _, where = server.rpartition("@")
        options = {
            "url": f"jdbc:postgresql://{where}?user={user}",
            "driver": "org.postgresql.Driver",
            "dbtable": table,
        }
    started = time.perf_counter()
    df.write.format(writer).options(**options).mode("append").save()
    elapsed = time.perf_counter() - started
    ((written,),) = execute(url, f"SELECT count(*) FROM {table}")
    if written != args.rows:
        raise RuntimeError(f"{writer} run {number} left {written} rows, not {args.rows}")
    log(f"{writer:<6} run {number}: {elapsed:.2f} s")
    return elapsed


def writes(url: str, args: argparse.Namespace, workdir: Path) -> dict[str, list[float]]:
    from jobs.cluster import session
    from sdk.spark import register

    if not Path(JDBC_JAR).is_file():
        raise SystemExit(f"{JDBC_JAR} missing: apt-get install -y libpostgresql-jdbc-java")
    execute(url, *(f"CREATE TABLE out_{writer} ({COLUMNS})" for writer in WRITERS))
    spark = session("bench-txsql", args.master, conf={"spark.jars": JDBC_JAR}, log_dir=workdir)
    try:
        register(spark)
        df = rows(spark, args.rows, args.partitions)
        for writer in WRITERS:  # warm-up: JVM, Python workers, code paths
            write_once(writer, df, url, 0, args)
        times: dict[str, list[float]] = {writer: [] for writer in WRITERS}
        for number in range(1, args.repeat + 1):
            for writer in WRITERS if number % 2 else WRITERS[::-1]:
                times[writer].append(write_once(writer, df, url, number, args))
        return times
    finally:
        spark.stop()


def in_threads(threads: int, calls: int, work: Callable[[int], None]) -> float:
    """Calls per second of `work(i)` for i in 0..calls-1, spread over `threads` threads."""
    barrier = threading.Barrier(threads + 1)

    def run(first: int) -> None:
        barrier.wait()
        for i in range(first, calls, threads):
            work(i)

    pool = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in pool:
        thread.join()
    return calls / (time.perf_counter() - started)


def once_calls(url: str, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    from sdk import EffectsClient

    with embedded_coordinator(workdir, url) as (service, _):
        effects = EffectsClient({"coordinator.url": service})
        http = effects._http  # the same pooled client, for the plain calls
        try:
            in_threads(args.threads, 50, lambda i: http.call("GET", "/healthz"))  # warm-up
            plain = in_threads(args.threads, args.calls, lambda i: http.call("GET", "/healthz"))
            fresh = in_threads(args.threads, args.calls, lambda i: effects.once(f"k{i}", str))
            done = in_threads(args.threads, args.calls, lambda i: effects.once(f"k{i}", str))
        finally:
            effects.close()
    log(f"plain {plain:.0f}/s, once (new keys) {fresh:.0f}/s, once (done keys) {done:.0f}/s")
    return {"plain_per_s": plain, "once_per_s": fresh, "once_done_per_s": done}


def bench(args: argparse.Namespace) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="bench-txsql-") as tmp,
        scratch(args.postgres_url) as url,
    ):
        times = writes(url, args, Path(tmp))
        calls = once_calls(url, args, Path(tmp))
    txsql, jdbc = statistics.median(times["txsql"]), statistics.median(times["jdbc"])
    paired = [t / j for t, j in zip(times["txsql"], times["jdbc"], strict=True)]
    return {
        "rows": args.rows,
        "partitions": args.partitions,
        "master": args.master,
        "repeat": args.repeat,
        "txsql_s": round(txsql, 3),
        "jdbc_s": round(jdbc, 3),
        "ratio": round(txsql / jdbc, 3),
        "paired_ratio_median": round(statistics.median(paired), 3),
        "txsql_runs_s": [round(t, 3) for t in times["txsql"]],
        "jdbc_runs_s": [round(t, 3) for t in times["jdbc"]],
        "calls": args.calls,
        "threads": args.threads,
        "plain_calls_per_s": round(calls["plain_per_s"], 1),
        "once_per_s": round(calls["once_per_s"], 1),
        "once_done_per_s": round(calls["once_done_per_s"], 1),
        "once_ratio": round(calls["once_per_s"] / calls["plain_per_s"], 3),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="txsql vs Spark's JDBC writer into Postgres, and once() vs plain calls; "
        "last line one JSON object with `ratio` and `once_ratio`.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--rows", type=positive_int, default=200_000, help="rows per write")
    parser.add_argument("--partitions", type=positive_int, default=4, help="write tasks")
    parser.add_argument("--repeat", type=positive_int, default=5, help="measured writes each")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument("--calls", type=positive_int, default=2000, help="once() calls")
    parser.add_argument("--threads", type=positive_int, default=4, help="calling threads")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(POSTGRES_ENV, DEFAULT_POSTGRES_URL),
        help=f"Postgres server to create the benchmark database on (${POSTGRES_ENV})",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    figures = bench(args)
    print(f"{figures['rows']} rows into Postgres, {figures['partitions']} tasks, {args.master}")
    for writer in WRITERS:
        runs = ", ".join(f"{t:.2f}" for t in figures[f"{writer}_runs_s"])
        print(f"  {writer:<6} median {figures[f'{writer}_s']:.3f} s   runs {runs}")
    print(
        f"  ratio {figures['ratio']:.3f} (goal <= 1.3), median of paired rounds "
        f"{figures['paired_ratio_median']:.3f}"
    )
    print(
        f"once(): {figures['once_per_s']:.0f}/s new keys, {figures['once_done_per_s']:.0f}/s "
        f"done keys, against {figures['plain_calls_per_s']:.0f} plain calls/s "
        f"({figures['threads']} threads): once_ratio {figures['once_ratio']:.3f}"
    )
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
