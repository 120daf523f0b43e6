"""Tables of the partition logs.

One row per produced batch, holding the record batch in Kafka's format (`recordbatch`) as the
producer built it, its base offset set by the log; a control marker is a row of its own (a Kafka
control batch); a per-partition counter row whose lock serialises appends; producer state per
(partition, pid).
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    Uuid,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from coordinator.core.tables import Base


class Topic(Base):
    __tablename__ = "topics"

    name: Mapped[str] = mapped_column(String(249), primary_key=True)
    partitions: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # The configs set on this topic (JSON object of Kafka names to string values; see `configs`),
    # read by the produce path in the statement that locks the partition.
    configs: Mapped[str] = mapped_column(Text, server_default="{}")
    # Kafka's topic id: a new one for every topic created, so a topic deleted and created again
    # under its name is a new topic to a client (Metadata v10+, KIP-848's assignments).
    topic_id: Mapped[uuid.UUID] = mapped_column(Uuid, default=uuid.uuid4)
    # The replication factor Kafka's CreateTopics asked for, kept as the topic's stated factor:
    # the copies are the database's, and Metadata lists as many replicas (all this one broker).
    replication_factor: Mapped[int] = mapped_column(Integer, server_default="1")

    __table_args__ = (Index("ix_topics_topic_id", "topic_id", unique=True),)


class Partition(Base):
    __tablename__ = "partitions"

    topic: Mapped[str] = mapped_column(
        String(249), ForeignKey("topics.name", ondelete="CASCADE"), primary_key=True
    )
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    log_start_offset: Mapped[int] = mapped_column(BigInteger, default=0)
    # The offset the next appended record gets; advanced only under this row's lock.
    high_watermark: Mapped[int] = mapped_column(BigInteger, default=0)
    # Compaction's checkpoint (`coordinator.log.cleaner`): the end of the range it last cleaned,
    # and when a tombstone it kept may go (null: none kept). Nothing new below the first and
    # not yet the second: the partition is skipped.
    cleaned_offset: Mapped[int] = mapped_column(BigInteger, server_default="0")
    clean_again_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The broker that leads the partition on the Kafka door (`coordinator.cluster`; null: none
    # placed yet) and its leader epoch, raised by every move. A Kafka append names the leader and
    # epoch it was taken under, and is written only if they are still these (the fence).
    leader_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    leader_epoch: Mapped[int] = mapped_column(Integer, server_default="0")


class Batch(Base):
    __tablename__ = "batches"

    topic: Mapped[str] = mapped_column(String(249), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    base_offset: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    last_offset: Mapped[int] = mapped_column(BigInteger)
    producer_id: Mapped[int] = mapped_column(BigInteger)
    producer_epoch: Mapped[int] = mapped_column(Integer)
    base_sequence: Mapped[int] = mapped_column(Integer)
    last_sequence: Mapped[int] = mapped_column(Integer)
    # Append time, milliseconds since the Unix epoch.
    timestamp: Mapped[int] = mapped_column(BigInteger)
    # The batch's newest record timestamp (its max timestamp; the append time under
    # LogAppendTime), what retention by time looks at.
    max_timestamp: Mapped[int] = mapped_column(BigInteger)
    # Bytes of `payload`, what retention by size adds up.
    size: Mapped[int] = mapped_column(Integer)
    # A control marker's: the first offset of the transaction it ends on this partition (null
    # when the transaction wrote nothing here). Abort markers with it give Kafka's
    # aborted-transactions list of a fetch.
    is_transactional: Mapped[bool] = mapped_column(Boolean)
    # Null for data; CONTROL_ABORT or CONTROL_COMMIT for a transaction marker.
    control: Mapped[int | None] = mapped_column(SmallInteger, nullable=True)
    aborted: Mapped[bool] = mapped_column(Boolean, default=False)
    first_offset: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    record_count: Mapped[int] = mapped_column(Integer)
    # The record batch, Kafka's format (magic 2), base offset set to `base_offset`.
    payload: Mapped[bytes] = mapped_column(LargeBinary)

    __table_args__ = (
        ForeignKeyConstraint(
            ["topic", "partition"],
            ["partitions.topic", "partitions.partition"],
            ondelete="CASCADE",
        ),
        # The last line of defence against a duplicate: one batch per (pid, epoch, sequence).
        Index(
            "uq_batches_producer_sequence",
            "topic",
            "partition",
            "producer_id",
            "producer_epoch",
            "base_sequence",
            unique=True,
            sqlite_where=text("producer_id >= 0 AND control IS NULL"),
            postgresql_where=text("producer_id >= 0 AND control IS NULL"),
        ),
        # Control markers by time, for the admin stats' commits and aborts per minute.
        Index(
            "ix_batches_control_timestamp",
            "timestamp",
            sqlite_where=text("control IS NOT NULL"),
            postgresql_where=text("control IS NOT NULL"),
        ),
        # Abort markers by offset, for the aborted transactions of a fetched range.
        Index(
            "ix_batches_abort_markers",
            "topic",
            "partition",
            "base_offset",
            sqlite_where=text("control = 0"),
            postgresql_where=text("control = 0"),
        ),
    )


# Kafka's control record types (the `control` column of a marker row).
CONTROL_ABORT = 0
CONTROL_COMMIT = 1


class ProducerState(Base):
    __tablename__ = "producer_states"

    topic: Mapped[str] = mapped_column(String(249), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    producer_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    producer_epoch: Mapped[int] = mapped_column(Integer)
    last_sequence: Mapped[int] = mapped_column(Integer)
    last_offset: Mapped[int] = mapped_column(BigInteger)
    last_timestamp: Mapped[int] = mapped_column(BigInteger)
    # First offset of this producer's open transaction on the partition: pins the LSO.
    current_txn_first_offset: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    __table_args__ = (
        ForeignKeyConstraint(
            ["topic", "partition"],
            ["partitions.topic", "partitions.partition"],
            ondelete="CASCADE",
        ),
        # Producer-id expiry asks whether a producer id has state left anywhere. An unchanging
        # column, so appends' updates of a state row stay HOT on Postgres.
        Index("ix_producer_states_producer_id", "producer_id"),
    )
