"""The SDK's Producer against the load it could carry: what Spark executors' writes get.

What it measures, in one run on one machine (client processes, the service and Postgres share
its cores), on one `coordinator serve` with its Kafka listener, on a fresh Postgres database:

1. prebuilt: `bench/produce.py`'s HTTP load, N producers each sending prebuilt record batches of
   `--batch-records` records (one request in flight each), through httpx (the SDK's own HTTP
   client): the baseline, what the service takes when building the batches costs nothing. Then
   the same through `bench/produce.py`'s lean generator (HTTP/1.1 on a bare stream), which costs
   the machine's shared cores about a tenth of httpx's CPU per request.
2. sdk: N processes, each an idempotent `sdk.Producer` calling `produce()` with `--record-bytes`
   records to its own partition for `--seconds` (`linger.ms` 5, `batch.size` for batches of up
   to `--batch-records`), once with `compression.type` none and once with zstd; then transactional
   (`transactional.id`, a commit every `--commit-ms`), none: once with `commit_transaction()`
   (which flushes, then ends the transaction, while the producing thread waits), once with
   `commit_transaction_async()` (the next transaction fills meanwhile). Each `produce()` call is
   timed: its p99 and p99.9 say whether the producing thread waits on the sender (one call in
   about a hundred meets a batch being sealed; batches are built and compressed outside the
   lock).
3. confluent-kafka: N processes, each confluent-kafka's Producer (librdkafka) through the Kafka
   listener, idempotent, the same records.

Records count when their delivery report arrives inside the measured window. Ratios:
`sdk_vs_prebuilt` (goal >= 0.8, compression none; the producer's own cost), `sdk_vs_lean` (the
same against the lean generator: the producer's and its HTTP client's cost), `zstd_vs_none` (the
SDK with zstd over none), `sdk_txn_overhead` (1 - transactional / idempotent MB/s, with
`commit_transaction()`), `sdk_txn_async_overhead` (the same with `commit_transaction_async()`),
`sdk_vs_confluent`; and the produce() p99 of none and zstd (goal: zstd costs nothing measurable
there).

Run (Postgres must be reachable; the benchmark creates and drops its own database):

    python bench/sdk_producer.py --seconds 10
    python bench/sdk_producer.py --producers 2 --record-bytes 1024 --commit-ms 100

A readable table goes to stdout; its last line is one JSON object with the figures. Progress
goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _confluent import kafka_producer
from _support import (
    MB,
    Window,
    add_postgres_url,
    cancel_on_sigterm,
    checkpoint,
    in_processes,
    log,
    percentile_ms,
    plain_url,
    positive_float,
    positive_int,
    run_bench,
    scratch_database,
    serving,
)
from produce import SERVE, SERVE_OPTIONS, Payload, Tally, merged, run_service

import sdk
from coordinator.launcher import free_port

TOPIC = "bench-sdk"
# Bytes a record adds to a batch beyond its value (its length, attributes, deltas, key, headers).
RECORD_OVERHEAD = 16
# Spawning the client processes (and importing the SDK in each) takes a moment of its own.
SPAWN_SECONDS = 2.0


def sdk_producer(
    url: str,
    partition: int,
    values: list[bytes],
    start: float,
    end: float,
    compression: str,
    commit_ms: float | None,
    background: bool = False,
    work_us: float = 0.0,
) -> tuple[Tally, list[float], list[tuple[float, float]]]:
    """One SDK producer until `end`: what was delivered between `start` and `end`, every
    produce() call's duration (seconds) in that window, and each commit's (flush, EndTxn), or
    with `background` (commit_transaction_async()) how long the producing thread waited in it.
    `work_us`: the producing thread spins that long before each record, as a task computing it."""
    tally = Tally()
    calls: list[float] = []
    commits: list[tuple[float, float]] = []
    failures: list[Any] = []
    size = len(values[0])
    clock = time.perf_counter
    config: dict[str, object] = {
        "coordinator.url": url,
        "linger.ms": 5,
        # Batches of up to `--batch-records` records, as the prebuilt ones (the default
        # batch.size, 16 KB, is Java's).
        "batch.size": len(values) * (size + RECORD_OVERHEAD),
        "compression.type": compression,
        "queue.buffering.max.messages": 20 * len(values),
    }
    if commit_ms is not None:
        config["transactional.id"] = f"bench-sdk-{partition}"

    def delivered(error: Any, _: Any) -> None:
        if error is not None:
            failures.append(error)
        elif start <= clock() <= end:
            tally.records += 1
            tally.value_bytes += size

    producer = sdk.Producer(config)
    futures: list[Future[None]] = []
    try:
        if commit_ms is not None:
            producer.init_transactions(30)
        i = 0
        while clock() < end:
            if commit_ms is not None:
                producer.begin_transaction()
            round_end = end if commit_ms is None else min(end, clock() + commit_ms / 1000)
            while clock() < round_end:
                if work_us:
                    computed = clock() + work_us / 1e6
                    while clock() < computed:
                        pass
                began = clock()
                try:
                    producer.produce(
                        TOPIC, values[i % len(values)], partition=partition, on_delivery=delivered
                    )
                    i += 1
                except BufferError:
                    producer.poll(0.005)
                    continue
                if start <= began <= end:
                    calls.append(clock() - began)
                producer.poll(0)
            if commit_ms is not None and background:
                committing = clock()
                futures.append(producer.commit_transaction_async(30))
                if start <= committing <= end:
                    commits.append((clock() - committing, 0.0))
            elif commit_ms is not None:
                # The commit in its two parts: the flush (every record of the transaction
                # acknowledged), then EndTxn.
                committing = clock()
                producer.flush(30)
                flushed = clock()
                producer.commit_transaction(30)
                if start <= committing <= end:
                    commits.append((flushed - committing, clock() - flushed))
        producer.flush(30)
        for future in futures:
            future.result(30)  # each commit's outcome: its error, if it failed
    finally:
        producer.close(30)
    if failures:
        raise RuntimeError(f"{len(failures)} deliveries failed, e.g. {failures[0]}")
    tally.batches = tally.records // len(values)
    return tally, calls, commits


def run_sdk(
    url: str,
    args: argparse.Namespace,
    payload: Payload,
    compression: str,
    commit_ms: float | None,
    background: bool,
) -> tuple[Tally, list[float], list[tuple[float, float]], Window]:
    """Every producer in a process of its own (one interpreter's GIL is not the load)."""
    window = Window.after(args.warmup + SPAWN_SECONDS, args.seconds)
    results = in_processes(
        [
            (
                sdk_producer,
                (
                    url,
                    i,
                    payload.values,
                    window.start,
                    window.end,
                    compression,
                    commit_ms,
                    background,
                    args.work_us,
                ),
            )
            for i in range(args.producers)
        ]
    )
    calls = sorted(c for _, cs, _ in results for c in cs)
    commits = [c for _, _, cs in results for c in cs]
    return merged([t for t, _, _ in results]), calls, commits, window


def run_confluent(
    bootstrap: str, args: argparse.Namespace, payload: Payload
) -> tuple[Tally, Window]:
    window = Window.after(args.warmup + SPAWN_SECONDS, args.seconds)
    tallies = in_processes(
        [
            (
                kafka_producer,
                (bootstrap, i, payload, window.start, window.end, TOPIC, len(payload.values)),
            )
            for i in range(args.producers)
        ]
    )
    return merged(tallies), window


async def bench(args: argparse.Namespace) -> None:
    cancel_on_sigterm()
    server_url = plain_url(args.postgres_url)
    payload = Payload.build(args.batch_records, args.record_bytes)
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    options = [*SERVE_OPTIONS, "--kafka-listener", bootstrap]
    figures: dict[str, Any] = {}
    async with (
        scratch_database(server_url, "bench_") as (_, database_url),
        serving(database_url, "bench-sdk-", SERVE, options) as service,
    ):
        async with httpx.AsyncClient(base_url=service.url) as client:
            response = await client.post(
                "/v1/topics", json={"name": TOPIC, "partitions": args.producers}
            )
            response.raise_for_status()
        await checkpoint(database_url)
        args.partitions, args.format = 0, "binary"
        for key, client in (("prebuilt", "httpx"), ("prebuilt_lean", "lean")):
            log(f"{key} phase: {args.warmup:g} s warm-up + {args.seconds:g} s")
            tally, seconds, _, _ = await run_service(service, args.producers, args, payload, client)
            figures[f"{key}_mb_per_s"] = tally.value_bytes / MB / seconds
            await checkpoint(database_url)
        runs: list[tuple[str, str, float | None, bool]] = [
            ("sdk", "none", None, False),
            ("sdk_zstd", "zstd", None, False),
            ("sdk_txn", "none", args.commit_ms, False),
            ("sdk_txn_async", "none", args.commit_ms, True),
        ]
        for name, compression, commit_ms, background in runs:
            await checkpoint(database_url)
            log(f"{name} phase: {args.warmup:g} s warm-up + {args.seconds:g} s")
            tally, calls, commits, window = await asyncio.to_thread(
                run_sdk, service.url, args, payload, compression, commit_ms, background
            )
            figures[f"{name}_mb_per_s"] = tally.value_bytes / MB / window.seconds
            figures[f"{name}_produce_p50_us"] = 1000 * percentile_ms(calls, 0.50)
            figures[f"{name}_produce_p99_us"] = 1000 * percentile_ms(calls, 0.99)
            figures[f"{name}_produce_p999_us"] = 1000 * percentile_ms(calls, 0.999)
            if commits and background:
                # What the producing thread waited in commit_transaction_async().
                waits = sorted(w for w, _ in commits)
                figures[f"{name}_commit_wait_p50_ms"] = percentile_ms(waits, 0.50)
                figures[f"{name}_commit_wait_p99_ms"] = percentile_ms(waits, 0.99)
            elif commits:
                # What a commit waits for: its records' acknowledgements, then EndTxn.
                for part, times in (
                    ("flush", [f for f, _ in commits]),
                    ("end", [e for _, e in commits]),
                ):
                    figures[f"{name}_commit_{part}_p50_ms"] = percentile_ms(sorted(times), 0.50)
        await checkpoint(database_url)
        log(f"confluent-kafka phase: {args.warmup:g} s warm-up + {args.seconds:g} s")
        tally, window = await asyncio.to_thread(run_confluent, bootstrap, args, payload)
        figures["confluent_mb_per_s"] = tally.value_bytes / MB / window.seconds
    figures["sdk_vs_prebuilt"] = figures["sdk_mb_per_s"] / figures["prebuilt_mb_per_s"]
    figures["sdk_vs_lean"] = figures["sdk_mb_per_s"] / figures["prebuilt_lean_mb_per_s"]
    figures["zstd_vs_none"] = figures["sdk_zstd_mb_per_s"] / figures["sdk_mb_per_s"]
    figures["sdk_txn_overhead"] = 1 - figures["sdk_txn_mb_per_s"] / figures["sdk_mb_per_s"]
    figures["sdk_txn_async_overhead"] = (
        1 - figures["sdk_txn_async_mb_per_s"] / figures["sdk_mb_per_s"]
    )
    figures["sdk_vs_confluent"] = figures["sdk_mb_per_s"] / figures["confluent_mb_per_s"]
    report(args, figures)


def report(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    print()
    print(
        f"sdk producer: {args.producers} producers (a partition each), {args.record_bytes} B "
        f"records, batches of up to {args.batch_records}, {args.seconds:g} s per phase, "
        f"{args.work_us:g} us of work per record"
    )
    print(f"{'':<40}{'MB/s':>8}{'produce() p50 us':>18}{'p99 us':>10}{'p99.9 us':>10}")
    rows = [
        ("prebuilt batches (httpx, baseline)", "prebuilt"),
        ("prebuilt batches (lean HTTP)", "prebuilt_lean"),
        ("SDK idempotent, none", "sdk"),
        ("SDK idempotent, zstd", "sdk_zstd"),
        (f"SDK transactional ({args.commit_ms:g} ms), none", "sdk_txn"),
        ("  the same, commit_transaction_async()", "sdk_txn_async"),
        ("confluent-kafka (Kafka door)", "confluent"),
    ]
    for label, key in rows:
        p50 = figures.get(f"{key}_produce_p50_us")
        p99 = figures.get(f"{key}_produce_p99_us")
        p999 = figures.get(f"{key}_produce_p999_us")
        timing = "" if p50 is None else f"{p50:>18.1f}{p99:>10.1f}{p999:>10.1f}"
        print(f"{label:<40}{figures[f'{key}_mb_per_s']:>8.2f}{timing}")
    print(
        f"sdk_vs_prebuilt: {figures['sdk_vs_prebuilt']:.3f} (goal >= 0.8)  "
        f"sdk_vs_lean: {figures['sdk_vs_lean']:.3f}  "
        f"zstd_vs_none: {figures['zstd_vs_none']:.3f}  "
        f"sdk_txn_overhead: {figures['sdk_txn_overhead']:.3f}  "
        f"sdk_txn_async_overhead: {figures['sdk_txn_async_overhead']:.3f}  "
        f"sdk_vs_confluent: {figures['sdk_vs_confluent']:.3f}"
    )
    print(
        f"a commit, p50: the flush {figures['sdk_txn_commit_flush_p50_ms']:.1f} ms, then EndTxn "
        f"{figures['sdk_txn_commit_end_p50_ms']:.1f} ms (every {args.commit_ms:g} ms); "
        f"commit_transaction_async() waited {figures['sdk_txn_async_commit_wait_p50_ms']:.2f} ms "
        f"at p50, {figures['sdk_txn_async_commit_wait_p99_ms']:.2f} at p99"
    )
    print(
        json.dumps(
            {
                **{k: round(v, 4) for k, v in figures.items()},
                "producers": args.producers,
                "record_bytes": args.record_bytes,
                "batch_records": args.batch_records,
                "commit_ms": args.commit_ms,
                "work_us": args.work_us,
                "seconds": args.seconds,
            }
        ),
        flush=True,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="The SDK Producer (idempotent, zstd, transactional) against prebuilt "
        "batches and confluent-kafka in the same run. The last stdout line is a JSON object "
        "with the figures.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_postgres_url(parser)
    parser.add_argument("--producers", type=positive_int, default=4, help="producer processes")
    parser.add_argument("--batch-records", type=positive_int, default=100, help="records/batch")
    parser.add_argument("--record-bytes", type=positive_int, default=1024, help="bytes per value")
    parser.add_argument(
        "--commit-ms", type=positive_float, default=100.0, help="transactional: commit interval"
    )
    parser.add_argument(
        "--work-us",
        type=float,
        default=0.0,
        help="CPU work per record in the producing thread (spun), as a Spark task's: with it, "
        "the producing thread rather than the sender bounds the rate, and what a commit stalls "
        "it shows",
    )
    parser.add_argument("--seconds", type=positive_float, default=10.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per phase")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run_bench(bench(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
