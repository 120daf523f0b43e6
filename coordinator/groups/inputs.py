"""What the groups domain is asked, as plain values every door builds (HTTP from its bodies,
Kafka's protocol from its requests), and the rules those values must keep, checked here for
every door. The HTTP door's bodies describe the same bounds in its schema, from these
constants."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from coordinator.core.errors import InvalidRequest
from coordinator.core.names import id_problem, topic_name_problem
from coordinator.core.schemas import INT32_MAX, INT64_MAX

# Kafka's offset.metadata.max.bytes, in characters.
METADATA_MAX = 4096
OFFSETS_MAX = 100_000
SUBSCRIBED_MAX = 10_000
CLIENT_ID_MAX = 255
DEFAULT_REBALANCE_TIMEOUT_MS = 300_000
# A member's epochs with a meaning of their own: joining, leaving, and (KIP-848 with an instance
# id) leaving for now: a static member keeps its place, and its partitions, until its session
# runs out or its instance joins again under a new member id.
JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """One partition's offset to commit, with the metadata and leader epoch kept beside it."""

    topic: str
    partition: int
    offset: int
    metadata: str | None = None
    leader_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class Beat:
    """A consumer-protocol member's heartbeat: join (epoch 0), heartbeat, or leave (epoch -1)."""

    member_id: str
    member_epoch: int
    subscribed_topics: Sequence[str] | None = None
    owned_partitions: Sequence[tuple[str, int]] | None = None
    rebalance_timeout_ms: int = DEFAULT_REBALANCE_TIMEOUT_MS
    session_timeout_ms: int | None = None
    client_id: str | None = None


def _within(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InvalidRequest(f"{name}: {low} to {high}, not {value}")


def _topic(name: str, topic: str) -> None:
    problem = topic_name_problem(topic)
    if problem is not None:
        raise InvalidRequest(f"{name}: {problem}")


def check_id(name: str, value: str) -> None:
    """A client-made id (a member id, a group id): 1 to 255 printable characters."""
    problem = id_problem(value)
    if problem is not None:
        raise InvalidRequest(f"{name}: {problem}")


def check_member(member_id: str | None, member_epoch: int | None) -> None:
    """A commit's member identity: both, or neither (a commit by no member)."""
    if (member_id is None) != (member_epoch is None):
        missing = "member_epoch" if member_epoch is None else "member_id"
        raise InvalidRequest(f"{missing}: required with the other member field (or send neither)")
    if member_id is not None and member_epoch is not None:
        check_id("member_id", member_id)
        _within("member_epoch", member_epoch, -1, INT32_MAX)


def check_offsets(offsets: Sequence[CommittedOffset], *, at_least: int) -> None:
    """Offsets to commit: `at_least` to OFFSETS_MAX of them, each of a topic and partition, an
    offset, metadata of at most METADATA_MAX characters and a leader epoch from -1."""
    if not at_least <= len(offsets) <= OFFSETS_MAX:
        raise InvalidRequest(f"offsets: {at_least} to {OFFSETS_MAX}, not {len(offsets)}")
    for i, o in enumerate(offsets):
        _topic(f"offsets.{i}.topic", o.topic)
        _within(f"offsets.{i}.partition", o.partition, 0, INT32_MAX)
        _within(f"offsets.{i}.offset", o.offset, 0, INT64_MAX)
        if o.metadata is not None and len(o.metadata) > METADATA_MAX:
            raise InvalidRequest(f"offsets.{i}.metadata: at most {METADATA_MAX} characters")
        if o.leader_epoch is not None:
            _within(f"offsets.{i}.leader_epoch", o.leader_epoch, -1, INT32_MAX)


def check_beat(beat: Beat) -> None:
    check_id("member_id", beat.member_id)
    _within("member_epoch", beat.member_epoch, -1, INT32_MAX)
    _topics("subscribed_topics", beat.subscribed_topics or (), SUBSCRIBED_MAX)
    owned = beat.owned_partitions or ()
    if len(owned) > OFFSETS_MAX:
        raise InvalidRequest(f"owned_partitions: at most {OFFSETS_MAX}")
    for i, (topic, partition) in enumerate(owned):
        _topic(f"owned_partitions.{i}.topic", topic)
        _within(f"owned_partitions.{i}.partition", partition, 0, INT32_MAX)
    _within("rebalance_timeout_ms", beat.rebalance_timeout_ms, 1, INT32_MAX)
    if beat.session_timeout_ms is not None:
        _within("session_timeout_ms", beat.session_timeout_ms, 1, INT32_MAX)
    if beat.client_id is not None and len(beat.client_id) > CLIENT_ID_MAX:
        raise InvalidRequest(f"client_id: at most {CLIENT_ID_MAX} characters")


def _topics(name: str, topics: Iterable[str], most: int) -> None:
    listed = list(topics)
    if len(listed) > most:
        raise InvalidRequest(f"{name}: at most {most}")
    for i, topic in enumerate(listed):
        _topic(f"{name}.{i}", topic)
