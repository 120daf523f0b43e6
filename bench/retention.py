"""Bounded storage under retention, on Postgres: the log tables stop growing while producers and
read_committed readers run, and throughput holds.

What it does, in one run:

`coordinator serve` on a fresh Postgres database, with the log cleaner every
`--check-interval-ms`. `--topics` topics of `--partitions` partitions each keep
`--retention-ms` (a few seconds; `message.timestamp.type=LogAppendTime`, so a batch's age is its
time in the log). One idempotent producer per partition sends record batches of
`--batch-records` x `--record-bytes` at a fixed rate (`--rate` batches/s each, binary format),
and one read_committed reader per topic follows every partition (it jumps to the log start
when retention overtook it, as `auto.offset.reset=earliest` does). Every `--sample-s` seconds
it prints the size of the log tables (`pg_total_relation_size` of batches, partitions and
producer_states, TOAST and indexes included) and the MB/s produced and read in that interval.

Figures (the last line is one JSON object):
- `growth_last_third`: size at the end over size at two thirds of the run, minus 1. Goal < 0.10
  (the size plateaus).
- `throughput_ratio`: MB/s produced in the last fifth over the first fifth (after the
  warm-up). Goal >= 0.9.

Space is reused because the cleaner runs `VACUUM (SKIP_LOCKED)` on the log tables after each
round that removed batches (`COORDINATOR_LOG_CLEANER_VACUUM`, on by default): measured here,
with this machine's Postgres running autovacuum off, the tables grew without it by 2 MB/s (130
MB after 60 s, linearly) while retention deleted the rows; with it they stay at about 13.5 MB.
Where autovacuum is on it would reclaim the space too, but only after its naptime and 20%
scale factor; the cleaner's own vacuum does not depend on the server's settings.

    python bench/retention.py --seconds 240
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _support import (
    BATCH_HEADERS,
    MB,
    BatchTemplate,
    BenchFailure,
    add_postgres_url,
    call,
    cancel_on_sigterm,
    plain_url,
    positive_float,
    positive_int,
    random_values,
    run_bench,
    scratch_database,
    serving,
)

from coordinator.launcher import SERVE

SERVE_OPTIONS = ["--log-level", "warning"]
TABLES = ("batches", "partitions", "producer_states")
RECORD_BATCH = "application/vnd.kafka.record-batch"


@dataclass
class Counters:
    produced: int = 0  # value bytes acknowledged
    read: int = 0  # bytes of batches fetched
    resets: int = 0  # a reader overtaken by retention
    samples: list[tuple[float, int, float, float]] = field(default_factory=list)


async def producer(
    client: httpx.AsyncClient, topic: str, partition: int, args: argparse.Namespace, c: Counters
) -> None:
    init = await call(client, "/v1/init-pid", {})
    pid, epoch = init["producer_id"], init["producer_epoch"]
    values = [v.encode() for v in random_values(args.batch_records, args.record_bytes, partition)]
    template = BatchTemplate(values)
    size = sum(len(v) for v in values)
    path = f"/v1/topics/{topic}/partitions/{partition}/records"
    sequence = 0
    period = 1 / args.rate
    next_at = time.perf_counter()
    while True:
        response = await client.post(
            path, content=template.at(pid, epoch, sequence), headers=BATCH_HEADERS
        )
        if response.status_code != 200:
            raise BenchFailure(f"produce {topic}-{partition}: {response.text[:300]}")
        sequence += args.batch_records
        c.produced += size
        next_at += period
        delay = next_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            next_at = time.perf_counter()  # behind: do not burst to catch up


async def reader(client: httpx.AsyncClient, topic: str, partitions: int, c: Counters) -> None:
    positions = dict.fromkeys(range(partitions), 0)
    while True:
        idle = True
        for partition, offset in positions.items():
            response = await client.get(
                f"/v1/topics/{topic}/partitions/{partition}/records",
                params={"offset": offset, "max_bytes": 1_000_000},
                headers={"accept": RECORD_BATCH},
            )
            if response.status_code == 416:
                described = await call_json(client, f"/v1/topics/{topic}")
                positions[partition] = described["partitions"][partition]["log_start_offset"]
                c.resets += 1
                continue
            if response.status_code != 200:
                raise BenchFailure(f"fetch {topic}-{partition}: {response.text[:300]}")
            next_offset = int(response.headers["Next-Offset"])
            if next_offset != offset:
                idle = False
            positions[partition] = next_offset
            c.read += len(response.content)
        if idle:
            await asyncio.sleep(0.05)


async def call_json(client: httpx.AsyncClient, path: str) -> Any:
    response = await client.get(path)
    if response.status_code != 200:
        raise BenchFailure(f"GET {path}: {response.text[:300]}")
    return response.json()


async def table_bytes(connection: asyncpg.Connection) -> int:
    total = 0
    for table in TABLES:
        total += await connection.fetchval("SELECT pg_total_relation_size($1)", table)
    return int(total)


async def bench(args: argparse.Namespace) -> None:
    cancel_on_sigterm()
    os.environ["COORDINATOR_LOG_RETENTION_CHECK_INTERVAL_MS"] = str(args.check_interval_ms)
    server_url = plain_url(args.postgres_url)
    counters = Counters()
    async with (
        scratch_database(server_url, "bench_") as (_, database_url),
        serving(database_url, "bench-retention-", SERVE, SERVE_OPTIONS) as service,
    ):
        client = httpx.AsyncClient(base_url=service.url, timeout=60)
        connection = await asyncpg.connect(database_url)
        tasks: list[asyncio.Task[None]] = []
        try:
            topics = [f"kept-{i}" for i in range(args.topics)]
            for topic in topics:
                await call(
                    client,
                    "/v1/topics",
                    {
                        "name": topic,
                        "partitions": args.partitions,
                        "configs": {
                            "retention.ms": str(args.retention_ms),
                            "message.timestamp.type": "LogAppendTime",
                        },
                    },
                )
            for topic in topics:
                for p in range(args.partitions):
                    tasks.append(asyncio.create_task(producer(client, topic, p, args, counters)))
                tasks.append(asyncio.create_task(reader(client, topic, args.partitions, counters)))
            started = time.perf_counter()
            last = (started, 0, 0)
            print(f"{'t (s)':>7}{'log tables (MB)':>17}{'produced MB/s':>15}{'read MB/s':>11}")
            while time.perf_counter() - started < args.seconds:
                await asyncio.sleep(args.sample_s)
                for task in tasks:
                    if task.done():
                        task.result()  # a failed producer or reader fails the run
                now = time.perf_counter()
                size = await table_bytes(connection)
                produced = (counters.produced - last[1]) / MB / (now - last[0])
                read = (counters.read - last[2]) / MB / (now - last[0])
                counters.samples.append((now - started, size, produced, read))
                print(
                    f"{now - started:>7.0f}{size / MB:>17.2f}{produced:>15.2f}{read:>11.2f}",
                    flush=True,
                )
                last = (now, counters.produced, counters.read)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await connection.close()
            await client.aclose()
    report(args, counters)


def report(args: argparse.Namespace, c: Counters) -> None:
    samples = [s for s in c.samples if s[0] > args.warmup]
    if len(samples) < 5:
        raise BenchFailure("too few samples: run longer (--seconds) or sample more (--sample-s)")
    sizes = [s[1] for s in samples]
    two_thirds = sizes[(2 * len(sizes)) // 3]
    growth = sizes[-1] / two_thirds - 1
    fifth = max(1, len(samples) // 5)
    start = sum(s[2] for s in samples[:fifth]) / fifth
    end = sum(s[2] for s in samples[-fifth:]) / fifth
    ratio = end / start if start else float("nan")
    print()
    print(
        f"retention {args.retention_ms} ms, {args.topics} topics x {args.partitions} partitions, "
        f"{args.rate:g} batches/s per partition of {args.batch_records} x {args.record_bytes} B"
    )
    print(f"log tables: peak {max(sizes) / MB:.2f} MB, end {sizes[-1] / MB:.2f} MB")
    print(f"growth over the last third: {growth:+.1%} (goal < 10%)")
    print(
        f"throughput: start {start:.2f} MB/s, end {end:.2f} MB/s, ratio {ratio:.3f} (goal >= 0.9)"
    )
    print(f"readers overtaken by retention: {c.resets}")
    print(
        json.dumps(
            {
                "seconds": args.seconds,
                "retention_ms": args.retention_ms,
                "peak_mb": round(max(sizes) / MB, 3),
                "end_mb": round(sizes[-1] / MB, 3),
                "growth_last_third": round(growth, 4),
                "start_mb_per_s": round(start, 3),
                "end_mb_per_s": round(end, 3),
                "throughput_ratio": round(ratio, 4),
                "reader_resets": c.resets,
            }
        ),
        flush=True,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_postgres_url(parser)
    parser.add_argument("--seconds", type=positive_float, default=240.0)
    parser.add_argument("--warmup", type=positive_float, default=15.0)
    parser.add_argument("--sample-s", type=positive_float, default=5.0)
    parser.add_argument("--topics", type=positive_int, default=2)
    parser.add_argument("--partitions", type=positive_int, default=2)
    parser.add_argument("--retention-ms", type=positive_int, default=5000)
    parser.add_argument("--check-interval-ms", type=positive_int, default=1000)
    parser.add_argument("--rate", type=positive_float, default=10.0)
    parser.add_argument("--batch-records", type=positive_int, default=50)
    parser.add_argument("--record-bytes", type=positive_int, default=1024)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(run_bench(bench(parse_args())))
