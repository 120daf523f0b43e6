"""Where a small transaction's commit goes (side_by_side's (c)) on the coordinator's side.

One transactional librdkafka producer runs `--transactions` transactions of `--txn-records`
records, one after the other, against `coordinator serve --workers 1 --kafka-listener` on a
fresh Postgres database (one process, so its `/metrics` saw every request), with
`synchronous_commit` on, then off. Printed for each: the commit's latency as the producer sees
it (`commit_transaction()`: the last records' flush and EndTxn), and the service's own time per
Kafka API over the run (`coordinator_kafka_request_duration_seconds`: requests per transaction
and the mean time of one). `server_share` = the service's time in the Produce and EndTxn of one
transaction over the client's mean commit: the rest is the client's own (librdkafka's
`linger.ms`, its threads, the network), which a broker cannot shorten. `sync_ratio` = the mean
commit with `synchronous_commit` on over off: what the flushes of the commits cost.

Then side_by_side's (e), the exactly-once loop (`--loop-records` written in transactions, then
consumed, transformed, produced and committed with their offsets every `--loop-batch`): the
requests of each of its cycles by Kafka API, and the service's mean time for one, so the round
trips a cycle pays can be counted.

    python bench/end_txn.py --transactions 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _support import (
    add_postgres_url,
    admin,
    cancel_on_sigterm,
    log,
    plain_url,
    positive_int,
    run_bench,
    scratch_database,
    serving,
)
from produce import SERVE, SERVE_OPTIONS, Payload
from side_by_side import (
    LOOP_TOPIC,
    READ_TOPIC,
    TOPIC,
    commit_latencies,
    eos_loop_rate,
    fill_in_transactions,
    percentile,
)

from coordinator.launcher import free_port

# The APIs of a transaction's life, in the order the producer sends them.
APIS = ("AddPartitionsToTxn", "Produce", "EndTxn")
# And those of the exactly-once loop's cycle.
LOOP_APIS = (
    "Fetch",
    "AddPartitionsToTxn",
    "Produce",
    "AddOffsetsToTxn",
    "FindCoordinator",
    "TxnOffsetCommit",
    "EndTxn",
    "OffsetFetch",
    "Heartbeat",
    "Metadata",
)
_METRIC = "coordinator_kafka_request_duration_seconds"


async def server_times(client: httpx.AsyncClient) -> dict[str, tuple[float, float]]:
    """(requests answered, seconds spent) per Kafka API, as the service counts them."""
    text = (await client.get("/metrics")).raise_for_status().text
    times: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != _METRIC:
            continue
        for sample in family.samples:
            api = sample.labels.get("api", "")
            if sample.name == f"{_METRIC}_count":
                times.setdefault(api, [0.0, 0.0])[0] = sample.value
            elif sample.name == f"{_METRIC}_sum":
                times.setdefault(api, [0.0, 0.0])[1] = sample.value
    return {api: (count, seconds) for api, (count, seconds) in times.items()}


async def one_run(args: argparse.Namespace, async_commit: bool) -> dict[str, float]:
    server_url = plain_url(args.postgres_url)
    bootstrap = f"127.0.0.1:{free_port()}"
    options = [*SERVE_OPTIONS, "--kafka-listener", bootstrap, "--workers", "1"]
    async with scratch_database(server_url, "bench_end_txn_") as (name, database_url):
        if async_commit:
            await admin(server_url, f'ALTER DATABASE "{name}" SET synchronous_commit = off')
        async with (
            serving(database_url, "bench-end-txn-", SERVE, options) as service,
            httpx.AsyncClient(base_url=service.url) as client,
        ):
            for topic in (TOPIC, READ_TOPIC, LOOP_TOPIC):
                created = await client.post("/v1/topics", json={"name": topic, "partitions": 1})
                created.raise_for_status()
            before = await server_times(client)
            run = argparse.Namespace(transactions=args.transactions, txn_records=args.txn_records)
            payload = Payload.build(args.txn_records, args.record_bytes)
            commits = await asyncio.to_thread(commit_latencies, bootstrap, payload, run)
            after = await server_times(client)
            loop = await loop_cycles(client, bootstrap, args)
    figures = {
        "commit_p50_ms": percentile(commits, 0.5),
        "commit_p99_ms": percentile(commits, 0.99),
        "commit_mean_ms": statistics.mean(commits),
    }
    figures |= api_figures(before, after, APIS, args.transactions, "{api}_per_txn")
    in_commit = sum(figures[f"{a}_per_txn"] * figures[f"{a}_mean_ms"] for a in APIS[1:])
    figures["server_share"] = in_commit / figures["commit_mean_ms"]
    return figures | loop


async def loop_cycles(
    client: httpx.AsyncClient, bootstrap: str, args: argparse.Namespace
) -> dict[str, float]:
    """(e) against the service: records/s, and each API's requests per cycle (a cycle: one
    transaction, so one EndTxn) and the service's mean time for one."""
    payload = Payload.build(args.loop_batch, args.record_bytes)
    await asyncio.to_thread(fill_in_transactions, bootstrap, payload, args.loop_records)
    before = await server_times(client)
    run = argparse.Namespace(
        read_records=args.loop_records, loop_batch=args.loop_batch, seconds=args.loop_seconds
    )
    rate = await asyncio.to_thread(eos_loop_rate, bootstrap, run)
    after = await server_times(client)
    cycles = (after["EndTxn"][0] - before.get("EndTxn", (0.0, 0.0))[0]) or float("nan")
    figures = {"loop_records_per_s": rate, "loop_cycles": cycles}
    return figures | api_figures(before, after, LOOP_APIS, cycles, "loop_{api}_per_cycle")


def api_figures(
    before: dict[str, tuple[float, float]],
    after: dict[str, tuple[float, float]],
    apis: tuple[str, ...],
    per: float,
    name: str,
) -> dict[str, float]:
    """Each API's requests between the two scrapes, per `per` (under `name`), and the service's
    mean time for one (`<name's prefix>{api}_mean_ms`)."""
    figures: dict[str, float] = {}
    for api in apis:
        count, seconds = (
            after.get(api, (0.0, 0.0))[i] - before.get(api, (0.0, 0.0))[i] for i in (0, 1)
        )
        figures[name.format(api=api)] = count / per
        figures[name.split("{")[0] + f"{api}_mean_ms"] = 1000 * seconds / count if count else 0.0
    return figures


async def bench(args: argparse.Namespace) -> None:
    cancel_on_sigterm()
    runs: dict[str, dict[str, float]] = {}
    for mode, async_commit in (("synchronous_commit_on", False), ("off", True)):
        log(f"{mode}: {args.transactions} transactions of {args.txn_records} records")
        runs[mode] = await one_run(args, async_commit)
    sync_ratio = runs["synchronous_commit_on"]["commit_mean_ms"] / runs["off"]["commit_mean_ms"]
    print()
    print(
        f"{args.transactions} transactions of {args.txn_records} x {args.record_bytes} B, "
        "one librdkafka producer, coordinator --workers 1 on Postgres"
    )
    print(f"{'':<34}{'synchronous_commit on':>24}{'off':>12}")
    for key in runs["off"]:
        on, off = runs["synchronous_commit_on"][key], runs["off"][key]
        print(f"{key:<34}{on:>24.3f}{off:>12.3f}")
    print(f"sync_ratio {sync_ratio:.2f}")
    print(json.dumps({"runs": runs, "sync_ratio": round(sync_ratio, 3)}), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Where a small transaction's commit goes: the producer's commit latency and "
        "the service's time per Kafka API; the last stdout line is one JSON object.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_postgres_url(parser)
    parser.add_argument("--transactions", type=positive_int, default=200, help="one by one")
    parser.add_argument("--txn-records", type=positive_int, default=100, help="per transaction")
    parser.add_argument("--record-bytes", type=positive_int, default=1024, help="per value")
    parser.add_argument("--loop-records", type=positive_int, default=20_000, help="for (e)")
    parser.add_argument("--loop-batch", type=positive_int, default=500, help="(e) per commit")
    parser.add_argument("--loop-seconds", type=float, default=5.0, help="(e) at most")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run_bench(bench(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
