"""delegation tokens (KIP-48): each token's owner, renewers, lifetimes, HMAC and the salt of its
SCRAM credential

Revision ID: 2b6d8f0a4c13
Revises: 7e3a9c1b5d42
Create Date: 2026-11-29 20:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "2b6d8f0a4c13"
down_revision: str | None = "7e3a9c1b5d42"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "delegation_tokens",
        sa.Column("token_id", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("requester", sa.String(255), nullable=False),
        sa.Column("renewers", sa.Text, nullable=False),
        sa.Column("issued_ms", sa.BigInteger, nullable=False),
        sa.Column("expiry_ms", sa.BigInteger, nullable=False),
        sa.Column("max_ms", sa.BigInteger, nullable=False),
        sa.Column("hmac", sa.LargeBinary, nullable=False),
        sa.Column("salt", sa.LargeBinary, nullable=False),
    )
    op.create_index("ix_delegation_tokens_hmac", "delegation_tokens", ["hmac"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_delegation_tokens_hmac", table_name="delegation_tokens")
    op.drop_table("delegation_tokens")
