"""Producer id rows: issue one, raise its epoch, retire it."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import bindparam, insert, update
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.schemas import EPOCH_MAX
from coordinator.producers.models import ProducerId

# Stored on a producer id replaced after its epochs ran out: every request carries an older epoch.
EPOCH_RETIRED = EPOCH_MAX + 1


async def issue_producer_id(session: AsyncSession, transactional_id: str | None) -> int:
    """A fresh producer id at epoch 0."""
    result = await session.execute(
        insert(ProducerId)
        .values(producer_epoch=0, transactional_id=transactional_id, created_at=datetime.now(UTC))
        .returning(ProducerId.producer_id)
    )
    producer_id: int = result.scalar_one()
    return producer_id


# Bind parameters `pid` and `epoch`; also a CTE of a transaction's end (`coordinator.transactions`).
SET_EPOCH = (
    update(ProducerId)
    .where(ProducerId.producer_id == bindparam("pid"))
    .values(producer_epoch=bindparam("epoch"))
)


async def set_epoch(session: AsyncSession, producer_id: int, epoch: int) -> None:
    await session.execute(SET_EPOCH, {"pid": producer_id, "epoch": epoch})
