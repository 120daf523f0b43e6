"""Answers of the admin calls (API.md, Admin)."""

from __future__ import annotations

from pydantic import BaseModel

from coordinator.transactions.schemas import TransactionDescription


class TransactionList(BaseModel):
    transactions: list[TransactionDescription]


class ProducerInfo(BaseModel):
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    current_txn_start_offset: int | None


class ProducerList(BaseModel):
    producers: list[ProducerInfo]


class PinnedPartition(BaseModel):
    topic: str
    partition: int
    producer_id: int
    current_txn_start_offset: int


class Hanging(BaseModel):
    transactions: list[TransactionDescription]
    partitions: list[PinnedPartition]
