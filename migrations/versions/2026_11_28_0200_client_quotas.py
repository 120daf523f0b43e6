"""client quotas: a user's (or the default user's) controller mutation rate, set by Kafka's
AlterClientQuotas (`kafka-configs --entity-type users`); the user "" is the default user

Revision ID: 5c1e7a9b3d20
Revises: 9d2f4a6c8e15
Create Date: 2026-11-28 02:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5c1e7a9b3d20"
down_revision: str | None = "9d2f4a6c8e15"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "client_quotas",
        sa.Column("user_name", sa.String(255), primary_key=True),
        sa.Column("quota_key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("client_quotas")
