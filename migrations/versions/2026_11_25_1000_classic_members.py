"""classic members: the protocol each group member speaks, and a classic member's assignor

Revision ID: 9a3f5c7d2e10
Revises: 7c1ea2e4b0d1
Create Date: 2026-11-25 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9a3f5c7d2e10"
down_revision: str | None = "7c1ea2e4b0d1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE ADD COLUMN on both stores (no batch-mode table copy).
    op.add_column(
        "group_members",
        sa.Column("protocol", sa.String(16), nullable=False, server_default="consumer"),
    )
    op.add_column("group_members", sa.Column("assignor", sa.String(255), nullable=True))


def downgrade() -> None:
    op.drop_column("group_members", "assignor")
    op.drop_column("group_members", "protocol")
