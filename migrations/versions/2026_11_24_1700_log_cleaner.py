"""log cleaner: compaction checkpoint, producer states by producer id

Revision ID: 7c1ea2e4b0d1
Revises: 5e1f0a15e0c7
Create Date: 2026-11-24 17:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7c1ea2e4b0d1"
down_revision: str | None = "5e1f0a15e0c7"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE ADD COLUMN on both stores: SQLite's batch mode would copy and drop the
    # table, and the drop would cascade to every batch.
    op.add_column(
        "partitions",
        sa.Column("cleaned_offset", sa.BigInteger(), nullable=False, server_default="0"),
    )
    op.add_column("partitions", sa.Column("clean_again_at", sa.BigInteger(), nullable=True))
    op.create_index(
        "ix_producer_states_producer_id", "producer_states", ["producer_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_producer_states_producer_id", table_name="producer_states")
    op.drop_column("partitions", "clean_again_at")
    op.drop_column("partitions", "cleaned_offset")
