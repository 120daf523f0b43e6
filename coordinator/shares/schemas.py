"""Bodies of the share group calls (docs/pages/http-api.md, Share groups), and of a transaction's
share acknowledgements."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from coordinator.core.schemas import (
    EPOCH_MAX,
    INT64_MAX,
    Offset,
    PartitionNumber,
    RequestModel,
    TopicName,
    TopicPartitionIn,
    TransactionalId,
)
from coordinator.groups.identity import MemberEpoch, MemberId

AckType = Literal["accept", "release", "reject", "renew"]
ACKS_MAX = 10_000


class ShareHeartbeatRequest(RequestModel):
    member_id: MemberId
    member_epoch: MemberEpoch
    subscribed_topics: Annotated[list[TopicName], Field(max_length=10_000)] | None = None
    rack_id: Annotated[str, Field(max_length=255)] | None = None


class TopicPartitionOut(BaseModel):
    topic: str
    partition: int


class ShareHeartbeatResponse(BaseModel):
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    # Given when it changed (and on joining); null: as last given.
    assignment: list[TopicPartitionOut] | None


class ShareFetchRequest(RequestModel):
    member_id: MemberId
    # None: the member's assignment.
    partitions: Annotated[list[TopicPartitionIn], Field(max_length=10_000)] | None = None
    max_records: Annotated[int, Field(ge=1, le=10_000)] = 500
    max_wait_ms: Annotated[int, Field(ge=0, le=30_000)] = 0
    encoding: Literal["utf8", "base64"] = "utf8"
    # False: acquire only, answering the acquired offsets without the records (a Spark driver
    # plans a micro-batch by them; its tasks read the records from the log).
    records: bool = True
    # Kafka's ShareFetch acquire modes (KIP-1206): whole batches, which may pass max_records to
    # end on a batch's edge, or exactly max_records at most.
    acquire_mode: Literal["batch_optimized", "record_limit"] = "batch_optimized"


class ShareRecordOut(BaseModel):
    topic: str
    partition: int
    offset: int
    key: str | None
    value: str | None
    headers: dict[str, str | None]
    timestamp: int
    delivery_count: int


class AcquiredOut(BaseModel):
    topic: str
    partition: int
    first_offset: int
    last_offset: int
    delivery_count: int


class ShareFetchResponse(BaseModel):
    records: list[ShareRecordOut]
    # The offsets acquired, as ranges (some may hold no record: compaction's gaps).
    acquired: list[AcquiredOut]
    acquisition_lock_timeout_ms: int


class Acknowledgement(RequestModel):
    topic: TopicName
    partition: PartitionNumber
    first_offset: Offset
    last_offset: Offset | None = None  # None: first_offset alone
    type: AckType

    @model_validator(mode="after")
    def _ordered(self) -> Acknowledgement:
        if self.last_offset is not None and self.last_offset < self.first_offset:
            raise ValueError("last_offset: at least first_offset")
        return self


Acknowledgements = Annotated[list[Acknowledgement], Field(min_length=1, max_length=ACKS_MAX)]


class ShareAcknowledgeRequest(RequestModel):
    member_id: MemberId
    acknowledgements: Acknowledgements


class ShareAcknowledgeResponse(BaseModel):
    acknowledged: int  # offsets
    acquisition_lock_timeout_ms: int


class ShareReleaseRequest(RequestModel):
    member_id: MemberId


class ShareMemberOut(BaseModel):
    member_id: str
    member_epoch: int
    client_id: str
    subscribed_topics: list[str]
    assignment: list[TopicPartitionOut]
    last_heartbeat_at: str | None


class ShareOffsetOut(BaseModel):
    topic: str
    partition: int
    start_offset: int
    lag: int | None


class ShareGroupDescription(BaseModel):
    group_id: str
    state: str
    group_epoch: int
    members: list[ShareMemberOut]
    offsets: list[ShareOffsetOut]


class ShareGroupSummary(BaseModel):
    group_id: str
    state: str
    members: int


class ShareGroupList(BaseModel):
    groups: list[ShareGroupSummary]


class ShareOffsetIn(RequestModel):
    topic: TopicName
    partition: PartitionNumber
    offset: Offset


class ResetShareOffsetsRequest(RequestModel):
    offsets: Annotated[list[ShareOffsetIn], Field(min_length=1, max_length=100_000)]


class ShareOffsetsResponse(BaseModel):
    offsets: list[ShareOffsetOut]


class GroupConfigEntry(BaseModel):
    name: str
    value: str
    source: Literal["GROUP", "DEFAULT"]


class GroupConfigList(BaseModel):
    configs: list[GroupConfigEntry]


class AlterGroupConfigs(RequestModel):
    set: Annotated[dict[str, Any], Field(max_length=100)] = Field(default_factory=dict)
    delete: Annotated[list[str], Field(max_length=100)] = Field(default_factory=list)


class TxnShareAcksRequest(RequestModel):
    producer_id: Annotated[int, Field(ge=0, le=INT64_MAX)]
    producer_epoch: Annotated[int, Field(ge=0, le=EPOCH_MAX)]
    group_id: TransactionalId
    member_id: MemberId
    acknowledgements: Acknowledgements
