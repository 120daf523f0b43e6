"""Produce throughput of the coordinator on Postgres, against Postgres itself.

What it measures, in one run on one machine:

1. service: `coordinator serve` is started as a child process on a fresh Postgres database. A
   topic is created and N idempotent producers (each from `POST /v1/init-pid {}`) send batches of
   `--batch-records` records of `--record-bytes` bytes each to `POST /v1/topics/{t}/partitions/
   {p}/records`, one request in flight per producer, with the right `base_sequence` (0, then the
   previous batch's last sequence + 1). Every answer must be 200 with `duplicate: false`.
2. raw: the same bytes (the same record values, concatenated: one batch = one row) inserted
   straight into Postgres with asyncpg (the driver the service uses), one INSERT per batch, each
   its own transaction (autocommit), from N concurrent connections, for the same duration.

Both phases run for `--seconds` after a `--warmup`; a batch counts when its answer arrives inside
the measured window. MB is 10**6 bytes of record values acknowledged (keys are null, no headers).
`ratio` is service MB/s over raw MB/s: how much of what the database could take the service
delivers. Goal: ratio >= 0.5.

The load generator is kept cheap (request bodies are built once, only the sequence number is
spliced in per batch; uvloop when installed), since client, service and Postgres share the
machine's cores. Figures are noisy when other work runs on the machine.

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
import random
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
POSTGRES_ENV = "COORDINATOR_TEST_POSTGRES_URL"
TOPIC = "bench"
RAW_TABLE = "bench_raw_batches"
MB = 1_000_000


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# -- the database -------------------------------------------------------------------------------


def plain_url(url: str) -> str:
    """asyncpg wants postgresql://; accept the SQLAlchemy spelling too."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+", 1)[0] not in ("postgresql", "postgres"):
        raise SystemExit(f"not a Postgres URL: {url!r}")
    return f"postgresql://{rest}"


def with_database(url: str, name: str) -> str:
    base, _, tail = url.partition("?")
    server = base.rpartition("/")[0] if base.count("/") > 2 else base
    return f"{server}/{name}" + (f"?{tail}" if tail else "")


async def admin(server_url: str, sql: str) -> None:
    connection = await asyncpg.connect(server_url)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


async def checkpoint(database_url: str) -> None:
    """Start each phase without the other's dirty pages pending (needs superuser; else skipped)."""
    try:
        await admin(database_url, "CHECKPOINT")
    except asyncpg.PostgresError as exc:
        log(f"CHECKPOINT skipped: {exc}")


# -- the payload --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Payload:
    values: list[bytes]  # one per record of a batch
    records_json: bytes  # `"records":[...]` as the service receives it
    raw_batch: bytes  # the values concatenated: one row of the raw baseline

    @classmethod
    def build(cls, batch_records: int, record_bytes: int, seed: int = 1) -> Payload:
        # Printable ASCII (no quote or backslash), so `utf8` JSON carries exactly record_bytes
        # bytes per value; random, so neither side gets it compressed for free.
        rng = random.Random(seed)
        alphabet = string.ascii_letters + string.digits
        values = [
            "".join(rng.choices(alphabet, k=record_bytes)).encode() for _ in range(batch_records)
        ]
        records = [{"key": None, "value": v.decode()} for v in values]
        return cls(
            values=values,
            records_json=b'"records":' + orjson.dumps(records),
            raw_batch=b"".join(values),
        )


# -- measuring ----------------------------------------------------------------------------------


@dataclass
class Window:
    """Warm-up, then `seconds` measured; work answered inside [start, end] counts."""

    start: float
    end: float

    @classmethod
    def after(cls, warmup: float, seconds: float) -> Window:
        start = time.perf_counter() + warmup
        return cls(start, start + seconds)

    def counts(self, at: float) -> bool:
        return self.start <= at <= self.end


@dataclass
class Tally:
    batches: int = 0
    records: int = 0
    value_bytes: int = 0
    latencies: list[float] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.batches += other.batches
        self.records += other.records
        self.value_bytes += other.value_bytes
        self.latencies.extend(other.latencies)


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

        def pct(p: float) -> float:
            return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")

        return cls(
            records_per_s=tally.records / seconds,
            mb_per_s=tally.value_bytes / MB / seconds,
            batches_per_s=tally.batches / seconds,
            p50_ms=pct(0.50),
            p99_ms=pct(0.99),
        )


# -- the service --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Service:
    """`python -m coordinator serve` in a child process; it migrates the store itself."""

    def __init__(self, database_url: str, workdir: Path) -> None:
        self.database_url = database_url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "service.log"
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def spawn(self) -> None:
        command = [
            sys.executable,
            "-m",
            "coordinator",
            "serve",
            "--port",
            str(self.port),
            "--database-url",
            self.database_url,
            "--log-level",
            "warning",
        ]
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                command, cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT
            )
        log(f"service pid {self.process.pid} on {self.url} (log: {self.log_path})")

    async def wait_healthy(self, within_s: float = 90.0) -> None:
        assert self.process is not None
        deadline = time.monotonic() + within_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the service exited:\n{self.log_tail()}")
                try:
                    if (await client.get(f"{self.url}/healthz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
        raise TimeoutError(f"the service did not become healthy:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=15)


class BenchFailure(Exception):
    pass


async def call(client: httpx.AsyncClient, method: str, path: str, body: Any) -> Any:
    response = await client.request(method, path, json=body)
    if response.status_code not in (200, 201):
        raise BenchFailure(f"{method} {path}: {response.status_code} {response.text[:500]}")
    return response.json()


async def service_producer(
    client: httpx.AsyncClient,
    partition: int,
    payload: Payload,
    window: Window,
) -> Tally:
    init = await call(client, "POST", "/v1/init-pid", {})
    pid, epoch = init["producer_id"], init["producer_epoch"]
    path = f"/v1/topics/{TOPIC}/partitions/{partition}/records"
    head = f'{{"producer_id":{pid},"producer_epoch":{epoch},"base_sequence":'.encode()
    tail = b"," + payload.records_json + b"}"
    headers = {"content-type": "application/json"}
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
        if window.counts(done):
            tally.batches += 1
            tally.records += batch_records
            tally.value_bytes += batch_bytes
            tally.latencies.append(done - sent)


async def run_service(
    service_url: str, args: argparse.Namespace, payload: Payload
) -> tuple[Tally, float]:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    timeout = httpx.Timeout(60.0)
    clients = [
        httpx.AsyncClient(base_url=service_url, limits=limits, timeout=timeout)
        for _ in range(args.producers)
    ]
    try:
        await call(clients[0], "POST", "/v1/topics", {"name": TOPIC, "partitions": args.partitions})
        window = Window.after(args.warmup, args.seconds)
        tallies = await asyncio.gather(
            *(
                service_producer(client, i % args.partitions, payload, window)
                for i, client in enumerate(clients)
            )
        )
    finally:
        for client in clients:
            await client.aclose()
    total = Tally()
    for tally in tallies:
        total.add(tally)
    return total, window.end - window.start


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


async def raw_writer(
    connection: asyncpg.Connection, producer_id: int, payload: Payload, window: Window
) -> Tally:
    batch_records = len(payload.values)
    batch_bytes = len(payload.raw_batch)
    raw = payload.raw_batch
    statement = await connection.prepare(RAW_INSERT)
    execute = statement.fetch
    clock = time.perf_counter
    sequence = 0
    tally = Tally()
    while True:
        sent = clock()
        if sent >= window.end:
            return tally
        # Autocommit: each INSERT is its own transaction, as each produce is in the service.
        await execute(producer_id, sequence, batch_records, time.time_ns() // 1_000_000, raw)
        done = clock()
        sequence += batch_records
        if window.counts(done):
            tally.batches += 1
            tally.records += batch_records
            tally.value_bytes += batch_bytes
            tally.latencies.append(done - sent)


async def run_raw(
    database_url: str, args: argparse.Namespace, payload: Payload
) -> tuple[Tally, float]:
    await admin(database_url, RAW_DDL)
    connections = [await asyncpg.connect(database_url) for _ in range(args.producers)]
    try:
        window = Window.after(args.warmup, args.seconds)
        tallies = await asyncio.gather(
            *(raw_writer(c, i, payload, window) for i, c in enumerate(connections))
        )
    finally:
        for connection in connections:
            await connection.close()
    total = Tally()
    for tally in tallies:
        total.add(tally)
    return total, window.end - window.start


# -- the run ------------------------------------------------------------------------------------


def report(args: argparse.Namespace, service: Figures, raw: Figures) -> None:
    ratio = service.mb_per_s / raw.mb_per_s if raw.mb_per_s else float("nan")
    print()
    print(
        f"produce: {args.producers} producers, {args.partitions} partitions, "
        f"{args.batch_records} records x {args.record_bytes} B per batch, "
        f"{args.seconds:g} s measured after {args.warmup:g} s warm-up"
    )
    header = f"{'':<22}{'records/s':>12}{'MB/s':>10}{'batches/s':>11}{'p50 ms':>9}{'p99 ms':>9}"
    print(header)
    print("-" * len(header))
    for name, f in (("service (HTTP)", service), ("raw (asyncpg INSERT)", raw)):
        print(
            f"{name:<22}{f.records_per_s:>12,.0f}{f.mb_per_s:>10.2f}{f.batches_per_s:>11.1f}"
            f"{f.p50_ms:>9.1f}{f.p99_ms:>9.1f}"
        )
    print(f"ratio (service MB/s / raw MB/s): {ratio:.3f}  (goal >= 0.5)")
    print(
        json.dumps(
            {
                "service_records_per_s": round(service.records_per_s, 1),
                "service_mb_per_s": round(service.mb_per_s, 3),
                "raw_records_per_s": round(raw.records_per_s, 1),
                "raw_mb_per_s": round(raw.mb_per_s, 3),
                "ratio": round(ratio, 4),
                "producers": args.producers,
                "batch_records": args.batch_records,
                "record_bytes": args.record_bytes,
                "seconds": args.seconds,
            }
        ),
        flush=True,
    )


async def bench(args: argparse.Namespace) -> None:
    # SIGTERM unwinds like Ctrl-C (the task is cancelled), so the service is stopped and the
    # database dropped on the way out.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    server_url = plain_url(args.postgres_url)
    name = f"bench_{uuid.uuid4().hex[:12]}"
    database_url = with_database(server_url, name)
    payload = Payload.build(args.batch_records, args.record_bytes)
    await admin(server_url, f'CREATE DATABASE "{name}"')
    log(f"created database {name}")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-produce-") as workdir:
            service = Service(database_url, Path(workdir))
            try:
                service.spawn()
                await service.wait_healthy()
                await checkpoint(database_url)
                log(f"service phase: {args.warmup:g} s warm-up + {args.seconds:g} s")
                service_tally, service_seconds = await run_service(service.url, args, payload)
            except BaseException:
                tail = service.log_tail()
                if tail:
                    log(f"service log tail:\n{tail}")
                raise
            finally:
                service.stop()
        await checkpoint(database_url)
        log(f"raw phase: {args.warmup:g} s warm-up + {args.seconds:g} s")
        raw_tally, raw_seconds = await run_raw(database_url, args, payload)
    finally:
        await admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        log(f"dropped database {name}")
    report(args, Figures.of(service_tally, service_seconds), Figures.of(raw_tally, raw_seconds))


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Produce throughput of the coordinator on Postgres vs. raw asyncpg INSERTs "
        "of the same bytes. The last stdout line is a JSON object with the figures.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get(POSTGRES_ENV, DEFAULT_POSTGRES_URL),
        help=f"Postgres server to create the benchmark database on (${POSTGRES_ENV})",
    )
    parser.add_argument("--producers", type=positive_int, default=4, help="concurrent producers")
    parser.add_argument(
        "--partitions",
        type=int,
        default=0,
        help="partitions of the topic, producer i writes to partition i mod this; "
        "0: one per producer",
    )
    parser.add_argument("--batch-records", type=positive_int, default=100, help="records/batch")
    parser.add_argument("--record-bytes", type=positive_int, default=1024, help="bytes per value")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per phase")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per phase")
    args = parser.parse_args(argv)
    if args.partitions < 0:
        parser.error("--partitions must not be negative")
    if args.partitions == 0:
        args.partitions = args.producers
    if args.seconds <= 0 or args.warmup < 0:
        parser.error("--seconds must be positive and --warmup not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(bench(args))
    except BenchFailure as exc:
        log(f"FAILED: {exc}")
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
