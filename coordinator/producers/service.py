"""InitPid: issue producer ids (API.md, Producer ids)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.database import Database
from coordinator.core.errors import InvalidRequest
from coordinator.core.settings import Settings
from coordinator.producers.errors import InvalidTransactionTimeout
from coordinator.producers.models import ProducerId
from coordinator.producers.schemas import InitPidRequest, InitPidResponse


async def issue_producer_id(session: AsyncSession, transactional_id: str | None) -> int:
    """A fresh producer id at epoch 0."""
    result = await session.execute(
        insert(ProducerId)
        .values(producer_epoch=0, transactional_id=transactional_id, created_at=datetime.now(UTC))
        .returning(ProducerId.producer_id)
    )
    producer_id: int = result.scalar_one()
    return producer_id


async def init_pid(db: Database, settings: Settings, body: InitPidRequest) -> InitPidResponse:
    maximum = settings.transaction_max_timeout_ms
    if not 1 <= body.transaction_timeout_ms <= maximum:
        raise InvalidTransactionTimeout(
            f"transaction_timeout_ms must be between 1 and {maximum}, "
            f"not {body.transaction_timeout_ms}"
        )
    if body.transactional_id is not None:
        raise InvalidRequest("transactional_id: transactional producers are not available yet")
    async with db.write() as session:
        producer_id = await issue_producer_id(session, None)
    return InitPidResponse(producer_id=producer_id, producer_epoch=0)
