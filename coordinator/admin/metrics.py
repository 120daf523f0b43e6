"""`GET /metrics`: Prometheus text format, admin role.

The process's own counters (`coordinator.core.metrics`) and the store's figures: open
transactions by state, each partition's high watermark, LSO lag, log start and bytes kept,
producer-state rows, members and epoch of each consumer group and its lag per partition,
side-effect keys by state; and what Kafka's clients push of their own metrics (KIP-714,
`coordinator.telemetry.export`). Read from the database at scrape time, so every process
answers the same figures.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import Response

from coordinator.core.acls import Operation
from coordinator.core.auth import AccessDep
from coordinator.core.clock import now_ms
from coordinator.core.dependencies import DB
from coordinator.core.metrics import PROCESS
from coordinator.effects.service import counts as effect_counts
from coordinator.groups.models import ConsumerGroup, GroupMember, GroupOffset
from coordinator.log.bounds import all_bounds, bytes_kept
from coordinator.log.models import Partition, ProducerState
from coordinator.telemetry.export import client_families
from coordinator.transactions.models import Transaction

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
async def scrape(db: DB, access: AccessDep) -> Response:
    access.cluster(Operation.DESCRIBE)
    async with db.read() as session:
        body = await render(session)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


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

    lag = GaugeMetricFamily(
        "coordinator_lso_lag",
        "High watermark minus last stable offset: offsets read_committed readers cannot see yet.",
        labels=["topic", "partition"],
    )
    high = GaugeMetricFamily(
        "coordinator_high_watermark", "Next offset per partition.", labels=["topic", "partition"]
    )
    start = GaugeMetricFamily(
        "coordinator_log_start_offset",
        "First offset each partition keeps (moved by retention and delete-records).",
        labels=["topic", "partition"],
    )
    for (topic, partition), bounds in (await all_bounds(session)).items():
        labels = [topic, str(partition)]
        lag.add_metric(labels, bounds.high_watermark - bounds.last_stable_offset)
        high.add_metric(labels, bounds.high_watermark)
        start.add_metric(labels, bounds.log_start_offset)

    kept = GaugeMetricFamily(
        "coordinator_log_bytes",
        "Bytes of record batches each partition keeps (what retention.bytes counts).",
        labels=["topic", "partition"],
    )
    for (topic, partition), size in sorted((await bytes_kept(session)).items()):
        kept.add_metric([topic, str(partition)], size)

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
        *await client_families(session, now_ms()),
    ]


async def _effect_family(session: AsyncSession) -> Metric:
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
