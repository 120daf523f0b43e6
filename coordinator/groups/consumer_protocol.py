"""Kafka's consumer protocol, the bytes a classic consumer's JoinGroup and SyncGroup carry: its
subscription (the topics it wants, the partitions it owns) and the assignment its group's leader
gives it. The groups domain reads them to know what classic members subscribe to and were
given, and writes them where the coordinator assigns classic members itself
(`groups.classic_members`) or describes a member."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from kio.schema.consumer_protocol_assignment.v0 import data as assignment_v0
from kio.schema.consumer_protocol_assignment.v1 import data as assignment_v1
from kio.schema.consumer_protocol_assignment.v2 import data as assignment_v2
from kio.schema.consumer_protocol_assignment.v3 import data as assignment_v3
from kio.schema.consumer_protocol_subscription.v0 import data as subscription_v0
from kio.schema.consumer_protocol_subscription.v1 import data as subscription_v1
from kio.schema.consumer_protocol_subscription.v2 import data as subscription_v2
from kio.schema.consumer_protocol_subscription.v3 import data as subscription_v3
from kio.serial import entity_writer

from coordinator.core import guard
from coordinator.groups.models import CONSUMER_PROTOCOL

_SUBSCRIPTIONS = [subscription_v0, subscription_v1, subscription_v2, subscription_v3]
_ASSIGNMENTS = [assignment_v0, assignment_v1, assignment_v2, assignment_v3]


def parse_subscription(metadata: bytes) -> tuple[list[str], list[tuple[str, int]]]:
    """A member's ConsumerProtocolSubscription: its topics and the partitions it owns (versions
    1+; a newer version is read as the newest known, as Kafka's clients do)."""
    data = bytes(metadata)
    if len(data) < 2:
        raise ValueError("subscription metadata shorter than its version")
    version = int.from_bytes(data[:2], "big", signed=True)
    module = _SUBSCRIPTIONS[max(0, min(version, len(_SUBSCRIPTIONS) - 1))]
    # Lengths checked first: the subscription is the client's bytes, read by kio (see guard).
    subscription, _ = guard.read(module.ConsumerProtocolSubscription, data, 2)
    owned = [
        (tp.topic, p) for tp in getattr(subscription, "owned_partitions", ()) for p in tp.partitions
    ]
    return list(subscription.topics), owned


def parse_assignment(data: bytes) -> list[tuple[str, int]]:
    """The partitions of a ConsumerProtocolAssignment (what a leader gave a member), read as
    the subscription is (lengths checked first)."""
    if len(data) < 2:
        return []  # an empty assignment
    version = int.from_bytes(data[:2], "big", signed=True)
    module = _ASSIGNMENTS[max(0, min(version, len(_ASSIGNMENTS) - 1))]
    assignment, _ = guard.read(module.ConsumerProtocolAssignment, data, 2)
    return [(tp.topic, p) for tp in assignment.assigned_partitions for p in tp.partitions]


def encode_assignment(partitions: list[tuple[str, int]] | list[list[Any]]) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    entity = assignment_v0.ConsumerProtocolAssignment(
        assigned_partitions=tuple(
            assignment_v0.TopicPartition(topic=t, partitions=tuple(sorted(ps)))  # type: ignore[arg-type]
            for t, ps in sorted(by_topic.items())
        ),
        user_data=None,
    )
    out = io.BytesIO(b"\0\0")
    out.seek(2)
    entity_writer(assignment_v0.ConsumerProtocolAssignment)(out, entity)
    return out.getvalue()


def encode_subscription(topics: list[str]) -> bytes:
    entity = subscription_v0.ConsumerProtocolSubscription(topics=tuple(topics), user_data=None)
    out = io.BytesIO(b"\0\0")
    out.seek(2)
    entity_writer(subscription_v0.ConsumerProtocolSubscription)(out, entity)
    return out.getvalue()


def subscription_of(
    protocol_type: str, protocols: Sequence[Any]
) -> tuple[list[str], list[tuple[str, int]]]:
    """A classic member's subscribed topics and owned partitions, read from its first
    protocol's metadata when it speaks the consumer protocol; another protocol's metadata
    (Kafka Connect's, Schema Registry's), or one that cannot be read, stays opaque, as Kafka
    keeps it (no topics, nothing owned)."""
    if protocol_type != CONSUMER_PROTOCOL or not protocols:
        return [], []
    try:
        return parse_subscription(protocols[0].metadata)
    except Exception:
        return [], []
