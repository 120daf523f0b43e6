"""Produce throughput of the coordinator on Postgres, against Postgres itself.

What it measures, in one run on one machine:

1. service: `coordinator serve` is started as a child process on a fresh Postgres database. A
   topic is created and N idempotent producers (each from `POST /v1/init-pid {}`) send batches of
   `--batch-records` records of `--record-bytes` bytes each to `POST /v1/topics/{t}/partitions/
   {p}/records`, one request in flight per producer, with the right base sequence (0, then the
   previous batch's last sequence + 1): as Kafka record batches (`--format binary`, the default,
   `application/vnd.kafka.record-batch`, uncompressed) or as JSON (`--format json`). Every answer
   must be 200 with `duplicate: false`.
2. raw: the same bytes (the same record values, concatenated: one batch = one row) inserted
   straight into Postgres with asyncpg (the driver the service uses), one INSERT per batch, each
   its own transaction (autocommit), from N concurrent connections, for the same duration.
3. raw COPY: the ceiling, the same rows written by COPY, 32 rows per COPY (each its own
   transaction), from N connections: what Postgres takes when round trips cost nothing.

Each of `--producers` (default 4 and 16) is one run of the three phases on a fresh database.

Both phases run for `--seconds` after a `--warmup`; a batch counts when its answer arrives inside
the measured window. MB is 10**6 bytes of record values acknowledged (keys are null, no headers).
`ratio` is service MB/s over raw INSERT MB/s: how much of what the database could take the
service delivers (goal: >= 0.6); `ratio_to_copy` the same against the COPY ceiling;
`service_cpu_ms_per_mb` the service process's CPU time in the measured window per MB delivered,
`client_cpu_ms_per_mb` the load generator's (this process's).
The JSON's top-level `ratio` is the first run's.

The load generator is kept cheap (request bodies are built once, only the sequence number is
spliced in per batch, and for a record batch its CRC-32C recomputed; HTTP/1.1 on a bare asyncio
stream, `_support.LeanHttp`, where httpx cost as much CPU per request as the service; uvloop when
installed), since client, service and Postgres share the machine's cores. Figures are noisy
when other work runs on the machine.

Run (Postgres must be reachable; the benchmark creates and drops its own database):

    python bench/produce.py --seconds 15
    python bench/produce.py --producers 8 --batch-records 100 --record-bytes 1024 \\
        --postgres-url postgresql://postgres@127.0.0.1:5432/test

The server URL comes from `--postgres-url`, else $COORDINATOR_TEST_POSTGRES_URL, else
postgresql://postgres@127.0.0.1:5432/test. A readable table goes to stdout; its last line is one
JSON object with the figures. Progress messages (and the service's pid, for `py-spy top --pid`)
go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _support import (
    BATCH_HEADERS,
    JSON_HEADERS,
    MB,
    BatchTemplate,
    BenchFailure,
    Client,
    Service,
    Window,
    add_postgres_url,
    admin,
    call,
    cancel_on_sigterm,
    checkpoint,
    close_all,
    cpus_in_window,
    log,
    make_clients,
    percentile_ms,
    plain_url,
    positive_int,
    random_values,
    records_json,
    run_bench,
    scratch_database,
    serving,
)

from coordinator.launcher import SERVE

TOPIC = "bench"
RAW_TABLE = "bench_raw_batches"
# Rows per COPY in the ceiling phase.
COPY_ROWS = 32
# The child process: `coordinator serve`, quiet.
SERVE_OPTIONS = ["--log-level", "warning"]


# -- the payload --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Payload:
    values: list[bytes]  # one per record of a batch
    records_json: bytes  # `"records":[...]` as the service receives it
    raw_batch: bytes  # the values concatenated: one row of the raw baseline

    @classmethod
    def build(cls, batch_records: int, record_bytes: int, seed: int = 1) -> Payload:
        values = random_values(batch_records, record_bytes, seed)
        encoded = [v.encode() for v in values]
        return cls(values=encoded, records_json=records_json(values), raw_batch=b"".join(encoded))


# -- measuring ----------------------------------------------------------------------------------


@dataclass
class Tally:
    batches: int = 0
    records: int = 0
    value_bytes: int = 0
    latencies: list[float] = field(default_factory=list)
    # librdkafka's statistics, one sample a second inside the window (confluent-kafka only):
    # the average round trip of its requests to the broker, and its requests awaiting an answer.
    request_rtt_ms: list[float] = field(default_factory=list)
    in_flight: list[int] = field(default_factory=list)
    batch_bytes: list[float] = field(default_factory=list)  # librdkafka's average batch
    client_cpu_s: float = 0.0  # the producer process's CPU inside the window

    def count(
        self, window: Window, sent: float, done: float, batches: int, records: int, size: int
    ) -> None:
        """Work answered at `done` (sent at `sent`), if inside the measured window."""
        if window.counts(done):
            self.batches += batches
            self.records += records
            self.value_bytes += size
            self.latencies.append(done - sent)

    def add(self, other: Tally) -> None:
        self.batches += other.batches
        self.records += other.records
        self.value_bytes += other.value_bytes
        self.latencies.extend(other.latencies)
        self.request_rtt_ms.extend(other.request_rtt_ms)
        self.in_flight.extend(other.in_flight)
        self.batch_bytes.extend(other.batch_bytes)
        self.client_cpu_s += other.client_cpu_s


def merged(tallies: list[Tally]) -> Tally:
    total = Tally()
    for tally in tallies:
        total.add(tally)
    return total


@dataclass(frozen=True)
class Figures:
    records_per_s: float
    mb_per_s: float
    batches_per_s: float
    p50_ms: float
    p99_ms: float

    @classmethod
    def of(cls, tally: Tally, seconds: float) -> Figures:
        lat = sorted(tally.latencies)
        return cls(
            records_per_s=tally.records / seconds,
            mb_per_s=tally.value_bytes / MB / seconds,
            batches_per_s=tally.batches / seconds,
            p50_ms=percentile_ms(lat, 0.50),
            p99_ms=percentile_ms(lat, 0.99),
        )


# -- the service --------------------------------------------------------------------------------


async def service_producer(
    client: Client,
    topic: str,
    partition: int,
    payload: Payload,
    window: Window,
    binary_format: bool,
) -> Tally:
    init = await call(client, "/v1/init-pid", {})
    pid, epoch = init["producer_id"], init["producer_epoch"]
    path = f"/v1/topics/{topic}/partitions/{partition}/records"
    head = f'{{"producer_id":{pid},"producer_epoch":{epoch},"base_sequence":'.encode()
    tail = b"," + payload.records_json + b"}"
    binary = BatchTemplate(payload.values) if binary_format else None
    headers = BATCH_HEADERS if binary_format else JSON_HEADERS
    batch_records = len(payload.values)
    batch_bytes = sum(len(v) for v in payload.values)
    sequence = 0
    tally = Tally()
    post = client.post
    loads = orjson.loads
    clock = time.perf_counter
    while True:
        sent = clock()
        if sent >= window.end:
            return tally
        if binary is not None:
            body = binary.at(pid, epoch, sequence)
        else:
            body = head + str(sequence).encode() + tail
        response = await post(path, content=body, headers=headers)
        done = clock()
        if response.status_code != 200:
            raise BenchFailure(
                f"produce pid {pid} seq {sequence}: {response.status_code} {response.text[:500]}"
            )
        answer = loads(response.content)
        span = answer["last_offset"] - answer["base_offset"] + 1
        if answer["duplicate"] is not False or span != batch_records:
            raise BenchFailure(f"produce pid {pid} seq {sequence}: unexpected answer {answer}")
        sequence += batch_records
        tally.count(window, sent, done, 1, batch_records, batch_bytes)


async def run_service(
    service: Service,
    producers: int,
    args: argparse.Namespace,
    payload: Payload,
    client: str = "lean",
) -> tuple[Tally, float, float, float]:
    """The service's tally, the window's seconds, and the service's and this process's (the
    load generator's) CPU seconds in it. `client`: "lean" (`LeanHttp`) or "httpx"."""
    clients = make_clients(service.url, producers, lean=client == "lean")
    partitions = args.partitions or producers
    topic = f"{TOPIC}-{producers}-{client}"
    try:
        await call(clients[0], "/v1/topics", {"name": topic, "partitions": partitions})
        window = Window.after(args.warmup, args.seconds)
        # The service's and this process's (the load generator's).
        cpu = asyncio.create_task(cpus_in_window(window, service.pid, os.getpid()))
        tallies = await asyncio.gather(
            *(
                service_producer(
                    client, topic, i % partitions, payload, window, args.format == "binary"
                )
                for i, client in enumerate(clients)
            )
        )
    finally:
        await close_all(clients)
    service_cpu, own_cpu = await cpu
    return merged(tallies), window.seconds, service_cpu, own_cpu


# -- the raw baseline ---------------------------------------------------------------------------

RAW_DDL = f"""
CREATE TABLE {RAW_TABLE} (
    producer_id bigint NOT NULL,
    base_sequence bigint NOT NULL,
    record_count integer NOT NULL,
    appended_at bigint NOT NULL,
    payload bytea NOT NULL,
    PRIMARY KEY (producer_id, base_sequence)
)
"""
RAW_INSERT = (
    f"INSERT INTO {RAW_TABLE} (producer_id, base_sequence, record_count, appended_at, payload) "
    "VALUES ($1, $2, $3, $4, $5)"
)


async def _timed(
    window: Window, rows: int, records_per_row: int, row_bytes: int, write: Callable[[int], Any]
) -> Tally:
    """Call `write(first sequence)` (it writes `rows` rows) until the window ends, timing each."""
    clock = time.perf_counter
    sequence = 0
    tally = Tally()
    while True:
        sent = clock()
        if sent >= window.end:
            return tally
        await write(sequence)
        done = clock()
        sequence += rows * records_per_row
        tally.count(window, sent, done, rows, rows * records_per_row, rows * row_bytes)


async def raw_writer(
    connection: asyncpg.Connection, producer_id: int, payload: Payload, window: Window
) -> Tally:
    """One INSERT per batch; autocommit: each its own transaction, as each produce is."""
    count, raw = len(payload.values), payload.raw_batch
    execute = (await connection.prepare(RAW_INSERT)).fetch

    def write(sequence: int) -> Any:
        return execute(producer_id, sequence, count, time.time_ns() // 1_000_000, raw)

    return await _timed(window, 1, count, len(raw), write)


async def copy_writer(
    connection: asyncpg.Connection, producer_id: int, payload: Payload, window: Window
) -> Tally:
    """The ceiling: the same rows, COPY_ROWS per COPY (each its own transaction)."""
    count, raw = len(payload.values), payload.raw_batch

    def write(sequence: int) -> Any:
        now = time.time_ns() // 1_000_000
        rows = [(producer_id, sequence + i * count, count, now, raw) for i in range(COPY_ROWS)]
        return connection.copy_records_to_table(RAW_TABLE, records=rows)

    return await _timed(window, COPY_ROWS, count, len(raw), write)


async def run_raw(
    database_url: str,
    producers: int,
    args: argparse.Namespace,
    payload: Payload,
    writer: Callable[[asyncpg.Connection, int, Payload, Window], Awaitable[Tally]],
) -> tuple[Tally, float]:
    await admin(database_url, f"DROP TABLE IF EXISTS {RAW_TABLE}", RAW_DDL)
    connections = [await asyncpg.connect(database_url) for _ in range(producers)]
    try:
        window = Window.after(args.warmup, args.seconds)
        tallies = await asyncio.gather(
            *(writer(c, i, payload, window) for i, c in enumerate(connections))
        )
    finally:
        for connection in connections:
            await connection.close()
    return merged(tallies), window.seconds


# -- the run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One producer count's figures."""

    producers: int
    service: Figures
    raw: Figures
    copy: Figures
    service_cpu_ms_per_mb: float
    client_cpu_ms_per_mb: float

    @property
    def ratio(self) -> float:
        return self.service.mb_per_s / self.raw.mb_per_s if self.raw.mb_per_s else float("nan")

    def figures(self) -> dict[str, Any]:
        return {
            "producers": self.producers,
            "service_records_per_s": round(self.service.records_per_s, 1),
            "service_mb_per_s": round(self.service.mb_per_s, 3),
            "service_p50_ms": round(self.service.p50_ms, 2),
            "service_p99_ms": round(self.service.p99_ms, 2),
            "service_cpu_ms_per_mb": round(self.service_cpu_ms_per_mb, 2),
            "client_cpu_ms_per_mb": round(self.client_cpu_ms_per_mb, 2),
            "raw_mb_per_s": round(self.raw.mb_per_s, 3),
            "raw_copy_mb_per_s": round(self.copy.mb_per_s, 3),
            "ratio": round(self.ratio, 4),
            "ratio_to_copy": round(self.service.mb_per_s / self.copy.mb_per_s, 4)
            if self.copy.mb_per_s
            else float("nan"),
        }


def report(args: argparse.Namespace, runs: list[Run]) -> None:
    print()
    print(
        f"produce ({args.format}): {args.batch_records} records x {args.record_bytes} B per "
        f"batch, {args.seconds:g} s measured after {args.warmup:g} s warm-up per phase"
    )
    header = f"{'':<30}{'records/s':>12}{'MB/s':>10}{'batches/s':>11}{'p50 ms':>9}{'p99 ms':>9}"
    for run in runs:
        partitions = args.partitions or run.producers
        print(f"\n{run.producers} producers, {partitions} partitions")
        print(header)
        print("-" * len(header))
        for name, f in (
            ("service (HTTP)", run.service),
            ("raw (asyncpg INSERT)", run.raw),
            (f"raw (COPY, {COPY_ROWS} rows each)", run.copy),
        ):
            print(
                f"{name:<30}{f.records_per_s:>12,.0f}{f.mb_per_s:>10.2f}{f.batches_per_s:>11.1f}"
                f"{f.p50_ms:>9.1f}{f.p99_ms:>9.1f}"
            )
        print(
            f"ratio (service MB/s / raw INSERT MB/s): {run.ratio:.3f}  (goal >= 0.6); "
            f"service CPU {run.service_cpu_ms_per_mb:.1f} ms per MB "
            f"(the load generator's {run.client_cpu_ms_per_mb:.1f})"
        )
    print(
        json.dumps(
            {
                "format": args.format,
                "batch_records": args.batch_records,
                "record_bytes": args.record_bytes,
                "seconds": args.seconds,
                "ratio": round(runs[0].ratio, 4),
                "runs": [run.figures() for run in runs],
            }
        ),
        flush=True,
    )


async def bench(args: argparse.Namespace) -> None:
    cancel_on_sigterm()
    server_url = plain_url(args.postgres_url)
    payload = Payload.build(args.batch_records, args.record_bytes)
    runs = []
    for producers in args.producers:
        async with scratch_database(server_url, "bench_") as (_, database_url):
            async with serving(database_url, "bench-produce-", SERVE, SERVE_OPTIONS) as service:
                await checkpoint(database_url)
                log(f"service phase, {producers} producers: {args.warmup:g} + {args.seconds:g} s")
                tally, seconds, cpu, own = await run_service(service, producers, args, payload)
            service_figures = Figures.of(tally, seconds)
            await checkpoint(database_url)
            log(f"raw INSERT phase: {args.warmup:g} s warm-up + {args.seconds:g} s")
            raw = Figures.of(*await run_raw(database_url, producers, args, payload, raw_writer))
            await checkpoint(database_url)
            log(f"raw COPY phase: {args.warmup:g} s warm-up + {args.seconds:g} s")
            copy = Figures.of(*await run_raw(database_url, producers, args, payload, copy_writer))
        mb = tally.value_bytes / MB
        per_mb = (1000 / mb) if mb else 0.0
        runs.append(Run(producers, service_figures, raw, copy, cpu * per_mb, own * per_mb))
    report(args, runs)


def producer_counts(text: str) -> list[int]:
    return [positive_int(part) for part in text.split(",")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Produce throughput of the coordinator on Postgres vs. raw asyncpg INSERTs "
        "of the same bytes. The last stdout line is a JSON object with the figures.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_postgres_url(parser)
    parser.add_argument(
        "--producers",
        type=producer_counts,
        default=[4, 16],
        help="concurrent producers, comma-separated: one run (service, INSERT, COPY) per count",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=0,
        help="partitions of the topic, producer i writes to partition i mod this; "
        "0: one per producer",
    )
    parser.add_argument("--batch-records", type=positive_int, default=100, help="records/batch")
    parser.add_argument(
        "--format",
        choices=["binary", "json"],
        default="binary",
        help="how batches travel: Kafka record batches, or JSON",
    )
    parser.add_argument("--record-bytes", type=positive_int, default=1024, help="bytes per value")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per phase")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per phase")
    args = parser.parse_args(argv)
    if args.partitions < 0:
        parser.error("--partitions must not be negative")
    if args.seconds <= 0 or args.warmup < 0:
        parser.error("--seconds must be positive and --warmup not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_bench(bench(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
