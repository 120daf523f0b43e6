"""Consumer groups: committed offsets, and the membership the coordinator runs (KIP-848's shape).

A group row is locked first by everything that changes its membership or checks a commit against
it; members, their target assignment and the partitions they own hang off it. Ownership has one
row per partition (the primary key), so no partition can ever have two owners, whatever a bug
elsewhere tries: the constraint is the last line of defence.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from coordinator.core.tables import Base, FreeText

# A group's type (`ConsumerGroup.protocol_type`) and how a member talks to the coordinator
# (`GroupMember.protocol`), as Kafka 4 has them: a consumer group is assigned by the coordinator
# (REST heartbeats, KIP-848's shape; classic members joining it are assigned too, as Kafka's
# consumer groups take classic members during an upgrade); a classic group runs Kafka's classic
# protocol, where a leader among the members assigns (`coordinator.groups.classic`).
CONSUMER = "consumer"
CLASSIC = "classic"
# A share group (KIP-932): its members and share partitions are `coordinator.shares`'.
SHARE = "share"
# A streams group (KIP-1071): its members are `GroupMember`s whose tasks the coordinator assigns
# as a consumer group's partitions (`coordinator.groups.streams`), its topology `StreamsGroup`.
STREAMS = "streams"
# Kafka's consumer protocol's type: the classic protocol type whose metadata the coordinator reads.
CONSUMER_PROTOCOL = "consumer"


class GroupOffset(Base):
    __tablename__ = "group_offsets"

    group_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    topic: Mapped[str] = mapped_column(String(249), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    offset: Mapped[int] = mapped_column(BigInteger)
    # Kafka's offset metadata: any string, a NUL included (stored as UTF-8 bytes).
    metadata_: Mapped[str | None] = mapped_column("metadata", FreeText, nullable=True)
    # The leader epoch the client committed with (Kafka's committed_leader_epoch), echoed.
    leader_epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)
    committed_ms: Mapped[int] = mapped_column(BigInteger)


class ConsumerGroup(Base):
    """A group: created by its first member or its first offset commit, removed only by
    `DELETE /v1/groups/{group}`, so its epochs never go back while it exists."""

    __tablename__ = "consumer_groups"

    group_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    # CONSUMER once a member joined; null for a group that only ever had offsets.
    protocol_type: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # Raised whenever the target assignment must be computed anew: a member joins, leaves or
    # expires, a subscription changes, a subscribed topic gains or loses partitions.
    group_epoch: Mapped[int] = mapped_column(Integer)
    # The group epoch the stored target assignment was computed for. Below `group_epoch` the group
    # is Assigning: a classic group waiting for its leader's assignment (the coordinator's own
    # assignor runs in the unit of work that raised the epoch, so a consumer group never is).
    assignment_epoch: Mapped[int] = mapped_column(Integer)
    # Every member epoch is taken from this one counter, so epochs never repeat within the group,
    # not even for a member that left and joined again under its old member id.
    last_member_epoch: Mapped[int] = mapped_column(Integer)
    # Partition count of each subscribed topic when the target was computed; a difference seen at
    # a heartbeat (a topic created, grown or deleted) computes it anew.
    subscribed_partitions: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_ms: Mapped[int] = mapped_column(BigInteger)
    updated_ms: Mapped[int] = mapped_column(BigInteger)
    # A classic group only (`coordinator.groups.classic`); its generation is `group_epoch`.
    # Kafka's state: Empty, PreparingRebalance, CompletingRebalance or Stable.
    classic_state: Mapped[str | None] = mapped_column(String(24), nullable=True)
    leader_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # The protocol (assignor) chosen among the members' for the generation.
    protocol_name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # The protocol type a classic group's members join with: Kafka's consumer protocol, or
    # another that the coordinator keeps opaque (Kafka Connect's "connect", Schema Registry's
    # "sr"); set by the first member of an empty group (null: "consumer").
    # Text: Kafka bounds it only by its frame (a string of up to 32767 bytes).
    classic_protocol_type: Mapped[str | None] = mapped_column(Text, nullable=True)
    # PreparingRebalance: the join phase ends by then whoever joined; CompletingRebalance: the
    # leader's SyncGroup is due by then.
    phase_deadline_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The initial rebalance of an empty group waits this long for more members (Kafka's
    # group.initial.rebalance.delay.ms), extended by each new one up to the deadline.
    join_wait_until_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)

    __table_args__ = (Index("ix_consumer_groups_phase_deadline_ms", "phase_deadline_ms"),)


class GroupMember(Base):
    __tablename__ = "group_members"

    group_id: Mapped[str] = mapped_column(
        String(255),
        ForeignKey("consumer_groups.group_id", ondelete="CASCADE"),
        primary_key=True,
    )
    member_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    member_epoch: Mapped[int] = mapped_column(Integer)
    # Accepted on heartbeats too, for a member whose last answer was lost.
    previous_member_epoch: Mapped[int] = mapped_column(Integer)
    client_id: Mapped[str] = mapped_column(String(255))
    client_host: Mapped[str] = mapped_column(String(255))
    subscribed_topics: Mapped[list[str]] = mapped_column(JSON)
    # What the member was last told to own: [[topic, partition], ...], sorted.
    assigned: Mapped[list[list[Any]]] = mapped_column(JSON)
    rebalance_timeout_ms: Mapped[int] = mapped_column(Integer)
    session_timeout_ms: Mapped[int] = mapped_column(Integer)
    joined_ms: Mapped[int] = mapped_column(BigInteger)
    last_heartbeat_ms: Mapped[int] = mapped_column(BigInteger)
    # Last heartbeat + session timeout: past it the member is gone.
    session_deadline_ms: Mapped[int] = mapped_column(BigInteger)
    # Set while it holds a partition the target gives to another: past it, the member is gone.
    revoke_deadline_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # CONSUMER (heartbeats over HTTP) or CLASSIC (Kafka's JoinGroup/SyncGroup over the Kafka
    # listener); a classic member's chosen assignor (range, cooperative-sticky, ...).
    protocol: Mapped[str] = mapped_column(String(16), server_default=CONSUMER)
    assignor: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # A member of a classic group: its group.instance.id (static membership), the protocols it
    # supports ([[name, metadata as base64], ...], in its order of preference), what the leader
    # assigned it this generation (opaque bytes; decoded into `assigned` where they are the
    # consumer protocol's), and whether a JoinGroup or SyncGroup of it is waiting ("join",
    # "sync"): such a member is not expired, as Kafka does not expire a parked request's member.
    group_instance_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    classic_protocols: Mapped[list[list[str]] | None] = mapped_column(JSON, nullable=True)
    classic_assignment: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    awaiting: Mapped[str | None] = mapped_column(String(8), nullable=True)
    # A streams group's member: its process id, user endpoint, client tags, rack and the
    # topology epoch it runs (`coordinator.groups.streams`); null for the other kinds.
    streams: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (
        Index("ix_group_members_session_deadline_ms", "session_deadline_ms"),
        Index("ix_group_members_revoke_deadline_ms", "revoke_deadline_ms"),
        Index(
            "ix_group_members_group_id_group_instance_id",
            "group_id",
            "group_instance_id",
            unique=True,
        ),
    )


class GroupTargetPartition(Base):
    """The assignor's answer: the member each subscribed partition should end up with."""

    __tablename__ = "group_target_partitions"

    group_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    topic: Mapped[str] = mapped_column(String(249), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    member_id: Mapped[str] = mapped_column(String(255))

    __table_args__ = (
        ForeignKeyConstraint(
            ["group_id", "member_id"],
            ["group_members.group_id", "group_members.member_id"],
            name="fk_group_target_partitions_member",
            ondelete="CASCADE",
        ),
        Index("ix_group_target_partitions_group_id_member_id", "group_id", "member_id"),
    )


class GroupOwnedPartition(Base):
    """The member that owns a partition now: granted by the coordinator, released only when the
    member's heartbeat no longer lists it or the member is gone. One row per partition."""

    __tablename__ = "group_owned_partitions"

    group_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    topic: Mapped[str] = mapped_column(String(249), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    member_id: Mapped[str] = mapped_column(String(255))
    # The member epoch it was granted with: a commit carrying an older epoch is stale.
    granted_epoch: Mapped[int] = mapped_column(Integer)

    __table_args__ = (
        ForeignKeyConstraint(
            ["group_id", "member_id"],
            ["group_members.group_id", "group_members.member_id"],
            name="fk_group_owned_partitions_member",
            ondelete="CASCADE",
        ),
        Index("ix_group_owned_partitions_group_id_member_id", "group_id", "member_id"),
    )


class ShareMember(Base):
    """A member of a share group (KIP-932): `coordinator.shares.membership` runs them."""

    __tablename__ = "share_group_members"

    group_id: Mapped[str] = mapped_column(
        String(255),
        ForeignKey("consumer_groups.group_id", ondelete="CASCADE"),
        primary_key=True,
    )
    member_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    # The group's assignment epoch when the member was last given its assignment.
    member_epoch: Mapped[int] = mapped_column(Integer)
    rack_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    client_id: Mapped[str] = mapped_column(String(255))
    client_host: Mapped[str] = mapped_column(String(255))
    subscribed_topics: Mapped[list[str]] = mapped_column(JSON)
    # What it was assigned: [[topic, partition], ...], sorted. Several members may share one.
    assigned: Mapped[list[list[Any]]] = mapped_column(JSON)
    session_timeout_ms: Mapped[int] = mapped_column(Integer)
    joined_ms: Mapped[int] = mapped_column(BigInteger)
    last_heartbeat_ms: Mapped[int] = mapped_column(BigInteger)
    # Past it the member is gone (and what it acquired is released).
    session_deadline_ms: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_share_group_members_session_deadline_ms", "session_deadline_ms"),)


class GroupConfig(Base):
    """The group configs set on a group id (Kafka's GROUP config resource: kafka-configs.sh
    --entity-type groups), kept whether or not the group exists, as Kafka keeps them."""

    __tablename__ = "group_configs"

    group_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    # {name: value} of the configs set; the others take their defaults (`groups.configs`).
    configs: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_ms: Mapped[int] = mapped_column(BigInteger)


class StreamsGroup(Base):
    """A streams group's topology (KIP-1071), as its members sent it, and how it is configured
    against the topics as they are (`groups.streams_topology`): each subtopology's task count,
    and the statuses to tell the members."""

    __tablename__ = "streams_groups"

    group_id: Mapped[str] = mapped_column(
        String(255),
        ForeignKey("consumer_groups.group_id", ondelete="CASCADE"),
        primary_key=True,
    )
    topology_epoch: Mapped[int] = mapped_column(Integer)
    topology: Mapped[dict[str, Any]] = mapped_column(JSON)
    # {subtopology id: tasks}; empty while the topology cannot be configured.
    task_counts: Mapped[dict[str, Any]] = mapped_column(JSON)
    # [[status code, detail], ...] (Kafka's StreamsGroupHeartbeatResponse.Status).
    statuses: Mapped[list[list[Any]]] = mapped_column(JSON)
    # A member asked every member to shut down (shutdown_application).
    shutdown: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    updated_ms: Mapped[int] = mapped_column(BigInteger)
