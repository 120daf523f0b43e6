"""Committed consumer group offsets: plain commits, reads, and `require_stable` (KIP-447)."""

from __future__ import annotations

from sqlalchemy import select

from coordinator.core.clock import now_ms
from coordinator.core.database import Database, upsert
from coordinator.core.errors import InvalidRequest
from coordinator.groups.errors import UnstableOffsetCommit
from coordinator.groups.models import GroupOffset
from coordinator.groups.schemas import CommitOffsetsRequest, OffsetOut, OffsetsResponse
from coordinator.transactions.models import Transaction, TransactionOffset
from coordinator.transactions.service import require_partitions
from coordinator.transactions.states import OPEN


async def commit(db: Database, group_id: str, body: CommitOffsetsRequest) -> OffsetsResponse:
    keys = sorted({(o.topic, o.partition) for o in body.offsets})
    if len(keys) != len(body.offsets):
        raise InvalidRequest("offsets: a partition appears more than once")
    async with db.write() as session:
        await require_partitions(session, keys)
        now = now_ms()
        for o in body.offsets:
            await upsert(
                session,
                GroupOffset,
                {
                    "group_id": group_id,
                    "topic": o.topic,
                    "partition": o.partition,
                    "offset": o.offset,
                    "metadata": o.metadata,
                    "committed_ms": now,
                },
                ["group_id", "topic", "partition"],
            )
    return OffsetsResponse(
        offsets=[
            OffsetOut(topic=o.topic, partition=o.partition, offset=o.offset, metadata=o.metadata)
            for o in sorted(body.offsets, key=lambda o: (o.topic, o.partition))
        ]
    )


async def fetch(
    db: Database, group_id: str, topic: str | None, require_stable: bool
) -> OffsetsResponse:
    async with db.read() as session:
        if require_stable:
            pending = (
                select(TransactionOffset.topic, TransactionOffset.partition)
                .join(
                    Transaction,
                    Transaction.transactional_id == TransactionOffset.transactional_id,
                )
                .where(TransactionOffset.group_id == group_id, Transaction.state.in_(list(OPEN)))
                .limit(1)
            )
            if topic is not None:
                pending = pending.where(TransactionOffset.topic == topic)
            held = (await session.execute(pending)).first()
            if held is not None:
                raise UnstableOffsetCommit(
                    f"an open transaction holds a pending offset of group {group_id!r} for "
                    f"{held.topic}-{held.partition}; retry once it ends"
                )
        query = (
            select(
                GroupOffset.topic, GroupOffset.partition, GroupOffset.offset, GroupOffset.metadata_
            )
            .where(GroupOffset.group_id == group_id)
            .order_by(GroupOffset.topic, GroupOffset.partition)
        )
        if topic is not None:
            query = query.where(GroupOffset.topic == topic)
        rows = (await session.execute(query)).all()
    return OffsetsResponse(
        offsets=[OffsetOut(topic=t, partition=p, offset=o, metadata=m) for t, p, o, m in rows]
    )
