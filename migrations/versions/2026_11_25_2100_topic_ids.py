"""topic ids: every topic gets a UUID at creation (Kafka's topic id), so a Kafka client sees a
deleted and recreated topic as a new one, and KIP-848's assignments (which name topics by id)
can be answered

Revision ID: 2e7b9f4c6a15
Revises: 9a4f2c7e1d38
Create Date: 2026-11-25 21:00:00.000000
"""

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "2e7b9f4c6a15"
down_revision: str | None = "9a4f2c7e1d38"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("topics") as batch:
        batch.add_column(sa.Column("topic_id", sa.Uuid, nullable=True))
    bind = op.get_bind()
    topics = sa.table("topics", sa.column("name", sa.String), sa.column("topic_id", sa.Uuid))
    for (name,) in bind.execute(sa.select(topics.c.name)).all():
        bind.execute(topics.update().where(topics.c.name == name).values(topic_id=uuid.uuid4()))
    with op.batch_alter_table("topics") as batch:
        batch.alter_column("topic_id", existing_type=sa.Uuid, nullable=False)
        batch.create_index("ix_topics_topic_id", ["topic_id"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("topics") as batch:
        batch.drop_index("ix_topics_topic_id")
        batch.drop_column("topic_id")
