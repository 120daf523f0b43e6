"""Share groups (KIP-932): members, share partitions, acknowledgements held by transactions (and
the transactions' flag that they hold some), and group configs

Revision ID: 8d2f4b6a1c37
Revises: 5c1e9a7d3b20
Create Date: 2026-12-01 23:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "8d2f4b6a1c37"
down_revision: str | None = "5c1e9a7d3b20"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("transactions") as batch:
        batch.add_column(
            sa.Column("share_acks", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.create_table(
        "group_configs",
        sa.Column("group_id", sa.String(255), primary_key=True),
        sa.Column("configs", sa.JSON(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "share_group_members",
        sa.Column(
            "group_id",
            sa.String(255),
            sa.ForeignKey(
                "consumer_groups.group_id",
                ondelete="CASCADE",
                name="fk_share_group_members_group_id_consumer_groups",
            ),
            primary_key=True,
        ),
        sa.Column("member_id", sa.String(255), primary_key=True),
        sa.Column("member_epoch", sa.Integer(), nullable=False),
        sa.Column("rack_id", sa.String(255), nullable=True),
        sa.Column("client_id", sa.String(255), nullable=False),
        sa.Column("client_host", sa.String(255), nullable=False),
        sa.Column("subscribed_topics", sa.JSON(), nullable=False),
        sa.Column("assigned", sa.JSON(), nullable=False),
        sa.Column("session_timeout_ms", sa.Integer(), nullable=False),
        sa.Column("joined_ms", sa.BigInteger(), nullable=False),
        sa.Column("last_heartbeat_ms", sa.BigInteger(), nullable=False),
        sa.Column("session_deadline_ms", sa.BigInteger(), nullable=False),
    )
    op.create_index(
        "ix_share_group_members_session_deadline_ms",
        "share_group_members",
        ["session_deadline_ms"],
    )
    op.create_table(
        "share_partitions",
        sa.Column(
            "group_id",
            sa.String(255),
            sa.ForeignKey(
                "consumer_groups.group_id",
                ondelete="CASCADE",
                name="fk_share_partitions_group_id_consumer_groups",
            ),
            primary_key=True,
        ),
        sa.Column("topic", sa.String(249), primary_key=True),
        sa.Column("partition", sa.Integer(), primary_key=True),
        sa.Column("start_offset", sa.BigInteger(), nullable=False),
        sa.Column("end_offset", sa.BigInteger(), nullable=False),
        sa.Column("state_epoch", sa.Integer(), nullable=False),
        sa.Column("spans", sa.JSON(), nullable=False),
        sa.Column("next_deadline_ms", sa.BigInteger(), nullable=True),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
    )
    op.create_index(
        "ix_share_partitions_next_deadline_ms", "share_partitions", ["next_deadline_ms"]
    )
    op.create_table(
        "transaction_share_acks",
        sa.Column(
            "transactional_id",
            sa.String(255),
            sa.ForeignKey(
                "transactions.transactional_id",
                ondelete="CASCADE",
                name="fk_transaction_share_acks_transactional_id_transactions",
            ),
            primary_key=True,
        ),
        sa.Column("group_id", sa.String(255), primary_key=True),
        sa.Column("topic", sa.String(249), primary_key=True),
        sa.Column("partition", sa.Integer(), primary_key=True),
    )


def downgrade() -> None:
    op.drop_table("transaction_share_acks")
    op.drop_index("ix_share_partitions_next_deadline_ms", table_name="share_partitions")
    op.drop_table("share_partitions")
    op.drop_index("ix_share_group_members_session_deadline_ms", table_name="share_group_members")
    op.drop_table("share_group_members")
    op.drop_table("group_configs")
    with op.batch_alter_table("transactions") as batch:
        batch.drop_column("share_acks")
