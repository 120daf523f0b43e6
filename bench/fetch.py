"""Fetch throughput of the coordinator on Postgres, against Postgres itself.

What it measures, in one run on one machine:

0. fill: `coordinator serve` is started on a fresh Postgres database; one topic with one
   partition per consumer gets, on every partition, `--batches` record batches of
   `--batch-records` records of `--record-bytes` bytes, written by a transactional producer that
   commits every `--batches-per-txn` batches (so the log holds control markers that readers
   skip, as a transactional pipeline's log does).
1. read_committed: N consumers, one per partition, one request in flight each, fetch their
   partition as Kafka record batches (`GET .../records` with `Accept:
   application/vnd.kafka.record-batch`, `max_bytes` `--max-bytes`) from offset 0 to the end,
   following `Next-Offset`, and start again at 0, for `--seconds`.
2. read_uncommitted: the same.
3. raw: the same rows read straight from Postgres with asyncpg, N connections, each
   `SELECT payload FROM batches WHERE topic = $1 AND partition = $2 AND base_offset >= $3 AND
   control IS NULL ORDER BY base_offset LIMIT k` with k batches per query as many as one fetch
   returns, from the start to the end and again.

MB is 10**6 bytes of record batches received; per phase, the service's and the load generator's
CPU ms per MB (the generator speaks HTTP/1.1 on a bare stream, `_support.LeanHttp`). `ratio` =
read_committed MB/s over raw MB/s (goal >= 0.6); `isolation_ratio` = read_committed MB/s over
read_uncommitted MB/s (goal >= 0.9). Figures are noisy when other work runs on the machine
(client, service and Postgres share it).

    python bench/fetch.py --seconds 10

With `--replica` it measures reads from a hot standby instead (issue 37; Kafka's follower
fetching): a primary and a synchronous standby of its own on this machine (built as the fault
run builds them, `tests/fault/postgres_pair.py`), filled as above. Then, each for `--seconds`:
read_committed consumers on a service reading from the primary alone, and on a service with the
standby in `COORDINATOR_READ_REPLICA_URLS`; and the same two again while `--producers`
idempotent producers append record batches to another topic, whose throughput is what heavy
reads leave the primary. `replica_read_ratio` = reads with the standby over reads from the
primary alone; `produce_left_ratio` = produce under reads served by the standby over produce
under reads served by the primary. On one 2-core machine both servers share the CPUs; a standby
on a machine of its own adds its CPUs.

    python bench/fetch.py --replica --seconds 10

The last stdout line is one JSON object with the figures; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # the project: tests.fault's pair
from _support import (
    BATCH_HEADERS,
    MB,
    BatchTemplate,
    BenchFailure,
    Client,
    Service,
    Window,
    add_postgres_url,
    call,
    cancel_on_sigterm,
    checked,
    checkpoint,
    close_all,
    cpus_in_window,
    log,
    make_clients,
    plain_url,
    positive_int,
    random_values,
    run_bench,
    scratch_database,
    serving,
)

from coordinator.launcher import SERVE

TOPIC = "bench-fetch"
SERVE_OPTIONS = ["--log-level", "warning"]
RECORD_BATCH = "application/vnd.kafka.record-batch"


async def fill(client: httpx.AsyncClient, partition: int, args: argparse.Namespace) -> int:
    """Write the partition's batches in transactions; returns its high watermark."""
    values = random_values(args.batch_records, args.record_bytes, seed=partition)
    template = BatchTemplate([v.encode() for v in values], transactional=True)
    tid = f"bench-fill-{partition}"
    answer = await call(client, "/v1/init-pid", {"transactional_id": tid})
    pid, epoch = answer["producer_id"], answer["producer_epoch"]
    path = f"/v1/topics/{TOPIC}/partitions/{partition}/records"
    sequence = 0
    for i in range(args.batches):
        checked(
            await client.post(
                path,
                content=template.at(pid, epoch, sequence),
                params={"transactional_id": tid},
                headers=BATCH_HEADERS,
            ),
            f"fill {partition}",
        )
        sequence += args.batch_records
        if (i + 1) % args.batches_per_txn == 0 or i + 1 == args.batches:
            body = {"producer_id": pid, "producer_epoch": epoch, "commit": True}
            ended = await call(client, f"/v1/transactions/{tid}/end", body)
            pid, epoch, sequence = ended["producer_id"], ended["producer_epoch"], 0
    described = checked(await client.get(f"/v1/topics/{TOPIC}"), "describe")
    hw: int = described["partitions"][partition]["high_watermark"]
    return hw


async def reader(
    client: Client, partition: int, level: str, max_bytes: int, window: Window
) -> tuple[int, int]:
    """(bytes, fetches) answered inside the window."""
    path = f"/v1/topics/{TOPIC}/partitions/{partition}/records"
    headers = {"accept": RECORD_BATCH}
    received = fetches = 0
    offset = 0
    clock = time.perf_counter
    while clock() < window.end:
        response = await client.get(
            path,
            params={"offset": offset, "isolation_level": level, "max_bytes": max_bytes},
            headers=headers,
        )
        if response.status_code != 200:
            raise BenchFailure(f"fetch {partition}@{offset}: {response.status_code}")
        if window.counts(clock()):
            received += len(response.content)
            fetches += 1
        following = int(response.headers["next-offset"])
        end = int(
            response.headers[
                "last-stable-offset" if level == "read_committed" else "high-watermark"
            ]
        )
        offset = 0 if following >= end else following
    return received, fetches


@dataclass(frozen=True)
class Phase:
    mb_per_s: float
    fetches_per_s: float
    service_cpu_ms_per_mb: float
    client_cpu_ms_per_mb: float  # the load generator's (this process's)


async def run_service(service: Service, args: argparse.Namespace, level: str) -> Phase:
    clients = make_clients(service.url, args.consumers)
    try:
        window = Window.after(args.warmup, args.seconds)
        # The service's and this process's (the load generator's).
        cpu = asyncio.create_task(cpus_in_window(window, service.pid, os.getpid()))
        results = await asyncio.gather(
            *(reader(c, i, level, args.max_bytes, window) for i, c in enumerate(clients))
        )
    finally:
        await close_all(clients)
    mb = sum(r[0] for r in results) / MB
    per_mb = 1000 / mb if mb else 0.0
    service_cpu, own_cpu = await cpu
    return Phase(
        mb / window.seconds,
        sum(r[1] for r in results) / window.seconds,
        service_cpu * per_mb,
        own_cpu * per_mb,
    )


RAW_SELECT = (
    "SELECT base_offset, payload FROM batches WHERE topic = $1 AND partition = $2 "
    "AND base_offset >= $3 AND control IS NULL ORDER BY base_offset LIMIT $4"
)


async def raw_reader(
    connection: asyncpg.Connection, partition: int, per_query: int, window: Window
) -> tuple[int, int]:
    statement = await connection.prepare(RAW_SELECT)
    received = queries = 0
    offset = 0
    clock = time.perf_counter
    while clock() < window.end:
        rows = await statement.fetch(TOPIC, partition, offset, per_query)
        if window.counts(clock()):
            received += sum(len(r["payload"]) for r in rows)
            queries += 1
        offset = 0 if len(rows) < per_query else rows[-1]["base_offset"] + 1
    return received, queries


async def run_raw(database_url: str, args: argparse.Namespace) -> tuple[float, float]:
    batch_bytes = args.batch_records * (args.record_bytes + 8) + 61
    per_query = max(1, args.max_bytes // batch_bytes + 1)
    connections = [await asyncpg.connect(database_url) for _ in range(args.consumers)]
    try:
        window = Window.after(args.warmup, args.seconds)
        results = await asyncio.gather(
            *(raw_reader(c, i, per_query, window) for i, c in enumerate(connections))
        )
    finally:
        for connection in connections:
            await connection.close()
    return sum(r[0] for r in results) / MB / window.seconds, sum(
        r[1] for r in results
    ) / window.seconds


async def bench(args: argparse.Namespace) -> None:
    cancel_on_sigterm()
    server_url = plain_url(args.postgres_url)
    phases: dict[str, Phase] = {}
    async with scratch_database(server_url, "bench_fetch_") as (_, database_url):
        async with serving(database_url, "bench-fetch-", SERVE, SERVE_OPTIONS) as service:
            async with httpx.AsyncClient(base_url=service.url, timeout=60.0) as client:
                await call(client, "/v1/topics", {"name": TOPIC, "partitions": args.consumers})
                log(f"filling {args.consumers} partitions x {args.batches} batches")
                await asyncio.gather(*(fill(client, p, args) for p in range(args.consumers)))
            for level in ("read_committed", "read_uncommitted"):
                await checkpoint(database_url)
                log(f"{level}: {args.warmup:g} s warm-up + {args.seconds:g} s")
                phases[level] = await run_service(service, args, level)
        log(f"raw: {args.warmup:g} s warm-up + {args.seconds:g} s")
        raw_mb, raw_per_s = await run_raw(database_url, args)
    committed, uncommitted = phases["read_committed"], phases["read_uncommitted"]
    rc, ru = committed.mb_per_s, uncommitted.mb_per_s
    ratio = rc / raw_mb if raw_mb else float("nan")
    isolation = rc / ru if ru else float("nan")
    print()
    print(
        f"fetch: {args.consumers} consumers, {args.batches} batches of {args.batch_records} x "
        f"{args.record_bytes} B per partition, max_bytes {args.max_bytes}, {args.seconds:g} s"
    )
    print(f"{'':<26}{'MB/s':>10}{'requests/s':>12}{'service CPU ms/MB':>19}{'client':>8}")
    for name, phase in (("read_committed", committed), ("read_uncommitted", uncommitted)):
        print(
            f"{name + ' (HTTP)':<26}{phase.mb_per_s:>10.2f}{phase.fetches_per_s:>12.1f}"
            f"{phase.service_cpu_ms_per_mb:>19.1f}{phase.client_cpu_ms_per_mb:>8.1f}"
        )
    print(f"{'raw (asyncpg SELECT)':<26}{raw_mb:>10.2f}{raw_per_s:>12.1f}")
    print(f"ratio (read_committed / raw): {ratio:.3f}  (goal >= 0.6)")
    print(f"isolation_ratio (read_committed / read_uncommitted): {isolation:.3f}  (goal >= 0.9)")
    print(
        json.dumps(
            {
                "read_committed_mb_per_s": round(rc, 3),
                "read_uncommitted_mb_per_s": round(ru, 3),
                "raw_mb_per_s": round(raw_mb, 3),
                "read_committed_service_cpu_ms_per_mb": round(committed.service_cpu_ms_per_mb, 2),
                "read_uncommitted_service_cpu_ms_per_mb": round(
                    uncommitted.service_cpu_ms_per_mb, 2
                ),
                "read_committed_client_cpu_ms_per_mb": round(committed.client_cpu_ms_per_mb, 2),
                "ratio": round(ratio, 4),
                "isolation_ratio": round(isolation, 4),
                "consumers": args.consumers,
                "batches": args.batches,
                "batch_records": args.batch_records,
                "record_bytes": args.record_bytes,
                "max_bytes": args.max_bytes,
                "seconds": args.seconds,
            }
        ),
        flush=True,
    )


PRODUCE_TOPIC = "bench-fetch-produce"


async def producer(client: Client, partition: int, args: argparse.Namespace, window: Window) -> int:
    """Idempotent appends of prebuilt batches for the window; bytes answered inside it."""
    values = random_values(args.batch_records, args.record_bytes, seed=100 + partition)
    template = BatchTemplate([v.encode() for v in values])
    path = f"/v1/topics/{PRODUCE_TOPIC}/partitions/{partition}/records"
    sent = 0
    clock = time.perf_counter
    while clock() < window.end:
        body = template.at(-1, -1, -1)
        response = await client.post(path, content=body, headers=BATCH_HEADERS)
        if response.status_code != 200:
            raise BenchFailure(f"produce {partition}: {response.status_code}")
        if window.counts(clock()):
            sent += len(body)
    return sent


async def reads_and_produce(
    service: Service, args: argparse.Namespace, with_producers: bool
) -> tuple[float, float]:
    """(read_committed MB/s, produce MB/s) in one window, producers only if asked."""
    readers = make_clients(service.url, args.consumers)
    writers = make_clients(service.url, args.producers if with_producers else 0)
    try:
        window = Window.after(args.warmup, args.seconds)
        read = asyncio.gather(
            *(reader(c, i, "read_committed", args.max_bytes, window) for i, c in enumerate(readers))
        )
        write = asyncio.gather(*(producer(c, i, args, window) for i, c in enumerate(writers)))
        read_results, written = await asyncio.gather(read, write)
    finally:
        await close_all([*readers, *writers])
    return (
        sum(r[0] for r in read_results) / MB / window.seconds,
        sum(written) / MB / window.seconds,
    )


async def bench_replica(args: argparse.Namespace) -> None:
    from tests.fault.postgres_pair import DATABASE, PostgresPair

    cancel_on_sigterm()
    pair = await asyncio.to_thread(PostgresPair(synchronous=True).start)
    figures: dict[str, float] = {}
    try:
        primary_url = pair.primary.dsn(DATABASE)
        os.environ.pop("COORDINATOR_READ_REPLICA_URLS", None)
        async with serving(primary_url, "bench-fetch-", SERVE, SERVE_OPTIONS) as service:
            async with httpx.AsyncClient(base_url=service.url, timeout=60.0) as client:
                await call(client, "/v1/topics", {"name": TOPIC, "partitions": args.consumers})
                await call(
                    client, "/v1/topics", {"name": PRODUCE_TOPIC, "partitions": args.producers}
                )
                log(f"filling {args.consumers} partitions x {args.batches} batches")
                await asyncio.gather(*(fill(client, p, args) for p in range(args.consumers)))
            for with_producers in (False, True):
                log(f"primary alone, producers {with_producers}: {args.seconds:g} s")
                read, written = await reads_and_produce(service, args, with_producers)
                key = "under_produce" if with_producers else "alone"
                figures[f"primary_read_mb_per_s_{key}"] = read
                if with_producers:
                    figures["produce_mb_per_s_reads_on_primary"] = written
        os.environ["COORDINATOR_READ_REPLICA_URLS"] = json.dumps([pair.standby.dsn(DATABASE)])
        try:
            async with serving(primary_url, "bench-fetch-", SERVE, SERVE_OPTIONS) as service:
                await asyncio.sleep(1.0)  # the first checks of the standby's lag
                for with_producers in (False, True):
                    log(f"with the standby, producers {with_producers}: {args.seconds:g} s")
                    read, written = await reads_and_produce(service, args, with_producers)
                    key = "under_produce" if with_producers else "alone"
                    figures[f"replica_read_mb_per_s_{key}"] = read
                    if with_producers:
                        figures["produce_mb_per_s_reads_on_replica"] = written
                sources = (await asyncio.to_thread(httpx.get, f"{service.url}/metrics")).text
        finally:
            del os.environ["COORDINATOR_READ_REPLICA_URLS"]
    finally:
        await asyncio.to_thread(pair.stop)
    served = {
        source: sum(
            float(line.split()[-1])
            for line in sources.splitlines()
            if line.startswith(f'coordinator_fetches_total{{source="{source}"}}')
        )
        for source in ("primary", "replica")
    }
    figures["replica_read_ratio"] = (
        figures["replica_read_mb_per_s_alone"] / figures["primary_read_mb_per_s_alone"]
    )
    figures["produce_left_ratio"] = (
        figures["produce_mb_per_s_reads_on_replica"] / figures["produce_mb_per_s_reads_on_primary"]
    )
    print()
    print(
        f"fetch from a standby: {args.consumers} read_committed consumers, {args.producers} "
        f"producers, {args.seconds:g} s each"
    )
    print(f"{'':<34}{'reads MB/s':>12}{'produce MB/s':>14}")
    print(f"{'primary alone, reads only':<34}{figures['primary_read_mb_per_s_alone']:>12.2f}")
    print(f"{'with the standby, reads only':<34}{figures['replica_read_mb_per_s_alone']:>12.2f}")
    print(
        f"{'primary alone, with produce':<34}"
        f"{figures['primary_read_mb_per_s_under_produce']:>12.2f}"
        f"{figures['produce_mb_per_s_reads_on_primary']:>14.2f}"
    )
    print(
        f"{'with the standby, with produce':<34}"
        f"{figures['replica_read_mb_per_s_under_produce']:>12.2f}"
        f"{figures['produce_mb_per_s_reads_on_replica']:>14.2f}"
    )
    print(f"replica_read_ratio: {figures['replica_read_ratio']:.3f}")
    print(f"produce_left_ratio: {figures['produce_left_ratio']:.3f}")
    print(f"fetches served with the standby configured: {served}")
    print(
        json.dumps(
            {k: round(v, 3) for k, v in figures.items()}
            | {"fetches_served": served, "consumers": args.consumers, "producers": args.producers},
        ),
        flush=True,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Binary fetch throughput of the coordinator on Postgres (read_committed and "
        "read_uncommitted) vs. raw asyncpg SELECTs of the same rows. The last stdout line is a "
        "JSON object with the figures.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_postgres_url(parser)
    parser.add_argument("--consumers", type=positive_int, default=4, help="one per partition")
    parser.add_argument("--batches", type=positive_int, default=100, help="batches per partition")
    parser.add_argument("--batches-per-txn", type=positive_int, default=10)
    parser.add_argument("--batch-records", type=positive_int, default=100, help="records/batch")
    parser.add_argument("--record-bytes", type=positive_int, default=1024, help="bytes per value")
    parser.add_argument("--max-bytes", type=positive_int, default=1_048_576, help="per fetch")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per phase")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per phase")
    parser.add_argument(
        "--replica",
        action="store_true",
        help="measure reads from a hot standby of a primary of its own, and the produce "
        "throughput heavy reads leave the primary (see above)",
    )
    parser.add_argument(
        "--producers", type=positive_int, default=2, help="with --replica: producers"
    )
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.warmup < 0:
        parser.error("--seconds must be positive and --warmup not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_bench(bench_replica(args) if args.replica else bench(args))


if __name__ == "__main__":
    sys.exit(main())
