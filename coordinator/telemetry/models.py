"""The telemetry tables: client-metrics subscriptions (Kafka's CLIENT_METRICS config resources,
one row per config set) and the latest push of each client instance."""

from __future__ import annotations

from sqlalchemy import BigInteger, Index, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from coordinator.core.tables import Base


class ClientMetricsConfig(Base):
    """One config of one subscription; a subscription exists while it has a config set."""

    __tablename__ = "client_metrics_configs"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    config: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(32768))


class ClientTelemetry(Base):
    """A client instance's latest push: its metrics as OpenTelemetry's MetricsData (inflated),
    shown until `expires_at_ms`."""

    __tablename__ = "client_telemetry"
    __table_args__ = (Index("ix_client_telemetry_expires", "expires_at_ms"),)

    # As Kafka writes a Uuid (22 characters of URL-safe base64).
    client_instance_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    client_id: Mapped[str] = mapped_column(String(255))
    software_name: Mapped[str] = mapped_column(String(255))
    software_version: Mapped[str] = mapped_column(String(255))
    source_address: Mapped[str] = mapped_column(String(255))
    source_port: Mapped[int] = mapped_column(Integer)
    pushed_at_ms: Mapped[int] = mapped_column(BigInteger)
    expires_at_ms: Mapped[int] = mapped_column(BigInteger)
    metrics: Mapped[bytes] = mapped_column(LargeBinary)
