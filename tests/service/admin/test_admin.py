"""The HTTP API's Admin calls: list, describe producers, find hanging, abort (which fences)."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import update

from coordinator.log.models import ProducerState
from tests.support.api import assert_problem, batch, create_topic, init_pid, produce, read_all
from tests.support.txn import started


async def listed(client: httpx.AsyncClient, **params: Any) -> list[str]:
    response = await client.get("/v1/admin/transactions", params=params)
    assert response.status_code == 200, response.text
    return [t["transactional_id"] for t in response.json()["transactions"]]


async def test_list_transactions_filters_by_state_prefix_and_age(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    ongoing = await started(client, "etl-1")
    await ongoing.add(("t", 0))
    await started(client, "etl-2")
    prepared = await started(client, "web-1")
    await prepared.prepare()
    assert await listed(client) == ["etl-1", "etl-2", "web-1"]
    assert await listed(client, state="Ongoing") == ["etl-1"]
    assert await listed(client, state="Prepared") == ["web-1"]
    assert await listed(client, prefix="etl-") == ["etl-1", "etl-2"]
    assert await listed(client, older_than_ms=0) == ["etl-1", "web-1"]  # open ones
    assert await listed(client, older_than_ms=3_600_000) == []
    described = (await client.get("/v1/admin/transactions", params={"state": "Ongoing"})).json()
    assert described["transactions"][0]["partitions"] == [{"topic": "t", "partition": 0}]
    bad = await client.get("/v1/admin/transactions", params={"state": "Sleeping"})
    assert_problem(bad, 422, "INVALID_REQUEST")


async def test_describe_producers_shows_state_per_partition(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    pid = await init_pid(client)
    await produce(client, "t", 0, batch(["a", "b"], pid, 0, 0))
    txn = await started(client, "tx")
    await txn.add(("t", 0))
    await txn.produce("t", 0, "c")
    response = await client.get("/v1/admin/producers", params={"topic": "t", "partition": 0})
    producers = response.json()["producers"]
    assert [
        (p["producer_id"], p["last_sequence"], p["current_txn_start_offset"]) for p in producers
    ] == [
        (pid, 1, None),
        (txn.pid, 0, 2),
    ]
    assert all(p["last_timestamp"] > 1_600_000_000_000 for p in producers)
    missing = await client.get("/v1/admin/producers", params={"topic": "t", "partition": 3})
    assert_problem(missing, 404, "UNKNOWN_TOPIC_OR_PARTITION")


async def test_find_hanging_lists_old_open_transactions_and_pinned_partitions(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t")
    old = await started(client, "old")
    await old.add(("t", 0))
    await old.produce("t", 0, "x")
    fresh = await client.get("/v1/admin/hanging")
    assert fresh.json() == {"transactions": [], "partitions": []}
    aged = (await client.get("/v1/admin/hanging", params={"max_transaction_timeout_ms": 0})).json()
    assert [t["transactional_id"] for t in aged["transactions"]] == ["old"]
    assert aged["partitions"] == []

    # A partition pinned by a producer the coordinator has no open transaction for can only come
    # from a store changed behind the service's back: make one and see it reported.
    pid = await init_pid(client)
    await produce(client, "t", 0, batch(["y"], pid, 0, 0))
    async with app.state.db.write() as session:
        await session.execute(
            update(ProducerState)
            .where(ProducerState.producer_id == pid)
            .values(current_txn_first_offset=1)
        )
    pinned = (await client.get("/v1/admin/hanging")).json()["partitions"]
    assert pinned == [
        {"topic": "t", "partition": 0, "producer_id": pid, "current_txn_start_offset": 1}
    ]


async def test_admin_abort_aborts_the_open_transaction_and_fences_its_producer(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "stuck")
    await producer.add(("t", 0))
    await producer.produce("t", 0, "never")
    answer = await client.post("/v1/admin/transactions/stuck/abort")
    assert answer.json() == {
        "state": "CompleteAbort",
        "producer_id": producer.pid,
        "producer_epoch": producer.epoch + 1,
    }
    assert_problem(await producer.end(commit=True), 409, "PRODUCER_FENCED")
    assert await read_all(client, "t") == []
    state = (await client.get("/v1/topics/t")).json()["partitions"][0]
    assert state["last_stable_offset"] == state["high_watermark"] == 2
    again = await client.post("/v1/admin/transactions/stuck/abort")
    assert_problem(again, 409, "INVALID_TXN_STATE")
    unknown = await client.post("/v1/admin/transactions/nobody/abort")
    assert_problem(unknown, 404, "TRANSACTIONAL_ID_NOT_FOUND")
