"""side effects once per key

Revision ID: 5e1f0a15e0c7
Revises: 2d5bf9bded28
Create Date: 2026-11-24 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5e1f0a15e0c7"
down_revision: str | None = "2d5bf9bded28"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "effects",
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=True),
        sa.Column("fencing_token", sa.BigInteger(), nullable=False),
        sa.Column("lease_expires_ms", sa.BigInteger(), nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("completed_ms", sa.BigInteger(), nullable=True),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_effects")),
    )
    op.create_index(
        "ix_effects_state_completed_ms", "effects", ["state", "completed_ms"], unique=False
    )
    op.create_index(
        "ix_effects_state_lease_expires_ms", "effects", ["state", "lease_expires_ms"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_effects_state_lease_expires_ms", table_name="effects")
    op.drop_index("ix_effects_state_completed_ms", table_name="effects")
    op.drop_table("effects")
