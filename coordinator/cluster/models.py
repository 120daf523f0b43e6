"""The brokers table: one row per Kafka listener that has served on this store."""

from __future__ import annotations

from sqlalchemy import BigInteger, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from coordinator.core.tables import Base


class BrokerRow(Base):
    __tablename__ = "brokers"

    broker_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    # The address clients are told to reach it at (Kafka's advertised.listeners).
    host: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer)
    rack: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # Live until then (milliseconds since the Unix epoch); renewed by every process serving as
    # this broker, set to 0 by a process that shuts down cleanly.
    lease_expires_ms: Mapped[int] = mapped_column(BigInteger)
    registered_ms: Mapped[int] = mapped_column(BigInteger)
