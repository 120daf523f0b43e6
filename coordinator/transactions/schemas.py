"""Bodies of the transaction calls (docs/pages/http-api.md, Transactions)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from coordinator.core.schemas import (
    EPOCH_MAX,
    INT64_MAX,
    GroupId,
    RequestModel,
    TopicPartitionIn,
    TransactionalId,
)
from coordinator.groups.identity import MemberIdentity
from coordinator.groups.schemas import OffsetIn

ProducerIdValue = Annotated[int, Field(ge=0, le=INT64_MAX)]
EpochValue = Annotated[int, Field(ge=0, le=EPOCH_MAX)]


class Caller(RequestModel):
    producer_id: ProducerIdValue
    producer_epoch: EpochValue


class AddPartitionsRequest(Caller):
    partitions: Annotated[list[TopicPartitionIn], Field(min_length=1, max_length=10_000)]


class AddOffsetsRequest(Caller, MemberIdentity):
    group_id: GroupId
    offsets: Annotated[list[OffsetIn], Field(max_length=100_000)]


class PrepareRequest(Caller):
    pass


class EndTxnRequest(Caller):
    commit: bool


class StateResponse(BaseModel):
    state: str


class EndTxnResponse(BaseModel):
    state: str
    producer_id: int
    producer_epoch: int


class TopicPartitionOut(BaseModel):
    topic: str
    partition: int


class TransactionDescription(BaseModel):
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    started_at: str | None
    partitions: list[TopicPartitionOut]
    groups: list[str]
    # The domain's value of `started_at` (ms), for Kafka's DescribeTransactions; not in the JSON.
    started_ms: int | None = Field(default=None, exclude=True)


class GroupMember(RequestModel):
    transactional_id: TransactionalId
    producer_id: ProducerIdValue
    producer_epoch: EpochValue


class CommitGroupRequest(RequestModel):
    transactions: Annotated[list[GroupMember], Field(min_length=1, max_length=100_000)]
    abort_others_with_prefix: Annotated[str, Field(min_length=1, max_length=255)] | None = None


class CommittedMember(BaseModel):
    transactional_id: str
    producer_id: int
    producer_epoch: int


class CommitGroupResponse(BaseModel):
    committed: list[CommittedMember]
    aborted: list[str]


class TransactionList(BaseModel):
    transactions: list[TransactionDescription]


class PinnedPartition(BaseModel):
    topic: str
    partition: int
    producer_id: int
    current_txn_start_offset: int


class Hanging(BaseModel):
    transactions: list[TransactionDescription]
    partitions: list[PinnedPartition]
