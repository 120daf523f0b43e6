"""Share groups' share partitions: each one's state (`coordinator.shares.inflight`).

A share group is a row of `consumer_groups` of type `share` (`groups.models.SHARE`): one name
space for every kind of group, as Kafka keeps it, and the same row lock first. Its members
(`groups.models.ShareMember`) and its share partitions hang off it, and go with it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from coordinator.core.tables import Base


class SharePartitionRow(Base):
    """One share partition: the group's state of one topic partition, locked by every call that
    acquires, acknowledges or releases its records."""

    __tablename__ = "share_partitions"

    group_id: Mapped[str] = mapped_column(
        String(255),
        ForeignKey("consumer_groups.group_id", ondelete="CASCADE"),
        primary_key=True,
    )
    topic: Mapped[str] = mapped_column(String(249), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    start_offset: Mapped[int] = mapped_column(BigInteger)
    end_offset: Mapped[int] = mapped_column(BigInteger)
    # Raised by every reset of its offsets (Kafka's state epoch).
    state_epoch: Mapped[int] = mapped_column(Integer)
    # The in-flight spans (`inflight.Span.row()`), in offset order.
    spans: Mapped[list[list[Any]]] = mapped_column(JSON)
    # The earliest lock deadline among them: where the sweep releases timed-out records.
    next_deadline_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    updated_ms: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_share_partitions_next_deadline_ms", "next_deadline_ms"),)
