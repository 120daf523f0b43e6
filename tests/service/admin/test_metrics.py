"""`/metrics` for Prometheus: request counts and latency per route and code, commits and aborts
by reason, and store-wide gauges (open transactions, LSO lag, producer-state rows)."""

from __future__ import annotations

from typing import Any

import httpx

from coordinator.core.clock import now_ms
from coordinator.transactions import aborts
from tests.support.api import create_topic
from tests.support.metrics import scrape, value
from tests.support.txn import started


async def test_metrics_count_requests_by_route_template_and_code(
    client: httpx.AsyncClient,
) -> None:
    before = await scrape(client)
    await create_topic(client, "t")
    await client.get("/v1/topics/t")
    await client.get("/v1/topics/missing")
    await client.get("/v1/topics/missing")
    after = await scrape(client)
    route = "/v1/topics/{topic}"
    grew = lambda name, **labels: value(after, name, **labels) - value(before, name, **labels)  # noqa: E731
    assert grew("coordinator_requests_total", method="GET", route=route, code="OK") == 1
    assert (
        grew(
            "coordinator_requests_total",
            method="GET",
            route=route,
            code="UNKNOWN_TOPIC_OR_PARTITION",
        )
        == 2
    )
    assert grew("coordinator_request_duration_seconds_count", method="GET", route=route) == 3


async def test_metrics_count_commits_and_aborts_by_reason(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t")
    before = await scrape(client)
    producer = await started(client, "a")
    await producer.add(("t", 0))
    await producer.end(commit=True)
    await producer.add(("t", 0))
    await producer.end(commit=False)
    await producer.add(("t", 0))
    await started(client, "a")  # fences the open transaction
    timed = await started(client, "b")
    await timed.add(("t", 0))
    await aborts.abort_timed_out(app.state.db, now=now_ms() + 10**7)
    after = await scrape(client)
    for name, reason, expected in (
        ("coordinator_transaction_commits_total", "client", 1),
        ("coordinator_transaction_aborts_total", "client", 1),
        ("coordinator_transaction_aborts_total", "fenced", 1),
        ("coordinator_transaction_aborts_total", "timeout", 1),
    ):
        assert value(after, name, reason=reason) - value(before, name, reason=reason) == expected


async def test_metrics_show_store_gauges(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t", partitions=2)
    producer = await started(client, "a")
    await producer.add(("t", 1))
    await producer.produce("t", 1, "x", "y")
    await started(client, "b")
    samples = await scrape(client)
    assert value(samples, "coordinator_transactions", state="Ongoing") == 1
    assert value(samples, "coordinator_transactions", state="Empty") == 1
    assert value(samples, "coordinator_lso_lag", topic="t", partition="1") == 2
    assert value(samples, "coordinator_lso_lag", topic="t", partition="0") == 0
    assert value(samples, "coordinator_high_watermark", topic="t", partition="1") == 2
    assert value(samples, "coordinator_producer_states") == 1
