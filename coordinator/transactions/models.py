"""Coordinator state: transactional.id -> (producer id, state), with the partitions and group
offsets of its open transaction. The producer's epoch lives on its `producer_ids` row."""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, ForeignKey, Index, Integer, String, false
from sqlalchemy.orm import Mapped, mapped_column

from coordinator.core.tables import Base, FreeText


class Transaction(Base):
    __tablename__ = "transactions"

    transactional_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    producer_id: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))
    timeout_ms: Mapped[int] = mapped_column(BigInteger)
    # When the open transaction began (ms since the epoch); null unless Ongoing or Prepared.
    started_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # When the coordinator aborts it: Ongoing at start + timeout, Prepared at prepare + the
    # prepared timeout.
    deadline_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Last change of state; idle ids (Empty or Complete) expire from here.
    updated_ms: Mapped[int] = mapped_column(BigInteger)
    # Who ended the last transaction: that producer id and epoch, the outcome, and why (ABORT_*
    # reasons), so a retried EndTxn is answered again and a timed-out producer is told so.
    last_producer_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_producer_epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    last_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # The commit-group call that ended it, so a retried commit-group gets the same answer.
    last_group_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # The producer id and epoch a recovering producer's InitProducerId (KIP-360) raised the epoch
    # from, so its retry gets the same answer; cleared by every other raise.
    recovered_producer_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    recovered_producer_epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The open transaction holds share-group acknowledgements (`TransactionShareAck`): its end
    # settles them, so it takes the locking path (EndTxn's one statement leaves it alone).
    share_acks: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    __table_args__ = (
        Index("ix_transactions_state_deadline", "state", "deadline_ms"),
        Index("ix_transactions_last_group_key", "last_group_key"),
    )


class TransactionPartition(Base):
    __tablename__ = "transaction_partitions"

    transactional_id: Mapped[str] = mapped_column(
        String(255),
        ForeignKey("transactions.transactional_id", ondelete="CASCADE"),
        primary_key=True,
    )
    topic: Mapped[str] = mapped_column(String(249), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    # The producer id whose records the transaction holds here: its markers clear this id's state
    # even if the transactional id moved to a new producer id since (epoch exhaustion).
    producer_id: Mapped[int] = mapped_column(BigInteger)


class TimedOutEpoch(Base):
    """A producer id and epoch whose transaction the coordinator aborted after its timeout: its
    calls are told TRANSACTION_TIMED_OUT, not PRODUCER_FENCED, for as long as the id lives."""

    __tablename__ = "timed_out_epochs"

    transactional_id: Mapped[str] = mapped_column(
        String(255),
        ForeignKey("transactions.transactional_id", ondelete="CASCADE"),
        primary_key=True,
    )
    producer_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    producer_epoch: Mapped[int] = mapped_column(Integer, primary_key=True)


class TransactionOffset(Base):
    """A group offset pending inside an open transaction; applied only if it commits."""

    __tablename__ = "transaction_offsets"

    transactional_id: Mapped[str] = mapped_column(
        String(255),
        ForeignKey("transactions.transactional_id", ondelete="CASCADE"),
        primary_key=True,
    )
    group_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    topic: Mapped[str] = mapped_column(String(249), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    offset: Mapped[int] = mapped_column(BigInteger)
    # Kafka's offset metadata: any string, a NUL included (stored as UTF-8 bytes).
    metadata_: Mapped[str | None] = mapped_column("metadata", FreeText, nullable=True)
    # The leader epoch the client committed with (Kafka's committed_leader_epoch), echoed.
    leader_epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)

    __table_args__ = (Index("ix_transaction_offsets_group", "group_id", "topic", "partition"),)


class TransactionShareAck(Base):
    """A share partition where the open transaction holds acknowledgements (of records a share
    group member acquired): its end settles them there (`coordinator.shares.service`)."""

    __tablename__ = "transaction_share_acks"

    transactional_id: Mapped[str] = mapped_column(
        String(255),
        ForeignKey("transactions.transactional_id", ondelete="CASCADE"),
        primary_key=True,
    )
    group_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    topic: Mapped[str] = mapped_column(String(249), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
