"""Committed consumer group offsets."""

from __future__ import annotations

from sqlalchemy import BigInteger, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from coordinator.core.database import Base


class GroupOffset(Base):
    __tablename__ = "group_offsets"

    group_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    topic: Mapped[str] = mapped_column(String(249), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    offset: Mapped[int] = mapped_column(BigInteger)
    metadata_: Mapped[str | None] = mapped_column("metadata", Text, nullable=True)
    committed_ms: Mapped[int] = mapped_column(BigInteger)
