"""Bodies of the transaction calls (API.md, Transactions)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from coordinator.core.schemas import (
    EPOCH_MAX,
    INT32_MAX,
    INT64_MAX,
    GroupId,
    Offset,
    PartitionNumber,
    RequestModel,
    TopicName,
    TransactionalId,
)
from coordinator.groups.identity import MemberIdentity

ProducerIdValue = Annotated[int, Field(ge=0, le=INT64_MAX)]
EpochValue = Annotated[int, Field(ge=0, le=EPOCH_MAX)]


class TopicPartitionIn(RequestModel):
    topic: TopicName
    partition: PartitionNumber


class OffsetIn(RequestModel):
    topic: TopicName
    partition: PartitionNumber
    offset: Offset
    metadata: Annotated[str, Field(max_length=4096)] | None = None
    # Beyond API.md: Kafka's committed_leader_epoch, kept and given back to Kafka's OffsetFetch.
    leader_epoch: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = None


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
