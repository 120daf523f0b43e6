"""What the transactions domain is asked, as plain values every door builds (HTTP from its
bodies, Kafka's protocol from its requests), and the rules those values must keep, checked here
for every door. The HTTP door's bodies describe the same bounds in its schema."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.core.errors import InvalidRequest
from coordinator.core.names import topic_name_problem
from coordinator.core.schemas import EPOCH_MAX, INT32_MAX, INT64_MAX
from coordinator.groups.inputs import CommittedOffset, check_id, check_member, check_offsets

PARTITIONS_MAX = 10_000
DEFAULT_TIMEOUT_MS = 60_000


def _within(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InvalidRequest(f"{name}: {low} to {high}, not {value}")


@dataclass(frozen=True, slots=True)
class Caller:
    """Who calls: a producer id and its epoch."""

    producer_id: int
    producer_epoch: int

    def check(self) -> None:
        _within("producer_id", self.producer_id, 0, INT64_MAX)
        _within("producer_epoch", self.producer_epoch, 0, EPOCH_MAX)


@dataclass(frozen=True, slots=True)
class InitPid:
    """InitPid: a transactional id (none: an idempotent producer), the transaction timeout and,
    for a Prepared transaction, whether the new instance keeps it to finish."""

    transactional_id: str | None = None
    transaction_timeout_ms: int = DEFAULT_TIMEOUT_MS
    keep_prepared: bool = False

    def check(self) -> None:
        if self.transactional_id is not None:
            check_id("transactional_id", self.transactional_id)


@dataclass(frozen=True, slots=True)
class AddOffsets:
    """A group's offsets joining the caller's transaction, with the member's identity when a
    member commits them (KIP-447); no offsets: the group joins, its offsets come later."""

    caller: Caller
    group_id: str
    offsets: Sequence[CommittedOffset] = ()
    member_id: str | None = None
    member_epoch: int | None = None

    def check(self) -> None:
        self.caller.check()
        check_id("group_id", self.group_id)
        check_member(self.member_id, self.member_epoch)
        check_offsets(self.offsets, at_least=0)


@dataclass(frozen=True, slots=True)
class Committing:
    """One transaction a commit-group commits: its id and its producer's id and epoch."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


def check_partitions(partitions: Sequence[tuple[str, int]]) -> None:
    """Partitions joining a transaction: 1 to PARTITIONS_MAX of them, each a topic's."""
    if not 1 <= len(partitions) <= PARTITIONS_MAX:
        raise InvalidRequest(f"partitions: 1 to {PARTITIONS_MAX}, not {len(partitions)}")
    for i, (topic, partition) in enumerate(partitions):
        problem = topic_name_problem(topic)
        if problem is not None:
            raise InvalidRequest(f"partitions.{i}.topic: {problem}")
        _within(f"partitions.{i}.partition", partition, 0, INT32_MAX)
