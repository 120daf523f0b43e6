"""append token: each partition keeps the mark of the append group that last moved its high
watermark, so a group sent while the one before it writes the same partition (pipelined
appends) is written only right after that one

Revision ID: 6e2a8c4f0b17
Revises: 5c1e7a9b3d20
Create Date: 2026-11-29 14:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "6e2a8c4f0b17"
down_revision: str | None = "5c1e7a9b3d20"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("partitions") as batch:
        batch.add_column(sa.Column("append_token", sa.BigInteger, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("partitions") as batch:
        batch.drop_column("append_token")
