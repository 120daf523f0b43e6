"""Kafka's Java producer through the Kafka door on Postgres, with a connection's Produce requests
under way together (`COORDINATOR_KAFKA_PRODUCE_PIPELINE`, 5 by default) and one at a time (1, as
Kafka's broker reads a connection), in one run.

Each round starts the service twice on the same fresh database, once in each mode (turning the
order round by round), and runs `--producers` Java producers at once (Kafka's own
`kafka-producer-perf-test`, bench/_java.py: idempotent, acks=all, the producer's defaults: 16 KB
batches, `linger.ms` 5, up to 5 requests in flight) of `--records` 1 KB records each, on a topic
of its own with a partition per producer. MB/s is the sum of the producers' steady-state rates.
`pipeline_ratio` = median pipelined MB/s / median one-at-a-time MB/s (the last stdout line,
JSON). `--batch-bytes` sets the producer's `batch.size`.

    python bench/kafka_pipeline.py --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _java import java_producers
from _support import (
    add_postgres_url,
    cancel_on_sigterm,
    log,
    plain_url,
    positive_int,
    run_bench,
    scratch_database,
    serving,
)
from produce import SERVE, SERVE_OPTIONS

from coordinator.launcher import free_port

MODES = {"pipelined": 5, "one_at_a_time": 1}


async def one_run(database_url: str, args: argparse.Namespace, mode: str, topic: str) -> float:
    bootstrap = f"127.0.0.1:{free_port()}"
    options = [*SERVE_OPTIONS, "--kafka-listener", bootstrap]
    env = {"COORDINATOR_KAFKA_PRODUCE_PIPELINE": str(MODES[mode])}
    async with serving(database_url, "bench-pipeline-", SERVE, options, env) as service:
        async with httpx.AsyncClient(base_url=service.url) as client:
            answer = await client.post(
                "/v1/topics", json={"name": topic, "partitions": args.producers}
            )
            answer.raise_for_status()
        properties = {} if args.batch_bytes is None else {"batch.size": str(args.batch_bytes)}
        return await asyncio.to_thread(
            java_producers, bootstrap, topic, args.producers, args.records, 1024, properties
        )


async def bench(args: argparse.Namespace) -> None:
    cancel_on_sigterm()
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    async with scratch_database(plain_url(args.postgres_url), "bench_pipeline_") as (_, url):
        for n in range(args.rounds):
            for mode in MODES if n % 2 == 0 else reversed(MODES):
                log(f"round {n + 1}: {mode}")
                rate = await one_run(url, args, mode, f"pipeline-{n}-{mode}")
                log(f"  {rate:.1f} MB/s")
                rates[mode].append(rate)
    medians = {mode: statistics.median(values) for mode, values in rates.items()}
    ratio = medians["pipelined"] / medians["one_at_a_time"]
    print()
    print(
        f"{args.producers} Java producers, {args.records} records each, "
        f"batch.size {args.batch_bytes or 'default (16384)'}, {args.rounds} rounds"
    )
    for mode, values in rates.items():
        shown = ", ".join(f"{v:.1f}" for v in values)
        print(f"{mode:<16} median {medians[mode]:7.1f} MB/s   ({shown})")
    print(f"pipeline_ratio   {ratio:.2f}")
    print(
        json.dumps(
            {
                "mb_per_s": {mode: round(value, 2) for mode, value in medians.items()},
                "runs": rates,
                "pipeline_ratio": round(ratio, 3),
                "producers": args.producers,
                "records": args.records,
                "batch_bytes": args.batch_bytes,
            }
        ),
        flush=True,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Java producers through the Kafka door with a connection's Produce requests "
        "pipelined and one at a time; the last stdout line is one JSON object.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_postgres_url(parser)
    parser.add_argument("--producers", type=positive_int, default=2, help="Java producers")
    parser.add_argument("--records", type=positive_int, default=200_000, help="per producer")
    parser.add_argument("--rounds", type=positive_int, default=2, help="rounds of both modes")
    parser.add_argument("--batch-bytes", type=positive_int, help="the producers' batch.size")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run_bench(bench(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
