"""client telemetry (KIP-714): client-metrics subscriptions, kept as Kafka's CLIENT_METRICS config
resources, and each client instance's latest push of its metrics

Revision ID: 7e3a9c1b5d42
Revises: 5c1e7a9b3d20
Create Date: 2026-11-29 19:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7e3a9c1b5d42"
down_revision: str | None = "5c1e7a9b3d20"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "client_metrics_configs",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("config", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(32768), nullable=False),
    )
    op.create_table(
        "client_telemetry",
        sa.Column("client_instance_id", sa.String(36), primary_key=True),
        sa.Column("client_id", sa.String(255), nullable=False),
        sa.Column("software_name", sa.String(255), nullable=False),
        sa.Column("software_version", sa.String(255), nullable=False),
        sa.Column("source_address", sa.String(255), nullable=False),
        sa.Column("source_port", sa.Integer, nullable=False),
        sa.Column("pushed_at_ms", sa.BigInteger, nullable=False),
        sa.Column("expires_at_ms", sa.BigInteger, nullable=False),
        sa.Column("metrics", sa.LargeBinary, nullable=False),
    )
    op.create_index("ix_client_telemetry_expires", "client_telemetry", ["expires_at_ms"])


def downgrade() -> None:
    op.drop_index("ix_client_telemetry_expires", table_name="client_telemetry")
    op.drop_table("client_telemetry")
    op.drop_table("client_metrics_configs")
