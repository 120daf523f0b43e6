"""scram credentials: the salted keys of SASL/SCRAM logins to the Kafka listener

Revision ID: 5d2a9c4e7b13
Revises: 3b8e6d1f4a27
Create Date: 2026-11-25 18:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5d2a9c4e7b13"
down_revision: str | None = "3b8e6d1f4a27"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "scram_credentials",
        sa.Column("principal", sa.String(255), nullable=False),
        sa.Column("mechanism", sa.String(16), nullable=False),
        sa.Column("salt", sa.LargeBinary, nullable=False),
        sa.Column("stored_key", sa.LargeBinary, nullable=False),
        sa.Column("server_key", sa.LargeBinary, nullable=False),
        sa.Column("iterations", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("principal", "mechanism", name=op.f("pk_scram_credentials")),
    )


def downgrade() -> None:
    op.drop_table("scram_credentials")
