"""Aggregate produce and fetch throughput of 1, 2 and 3 coordinator processes as one Kafka
cluster on this machine (docs/pages/cluster.md; issue 48, item 4).

For each cluster size N, on a fresh Postgres database (synchronous_commit on):
- N `coordinator serve` processes, each a broker with its own Kafka listener;
- a topic of `--partitions` partitions, whose leadership the cluster spreads over the N;
- produce: `--producers` idempotent librdkafka producers (acks=all, each in a process of its
  own, bootstrapped with every broker, on the partitions in turn) for `--seconds` after a
  warm-up: `produce_mb_per_s`;
- fetch: one consumer per partition (each in a process of its own) reads what was produced from
  the start: `fetch_mb_per_s`, the bytes read over the time the slowest took;
- the CPU the N services and the database's Postgres backends took during the produce window,
  and the producers' processes, in cores, against the machine's core count:
  what bounds the figures.

Each figure is printed with `vs_1`, its ratio to the one-process cluster of the same run. The
last stdout line is one JSON object with everything.

    python bench/cluster.py --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import confluent_kafka.admin as cka
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _confluent import producers_in_processes
from _support import (
    MB,
    CpuMeter,
    Window,
    add_postgres_url,
    cancel_on_sigterm,
    cpu_seconds,
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

from coordinator.launcher import free_port

TOPIC = "cluster-scale"
SIZES = (1, 2, 3)


def read_partition(bootstrap: str, topic: str, partition: int, end: int) -> tuple[int, float]:
    """Bytes of `topic`'s `partition` read from offset 0 to `end`, and the seconds it took."""
    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "log_level": 3,
        }
    )
    consumer.assign([ck.TopicPartition(topic, partition, 0)])
    size, position, started = 0, 0, time.perf_counter()
    deadline = started + 300
    try:
        while position < end and time.perf_counter() < deadline:
            for message in consumer.consume(1000, 1.0):
                if message.error() is None:
                    size += len(message.value())
                    position = message.offset() + 1
    finally:
        consumer.close()
    if position < end:
        raise RuntimeError(f"{topic}-{partition}: read to {position} of {end}")
    return size, time.perf_counter() - started


def leaders_spread(bootstrap: str, topic: str, brokers: int) -> bool:
    admin = cka.AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    described = admin.list_topics(topic, timeout=5).topics.get(topic)
    if described is None or described.error is not None:
        return False
    leaders = {p.leader for p in described.partitions.values()}
    return -1 not in leaders and len(leaders) == min(brokers, len(described.partitions))


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> list[int]:
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "log_level": 3})
    try:
        return [
            consumer.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        ]
    finally:
        consumer.close()


async def one_size(args: argparse.Namespace, size: int, payload: Payload) -> dict[str, float]:
    server_url = plain_url(args.postgres_url)
    async with (
        scratch_database(server_url, "bench_cluster_") as (name, database_url),
        contextlib.AsyncExitStack() as stack,
    ):
        listeners = [f"127.0.0.1:{free_port()}" for _ in range(size)]
        services = []
        for listener in listeners:  # one after another: the first migrates the store
            options = [*SERVE_OPTIONS, "--kafka-listener", listener]
            services.append(
                await stack.enter_async_context(
                    serving(database_url, "bench-cluster-", SERVE, options)
                )
            )
        bootstrap = ",".join(listeners)
        async with httpx.AsyncClient(base_url=services[0].url) as client:
            answer = await client.post(
                "/v1/topics", json={"name": TOPIC, "partitions": args.partitions}
            )
            answer.raise_for_status()
        deadline = time.monotonic() + 60
        while not await asyncio.to_thread(leaders_spread, bootstrap, TOPIC, size):
            if time.monotonic() > deadline:
                raise RuntimeError("leadership was not spread over the brokers")
            await asyncio.sleep(0.5)
        meter = CpuMeter(server_url, name, services[0].pid)
        log(f"{size} broker(s): produce, {args.warmup:g} s warm-up + {args.seconds:g} s")
        window = Window.after(args.warmup + 2.0, args.seconds)
        produced = asyncio.create_task(
            asyncio.to_thread(
                producers_in_processes,
                bootstrap,
                TOPIC,
                args.producers,
                args.partitions,
                payload,
                window,
                None,
            )
        )
        await asyncio.sleep(max(0.0, window.start - time.perf_counter()))
        services0 = sum(cpu_seconds(s.pid) for s in services)
        _, backends0 = await meter.sample()
        await asyncio.sleep(max(0.0, window.end - time.perf_counter()))
        services1 = sum(cpu_seconds(s.pid) for s in services)
        _, backends1 = await meter.sample()
        tally = await produced
        postgres = sum(cpu - backends0.get(pid, 0.0) for pid, cpu in backends1.items())
        ends = await asyncio.to_thread(high_watermarks, bootstrap, TOPIC, args.partitions)
        log(f"{size} broker(s): fetch {sum(ends):,} records, a consumer per partition")
        reads = await asyncio.to_thread(
            in_processes,
            [(read_partition, (bootstrap, TOPIC, p, end)) for p, end in enumerate(ends)],
        )
        return {
            "produce_mb_per_s": tally.value_bytes / MB / args.seconds,
            "fetch_mb_per_s": sum(b for b, _ in reads) / MB / max(s for _, s in reads),
            "service_cores": (services1 - services0) / window.seconds,
            "client_cores": tally.client_cpu_s / window.seconds,
            "postgres_cores": postgres / window.seconds,
        }


async def bench(args: argparse.Namespace) -> None:
    cancel_on_sigterm()
    payload = Payload.build(1, args.record_bytes)
    results: dict[int, dict[str, float]] = {}
    for size in args.sizes:
        results[size] = await one_size(args, size, payload)
    base = results[args.sizes[0]]
    cores = os.cpu_count() or 1
    print(f"cores: {cores}; partitions {args.partitions}, producers {args.producers}")
    print(f"{'brokers':>7} {'produce MB/s':>12} {'vs_1':>5} {'fetch MB/s':>10} {'vs_1':>5} "
          f"{'service cores':>13} {'postgres cores':>14} {'client cores':>12}")  # fmt: skip
    for size, r in results.items():
        print(
            f"{size:>7} {r['produce_mb_per_s']:>12.2f} "
            f"{r['produce_mb_per_s'] / base['produce_mb_per_s']:>5.2f} "
            f"{r['fetch_mb_per_s']:>10.2f} {r['fetch_mb_per_s'] / base['fetch_mb_per_s']:>5.2f} "
            f"{r['service_cores']:>13.2f} {r['postgres_cores']:>14.2f} {r['client_cores']:>12.2f}"
        )
    summary: dict[str, Any] = {"cores": cores, "partitions": args.partitions}
    summary |= {f"brokers_{size}": r for size, r in results.items()}
    print(json.dumps(summary))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_postgres_url(parser)
    parser.add_argument("--seconds", type=positive_float, default=10.0, help="measured (10)")
    parser.add_argument("--warmup", type=positive_float, default=3.0, help="warm-up (3)")
    parser.add_argument("--partitions", type=positive_int, default=6, help="of the topic (6)")
    parser.add_argument("--producers", type=positive_int, default=3, help="producers (3)")
    parser.add_argument("--record-bytes", type=positive_int, default=1000, help="(1000)")
    parser.add_argument(
        "--sizes",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=SIZES,
        help="cluster sizes, the first the baseline (1,2,3)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run_bench(bench(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
