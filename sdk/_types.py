"""Values the client hands out and takes: partitions, messages, group metadata, offsets.

Shaped like confluent-kafka's (`TopicPartition` attributes, `Message` accessor methods), so code
written for it reads the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from sdk._errors import KafkaError

__all__ = [
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TIMESTAMP_NOT_AVAILABLE",
    "CommitCallback",
    "ConsumerGroupMetadata",
    "DeliveryCallback",
    "Headers",
    "Message",
    "RebalanceCallback",
    "TopicPartition",
]

# Logical offsets, as in confluent-kafka.
OFFSET_BEGINNING = -2
OFFSET_END = -1
OFFSET_STORED = -1000
OFFSET_INVALID = -1001

TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2

#: Record headers as `produce()` takes them: a dict, or (name, value) pairs with unique names.
Headers: TypeAlias = Mapping[str, bytes | str] | Sequence[tuple[str, bytes | str]]


class TopicPartition:
    """A partition of a topic, optionally with an offset (and metadata) attached."""

    __slots__ = ("error", "leader_epoch", "metadata", "offset", "partition", "topic")

    def __init__(
        self,
        topic: str,
        partition: int = -1,
        offset: int = OFFSET_INVALID,
        metadata: str | None = None,
        leader_epoch: int | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.metadata = metadata
        self.leader_epoch = leader_epoch
        self.error: KafkaError | None = None

    def _key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopicPartition):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other: TopicPartition) -> bool:
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        extra = f", error={self.error}" if self.error is not None else ""
        return (
            f"TopicPartition{{topic={self.topic},partition={self.partition},"
            f"offset={self.offset}{extra}}}"
        )


class ConsumerGroupMetadata:
    """What `Consumer.consumer_group_metadata()` returns for `send_offsets_to_transaction`: the
    group and, for a consumer that `subscribe`d, its member id and epoch at that moment, which the
    coordinator checks (KIP-447) so a consumer that lost its partitions cannot commit them."""

    __slots__ = ("group_id", "member_epoch", "member_id")

    def __init__(
        self, group_id: str, member_id: str | None = None, member_epoch: int | None = None
    ) -> None:
        self.group_id = group_id
        self.member_id = member_id
        self.member_epoch = member_epoch

    def __repr__(self) -> str:
        if self.member_id is None:
            return f"ConsumerGroupMetadata({self.group_id!r})"
        return (
            f"ConsumerGroupMetadata({self.group_id!r}, member_id={self.member_id!r}, "
            f"member_epoch={self.member_epoch})"
        )


class Message:
    """A record read by a `Consumer`, or one whose delivery a `Producer` reports; or an event
    (such as the end of a partition) when `error()` is not None."""

    __slots__ = ("_error", "_headers", "_key", "_offset", "_partition", "_timestamp",
                 "_timestamp_type", "_topic", "_value")  # fmt: skip

    def __init__(
        self,
        topic: str | None,
        partition: int | None = None,
        offset: int | None = None,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: list[tuple[str, bytes | None]] | None = None,
        error: KafkaError | None = None,
        timestamp: int | None = None,
        timestamp_type: int = TIMESTAMP_LOG_APPEND_TIME,
    ) -> None:
        self._topic = topic
        self._partition = partition
        self._offset = offset
        self._key = key
        self._value = value
        self._headers = headers or None
        self._error = error
        self._timestamp = timestamp
        self._timestamp_type = timestamp_type

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int | None:
        return self._partition

    def offset(self) -> int | None:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        """(name, value) pairs, or None when the record has none (as confluent-kafka)."""
        return self._headers

    def error(self) -> KafkaError | None:
        return self._error

    def timestamp(self) -> tuple[int, int]:
        """(timestamp type, milliseconds since the epoch): `TIMESTAMP_CREATE_TIME` (the
        producer's) or `TIMESTAMP_LOG_APPEND_TIME` (the service's, on a LogAppendTime topic)."""
        if self._timestamp is None:
            return (TIMESTAMP_NOT_AVAILABLE, -1)
        return (self._timestamp_type, self._timestamp)

    def __len__(self) -> int:
        return len(self._value or b"")

    def __repr__(self) -> str:
        where = f"{self._topic}[{self._partition}]@{self._offset}"
        return f"Message({where}, error={self._error})" if self._error else f"Message({where})"


#: `on_delivery(err, msg)`: err is None when the record was written at `msg.offset()`.
DeliveryCallback: TypeAlias = Callable[[KafkaError | None, Message], object]
#: `on_commit(err, partitions)`: err is None when every offset in `partitions` was committed.
CommitCallback: TypeAlias = Callable[[KafkaError | None, list[TopicPartition]], object]
#: `on_assign`, `on_revoke`, `on_lost` of `subscribe()`: called with the consumer and the
#: partitions concerned, on the caller's thread, inside `poll()`/`consume()`.
RebalanceCallback: TypeAlias = Callable[[Any, list[TopicPartition]], object]
