"""Prometheus metrics, per process: request counts and latency per route and answer code,
transaction commits and aborts by reason, consumer group rebalances, side-effect calls by
outcome, refusals. Each process serves its own; scrape every process (Prometheus labels each
target with its `instance`) and sum. The store-wide figures, the same from every process, are
read at scrape time by `coordinator.admin.metrics`.
"""

from __future__ import annotations

import time

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PROCESS = CollectorRegistry()
ProcessCollector(registry=PROCESS)
PlatformCollector(registry=PROCESS)

REQUESTS = Counter(
    "coordinator_requests",
    "HTTP requests answered, by route and answer code (OK or the API error code).",
    ["method", "route", "code"],
    registry=PROCESS,
)
LATENCY = Histogram(
    "coordinator_request_duration_seconds",
    "Time to answer an HTTP request, by route.",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=PROCESS,
)
KAFKA_LATENCY = Histogram(
    "coordinator_kafka_request_duration_seconds",
    "Time to answer a Kafka request, by API, from its frame read to its answer encoded (as "
    "Kafka's RequestMetrics TotalTimeMs, without the time an answer waits behind earlier ones "
    "of its connection).",
    ["api"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=PROCESS,
)
COMMITS = Counter(
    "coordinator_transaction_commits",
    "Transactions committed, by who ended them (client: EndTxn, group: commit-group).",
    ["reason"],
    registry=PROCESS,
)
ABORTS = Counter(
    "coordinator_transaction_aborts",
    "Transactions aborted, by reason (client, fenced, timeout, admin).",
    ["reason"],
    registry=PROCESS,
)
REBALANCES = Counter(
    "coordinator_group_rebalances",
    "Consumer group rebalances: target assignments computed anew (a member joined, left or "
    "expired, a subscription or a subscribed topic changed).",
    registry=PROCESS,
)

EFFECTS = Counter(
    "coordinator_effect_calls",
    "Side-effect calls by outcome: claims that were granted (claimed, renewed by their owner), "
    "answered with a stored result (done) or refused (busy); completed; released.",
    ["outcome"],
    registry=PROCESS,
)

REMOVED_BYTES = Counter(
    "coordinator_log_removed_bytes",
    "Bytes of record batches removed from the logs, by cause (retention, compaction).",
    ["cause"],
    registry=PROCESS,
)
REMOVED_BATCHES = Counter(
    "coordinator_log_removed_batches",
    "Record batches removed from the logs, by cause (retention, compaction: whole batches only).",
    ["cause"],
    registry=PROCESS,
)
CONNECTION_REFUSALS = Counter(
    "coordinator_connection_refusals",
    "Connections a door closed on a peer, by door (http, kafka) and reason: malformed, "
    "too_large, unsupported, unauthenticated, authentication_failed (Kafka), headers_too_large "
    "(HTTP), connection_limit, idle.",
    ["door", "reason"],
    registry=PROCESS,
)


FETCH_SOURCES = Counter(
    "coordinator_fetches",
    "Fetches on Postgres (both doors) by where they were read: primary, or replica (a hot "
    "standby within COORDINATOR_REPLICA_MAX_LAG_MS).",
    ["source"],
    registry=PROCESS,
)


LIMIT_REFUSALS = Counter(
    "coordinator_limit_refusals",
    "Requests refused by a limit of the domain, through either door: group_max_size, "
    "partition_mutation_rate.",
    ["limit"],
    registry=PROCESS,
)


def record_limit_refusal(limit: str) -> None:
    LIMIT_REFUSALS.labels(limit=limit).inc()


def record_refusal(door: str, reason: str) -> None:
    CONNECTION_REFUSALS.labels(door=door, reason=reason).inc()


def record_removed(cause: str, batches: int, size: int) -> None:
    REMOVED_BATCHES.labels(cause=cause).inc(batches)
    REMOVED_BYTES.labels(cause=cause).inc(size)


def record_effect(outcome: str) -> None:
    EFFECTS.labels(outcome=outcome).inc()


def record_end(committed: bool, reason: str) -> None:
    (COMMITS if committed else ABORTS).labels(reason=reason).inc()


def record_rebalance() -> None:
    REBALANCES.inc()


def set_error_code(scope: Scope, code: str) -> None:
    """Tell the metrics middleware which API code a request was answered with."""
    scope.setdefault("state", {})["error_code"] = code


class MetricsMiddleware:
    """Counts and times every HTTP request by its route template (never the raw path)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            code = scope.get("state", {}).get("error_code") or (
                "OK" if status < 400 else f"HTTP_{status}"
            )
            method = scope["method"]
            REQUESTS.labels(method=method, route=template, code=code).inc()
            LATENCY.labels(method=method, route=template).observe(time.perf_counter() - started)
