"""Every producer id ever issued, with its current epoch."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from coordinator.core.tables import Base, BigIntKey


class ProducerId(Base):
    __tablename__ = "producer_ids"

    producer_id: Mapped[int] = mapped_column(BigIntKey, primary_key=True, autoincrement=True)
    producer_epoch: Mapped[int] = mapped_column(Integer, default=0)
    # Null for an idempotent (non-transactional) producer.
    transactional_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
