"""Apache Kafka and the coordinator side by side, the same workloads in one run (issue 38).

The brokers:
- `kafka`: Apache Kafka itself (bench/reference_broker.py: KRaft, one node, on loopback; its
  settings printed with the figures). It acknowledges from the page cache: `acks=all` on one
  node is written, not flushed.
- `coordinator`: `coordinator serve --kafka-listener` on a fresh Postgres database: a write is
  acknowledged after Postgres's commit reached its disk (synchronous_commit on).
- `coordinator_async_commit`: the same with the database's `synchronous_commit = off`, which
  acknowledges before the commit is flushed: the like-for-like durability of Kafka's.

The workloads, each through confluent-kafka (librdkafka), `--record-bytes` records:
- (a) `idempotent_mb_per_s`: `--producers` idempotent producers (acks=all), each in a process
  of its own on its own partition, as fast as they are acknowledged, for `--seconds`, batching
  as librdkafka does by default (up to 10,000 records or 1 MB a batch: what waits while a
  request is out goes in the next one). Then `fixed_batches_*`: the same with batches of at
  most `--batch-records` records, as the HTTP benchmarks send them. For each, what bounds it:
  `_rtt_ms` and `_in_flight`, librdkafka's own statistics of the broker connection sampled every
  second inside the window (the median of its average request round trip; the mean of its
  requests awaiting an answer), `_batch_kb` (the median of its average batch) and
  `_client_cpu_ms_per_mb`, the CPU the producers' processes spent per MB delivered. An
  idempotent librdkafka producer keeps one request out per partition (it counts the records in
  flight against its limit of 5 requests, rdkafka_broker.c), and while that request is out with
  a batch ready, its broker thread polls without sleeping: the longer the round trip, the more
  of the shared cores the producers burn.
  Then `java_mb_per_s`: `--producers` Java producers at once (Kafka's own
  `kafka-producer-perf-test`, kafka-clients 4.4.0, idempotent, acks=all), each sending
  `--java-records` records (the first fifth a warm-up), with the Java producer's defaults
  (batches of 16 KB, `linger.ms` 5, 5 requests in flight); and `java_1mb_batches_mb_per_s`, the
  same with `batch.size` 1 MB, librdkafka's default batch. The sum of their steady-state rates.
- (b) `txn_overhead`: one producer, idempotent, then transactional with a commit every
  `--commit-ms`, alternating for `--rounds` rounds of `--overhead-seconds`: 1 - median
  transactional / median idempotent MB/s (Kafka's own measure of the cost of transactions).
  `sdk_txn_overhead`, `sdk_txn_async_overhead`: the same measure for the project's SDK
  Producer (`bench/sdk_producer.py`'s producer, in a process of its own, through the HTTP API
  of the same service), with `commit_transaction()` and with `commit_transaction_async()`, its
  idempotent and transactional rounds alternating as well. Kafka has no SDK: its column holds
  its own client's `txn_overhead`, the figure the SDK's is held against.
- (c) `end_txn_p50_ms`, `end_txn_p99_ms`: one transactional producer runs `--transactions`
  transactions of `--txn-records` records, one after the other; each commit's latency as the
  producer sees it (commit_transaction(): the last records' flush, EndTxn, the markers). Small
  transactions, so that the commit is mostly EndTxn (in (b) a commit waits for everything
  produced in its 100 ms to be acknowledged first).

- (d) `read_committed_mb_per_s`: `--read-records` records written first in transactions of
  1,000 (so the log holds markers, as a transactional pipeline's does), then read from the start
  by one consumer with `isolation.level=read_committed`.
- (e) `eos_loop_records_per_s`: Kafka's exactly-once loop over those records: a consumer
  (read_committed, in a group) and a transactional producer that writes each record back
  upper-cased and commits the consumed offsets with it (`send_offsets_to_transaction`) every
  `--loop-batch` records, for at most `--seconds`.

Every figure is printed for each broker with `vs_kafka` (the coordinator's over Kafka's; for
overhead and latency lower is better, so a `vs_kafka` above 1 is worse). The last stdout line is
one JSON object with everything, the reference broker's settings included.

    python bench/side_by_side.py --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _confluent import producers_in_processes, transactional_round
from _java import java_producers
from _support import (
    MB,
    CpuMeter,
    Window,
    add_postgres_url,
    admin,
    cancel_on_sigterm,
    in_processes,
    log,
    plain_url,
    positive_float,
    positive_int,
    run_bench,
    scratch_database,
    serving,
)
from produce import SERVE, SERVE_OPTIONS, Payload
from reference_broker import ReferenceBroker
from sdk_producer import TOPIC as SDK_TOPIC
from sdk_producer import sdk_producer

from coordinator.launcher import free_port

TOPIC = "side-by-side"
WORKLOADS = ("a", "java", "b", "c", "d", "e")
SCALING_WORKERS = (1, 2, 4)
READ_TOPIC = "side-by-side-read"
LOOP_TOPIC = "side-by-side-loop"


def advised_workers() -> int:
    """What docs/pages/operations.md advises for `COORDINATOR_WORKERS`: one per core the
    service has to itself (here the clients share them, which the 1-worker column shows)."""
    return os.cpu_count() or 1


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


async def workloads(
    bootstrap: str, args: argparse.Namespace, sdk_url: str | None = None
) -> dict[str, float]:
    """(a) to (e) against one listener, its topics already there; (b) for the SDK too through
    `sdk_url`, the same service's HTTP API (None: Kafka, which has none)."""
    payload = Payload.build(args.batch_records, args.record_bytes)
    figures: dict[str, float] = {}
    if "a" in args.only:
        figures |= await librdkafka_producers(bootstrap, args, payload)
    if "java" in args.only:
        figures |= await java_producer_rates(bootstrap, args)
    if "b" in args.only:
        figures |= await overheads(bootstrap, args, payload, sdk_url)
    if "c" in args.only:
        log(f"(c): {args.transactions} transactions of {args.txn_records} records")
        commits = await asyncio.to_thread(commit_latencies, bootstrap, payload, args)
        figures["end_txn_p50_ms"] = percentile(commits, 0.5)
        figures["end_txn_p99_ms"] = percentile(commits, 0.99)
    if "d" in args.only or "e" in args.only:
        log(f"(d): {args.read_records} records written in transactions, then read")
        await asyncio.to_thread(fill_in_transactions, bootstrap, payload, args.read_records)
        if "d" in args.only:
            read_mb_s = await asyncio.to_thread(read_committed_rate, bootstrap, args.read_records)
            figures["read_committed_mb_per_s"] = read_mb_s
    if "e" in args.only:
        log(f"(e): the exactly-once loop, at most {args.seconds:g} s")
        figures["eos_loop_records_per_s"] = await asyncio.to_thread(eos_loop_rate, bootstrap, args)
    return figures


async def librdkafka_producers(
    bootstrap: str, args: argparse.Namespace, payload: Payload
) -> dict[str, float]:
    """(a) through librdkafka: its own batching, then batches of `--batch-records`."""
    figures: dict[str, float] = {}
    for batching, records in (("idempotent", None), ("fixed_batches", args.batch_records)):
        how = "librdkafka's own batches" if records is None else f"batches of {records}"
        log(f"(a) idempotent, {how}: {args.warmup:g} s warm-up + {args.seconds:g} s")
        window = Window.after(args.warmup + 2.0, args.seconds)  # after the processes' start
        tally = await asyncio.to_thread(
            producers_in_processes,
            bootstrap,
            TOPIC,
            args.producers,
            args.producers,
            payload,
            window,
            records,
        )
        mb = tally.value_bytes / MB
        figures |= {
            f"{batching}_mb_per_s": mb / args.seconds,
            # What bounds (a): librdkafka's round trip to the broker, its requests out, its
            # batches, and the CPU the producers' processes take on the machine's cores.
            f"{batching}_rtt_ms": statistics.median(tally.request_rtt_ms or [float("nan")]),
            f"{batching}_in_flight": statistics.mean(tally.in_flight or [float("nan")]),
            f"{batching}_batch_kb": statistics.median(tally.batch_bytes or [float("nan")]) / 1024,
            f"{batching}_client_cpu_ms_per_mb": 1000 * tally.client_cpu_s / (mb or float("nan")),
        }
    return figures


async def java_producer_rates(bootstrap: str, args: argparse.Namespace) -> dict[str, float]:
    """(a) through Kafka's Java producer: its defaults, then 1 MB batches."""
    figures: dict[str, float] = {}
    for name, properties in (("java", {}), ("java_1mb_batches", {"batch.size": str(2**20)})):
        log(f"(a) {args.producers} Java producers, {args.java_records} records each: {name}")
        figures[f"{name}_mb_per_s"] = await asyncio.to_thread(
            java_producers,
            bootstrap,
            TOPIC,
            args.producers,
            args.java_records,
            args.record_bytes,
            properties,
        )
    return figures


async def overheads(
    bootstrap: str, args: argparse.Namespace, payload: Payload, sdk_url: str | None
) -> dict[str, float]:
    """(b): transactions' cost to librdkafka's producer, and to the SDK's."""
    log(f"(b): {args.rounds} rounds of 2 x {args.overhead_seconds:g} s")
    idempotent: list[float] = []
    transactional: list[float] = []
    for n in range(args.rounds):
        for txn in (False, True) if n % 2 == 0 else (True, False):
            mb_s = await asyncio.to_thread(
                transactional_round,
                bootstrap,
                payload,
                args.overhead_seconds,
                args.commit_ms,
                txn,
                n,
                TOPIC,
            )
            (transactional if txn else idempotent).append(mb_s)
    txn_overhead = 1 - statistics.median(transactional) / statistics.median(idempotent)
    sdk = {"sdk_txn_overhead": txn_overhead, "sdk_txn_async_overhead": txn_overhead}
    if sdk_url is not None:
        sdk = await sdk_overheads(sdk_url, payload, args)
    return {"txn_overhead": txn_overhead, **sdk}


async def sdk_overheads(url: str, payload: Payload, args: argparse.Namespace) -> dict[str, float]:
    """(b) for the SDK: one Producer, idempotent, then committing every `--commit-ms` with
    commit_transaction(), then with commit_transaction_async(), the order turning each round."""
    modes: list[tuple[str, float | None, bool]] = [
        ("idempotent", None, False),
        ("commit", args.commit_ms, False),
        ("commit_async", args.commit_ms, True),
    ]
    rates: dict[str, list[float]] = {name: [] for name, _, _ in modes}
    log(f"(b) for the SDK: {args.rounds} rounds of 3 x {args.overhead_seconds:g} s")
    for n in range(args.rounds):
        for name, commit_ms, background in modes[n % 3 :] + modes[: n % 3]:
            window = Window.after(args.warmup + 2.0, args.overhead_seconds)  # after the spawn
            call = (url, 0, payload.values, window.start, window.end, "none", commit_ms, background)
            [(tally, _, _)] = await asyncio.to_thread(in_processes, [(sdk_producer, call)])
            rates[name].append(tally.value_bytes / MB / window.seconds)
    idempotent = statistics.median(rates["idempotent"])
    return {
        "sdk_txn_overhead": 1 - statistics.median(rates["commit"]) / idempotent,
        "sdk_txn_async_overhead": 1 - statistics.median(rates["commit_async"]) / idempotent,
    }


def transactional_producer(bootstrap: str, name: str) -> ck.Producer:
    """A transactional producer of its own id (`name` and a random suffix), initialised."""
    producer = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"{name}-{uuid.uuid4().hex[:8]}",
            "linger.ms": 5,
            "log_level": 3,
        }
    )
    producer.init_transactions(30)
    return producer


def commit_latencies(bootstrap: str, payload: Payload, args: argparse.Namespace) -> list[float]:
    """Milliseconds of each commit of small transactions run one after the other."""
    producer = transactional_producer(bootstrap, "side-by-side")
    latencies: list[float] = []
    for _ in range(args.transactions):
        producer.begin_transaction()
        for i in range(args.txn_records):
            producer.produce(TOPIC, payload.values[i % len(payload.values)], partition=0)
        started = time.perf_counter()
        producer.commit_transaction(30)
        latencies.append(1000 * (time.perf_counter() - started))
    return latencies


def fill_in_transactions(bootstrap: str, payload: Payload, records: int) -> None:
    producer = transactional_producer(bootstrap, "side-by-side-fill")
    for start in range(0, records, 1000):
        producer.begin_transaction()
        for i in range(start, min(records, start + 1000)):
            while True:
                try:
                    producer.produce(READ_TOPIC, payload.values[i % len(payload.values)])
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.commit_transaction(60)


def read_committed_rate(bootstrap: str, records: int) -> float:
    """MB/s of one read_committed consumer reading `records` values from the start."""
    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"side-by-side-read-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "log_level": 3,
        }
    )
    consumer.subscribe([READ_TOPIC])
    seen = size = 0
    started = None
    deadline = time.monotonic() + 300
    try:
        while seen < records and time.monotonic() < deadline:
            for message in consumer.consume(1000, 1.0):
                if message.error() is None:
                    if started is None:
                        started = time.perf_counter()
                    seen += 1
                    size += len(message.value())
    finally:
        consumer.close()
    if seen < records or started is None:
        raise RuntimeError(f"read {seen} of {records} records")
    return size / MB / (time.perf_counter() - started)


def eos_loop_rate(bootstrap: str, args: argparse.Namespace) -> float:
    """Records per second through consume, transform, produce and commit-with-offsets."""
    group = f"side-by-side-loop-{uuid.uuid4().hex[:8]}"
    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "log_level": 3,
        }
    )
    producer = transactional_producer(bootstrap, group)
    consumer.subscribe([READ_TOPIC])
    done = 0
    started = None
    end = time.monotonic() + args.seconds + 60  # the group's first assignment comes first
    try:
        while done < args.read_records and time.monotonic() < end:
            messages = [m for m in consumer.consume(args.loop_batch, 1.0) if m.error() is None]
            if not messages:
                continue
            if started is None:
                started = time.perf_counter()
                end = time.monotonic() + args.seconds
            producer.begin_transaction()
            for message in messages:
                producer.produce(LOOP_TOPIC, message.value().upper())
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
            )
            producer.commit_transaction(30)
            done += len(messages)
    finally:
        consumer.close()
    if started is None:
        raise RuntimeError("the loop read nothing")
    return done / (time.perf_counter() - started)


async def on_kafka(args: argparse.Namespace) -> tuple[dict[str, float], dict[str, Any]]:
    import confluent_kafka.admin as kafka_admin

    with ReferenceBroker() as broker:
        log(f"reference broker: Apache Kafka on {broker.bootstrap}")
        client = kafka_admin.AdminClient({"bootstrap.servers": broker.bootstrap})
        created = client.create_topics(
            [
                kafka_admin.NewTopic(TOPIC, args.producers, 1),
                kafka_admin.NewTopic(READ_TOPIC, 1, 1),
                kafka_admin.NewTopic(LOOP_TOPIC, 1, 1),
            ]
        )
        for future in created.values():
            future.result(60)
        return await workloads(broker.bootstrap, args), broker.describe()


async def on_coordinator(
    args: argparse.Namespace, async_commit: bool, workers: int, only: set[str] | None = None
) -> dict[str, float]:
    """The workloads (`only` those, else `--only`) against `coordinator serve --workers
    workers`, and the CPU the service's processes and its database's Postgres backends took
    meanwhile, in cores (`service_cores`, `postgres_cores`)."""
    server_url = plain_url(args.postgres_url)
    bootstrap = f"127.0.0.1:{free_port()}"
    options = [*SERVE_OPTIONS, "--kafka-listener", bootstrap, "--workers", str(workers)]
    async with scratch_database(server_url, "bench_side_") as (name, database_url):
        if async_commit:
            await admin(server_url, f'ALTER DATABASE "{name}" SET synchronous_commit = off')
        async with serving(database_url, "bench-side-", SERVE, options) as service:
            async with httpx.AsyncClient(base_url=service.url) as client:
                topics = ((TOPIC, args.producers), (READ_TOPIC, 1), (LOOP_TOPIC, 1), (SDK_TOPIC, 1))
                for topic, partitions in topics:
                    answer = await client.post(
                        "/v1/topics", json={"name": topic, "partitions": partitions}
                    )
                    answer.raise_for_status()
            meter = CpuMeter(server_url, name, service.pid)
            started, (service0, backends0) = time.perf_counter(), await meter.sample_tree()
            run = args if only is None else argparse.Namespace(**{**vars(args), "only": only})
            figures = await workloads(bootstrap, run, service.url)
            service1, backends1 = await meter.sample_tree()
            seconds = time.perf_counter() - started
            postgres = sum(cpu - backends0.get(pid, 0.0) for pid, cpu in backends1.items())
            return figures | {
                "service_cores": (service1 - service0) / seconds,
                "postgres_cores": postgres / seconds,
            }


def columns(args: argparse.Namespace) -> list[tuple[str, bool, int]]:
    """The coordinator's runs: (name, synchronous_commit off, workers)."""
    runs = [("coordinator", False, args.workers)]
    if args.workers != 1:
        runs.append(("coordinator_1_worker", False, 1))
    runs.append(("coordinator_async_commit", True, args.workers))
    return runs


async def bench(args: argparse.Namespace) -> None:
    cancel_on_sigterm()
    figures: dict[str, dict[str, float]] = {}
    cores = os.cpu_count() or 1
    log(f"kafka; the coordinator with --workers {args.workers} on {cores} cores")
    figures["kafka"], reference = await on_kafka(args)
    for column, async_commit, workers in columns(args):
        log(f"{column}: --workers {workers}, synchronous_commit {'off' if async_commit else 'on'}")
        figures[column] = await on_coordinator(args, async_commit, workers)
    scaling: dict[int, dict[str, float]] = {}
    if args.scaling:
        for workers in SCALING_WORKERS:
            log(f"scaling: (a) with --workers {workers}")
            scaling[workers] = await on_coordinator(args, False, workers, {"a"})
    brokers = list(figures)
    vs_kafka = {
        broker: {
            name: value / figures["kafka"][name] if figures["kafka"].get(name) else float("nan")
            for name, value in figures[broker].items()
            if name in figures["kafka"]
        }
        for broker in brokers[1:]
    }
    print()
    print(
        f"side by side on {cores} cores: {args.producers} producers, {args.record_bytes} B "
        f"records, {args.seconds:g} s; transactions every {args.commit_ms:g} ms, "
        f"{args.rounds} rounds; the coordinator with --workers {args.workers} (advised for "
        f"{cores} cores: {advised_workers()}) and 1"
    )
    print(f"reference: Apache Kafka {reference['kafka']}, settings {reference['settings']}")
    header = "".join(f"{broker:>26}" for broker in brokers)
    print(f"{'':<36}{header}")
    for name in figures["kafka"]:
        row = f"{figures['kafka'][name]:>26.3f}"
        for broker in brokers[1:]:
            cell = f"{figures[broker][name]:.3f} ({vs_kafka[broker][name]:.2f}x)"
            row += f"{cell:>26}"
        print(f"{name:<36}{row}")
    for broker in brokers[1:]:
        print(
            f"{broker}: the service took {figures[broker]['service_cores']:.2f} cores, "
            f"Postgres {figures[broker]['postgres_cores']:.2f}"
        )
    print(
        "(x: vs_kafka; for the overheads, end_txn, the round trip and the client CPU, lower is "
        "better; Kafka's sdk_* are its own client's txn_overhead, which the SDK's are held "
        "against)"
    )
    for workers, row in scaling.items():
        producers_cores = row["idempotent_client_cpu_ms_per_mb"] * row["idempotent_mb_per_s"] / 1000
        print(
            f"scaling, --workers {workers}: (a) {row['idempotent_mb_per_s']:.1f} MB/s "
            f"(batches of {args.batch_records}: {row['fixed_batches_mb_per_s']:.1f}); the "
            f"service {row['service_cores']:.2f} cores, Postgres {row['postgres_cores']:.2f}, "
            f"the producers {producers_cores:.2f}"
        )
    print(
        json.dumps(
            {
                "figures": {b: {k: round(v, 4) for k, v in f.items()} for b, f in figures.items()},
                "vs_kafka": {
                    b: {k: round(v, 4) for k, v in f.items()} for b, f in vs_kafka.items()
                },
                "scaling": {
                    str(w): {k: round(v, 4) for k, v in f.items()} for w, f in scaling.items()
                },
                "cores": cores,
                "workers": args.workers,
                "reference": reference,
                "producers": args.producers,
                "record_bytes": args.record_bytes,
                "seconds": args.seconds,
                "commit_ms": args.commit_ms,
            }
        ),
        flush=True,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Apache Kafka and the coordinator's Kafka listener (Postgres, with and "
        "without synchronous_commit) side by side: idempotent throughput, transaction overhead "
        "and EndTxn latency, each with vs_kafka. The last stdout line is one JSON object.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_postgres_url(parser)
    parser.add_argument("--producers", type=positive_int, default=2, help="for (a)")
    parser.add_argument("--batch-records", type=positive_int, default=100, help="records/batch")
    parser.add_argument("--record-bytes", type=positive_int, default=1024, help="bytes per value")
    parser.add_argument("--seconds", type=positive_float, default=10.0, help="(a)'s window")
    parser.add_argument(
        "--java-records", type=positive_int, default=200_000, help="(a) per Java producer"
    )
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds")
    parser.add_argument("--rounds", type=positive_int, default=2, help="(b) rounds")
    parser.add_argument("--overhead-seconds", type=positive_float, default=5.0, help="per mode")
    parser.add_argument("--commit-ms", type=positive_float, default=100.0, help="commit interval")
    parser.add_argument("--transactions", type=positive_int, default=200, help="(c) commits")
    parser.add_argument("--txn-records", type=positive_int, default=100, help="(c) per commit")
    parser.add_argument("--read-records", type=positive_int, default=50_000, help="(d), (e)")
    parser.add_argument("--loop-batch", type=positive_int, default=500, help="(e) per commit")
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=advised_workers(),
        help="the coordinator's service processes, as docs/pages/operations.md advises for "
        "this machine's cores (a run with 1 is printed beside it)",
    )
    parser.add_argument(
        "--only",
        type=lambda text: set(text.split(",")),
        default=",".join(WORKLOADS),
        help="the workloads to run, comma-separated",
    )
    parser.add_argument(
        "--scaling",
        action="store_true",
        help=f"also (a) with --workers {', '.join(map(str, SCALING_WORKERS))}, and the cores "
        "the service and Postgres took",
    )
    args = parser.parse_args(argv)
    if not args.only <= set(WORKLOADS):
        parser.error(f"--only: of {','.join(WORKLOADS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_bench(bench(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
