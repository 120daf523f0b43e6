"""Bodies of the consumer group calls (docs/pages/http-api.md, Consumer groups: offsets and
membership)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from coordinator.core.schemas import (
    INT32_MAX,
    Offset,
    PartitionNumber,
    RequestModel,
    TopicName,
    TopicPartitionIn,
)
from coordinator.groups.identity import MemberEpoch, MemberId, MemberIdentity

TimeoutMs = Annotated[int, Field(ge=1, le=INT32_MAX)]


class OffsetIn(RequestModel):
    topic: TopicName
    partition: PartitionNumber
    offset: Offset
    metadata: Annotated[str, Field(max_length=4096)] | None = None
    # Beyond docs/pages/http-api.md: Kafka's committed_leader_epoch, kept and given back to Kafka's
    # OffsetFetch.
    leader_epoch: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = None


class CommitOffsetsRequest(MemberIdentity):
    offsets: Annotated[list[OffsetIn], Field(min_length=1, max_length=100_000)]


class OffsetOut(BaseModel):
    topic: str
    partition: int
    offset: int
    metadata: str | None
    # For Kafka's OffsetFetch only: not in the HTTP API's answer.
    leader_epoch: int | None = Field(default=None, exclude=True)


class OffsetsResponse(BaseModel):
    offsets: list[OffsetOut]


class HeartbeatRequest(RequestModel):
    member_id: MemberId
    member_epoch: MemberEpoch
    subscribed_topics: Annotated[list[TopicName], Field(max_length=10_000)] | None = None
    owned_partitions: Annotated[list[TopicPartitionIn], Field(max_length=100_000)] | None = None
    rebalance_timeout_ms: TimeoutMs = 300_000
    # Beyond docs/pages/http-api.md: the client's session.timeout.ms (bounded by the service's min
    # and max; default COORDINATOR_GROUP_SESSION_TIMEOUT_MS) and client.id (default: its
    # User-Agent).
    session_timeout_ms: TimeoutMs | None = None
    client_id: Annotated[str, Field(max_length=255)] | None = None


class TopicPartitionOut(BaseModel):
    topic: str
    partition: int


class HeartbeatResponse(BaseModel):
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: list[TopicPartitionOut]


class MemberDescription(BaseModel):
    member_id: str
    member_epoch: int
    client_id: str
    client_host: str
    # "consumer" (heartbeats over HTTP) or "classic" (JoinGroup over the Kafka listener), and a
    # classic member's assignor (the protocol name it chose, e.g. "range").
    protocol: str
    assignor: str | None
    subscribed_topics: list[str]
    # What the member was last told to own.
    assignment: list[TopicPartitionOut]
    # Where the assignor wants the member to end up; equal to `assignment` once reconciled.
    target_assignment: list[TopicPartitionOut]
    last_heartbeat_at: str | None
    # For Kafka's DescribeGroups only, not in the HTTP API's answer: a classic member's instance id,
    # its metadata for the group's protocol and the leader's assignment, as the client sent them.
    group_instance_id: str | None = Field(default=None, exclude=True)
    metadata: bytes | None = Field(default=None, exclude=True)
    assignment_data: bytes | None = Field(default=None, exclude=True)


class PartitionOffset(BaseModel):
    topic: str
    partition: int
    offset: int
    high_watermark: int
    lag: int
    # The member that owns the partition now, or null.
    member_id: str | None


class GroupDescription(BaseModel):
    group_id: str
    state: str
    # "consumer" (this API's membership), "classic" (Kafka's JoinGroup), or null for a group that
    # only ever had offsets committed.
    type: str | None
    group_epoch: int
    assignment_epoch: int
    members: list[MemberDescription]
    offsets: list[PartitionOffset]
    # For Kafka's DescribeGroups only: a classic group's state by Kafka's name, and its protocol.
    classic_state: str | None = Field(default=None, exclude=True)
    protocol_name: str | None = Field(default=None, exclude=True)
    classic_protocol_type: str | None = Field(default=None, exclude=True)


class GroupSummary(BaseModel):
    group_id: str
    state: str
    type: str | None
    members: int
    # For Kafka's ListGroups only: a classic group's state by Kafka's name, its protocol type.
    classic_state: str | None = Field(default=None, exclude=True)
    classic_protocol_type: str | None = Field(default=None, exclude=True)


class GroupList(BaseModel):
    groups: list[GroupSummary]


class GroupDescriptions(BaseModel):
    groups: list[GroupDescription]


class DeletedGroup(BaseModel):
    group_id: str
