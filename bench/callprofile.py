"""Round trips and CPU per call, by layer, of the coordinator's data-path calls (not a
throughput benchmark: one caller, in process, so nothing queues and every figure is per call).

For each kind of call it runs the app in this process over httpx's ASGI transport on a fresh
Postgres database and reports, per call: the database round trips (statements sent, plus BEGIN
and COMMIT; counted with SQLAlchemy's engine events, and the statements the hot paths send
straight to asyncpg), and the CPU time under cProfile (process time), split by the package it
was spent in: the service's domains, SQLAlchemy, asyncpg, FastAPI/Starlette, pydantic, the
record-batch codec, C built-ins, the rest. The client runs in
the same process, so its share (httpx, and the batch it builds) is in the figures too;
cProfile's own overhead inflates every figure alike: compare versions, not absolute ms. Calls:

- `produce-json`: idempotent produce of `--records` x `--record-bytes` as JSON;
- `produce-binary`: the same records as one Kafka record batch (skipped by a service without it);
- `heartbeat`: a steady member's heartbeat (a group of one owning both partitions);
- `txn`: a transaction as a producer runs it: [AddPartitions when `--add-partitions`], produce
  (JSON, transactional), AddOffsets (a group's offset in the transaction, without member
  identity), EndTxn commit; reported per call type.

Written to compare two versions of the service: run it once per checkout, e.g.
`PYTHONPATH=/path/to/other/checkout python bench/callprofile.py`. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
from sqlalchemy import event

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _support import add_postgres_url, plain_url, random_values, scratch_database

LAYERS = [
    ("recordbatch", "coordinator/log/recordbatch"),
    ("log", "coordinator/log/"),
    ("transactions", "coordinator/transactions/"),
    ("coordinator (other)", "coordinator/"),
    ("sqlalchemy", "sqlalchemy/"),
    ("asyncpg", "asyncpg/"),
    ("fastapi/starlette", "fastapi/"),
    ("fastapi/starlette", "starlette/"),
    ("pydantic", "pydantic"),
    ("httpx (client)", "httpx/"),
    ("asyncio", "asyncio/"),
]


def layer_of(filename: str) -> str:
    if filename == "~":
        return "C built-ins (json, crc, codecs, sockets)"
    for name, marker in LAYERS:
        if marker in filename:
            return name
    return "other"


def by_layer(profile: cProfile.Profile) -> dict[str, float]:
    """Own (tottime) CPU seconds per layer (the profiler's clock is process time)."""
    stats = pstats.Stats(profile)
    totals: dict[str, float] = defaultdict(float)
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        totals[layer_of(filename)] += tottime
    return dict(totals)


class RoundTrips:
    """Statements SQLAlchemy sends (and its BEGIN, COMMIT, ROLLBACK), and those the hot paths
    send straight to asyncpg (`Connection.fetch`, which SQLAlchemy's own driver adapter does
    not use), each a round trip."""

    def __init__(self, engine: Any) -> None:
        self.count = 0
        sync = engine.sync_engine
        event.listen(sync, "before_cursor_execute", self._hit)
        event.listen(sync, "begin", self._hit)
        event.listen(sync, "commit", self._hit)
        event.listen(sync, "rollback", self._hit)
        fetch = asyncpg.Connection.fetch

        async def counted(connection: Any, *args: Any, **kwargs: Any) -> Any:
            self._hit()
            return await fetch(connection, *args, **kwargs)

        asyncpg.Connection.fetch = counted  # type: ignore[method-assign]

    def _hit(self, *_: Any, **__: Any) -> None:
        self.count += 1


async def measure(name: str, call: Any, rounds: int, trips: RoundTrips) -> dict[str, Any]:
    for _ in range(20):  # warm up: statement caches, imports
        await call()
    trips.count = 0
    profile = cProfile.Profile(time.process_time)
    started = time.process_time()
    profile.enable()
    for _ in range(rounds):
        await call()
    profile.disable()
    cpu = time.process_time() - started
    layers = {k: round(1000 * v / rounds, 3) for k, v in sorted(by_layer(profile).items())}
    return {
        "call": name,
        "round_trips": round(trips.count / rounds, 2),
        "cpu_ms_profiled": round(1000 * cpu / rounds, 3),
        "layers_ms": layers,
    }


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from coordinator.app import create_app
    from coordinator.core.migrate import upgrade_to_head
    from coordinator.core.settings import Settings

    results = []
    async with scratch_database(plain_url(args.postgres_url), "bench_prof_") as (_, url):
        settings = Settings(database_url=url)
        upgrade_to_head(settings.database_url)
        app = create_app(settings)
        trips = RoundTrips(app.state.db.engine)
        transport = httpx.ASGITransport(app=app)
        client = httpx.AsyncClient(transport=transport, base_url="http://c")
        try:
            await client.post("/v1/topics", json={"name": "t", "partitions": 2})
            values = random_values(args.records, args.record_bytes, seed=1)
            records = [{"key": None, "value": v} for v in values]
            pid = (await client.post("/v1/init-pid", json={})).json()["producer_id"]
            sequence = 0

            async def produce_json() -> None:
                nonlocal sequence
                body = {"producer_id": pid, "producer_epoch": 0, "base_sequence": sequence,
                        "records": records}  # fmt: skip
                response = await client.post("/v1/topics/t/partitions/0/records", json=body)
                assert response.status_code == 200, response.text
                sequence += len(records)

            results.append(await measure("produce-json", produce_json, args.rounds, trips))

            try:
                from sdk import recordbatch
            except ImportError:
                recordbatch = None
            if recordbatch is not None:
                raw = [(0, None, v.encode(), ()) for v in values]
                pid2 = (await client.post("/v1/init-pid", json={})).json()["producer_id"]
                seq2 = 0

                async def produce_binary() -> None:
                    nonlocal seq2
                    data = recordbatch.build(
                        raw, producer_id=pid2, producer_epoch=0, base_sequence=seq2
                    )
                    response = await client.post(
                        "/v1/topics/t/partitions/1/records",
                        content=data,
                        headers={"content-type": "application/vnd.kafka.record-batch"},
                    )
                    assert response.status_code == 200, response.text
                    seq2 += len(raw)

                results.append(await measure("produce-binary", produce_binary, args.rounds, trips))

            # A member of a group of one, steady: what every consumer sends every few seconds.
            member = {"member_id": "m", "member_epoch": 0, "subscribed_topics": ["t"]}
            for _ in range(2):
                answer = (await client.post("/v1/groups/g/heartbeat", json=member)).json()
                member = {"member_id": "m", "member_epoch": answer["member_epoch"],
                          "owned_partitions": answer["assignment"]}  # fmt: skip

            async def heartbeat() -> None:
                response = await client.post("/v1/groups/g/heartbeat", json=member)
                assert response.status_code == 200, response.text

            results.append(await measure("heartbeat", heartbeat, args.rounds, trips))

            txn = await client.post("/v1/init-pid", json={"transactional_id": "tx"})
            state = {"pid": txn.json()["producer_id"], "epoch": 0}
            small = [{"value": v[:100]} for v in values[:5]]
            kinds: dict[str, Any] = {}

            async def add() -> None:
                body = {"producer_id": state["pid"], "producer_epoch": state["epoch"],
                        "partitions": [{"topic": "t", "partition": 0}]}  # fmt: skip
                response = await client.post("/v1/transactions/tx/partitions", json=body)
                assert response.status_code == 200, response.text

            async def produce_txn() -> None:
                body = {"producer_id": state["pid"], "producer_epoch": state["epoch"],
                        "base_sequence": 0, "transactional_id": "tx", "records": small}  # fmt: skip
                response = await client.post("/v1/topics/t/partitions/0/records", json=body)
                assert response.status_code == 200, response.text

            async def add_offsets() -> None:
                body = {"producer_id": state["pid"], "producer_epoch": state["epoch"],
                        "group_id": "g", "offsets": [{"topic": "t", "partition": 1,
                                                      "offset": 1}]}  # fmt: skip
                response = await client.post("/v1/transactions/tx/offsets", json=body)
                assert response.status_code == 200, response.text

            async def end() -> None:
                body = {"producer_id": state["pid"], "producer_epoch": state["epoch"],
                        "commit": True}  # fmt: skip
                response = await client.post(
                    "/v1/transactions/tx/end",
                    content=orjson.dumps(body),
                    headers={"content-type": "application/json"},
                )
                assert response.status_code == 200, response.text
                state["pid"] = response.json()["producer_id"]
                state["epoch"] = response.json()["producer_epoch"]

            steps = ([("AddPartitions", add)] if args.add_partitions else []) + [
                ("produce-txn", produce_txn),
                ("AddOffsets", add_offsets),
                ("EndTxn", end),
            ]
            for step_name, _ in steps:
                kinds[step_name] = {
                    "trips": 0,
                    "cpu": 0.0,
                    "profile": cProfile.Profile(time.process_time),
                }
            for _ in range(20):
                for _, step in steps:
                    await step()
            for _ in range(args.rounds):
                for step_name, step in steps:
                    entry = kinds[step_name]
                    trips.count = 0
                    started = time.process_time()
                    entry["profile"].enable()
                    await step()
                    entry["profile"].disable()
                    entry["cpu"] += time.process_time() - started
                    entry["trips"] += trips.count
            for step_name, entry in kinds.items():
                layers = by_layer(entry["profile"])
                results.append(
                    {
                        "call": step_name,
                        "round_trips": round(entry["trips"] / args.rounds, 2),
                        "cpu_ms_profiled": round(1000 * entry["cpu"] / args.rounds, 3),
                        "layers_ms": {
                            k: round(1000 * v / args.rounds, 3) for k, v in sorted(layers.items())
                        },
                    }
                )
        finally:
            await client.aclose()
            await app.state.db.dispose()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_postgres_url(parser)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--records", type=int, default=100)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument(
        "--add-partitions", action="store_true", help="call AddPartitions before each produce"
    )
    args = parser.parse_args()
    results = asyncio.run(run(args))
    for r in results:
        print(
            f"{r['call']:<16} round trips {r['round_trips']:>5}  CPU {r['cpu_ms_profiled']:>7} ms"
        )
        for layer, ms in sorted(r["layers_ms"].items(), key=lambda kv: -kv[1])[:8]:
            print(f"    {layer:<22}{ms:>8.3f} ms")
    print(json.dumps({"calls": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
