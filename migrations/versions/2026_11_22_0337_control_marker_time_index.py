"""control marker time index

Revision ID: 2db85b65fee8
Revises: c410a4c4cba3
Create Date: 2026-11-22 03:37:49.282317
"""

from collections.abc import Sequence
from contextlib import nullcontext

import sqlalchemy as sa
from alembic import op

revision: str = "2db85b65fee8"
down_revision: str | None = "c410a4c4cba3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WHERE = sa.text("control IS NOT NULL")


def upgrade() -> None:
    # Postgres builds it CONCURRENTLY (outside the migration's transaction): batches is the big
    # table, and a plain CREATE INDEX would hold up every append while it is built.
    postgres = op.get_bind().dialect.name == "postgresql"
    with op.get_context().autocommit_block() if postgres else nullcontext():
        op.create_index(
            "ix_batches_control_timestamp",
            "batches",
            ["timestamp"],
            unique=False,
            sqlite_where=WHERE,
            postgresql_where=WHERE,
            postgresql_concurrently=postgres,
        )


def downgrade() -> None:
    op.drop_index("ix_batches_control_timestamp", table_name="batches")
