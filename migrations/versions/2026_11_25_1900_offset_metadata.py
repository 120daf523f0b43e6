"""offset metadata as bytes, and the committed leader epoch: Kafka's offset-commit metadata may
hold any string, a NUL included, which Postgres text cannot; Kafka's OffsetFetch echoes the
leader epoch a client committed with

Revision ID: 7c1e4b9d2f60
Revises: 5d2a9c4e7b13
Create Date: 2026-11-25 19:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7c1e4b9d2f60"
down_revision: str | None = "5d2a9c4e7b13"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("group_offsets", "transaction_offsets")


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for table in TABLES:
        op.add_column(table, sa.Column("leader_epoch", sa.Integer, nullable=True))
        if postgres:
            op.execute(
                f"ALTER TABLE {table} ALTER COLUMN metadata TYPE bytea "
                "USING convert_to(metadata, 'UTF8')"
            )
        else:
            # SQLite keeps a value's own type: the declared type changes with a table copy,
            # the stored text becomes its bytes.
            with op.batch_alter_table(table) as batch:
                batch.alter_column("metadata", type_=sa.LargeBinary, existing_nullable=True)
            op.execute(f"UPDATE {table} SET metadata = CAST(metadata AS BLOB)")


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    for table in TABLES:
        if postgres:
            op.execute(
                f"ALTER TABLE {table} ALTER COLUMN metadata TYPE text "
                "USING convert_from(metadata, 'UTF8')"
            )
        else:
            op.execute(f"UPDATE {table} SET metadata = CAST(metadata AS TEXT)")
            with op.batch_alter_table(table) as batch:
                batch.alter_column("metadata", type_=sa.Text, existing_nullable=True)
        op.drop_column(table, "leader_epoch")
