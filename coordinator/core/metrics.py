"""Prometheus metrics (`GET /metrics`, admin role).

Two kinds, so several service processes on one store stay truthful:
- per process: request counts and latency per route and answer code, transaction commits and
  aborts by reason, consumer group rebalances, side-effect calls by outcome. Each process serves
  its own; scrape every process (Prometheus labels each target with its `instance`) and sum.
- per store: open transactions by state, LSO lag per partition, producer-state rows, members and
  epoch of each consumer group and its lag per partition, side-effect keys by state. Read from
  the database at scrape time, so every process answers the same figures.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator.core.clock import now_ms
from coordinator.groups.models import ConsumerGroup, GroupMember, GroupOffset
from coordinator.log.models import Batch, Partition, ProducerState
from coordinator.transactions.models import Transaction

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


class _Snapshot:
    """Store-wide figures read once per scrape, exposed as gauges."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


async def _store_families(session: AsyncSession) -> list[Metric]:
    open_txns = GaugeMetricFamily(
        "coordinator_transactions",
        "Transactional ids by state.",
        labels=["state"],
    )
    for state, count in await session.execute(
        select(Transaction.state, func.count()).group_by(Transaction.state)
    ):
        open_txns.add_metric([state], count)

    pinned = (
        select(
            ProducerState.topic,
            ProducerState.partition,
            func.min(ProducerState.current_txn_first_offset).label("first"),
        )
        .group_by(ProducerState.topic, ProducerState.partition)
        .subquery()
    )
    lag = GaugeMetricFamily(
        "coordinator_lso_lag",
        "High watermark minus last stable offset: offsets read_committed readers cannot see yet.",
        labels=["topic", "partition"],
    )
    high = GaugeMetricFamily(
        "coordinator_high_watermark", "Next offset per partition.", labels=["topic", "partition"]
    )
    rows = await session.execute(
        select(Partition.topic, Partition.partition, Partition.high_watermark, pinned.c.first)
        .outerjoin(
            pinned,
            (pinned.c.topic == Partition.topic) & (pinned.c.partition == Partition.partition),
        )
        .order_by(Partition.topic, Partition.partition)
    )
    for topic, partition, hw, first in rows:
        stable = hw if first is None else min(first, hw)
        lag.add_metric([topic, str(partition)], hw - stable)
        high.add_metric([topic, str(partition)], hw)

    kept = GaugeMetricFamily(
        "coordinator_log_bytes",
        "Bytes of record batches each partition keeps (what retention.bytes counts).",
        labels=["topic", "partition"],
    )
    for (topic, partition), size in sorted((await bytes_kept(session)).items()):
        kept.add_metric([topic, str(partition)], size)
    start = GaugeMetricFamily(
        "coordinator_log_start_offset",
        "First offset each partition keeps (moved by retention and delete-records).",
        labels=["topic", "partition"],
    )
    for topic, partition, offset in await session.execute(
        select(Partition.topic, Partition.partition, Partition.log_start_offset).order_by(
            Partition.topic, Partition.partition
        )
    ):
        start.add_metric([topic, str(partition)], offset)

    producers = GaugeMetricFamily(
        "coordinator_producer_states", "Producer-state rows (one per producer and partition)."
    )
    producers.add_metric(
        [], await session.scalar(select(func.count()).select_from(ProducerState)) or 0
    )
    return [
        open_txns,
        lag,
        high,
        kept,
        start,
        producers,
        *await _group_families(session),
        await _effect_family(session),
    ]


async def bytes_kept(session: AsyncSession) -> dict[tuple[str, int], int]:
    """Bytes of the record batches each partition keeps (partitions with none are absent)."""
    rows = await session.execute(
        select(Batch.topic, Batch.partition, func.sum(Batch.size)).group_by(
            Batch.topic, Batch.partition
        )
    )
    return {(topic, partition): int(size) for topic, partition, size in rows}


async def _effect_family(session: AsyncSession) -> Metric:
    # Imported here: the effects service counts its calls through this module.
    from coordinator.effects.service import counts as effect_counts

    effects = GaugeMetricFamily(
        "coordinator_effects",
        "Side-effect keys: claimed (lease live), done, lapsed (claimed, lease ran out).",
        labels=["state"],
    )
    for state, count in (await effect_counts(session, now_ms())).items():
        effects.add_metric([state], count)
    return effects


async def _group_families(session: AsyncSession) -> list[Metric]:
    now = now_ms()
    members = GaugeMetricFamily(
        "coordinator_group_members",
        "Members of each consumer group (whose session and rebalance timeouts have not passed).",
        labels=["group"],
    )
    epochs = GaugeMetricFamily(
        "coordinator_group_epoch",
        "Group epoch of each consumer group: it rises with every rebalance.",
        labels=["group"],
    )
    live = (
        select(GroupMember.group_id, func.count().label("n"))
        .where(
            GroupMember.session_deadline_ms >= now,
            or_(GroupMember.revoke_deadline_ms.is_(None), GroupMember.revoke_deadline_ms >= now),
        )
        .group_by(GroupMember.group_id)
        .subquery()
    )
    for group, epoch, count in await session.execute(
        select(ConsumerGroup.group_id, ConsumerGroup.group_epoch, live.c.n)
        .outerjoin(live, live.c.group_id == ConsumerGroup.group_id)
        .order_by(ConsumerGroup.group_id)
    ):
        members.add_metric([group], count or 0)
        epochs.add_metric([group], epoch)
    lag = GaugeMetricFamily(
        "coordinator_group_lag",
        "High watermark minus the group's committed offset, per partition it committed.",
        labels=["group", "topic", "partition"],
    )
    for group, topic, partition, offset, hw in await session.execute(
        select(
            GroupOffset.group_id,
            GroupOffset.topic,
            GroupOffset.partition,
            GroupOffset.offset,
            Partition.high_watermark,
        )
        .join(
            Partition,
            (Partition.topic == GroupOffset.topic) & (Partition.partition == GroupOffset.partition),
        )
        .order_by(GroupOffset.group_id, GroupOffset.topic, GroupOffset.partition)
    ):
        lag.add_metric([group, topic, str(partition)], hw - offset)
    return [members, epochs, lag]


async def render(session: AsyncSession) -> bytes:
    store = CollectorRegistry(auto_describe=False)
    store.register(_Snapshot(await _store_families(session)))
    return generate_latest(PROCESS) + generate_latest(store)
