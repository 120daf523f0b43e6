"""Transaction throughput of the coordinator on Postgres, against a one-UPDATE baseline.

What it measures, in one run on one machine (the service, its Postgres and this load generator
share the machine's cores):

1. rpc: N transactional producers (`--producers`), each with its own transactional id and its
   own partition of one topic, loop for `--seconds`: produce one record batch of
   `--rpc-records` small records (`POST /v1/topics/{t}/partitions/{p}/records?transactional_id=`,
   binary, base sequence 0: every transaction runs at a new epoch; the batch adds its partition to
   the transaction itself, transaction version 2) -> EndTxn commit
   (`POST /v1/transactions/{tid}/end`), whose answer carries the producer id and epoch the next
   transaction uses. Reported: transactions/s, coordinator calls/s (2 per transaction) and
   p50/p99 per call type.
2. baseline: the same N clients, one request in flight each, call `POST /bench/update` for the
   same time. That route lives in the same app (built by `coordinator.app.create_app`, then
   this one route added: same FastAPI, middleware, engine, pool and `Store.write()` unit of
   work) and runs one single-row `UPDATE bench_counter SET n = n + 1 WHERE id = :id RETURNING n`
   (one row per client, so there is no hot row). `rpc_ratio` = coordinator calls/s over baseline
   requests/s. Goal: >= 0.7.
3. overhead: `--overhead-records` records of `--record-bytes` bytes per batch, sent as fast as
   the service answers, as Kafka record batches, for `--overhead-seconds`, in two modes:
   idempotent only (InitPid with a null transactional id, sequences 0, n, 2n, ...), and
   transactional (batches until `--commit-interval-ms` of wall time have passed since the
   transaction began, EndTxn, then the next transaction at the new epoch with sequences from 0
   again; every transaction carries at least one batch). The modes
   alternate for `--rounds` rounds, in the order AB, BA, AB, ... so slow drifts (a growing log,
   other work on the machine) hit both alike; `txn_overhead` = 1 - median transactional MB/s /
   median idempotent MB/s. Kafka publishes about 3% for 1 KB records and 100 ms commits.
   Goal: <= 0.02.

Each phase (and each overhead run) counts only the calls answered inside its measured window,
after a `--warmup`. Latency is per HTTP call, as the client sees it. MB is 10**6 bytes of record
values acknowledged. Every answer is checked (status, offsets, no duplicates); any unexpected
answer fails the run. Besides wall-clock figures, the CPU seconds the service process and the
Postgres backends of the benchmark database used inside each window are read from /proc (local
Postgres on Linux; else NaN/null): CPU per call is far less disturbed by other load on the
machine than calls/s, and `rpc_cpu_ratio` (baseline CPU per request over coordinator CPU per
call) is what `rpc_ratio` would be if CPU alone limited both.

Run (Postgres must be reachable; the benchmark creates a database `bench_txn_<random>` and drops
it at the end, also on failure or Ctrl-C):

    python bench/transactions.py
    python bench/transactions.py --producers 4 --seconds 15 --rounds 3 \\
        --postgres-url postgresql://postgres@127.0.0.1:5432/test
    python bench/transactions.py --py-spy /tmp/bench-txn-prof   # also profile the service

The server URL comes from `--postgres-url`, else $COORDINATOR_TEST_POSTGRES_URL, else
postgresql://postgres@127.0.0.1:5432/test. The service runs as a child process (this file with
`--serve`: migrate to head, then uvicorn, as `coordinator serve` does). A readable table goes to
stdout; its last line is one JSON object with the figures. Progress (and the service's pid, for
`py-spy top --pid`) goes to stderr. Figures are noisy when other work shares the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from sqlalchemy import text
from starlette.responses import Response

from coordinator.app import create_app
from coordinator.core.dependencies import DB
from coordinator.core.responses import json_response
from coordinator.core.schemas import RequestModel
from coordinator.core.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
import _support
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
    checked,
    checkpoint,
    close_all,
    log,
    make_clients,
    percentile_ms,
    plain_url,
    positive_float,
    positive_int,
    random_values,
    run_bench,
    scratch_database,
    serving,
)

RPC_TOPIC = "bench-rpc"
OVERHEAD_TOPIC = "bench-overhead"
COUNTER_TABLE = "bench_counter"
BASELINE_PATH = "/bench/update"
# The child process: this file with `--serve` (see `serve`).
SERVE = [str(Path(__file__).resolve()), "--serve"]


# -- the service: the coordinator's app plus the baseline route ---------------------------------


class BenchUpdate(RequestModel):
    id: int


def build_app(database_url: str) -> Any:
    """`create_app` as `coordinator serve` builds it, plus `POST /bench/update`: one single-row
    UPDATE in the app's own unit of work (`Store.write()`)."""
    statement = text(f"UPDATE {COUNTER_TABLE} SET n = n + 1 WHERE id = :id RETURNING n")
    app = create_app(Settings(database_url=database_url))

    @app.post(BASELINE_PATH, include_in_schema=False)
    async def bench_update(body: BenchUpdate, db: DB) -> Response:
        async with db.write() as session:
            n = (await session.execute(statement, {"id": body.id})).scalar_one()
        return json_response({"id": body.id, "n": n})

    return app


def serve(args: argparse.Namespace) -> int:
    """The child process: migrate, then serve the app with uvicorn, as `coordinator serve`."""
    import logging

    import uvicorn

    from coordinator.core.migrate import upgrade_to_head

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    upgrade_to_head(Settings(database_url=args.database_url).database_url)
    uvicorn.run(
        build_app(args.database_url),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return 0


class Profiler:
    """Optional: `py-spy record` of the service for one phase, as collapsed stacks (raw)."""

    def __init__(self, directory: Path | None, pid: int) -> None:
        self.directory = directory
        self.pid = pid
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, name: str) -> None:
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        output = self.directory / f"{name}.txt"
        command = ["py-spy", "record", "--pid", str(self.pid), "--rate", "250", "--format"]
        command += ["raw", "--nonblocking", "-o", str(output)]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        log(f"py-spy recording {name} -> {output} (pid {self.process.pid})")

    def stop(self) -> None:
        if self.process is None:
            return
        # SIGINT makes py-spy write its output and exit.
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


# -- measuring ----------------------------------------------------------------------------------


@dataclass
class Calls:
    """Latencies (s) of one kind of call answered inside the window."""

    latencies: list[float] = field(default_factory=list)

    def add(self, other: Calls) -> None:
        self.latencies.extend(other.latencies)

    def per_s(self, seconds: float) -> float:
        return len(self.latencies) / seconds

    def pct_ms(self, p: float) -> float:
        return percentile_ms(sorted(self.latencies), p)


@dataclass
class Tally:
    calls: dict[str, Calls] = field(default_factory=dict)
    transactions: int = 0
    value_bytes: int = 0
    # CPU seconds used inside the window by the service process and by its Postgres backends
    # (Linux, local Postgres; else NaN): robust where wall-clock figures suffer from other load.
    service_cpu_s: float = 0.0
    postgres_cpu_s: float = 0.0

    def call(self, kind: str) -> Calls:
        calls = self.calls.get(kind)
        if calls is None:
            calls = self.calls[kind] = Calls()
        return calls

    def add(self, other: Tally) -> None:
        for kind, calls in other.calls.items():
            self.call(kind).add(calls)
        self.transactions += other.transactions
        self.value_bytes += other.value_bytes
        self.service_cpu_s += other.service_cpu_s
        self.postgres_cpu_s += other.postgres_cpu_s

    def count(self) -> int:
        return sum(len(c.latencies) for c in self.calls.values())


def merged(tallies: list[Tally]) -> Tally:
    total = Tally()
    for tally in tallies:
        total.add(tally)
    return total


class CpuMeter(_support.CpuMeter):
    """`_support.CpuMeter`, added to a window's `Tally`."""

    async def over(self, window: Window, tally: Tally) -> None:
        """Wait for the window, then add its CPU seconds to `tally`."""
        await asyncio.sleep(max(0.0, window.start - time.perf_counter()))
        service0, backends0 = await self.sample()
        await asyncio.sleep(max(0.0, window.end - time.perf_counter()))
        service1, backends1 = await self.sample()
        tally.service_cpu_s += service1 - service0
        # A backend that started inside the window counts from zero.
        tally.postgres_cpu_s += sum(cpu - backends0.get(pid, 0.0) for pid, cpu in backends1.items())


async def measured(meter: CpuMeter | None, window: Window, loops: list[Any]) -> Tally:
    """Run the loops; with a meter, also measure CPU over the window."""
    cpu = Tally()
    tasks = [asyncio.gather(*loops)]
    if meter is not None:
        tasks.append(meter.over(window, cpu))
    results = await asyncio.gather(*tasks)
    total = merged(list(results[0]))
    total.add(cpu)
    return total


# -- the payloads -------------------------------------------------------------------------------


def identity(pid: int, epoch: int) -> bytes:
    return f'{{"producer_id":{pid},"producer_epoch":{epoch},'.encode()


class Producer:
    """One transactional producer's prebuilt request bodies and paths."""

    def __init__(self, client: Client, tid: str, topic: str, partition: int) -> None:
        self.client = client
        self.tid = tid
        self.end_path = f"/v1/transactions/{tid}/end"
        self.produce_path = f"/v1/topics/{topic}/partitions/{partition}/records"
        self.params = {"transactional_id": tid}
        self.pid = -1
        self.epoch = -1

    async def init(self) -> None:
        answer = await call(self.client, "/v1/init-pid", {"transactional_id": self.tid})
        self.pid, self.epoch = answer["producer_id"], answer["producer_epoch"]

    async def produce(self, sequence: int, records: BatchTemplate, count: int) -> None:
        body = records.at(self.pid, self.epoch, sequence)
        answer = checked(
            await self.client.post(
                self.produce_path, content=body, params=self.params, headers=BATCH_HEADERS
            ),
            f"produce {self.tid} epoch {self.epoch} seq {sequence}",
        )
        if answer["duplicate"] is not False or answer["last_offset"] - answer["base_offset"] != (
            count - 1
        ):
            raise BenchFailure(f"produce {self.tid}: unexpected answer {answer}")

    async def end(self) -> None:
        body = identity(self.pid, self.epoch) + b'"commit":true}'
        answer = checked(
            await self.client.post(self.end_path, content=body, headers=JSON_HEADERS),
            f"EndTxn {self.tid} epoch {self.epoch}",
        )
        if answer["state"] != "CompleteCommit":
            raise BenchFailure(f"EndTxn {self.tid}: unexpected answer {answer}")
        self.pid, self.epoch = answer["producer_id"], answer["producer_epoch"]


# -- phase 1: produce -> EndTxn -----------------------------------------------------------------


async def rpc_loop(producer: Producer, records: BatchTemplate, count: int, window: Window) -> Tally:
    tally = Tally()
    produce, end = tally.call("produce"), tally.call("EndTxn")
    clock = time.perf_counter
    counts = window.counts
    while True:
        t1 = clock()
        if t1 >= window.end:
            return tally
        await producer.produce(0, records, count)
        t2 = clock()
        await producer.end()
        t3 = clock()
        if counts(t2):
            produce.latencies.append(t2 - t1)
        if counts(t3):
            end.latencies.append(t3 - t2)
            tally.transactions += 1


async def run_rpc(
    url: str, args: argparse.Namespace, meter: CpuMeter | None
) -> tuple[Tally, float]:
    values = random_values(args.rpc_records, args.rpc_record_bytes, seed=2)
    records = BatchTemplate([v.encode() for v in values], transactional=True)
    clients = make_clients(url, args.producers)
    try:
        producers = [Producer(c, f"bench-rpc-{i}", RPC_TOPIC, i) for i, c in enumerate(clients)]
        for producer in producers:
            await producer.init()
        window = Window.after(args.warmup, args.seconds)
        loops = [rpc_loop(p, records, args.rpc_records, window) for p in producers]
        tally = await measured(meter, window, loops)
    finally:
        await close_all(clients)
    return tally, window.seconds


# -- phase 2: the baseline ----------------------------------------------------------------------


async def baseline_loop(client: Client, row: int, window: Window) -> Tally:
    tally = Tally()
    calls = tally.call("update")
    body = orjson.dumps({"id": row})
    post = client.post
    clock = time.perf_counter
    while True:
        sent = clock()
        if sent >= window.end:
            return tally
        response = await post(BASELINE_PATH, content=body, headers=JSON_HEADERS)
        done = clock()
        answer = checked(response, f"POST {BASELINE_PATH}")
        if answer["id"] != row:
            raise BenchFailure(f"{BASELINE_PATH}: unexpected answer {answer}")
        if window.counts(done):
            calls.latencies.append(done - sent)


async def run_baseline(
    url: str, args: argparse.Namespace, meter: CpuMeter | None
) -> tuple[Tally, float]:
    clients = make_clients(url, args.producers)
    try:
        window = Window.after(args.warmup, args.seconds)
        loops = [baseline_loop(c, i, window) for i, c in enumerate(clients)]
        tally = await measured(meter, window, loops)
    finally:
        await close_all(clients)
    return tally, window.seconds


# -- phase 3: transactional vs idempotent-only throughput ---------------------------------------


async def idempotent_loop(
    client: Client,
    partition: int,
    records: BatchTemplate,
    count: int,
    size: int,
    w: Window,
) -> Tally:
    answer = await call(client, "/v1/init-pid", {"transactional_id": None})
    pid, epoch = answer["producer_id"], answer["producer_epoch"]
    path = f"/v1/topics/{OVERHEAD_TOPIC}/partitions/{partition}/records"
    tally = Tally()
    calls = tally.call("produce")
    post = client.post
    clock = time.perf_counter
    sequence = 0
    while True:
        sent = clock()
        if sent >= w.end:
            return tally
        response = await post(path, content=records.at(pid, epoch, sequence), headers=BATCH_HEADERS)
        done = clock()
        answer = checked(response, f"produce pid {pid} seq {sequence}")
        if answer["duplicate"] is not False or answer["last_offset"] - answer["base_offset"] != (
            count - 1
        ):
            raise BenchFailure(f"produce pid {pid}: unexpected answer {answer}")
        sequence += count
        if w.counts(done):
            calls.latencies.append(done - sent)
            tally.value_bytes += size


async def transactional_loop(
    producer: Producer, records: BatchTemplate, count: int, size: int, interval: float, w: Window
) -> Tally:
    await producer.init()
    tally = Tally()
    produce, end = tally.call("produce"), tally.call("EndTxn")
    clock = time.perf_counter
    while True:
        began = clock()
        if began >= w.end:
            return tally
        sequence = 0
        while True:
            sent = clock()
            # At least one batch per transaction, then until the interval has passed.
            if sequence and (sent - began >= interval or sent >= w.end):
                break
            await producer.produce(sequence, records, count)
            done = clock()
            sequence += count
            if w.counts(done):
                produce.latencies.append(done - sent)
                tally.value_bytes += size
        sent = clock()
        await producer.end()
        done = clock()
        if w.counts(done):
            end.latencies.append(done - sent)
            tally.transactions += 1


@dataclass
class OverheadRun:
    mode: str
    round: int
    tally: Tally
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.tally.value_bytes / MB / self.seconds


async def run_overhead(
    url: str, args: argparse.Namespace, mode: str, round_: int, meter: CpuMeter | None
) -> OverheadRun:
    encoded = [v.encode() for v in random_values(args.overhead_records, args.record_bytes, 1)]
    size = args.overhead_records * args.record_bytes
    clients = make_clients(url, args.producers)
    try:
        window = Window.after(args.warmup, args.overhead_seconds)
        if mode == "idempotent":
            records = BatchTemplate(encoded)
            loops = [
                idempotent_loop(c, i, records, args.overhead_records, size, window)
                for i, c in enumerate(clients)
            ]
        else:
            interval = args.commit_interval_ms / 1000
            records = BatchTemplate(encoded, transactional=True)
            loops = [
                transactional_loop(
                    Producer(c, f"bench-overhead-{i}", OVERHEAD_TOPIC, i),
                    records,
                    args.overhead_records,
                    size,
                    interval,
                    window,
                )
                for i, c in enumerate(clients)
            ]
        tally = await measured(meter, window, loops)
    finally:
        await close_all(clients)
    return OverheadRun(mode, round_, tally, window.seconds)


# -- the run ------------------------------------------------------------------------------------


def per_ms(seconds: float, count: int) -> float:
    return 1000 * seconds / count if count else float("nan")


def r(value: float, digits: int = 2) -> float | None:
    return None if value != value else round(value, digits)  # NaN -> null


def report(
    args: argparse.Namespace,
    rpc: Tally,
    rpc_seconds: float,
    base: Tally,
    base_seconds: float,
    runs: list[OverheadRun],
) -> None:
    calls_per_s = rpc.count() / rpc_seconds
    txn_per_s = rpc.transactions / rpc_seconds
    base_calls = base.call("update")
    base_per_s = base_calls.per_s(base_seconds)
    rpc_ratio = calls_per_s / base_per_s if base_per_s else float("nan")
    rpc_svc_ms = per_ms(rpc.service_cpu_s, rpc.count())
    rpc_pg_ms = per_ms(rpc.postgres_cpu_s, rpc.count())
    base_svc_ms = per_ms(base.service_cpu_s, base.count())
    base_pg_ms = per_ms(base.postgres_cpu_s, base.count())
    # What rpc_ratio would be if CPU (service + Postgres) were all that limited both.
    rpc_cpu_ms = rpc_svc_ms + rpc_pg_ms
    cpu_ratio = (base_svc_ms + base_pg_ms) / rpc_cpu_ms if rpc_cpu_ms else float("nan")

    idem = [run.mb_per_s for run in runs if run.mode == "idempotent"]
    txn = [run.mb_per_s for run in runs if run.mode == "transactional"]
    idem_median = statistics.median(idem)
    txn_median = statistics.median(txn)
    overhead = 1 - txn_median / idem_median if idem_median else float("nan")
    per_round = [1 - t / i for i, t in zip(idem, txn, strict=True) if i]
    txn_runs = merged([run.tally for run in runs if run.mode == "transactional"])
    idem_runs = merged([run.tally for run in runs if run.mode == "idempotent"])
    txn_seconds = sum(run.seconds for run in runs if run.mode == "transactional")

    print()
    print(
        f"rpc: {args.producers} transactional producers, produce "
        f"{args.rpc_records} x {args.rpc_record_bytes} B -> EndTxn, {args.seconds:g} s measured "
        f"after {args.warmup:g} s warm-up (x{args.rpc_rounds})"
    )
    header = f"{'':<28}{'calls/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
    print(header)
    print("-" * len(header))
    for kind in ("produce", "EndTxn"):
        c = rpc.call(kind)
        print(f"{kind:<28}{c.per_s(rpc_seconds):>10.1f}{c.pct_ms(0.5):>9.2f}{c.pct_ms(0.99):>9.2f}")
    print(f"{'coordinator calls (both)':<28}{calls_per_s:>10.1f}")
    print(f"{'transactions':<28}{txn_per_s:>10.1f}")
    print(
        f"{'baseline (1 UPDATE/request)':<28}{base_per_s:>10.1f}{base_calls.pct_ms(0.5):>9.2f}"
        f"{base_calls.pct_ms(0.99):>9.2f}"
    )
    print(
        f"CPU per call, ms: coordinator call: service {rpc_svc_ms:.2f}, Postgres {rpc_pg_ms:.2f}"
        f" (service busy {100 * rpc.service_cpu_s / rpc_seconds:.0f}% of a core); baseline: "
        f"service {base_svc_ms:.2f}, Postgres {base_pg_ms:.2f} (service busy "
        f"{100 * base.service_cpu_s / base_seconds:.0f}%)"
    )
    print(f"CPU ratio (baseline CPU per request / coordinator CPU per call): {cpu_ratio:.3f}")
    print(f"rpc_ratio (coordinator calls/s / baseline requests/s): {rpc_ratio:.3f}  (goal >= 0.7)")
    print()
    print(
        f"overhead: {args.producers} producers, {args.overhead_records} records x "
        f"{args.record_bytes} B per batch, commit every {args.commit_interval_ms:g} ms, "
        f"{args.overhead_seconds:g} s per run, {args.rounds} rounds"
    )
    header = (
        f"{'round':<7}{'mode':<15}{'MB/s':>9}{'batches/s':>11}{'txn/s':>8}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'svc cpu':>9}{'pg cpu':>8}"
    )
    print(header)
    print("-" * len(header))
    for run in runs:
        c = run.tally.call("produce")
        print(
            f"{run.round:<7}{run.mode:<15}{run.mb_per_s:>9.2f}{c.per_s(run.seconds):>11.1f}"
            f"{run.tally.transactions / run.seconds:>8.1f}"
            f"{c.pct_ms(0.5):>9.1f}{c.pct_ms(0.99):>9.1f}"
            f"{100 * run.tally.service_cpu_s / run.seconds:>8.0f}%"
            f"{100 * run.tally.postgres_cpu_s / run.seconds:>7.0f}%"
        )
    print(
        f"medians: idempotent {idem_median:.2f} MB/s, transactional {txn_median:.2f} MB/s; "
        f"per-round overheads {', '.join(f'{o:.3f}' for o in per_round)}"
    )
    for kind in ("EndTxn",):
        c = txn_runs.call(kind)
        print(f"  transactional {kind}: p50 {c.pct_ms(0.5):.2f} ms, p99 {c.pct_ms(0.99):.2f} ms")
    print(f"txn_overhead (1 - txn MB/s / idempotent MB/s): {overhead:.4f}  (goal <= 0.02)")

    figures: dict[str, Any] = {
        "transactions_per_s": r(txn_per_s, 1),
        "coordinator_calls_per_s": r(calls_per_s, 1),
        "baseline_requests_per_s": r(base_per_s, 1),
        "rpc_ratio": r(rpc_ratio, 4),
    }
    for kind in ("produce", "EndTxn"):
        c = rpc.call(kind)
        figures[f"{kind}_p50_ms"] = r(c.pct_ms(0.5))
        figures[f"{kind}_p99_ms"] = r(c.pct_ms(0.99))
    figures["baseline_p50_ms"] = r(base_calls.pct_ms(0.5))
    figures["baseline_p99_ms"] = r(base_calls.pct_ms(0.99))
    figures |= {
        "rpc_service_cpu_ms_per_call": r(rpc_svc_ms, 3),
        "rpc_postgres_cpu_ms_per_call": r(rpc_pg_ms, 3),
        "baseline_service_cpu_ms_per_request": r(base_svc_ms, 3),
        "baseline_postgres_cpu_ms_per_request": r(base_pg_ms, 3),
        "rpc_cpu_ratio": r(cpu_ratio, 4),
    }
    figures |= {
        "idempotent_mb_per_s": r(idem_median, 3),
        "transactional_mb_per_s": r(txn_median, 3),
        "idempotent_mb_per_s_runs": [r(v, 3) for v in idem],
        "transactional_mb_per_s_runs": [r(v, 3) for v in txn],
        "idempotent_service_cpu_ms_per_mb": r(
            1000 * idem_runs.service_cpu_s * MB / idem_runs.value_bytes, 2
        )
        if idem_runs.value_bytes
        else None,
        "transactional_service_cpu_ms_per_mb": r(
            1000 * txn_runs.service_cpu_s * MB / txn_runs.value_bytes, 2
        )
        if txn_runs.value_bytes
        else None,
        "idempotent_produce_p50_ms": r(idem_runs.call("produce").pct_ms(0.5)),
        "transactional_produce_p50_ms": r(txn_runs.call("produce").pct_ms(0.5)),
        "overhead_txn_per_s": r(txn_runs.transactions / txn_seconds, 1) if txn_seconds else None,
        "txn_overhead": r(overhead, 4),
        "producers": args.producers,
        "seconds": args.seconds,
        "overhead_seconds": args.overhead_seconds,
        "rounds": args.rounds,
        "record_bytes": args.record_bytes,
        "overhead_records": args.overhead_records,
        "commit_interval_ms": args.commit_interval_ms,
    }
    print(json.dumps(figures), flush=True)


async def phases(
    service: Service,
    database_url: str,
    args: argparse.Namespace,
    profiler: Profiler,
    meter: CpuMeter | None,
) -> tuple[Tally, float, Tally, float, list[OverheadRun]]:
    async with httpx.AsyncClient(base_url=service.url, timeout=60.0) as client:
        for topic in (RPC_TOPIC, OVERHEAD_TOPIC):
            await call(client, "/v1/topics", {"name": topic, "partitions": args.producers})

    rpc_tallies: list[Tally] = []
    base_tallies: list[Tally] = []
    rpc_seconds = base_seconds = 0.0
    for round_ in range(args.rpc_rounds):
        order = ("rpc", "baseline") if round_ % 2 == 0 else ("baseline", "rpc")
        for phase in order:
            await checkpoint(database_url)
            log(f"{phase} phase (round {round_}): {args.warmup:g} s warm-up + {args.seconds:g} s")
            profiler.start(f"{phase}-{round_}")
            try:
                if phase == "rpc":
                    tally, seconds = await run_rpc(service.url, args, meter)
                    rpc_tallies.append(tally)
                    rpc_seconds += seconds
                else:
                    tally, seconds = await run_baseline(service.url, args, meter)
                    base_tallies.append(tally)
                    base_seconds += seconds
            finally:
                profiler.stop()

    runs: list[OverheadRun] = []
    for round_ in range(args.rounds):
        order = ("idempotent", "transactional")
        if round_ % 2 == 1:
            order = order[::-1]
        for mode in order:
            await checkpoint(database_url)
            log(
                f"overhead {mode} (round {round_}): {args.warmup:g} s warm-up + "
                f"{args.overhead_seconds:g} s"
            )
            profiler.start(f"overhead-{mode}-{round_}")
            try:
                run = await run_overhead(service.url, args, mode, round_, meter)
            finally:
                profiler.stop()
            log(f"  {run.mb_per_s:.2f} MB/s")
            runs.append(run)
    return merged(rpc_tallies), rpc_seconds, merged(base_tallies), base_seconds, runs


async def bench(args: argparse.Namespace) -> None:
    cancel_on_sigterm()
    server_url = plain_url(args.postgres_url)
    async with scratch_database(server_url, "bench_txn_") as (name, database_url):
        await admin(
            database_url,
            f"CREATE TABLE {COUNTER_TABLE} (id integer PRIMARY KEY, n bigint NOT NULL)",
            f"INSERT INTO {COUNTER_TABLE} (id, n) "
            f"SELECT i, 0 FROM generate_series(0, {args.producers - 1}) AS i",
        )
        async with serving(database_url, "bench-txn-", SERVE) as service:
            profiler = Profiler(args.py_spy, service.pid)
            try:
                meter = CpuMeter(server_url, name, service.pid)
                results = await phases(service, database_url, args, profiler, meter)
            finally:
                profiler.stop()
    report(args, *results)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Transactions/s and per-call latency of the coordinator on Postgres against "
        "a one-UPDATE endpoint in the same app (rpc_ratio), and the throughput cost of "
        "transactions over idempotent-only produce (txn_overhead). The last stdout line is a "
        "JSON object with the figures.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_postgres_url(parser)
    parser.add_argument(
        "--producers", type=positive_int, default=4, help="concurrent producers (and clients)"
    )
    parser.add_argument(
        "--seconds", type=positive_float, default=15.0, help="measured seconds of rpc and baseline"
    )
    parser.add_argument(
        "--rpc-rounds",
        type=positive_int,
        default=1,
        help="rounds of rpc and baseline, alternating their order; figures pool all rounds",
    )
    parser.add_argument(
        "--rpc-records", type=positive_int, default=5, help="records per batch in the rpc phase"
    )
    parser.add_argument(
        "--rpc-record-bytes", type=positive_int, default=100, help="bytes per value, rpc phase"
    )
    parser.add_argument(
        "--overhead-seconds",
        type=positive_float,
        default=10.0,
        help="measured seconds of each overhead run",
    )
    parser.add_argument(
        "--rounds", type=positive_int, default=3, help="overhead rounds (one run of each mode)"
    )
    parser.add_argument(
        "--overhead-records", type=positive_int, default=100, help="records per overhead batch"
    )
    parser.add_argument(
        "--record-bytes", type=positive_int, default=1024, help="bytes per value, overhead phase"
    )
    parser.add_argument(
        "--commit-interval-ms",
        type=positive_float,
        default=100.0,
        help="wall time of each transaction in the overhead phase",
    )
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per run")
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="record the service with `py-spy record --format raw` per phase into DIR",
    )
    # The child process: `--serve --port P --database-url URL`.
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    # The launcher (coordinator.launcher.ServiceProcess) passes the store as coordinator serve
    # takes it, in COORDINATOR_DATABASE_URL.
    parser.add_argument(
        "--database-url", default=os.environ.get("COORDINATOR_DATABASE_URL"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.serve and (args.port is None or not args.database_url):
        parser.error("--serve needs --port and --database-url")
    if args.warmup < 0:
        parser.error("--warmup must not be negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        return serve(args)
    return run_bench(bench(args))


if __name__ == "__main__":
    sys.exit(main())
