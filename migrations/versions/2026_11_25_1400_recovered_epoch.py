"""recovered epoch: the producer id and epoch a KIP-360 InitProducerId raised the epoch from

Revision ID: 3b8e6d1f4a27
Revises: 9a3f5c7d2e10
Create Date: 2026-11-25 14:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "3b8e6d1f4a27"
down_revision: str | None = "9a3f5c7d2e10"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE ADD COLUMN on both stores (no batch-mode table copy).
    op.add_column("transactions", sa.Column("recovered_producer_id", sa.BigInteger, nullable=True))
    op.add_column("transactions", sa.Column("recovered_producer_epoch", sa.Integer, nullable=True))


def downgrade() -> None:
    op.drop_column("transactions", "recovered_producer_epoch")
    op.drop_column("transactions", "recovered_producer_id")
