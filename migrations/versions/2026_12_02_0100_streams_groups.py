"""Streams groups (KIP-1071): their topologies, and their members' streams metadata

Revision ID: 3a7c9e1f5b28
Revises: 8d2f4b6a1c37
Create Date: 2026-12-02 01:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "3a7c9e1f5b28"
down_revision: str | None = "8d2f4b6a1c37"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "streams_groups",
        sa.Column(
            "group_id",
            sa.String(255),
            sa.ForeignKey(
                "consumer_groups.group_id",
                ondelete="CASCADE",
                name="fk_streams_groups_group_id_consumer_groups",
            ),
            primary_key=True,
        ),
        sa.Column("topology_epoch", sa.Integer(), nullable=False),
        sa.Column("topology", sa.JSON(), nullable=False),
        sa.Column("task_counts", sa.JSON(), nullable=False),
        sa.Column("statuses", sa.JSON(), nullable=False),
        sa.Column("shutdown", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
    )
    with op.batch_alter_table("group_members") as batch:
        batch.add_column(sa.Column("streams", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("group_members") as batch:
        batch.drop_column("streams")
    op.drop_table("streams_groups")
