"""The HTTP API's log lifecycle in the background: retention by time and by size (whole batches from
the start, never at or above the LSO), partitions claimed so two processes never clean one at
once, and producer-state expiry with the removal of idempotent producer ids left without state.

The cleaner is driven one round at a time (`clean_once`) with a chosen clock, so no test waits
for time to pass. Run on SQLite and on Postgres.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
from sqlalchemy import select

from coordinator.app import create_app
from coordinator.core.clock import now_ms
from coordinator.log.cleaner import clean_once
from coordinator.log.models import Batch
from coordinator.store import Store
from coordinator.store.engines import open_store
from tests.support.api import (
    assert_problem,
    batch,
    create_topic,
    fetch,
    init_pid,
    produce,
    read_all,
)
from tests.support.services import Backend, empty_tables, make_settings
from tests.support.txn import Instance, partition_state

DAY = 86_400_000


async def topic_with(client: httpx.AsyncClient, name: str, **configs: str) -> None:
    response = await client.post(
        "/v1/topics", json={"name": name, "partitions": 1, "configs": configs}
    )
    assert response.status_code == 201, response.text


async def append(client: httpx.AsyncClient, topic: str, values: list[str], at: int) -> None:
    body = {"records": [{"value": v, "timestamp": at} for v in values]}
    response = await produce(client, topic, 0, body)
    assert response.status_code == 200, response.text


async def test_retention_by_time_deletes_expired_batches_from_the_start(
    client: httpx.AsyncClient, app: Any
) -> None:
    await topic_with(client, "t", **{"retention.ms": "60000"})
    now = now_ms()
    await append(client, "t", ["a", "b"], now - 120_000)  # offsets 0-1, expired
    await append(client, "t", ["c"], now)  # offset 2, kept
    await append(client, "t", ["d"], now - 120_000)  # offset 3: expired, but after a kept one
    done = await clean_once(app.state.db, app.state.settings, now=now)
    assert (done.retention.batches, done.retention.bytes > 0) == (1, True)
    assert (await partition_state(client, "t", 0))["log_start_offset"] == 2
    assert [r["value"] for r in (await fetch(client, "t", 0, offset=2))["records"]] == [
        "c",
        "d",
    ]
    assert_problem(
        await client.get("/v1/topics/t/partitions/0/records", params={"offset": 1}),
        416,
        "OFFSET_OUT_OF_RANGE",
    )
    # Later, everything has expired: the log start reaches the high watermark.
    await clean_once(app.state.db, app.state.settings, now=now + 10 * 60_000)
    state = await partition_state(client, "t", 0)
    assert state["log_start_offset"] == state["high_watermark"] == 4


async def test_retention_by_size_keeps_the_newest_batches_that_fit(
    client: httpx.AsyncClient, app: Any
) -> None:
    await topic_with(client, "t", **{"retention.ms": "-1"})
    now = now_ms()
    for i in range(4):
        await append(client, "t", [f"v{i}" * 10], now)
    sizes = await batch_sizes(app.state.db, "t")
    limit = sizes[-1] + sizes[-2]  # room for exactly the two newest
    patched = await client.patch(
        "/v1/topics/t/configs", json={"set": {"retention.bytes": str(limit)}}
    )
    assert patched.status_code == 200, patched.text
    await clean_once(app.state.db, app.state.settings, now=now)
    assert (await partition_state(client, "t", 0))["log_start_offset"] == 2
    assert [r["value"] for r in await read_from_start(client, "t")] == ["v2" * 10, "v3" * 10]


async def test_retention_never_removes_anything_at_or_above_the_lso(
    client: httpx.AsyncClient, app: Any
) -> None:
    await topic_with(client, "t", **{"retention.ms": "0"})
    await append(client, "t", ["old"], now_ms() - DAY)  # offset 0
    producer = Instance(client, "tx")
    await producer.init()
    assert (await producer.produce("t", 0, "open")).status_code == 200  # offset 1, open
    await append(client, "t", ["after"], now_ms() - DAY)  # offset 2, above the LSO
    later = now_ms() + DAY
    await clean_once(app.state.db, app.state.settings, now=later)
    assert (await partition_state(client, "t", 0))["log_start_offset"] == 1
    assert (await producer.end(commit=True)).status_code == 200
    values = [r["value"] for r in await read_from_start(client, "t")]
    assert values == ["open", "after"]
    await clean_once(app.state.db, app.state.settings, now=later)
    state = await partition_state(client, "t", 0)
    assert state["log_start_offset"] == state["high_watermark"] == 4  # the marker too


async def test_a_topic_keeping_forever_is_left_alone(client: httpx.AsyncClient, app: Any) -> None:
    await topic_with(client, "t", **{"retention.ms": "-1"})
    await append(client, "t", ["a"], 0)
    await clean_once(app.state.db, app.state.settings, now=now_ms() + 1000 * DAY)
    assert (await partition_state(client, "t", 0))["log_start_offset"] == 0


async def test_a_partition_another_process_is_cleaning_is_skipped(postgres_store: Backend) -> None:
    # Postgres only: SQLite's write unit already excludes every other writer.
    async with running(postgres_store, lifespan=False) as (app, client):
        await topic_with(client, "t", **{"retention.ms": "1000"})
        await append(client, "t", ["a"], now_ms() - DAY)
        other = open_store(make_settings(postgres_store))
        try:
            async with other.write() as session:
                assert await other.claim(session, "t/0")
                done = await clean_once(app.state.db, app.state.settings)
                assert done.retention.batches == 0
            done = await clean_once(app.state.db, app.state.settings)
            assert done.retention.batches == 1
        finally:
            await other.dispose()


async def test_removals_are_counted_in_the_metrics(client: httpx.AsyncClient, app: Any) -> None:
    # Half a day: "a", a day old, is due; "b", written now, stays within retention however long
    # the test takes (with 1 s, a slow run saw both removed).
    await topic_with(client, "t", **{"retention.ms": str(DAY // 2)})
    await append(client, "t", ["a"], now_ms() - DAY)
    await append(client, "t", ["b"], now_ms())
    before = await removed_batches(client)
    await clean_once(app.state.db, app.state.settings)
    assert await removed_batches(client) == before + 1
    text = (await client.get("/metrics")).text
    assert 'coordinator_log_start_offset{partition="0",topic="t"} 1.0' in text
    [size] = await batch_sizes(app.state.db, "t")
    assert f'coordinator_log_bytes{{partition="0",topic="t"}} {float(size)}' in text


# -- producer-state expiry ----------------------------------------------------------------------


async def test_idle_producer_state_expires_and_the_producer_must_restart_its_sequence(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t")
    pid = await init_pid(client)
    assert (await produce(client, "t", 0, batch(["a"], pid, 0, 0))).status_code == 200
    later = now_ms() + app.state.settings.producer_id_expiration_ms + 1
    done = await clean_once(app.state.db, app.state.settings, now=later)
    assert done.producer_states == 1
    assert await producer_rows(client, "t") == []
    # The id itself is the newest ever issued, so it stays (SQLite would issue it again).
    assert done.producer_ids == 0
    assert_problem(
        await produce(client, "t", 0, batch(["b"], pid, 0, 1)), 409, "UNKNOWN_PRODUCER_ID"
    )
    # A retry of its first batch is still known for what it is.
    retry = await produce(client, "t", 0, batch(["a"], pid, 0, 0))
    assert retry.json() == {"base_offset": 0, "last_offset": 0, "duplicate": True}


async def test_state_with_an_open_transaction_never_expires(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t")
    producer = Instance(client, "tx")
    await producer.init()
    assert (await producer.produce("t", 0, "a")).status_code == 200
    later = now_ms() + 2 * app.state.settings.producer_id_expiration_ms
    done = await clean_once(app.state.db, app.state.settings, now=later)
    assert done.producer_states == 0
    assert (await producer.end(commit=True)).status_code == 200
    assert [r["value"] for r in await read_all(client, "t")] == ["a"]


async def test_idempotent_ids_without_state_are_removed_but_never_the_newest(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t")
    transactional = Instance(client, "tx")
    await transactional.init()
    old = await init_pid(client)
    assert (await produce(client, "t", 0, batch(["a"], old, 0, 0))).status_code == 200
    newest = await init_pid(client)
    later = now_ms() + app.state.settings.producer_id_expiration_ms + 1
    done = await clean_once(app.state.db, app.state.settings, now=later)
    assert done.producer_ids == 1
    assert_problem(
        await produce(client, "t", 0, batch(["b"], old, 0, 0)), 409, "UNKNOWN_PRODUCER_ID"
    )
    # Neither the newest id nor a transactional id's is removed.
    assert (await produce(client, "t", 0, batch(["c"], newest, 0, 0))).status_code == 200
    assert (await transactional.produce("t", 0, "d")).status_code == 200
    assert await init_pid(client) > newest


async def test_the_cleaner_runs_in_the_background(store: Backend) -> None:
    async with running(store, log_retention_check_interval_ms=20) as (_, client):
        await topic_with(client, "t", **{"retention.ms": "1000"})
        await append(client, "t", ["a"], now_ms() - DAY)
        deadline = asyncio.get_running_loop().time() + 30
        while (await partition_state(client, "t", 0))["log_start_offset"] != 1:
            assert asyncio.get_running_loop().time() < deadline, "the cleaner never ran"
            await asyncio.sleep(0.02)


# -- helpers ------------------------------------------------------------------------------------


@asynccontextmanager
async def running(
    store: Backend, lifespan: bool = True, **overrides: Any
) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """An app on `store` with its background tasks running (`lifespan`), and a client."""
    app = create_app(make_settings(store, **overrides))
    await empty_tables(app.state.db)
    transport = httpx.ASGITransport(app=app)
    async with AsyncExitStack() as stack:
        if lifespan:
            await stack.enter_async_context(app.router.lifespan_context(app))
        else:
            stack.push_async_callback(app.state.db.dispose)
        client = await stack.enter_async_context(
            httpx.AsyncClient(transport=transport, base_url="http://coordinator")
        )
        yield app, client


async def batch_sizes(db: Store, topic: str) -> list[int]:
    async with db.read() as session:
        return list(
            await session.scalars(
                select(Batch.size).where(Batch.topic == topic).order_by(Batch.base_offset)
            )
        )


async def read_from_start(client: httpx.AsyncClient, topic: str) -> list[dict[str, Any]]:
    start = (await partition_state(client, topic, 0))["log_start_offset"]
    page = await fetch(client, topic, 0, offset=start, max_records=10_000)
    records: list[dict[str, Any]] = page["records"]
    return records


async def producer_rows(client: httpx.AsyncClient, topic: str) -> list[dict[str, Any]]:
    response = await client.get("/v1/admin/producers", params={"topic": topic, "partition": 0})
    assert response.status_code == 200, response.text
    rows: list[dict[str, Any]] = response.json()["producers"]
    return rows


async def removed_batches(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith('coordinator_log_removed_batches_total{cause="retention"}'):
            return float(line.split()[-1])
    return 0.0
