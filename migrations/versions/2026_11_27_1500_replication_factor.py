"""replication factor: the factor a topic was created with is kept as its stated factor (Kafka's
CreateTopics may ask any; durability here is the database's), and Metadata lists as many
replicas, as a cluster of that factor would

Revision ID: 4b8e2d6f1a73
Revises: 7c1d3e5f9b20
Create Date: 2026-11-27 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "4b8e2d6f1a73"
down_revision: str | None = "7c1d3e5f9b20"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("topics") as batch:
        batch.add_column(
            sa.Column("replication_factor", sa.Integer, nullable=False, server_default="1")
        )


def downgrade() -> None:
    with op.batch_alter_table("topics") as batch:
        batch.drop_column("replication_factor")
