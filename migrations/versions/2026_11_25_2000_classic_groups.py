"""classic groups: Kafka's classic protocol run as Kafka runs it (a JoinGroup barrier, a leader
that assigns, SyncGroup, static membership) needs the group's phase, leader and chosen protocol,
and each member's protocols, assignment and group instance id

Revision ID: 9a4f2c7e1d38
Revises: 7c1e4b9d2f60
Create Date: 2026-11-25 20:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9a4f2c7e1d38"
down_revision: str | None = "7c1e4b9d2f60"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("consumer_groups") as batch:
        batch.add_column(sa.Column("classic_state", sa.String(24), nullable=True))
        batch.add_column(sa.Column("leader_id", sa.String(255), nullable=True))
        batch.add_column(sa.Column("protocol_name", sa.String(255), nullable=True))
        batch.add_column(sa.Column("phase_deadline_ms", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("join_wait_until_ms", sa.BigInteger, nullable=True))
    with op.batch_alter_table("group_members") as batch:
        batch.add_column(sa.Column("group_instance_id", sa.String(255), nullable=True))
        batch.add_column(sa.Column("classic_protocols", sa.JSON, nullable=True))
        batch.add_column(sa.Column("classic_assignment", sa.LargeBinary, nullable=True))
        batch.add_column(sa.Column("awaiting", sa.String(8), nullable=True))
        batch.create_index(
            "ix_group_members_group_id_group_instance_id",
            ["group_id", "group_instance_id"],
            unique=True,
        )
    op.create_index(
        "ix_consumer_groups_phase_deadline_ms", "consumer_groups", ["phase_deadline_ms"]
    )


def downgrade() -> None:
    op.drop_index("ix_consumer_groups_phase_deadline_ms", table_name="consumer_groups")
    with op.batch_alter_table("group_members") as batch:
        batch.drop_index("ix_group_members_group_id_group_instance_id")
        for column in ("awaiting", "classic_assignment", "classic_protocols", "group_instance_id"):
            batch.drop_column(column)
    with op.batch_alter_table("consumer_groups") as batch:
        for column in (
            "join_wait_until_ms",
            "phase_deadline_ms",
            "protocol_name",
            "leader_id",
            "classic_state",
        ):
            batch.drop_column(column)
