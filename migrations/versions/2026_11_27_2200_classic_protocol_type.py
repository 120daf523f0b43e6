"""classic protocol type: a classic group keeps the protocol type its members join with, so groups
of Kafka Connect's workers ("connect") or Schema Registry's ("sr") run beside consumers' (null is
Kafka's consumer protocol)

Revision ID: 9d2f4a6c8e15
Revises: 4b8e2d6f1a73
Create Date: 2026-11-27 22:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9d2f4a6c8e15"
down_revision: str | None = "4b8e2d6f1a73"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("consumer_groups") as batch:
        batch.add_column(sa.Column("classic_protocol_type", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("consumer_groups") as batch:
        batch.drop_column("classic_protocol_type")
