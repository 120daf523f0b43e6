"""How fast the transaction timeout sweeper aborts transactions that time out together, on
Postgres: batched (`ABORTS_PER_UNIT` per unit of work, the sweeper's way) against one per unit of
work (the baseline, the same function with `per_unit=1`), in one process on one store.

Set-up, through the app in-process: `--transactions` x 2 transactional ids, each with an open
transaction holding one batch on one of `--partitions` partitions. Then half of them are put past
their deadline and aborted one per unit of work, timed; then the other half, batched, timed.
`ratio` is batched aborts/s over one-per-unit aborts/s; `drain_10k_s` what 10,000 transactions
timing out together would take at the batched rate.

    python bench/timeouts.py --transactions 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _support import add_postgres_url, log, plain_url, positive_int, run_bench, scratch_database

from coordinator.app import create_app
from coordinator.core.migrate import upgrade_to_head
from coordinator.core.settings import Settings
from coordinator.transactions.aborts import ABORTS_PER_UNIT, abort_timed_out


async def open_transactions(
    client: httpx.AsyncClient, prefix: str, n: int, partitions: int
) -> None:
    async def one(i: int) -> None:
        tid = f"{prefix}-{i}"
        init = await client.post("/v1/init-pid", json={"transactional_id": tid})
        init.raise_for_status()
        pid, epoch = init.json()["producer_id"], init.json()["producer_epoch"]
        answer = await client.post(
            f"/v1/topics/t/partitions/{i % partitions}/records",
            json={
                "producer_id": pid,
                "producer_epoch": epoch,
                "base_sequence": 0,
                "transactional_id": tid,
                "records": [{"value": "x"}],
            },
        )
        answer.raise_for_status()

    for start in range(0, n, 50):
        await asyncio.gather(*(one(i) for i in range(start, min(n, start + 50))))


async def timed_abort(app: object, prefix: str, per_unit: int) -> tuple[int, float]:
    db = app.state.db  # type: ignore[attr-defined]
    async with db.write() as session:
        await session.execute(
            text("UPDATE transactions SET deadline_ms = 1 WHERE transactional_id LIKE :p"),
            {"p": f"{prefix}-%"},
        )
    began = time.perf_counter()
    aborted = await abort_timed_out(db, per_unit=per_unit)
    return len(aborted), time.perf_counter() - began


async def bench(args: argparse.Namespace) -> None:
    async with scratch_database(plain_url(args.postgres_url), "bench_") as (_, database_url):
        settings = Settings(database_url=database_url)
        upgrade_to_head(settings.database_url)
        app = create_app(settings)
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
                created = await client.post(
                    "/v1/topics", json={"name": "t", "partitions": args.partitions}
                )
                created.raise_for_status()
                log(f"opening 2 x {args.transactions} transactions")
                for prefix in ("single", "batched"):
                    await open_transactions(client, prefix, args.transactions, args.partitions)
            log("aborting one per unit of work")
            single, single_s = await timed_abort(app, "single", 1)
            log(f"aborting {ABORTS_PER_UNIT} per unit of work")
            batched, batched_s = await timed_abort(app, "batched", ABORTS_PER_UNIT)
        finally:
            await app.state.db.dispose()
    assert single == batched == args.transactions, (single, batched)
    single_rate, batched_rate = single / single_s, batched / batched_s
    print(
        f"\n{args.transactions} timed-out transactions on {args.partitions} partitions: "
        f"one per unit {single_rate:.0f} aborts/s, {ABORTS_PER_UNIT} per unit "
        f"{batched_rate:.0f} aborts/s (ratio {batched_rate / single_rate:.2f}); "
        f"10,000 at once drain in {10_000 / batched_rate:.1f} s"
    )
    print(
        json.dumps(
            {
                "transactions": args.transactions,
                "single_aborts_per_s": round(single_rate, 1),
                "batched_aborts_per_s": round(batched_rate, 1),
                "ratio": round(batched_rate / single_rate, 3),
                "drain_10k_s": round(10_000 / batched_rate, 2),
            }
        ),
        flush=True,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Aborts per second of the transaction timeout sweeper, batched vs one per "
        "unit of work. The last stdout line is a JSON object with the figures.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_postgres_url(parser)
    parser.add_argument("--transactions", type=positive_int, default=1000, help="per variant")
    parser.add_argument("--partitions", type=positive_int, default=8, help="of the topic")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run_bench(bench(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
