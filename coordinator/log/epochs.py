"""Leader epochs (KIP-101, KIP-320) of a log that a move of leadership never truncates.

Every partition's leader epoch is 0 from its creation, as a fresh Kafka partition's first
leader's is. With one broker it stays 0. With several (`coordinator.cluster`) each move of the
partition's leadership raises it, and an append is written only under the leader and epoch it
was taken by (`leads`, the fence). Durability and failover are the store's, below the log, and
they neither lose nor rewrite an acknowledged offset, so no epoch ever ends a log early.

The Kafka door sets the partition's current epoch in each batch a fetch answers, as Kafka's
leader stamps its epoch into what it appends (the log itself keeps each batch as its producer
wrote it, which the HTTP API promises); it reports it in Metadata and ListOffsets, checks a
request's `current_leader_epoch` against it, and answers OffsetForLeaderEpoch as if each epoch
ran to the log's end. So a client that checks its position after a move (KIP-320: the Java
consumer, franz-go, librdkafka) finds no truncation, because there never is any.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.log.bounds import partition_bounds
from coordinator.log.errors import FencedLeaderEpoch, UnknownLeaderEpoch, UnknownTopicOrPartition
from coordinator.store import Store

LEADER_EPOCH = 0
# Kafka's RecordBatch.NO_PARTITION_LEADER_EPOCH and the cache's UNDEFINED_EPOCH(_OFFSET).
NO_EPOCH = -1
NO_OFFSET = -1


def leads(stored_leader: int | None, stored_epoch: int, claimed: tuple[int, int]) -> bool:
    """The fence of an append taken by broker `claimed[0]` as the partition's leader at epoch
    `claimed[1]`: the partition's row still has that epoch, and that leader or none placed yet
    (a new partition, which any broker may write at epoch 0 until its first leader is placed,
    at the same epoch: from then on only that one). `leads_in_sql` is the same rule."""
    broker, epoch = claimed
    return stored_epoch == epoch and (stored_leader is None or stored_leader == broker)


def leads_in_sql(stored_leader: str, stored_epoch: str, broker: str, epoch: str) -> str:
    """`leads` as an SQL condition over these expressions (a null `epoch`: no leader asked)."""
    return (
        f"({epoch} IS NULL OR ({stored_epoch} = {epoch}"
        f" AND coalesce({stored_leader}, {broker}) = {broker}))"
    )


def check_current_epoch(current_leader_epoch: int, leader_epoch: int = LEADER_EPOCH) -> None:
    """A request's `current_leader_epoch` against the leader's, `leader_epoch` (-1: the client
    does not say), as Kafka's partition checks it: an older one is fenced, a newer one unknown
    (the client's metadata is ahead of this broker's, which learns the move shortly)."""
    if current_leader_epoch in (NO_EPOCH, leader_epoch):
        return
    if current_leader_epoch < leader_epoch:
        raise FencedLeaderEpoch(
            f"leader epoch {current_leader_epoch} is older than the leader's, {leader_epoch}"
        )
    raise UnknownLeaderEpoch(
        f"leader epoch {current_leader_epoch} is newer than the leader's, {leader_epoch}"
    )


@dataclass(frozen=True, slots=True)
class EpochEnd:
    leader_epoch: int
    end_offset: int


async def end_offset_for_epoch(
    db: Store,
    topic: str,
    partition: int,
    epoch: int,
    current_leader_epoch: int = NO_EPOCH,
    leader_epoch: int = LEADER_EPOCH,
) -> EpochEnd:
    """The end of `epoch` in the partition's log, whose leader is at `leader_epoch` now (Kafka's
    `LeaderEpochFileCache.endOffsetFor`). A move of leadership never truncates the log (every
    broker writes the one log in the store), so each epoch from 0 to the current one is
    answered as the one entry that runs to the log's end:

    - an epoch from 0 to the current one: that epoch, ending at the log end offset;
    - a later epoch, or -1: undefined (-1, -1), which Kafka answers without an error;
    - an epoch below 0 other than -1: that epoch, ending where epoch 0 starts (the log start).
    """
    async with db.read() as session:
        bounds = await partition_bounds(await session.connection(), topic, partition)
    if bounds is None:
        raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
    check_current_epoch(current_leader_epoch, leader_epoch)
    if 0 <= epoch <= leader_epoch:
        return EpochEnd(epoch, bounds.high_watermark)
    if epoch == NO_EPOCH or epoch > leader_epoch:
        return EpochEnd(NO_EPOCH, NO_OFFSET)
    return EpochEnd(epoch, bounds.log_start_offset)
