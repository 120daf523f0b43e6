"""Brokers (several processes as one Kafka cluster) and each partition's leader and epoch

Revision ID: 5e1b7d3f9a42
Revises: 3a7c9e1f5b28
Create Date: 2026-12-02 03:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5e1b7d3f9a42"
down_revision: str | None = "3a7c9e1f5b28"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "brokers",
        sa.Column("broker_id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("rack", sa.String(255), nullable=True),
        sa.Column("lease_expires_ms", sa.BigInteger(), nullable=False),
        sa.Column("registered_ms", sa.BigInteger(), nullable=False),
    )
    with op.batch_alter_table("partitions") as batch:
        batch.add_column(sa.Column("leader_id", sa.Integer(), nullable=True))
        batch.add_column(
            sa.Column("leader_epoch", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("partitions") as batch:
        batch.drop_column("leader_epoch")
        batch.drop_column("leader_id")
    op.drop_table("brokers")
