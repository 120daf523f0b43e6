"""Kafka's ACLs (kafka-acls.sh, CreateAcls): one row per binding

Revision ID: 5c1e9a7d3b20
Revises: 2b6d8f0a4c13
Create Date: 2026-11-30 21:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5c1e9a7d3b20"
down_revision: str | None = "2b6d8f0a4c13"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BINDING = [
    "resource_type",
    "resource_name",
    "pattern_type",
    "principal",
    "host",
    "operation",
    "permission",
]


def upgrade() -> None:
    op.create_table(
        "acls",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("resource_type", sa.Integer, nullable=False),
        sa.Column("resource_name", sa.Text, nullable=False),
        sa.Column("pattern_type", sa.Integer, nullable=False),
        sa.Column("principal", sa.Text, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("operation", sa.Integer, nullable=False),
        sa.Column("permission", sa.Integer, nullable=False),
        sa.UniqueConstraint(*_BINDING, name="uq_acls_binding"),
    )


def downgrade() -> None:
    op.drop_table("acls")
