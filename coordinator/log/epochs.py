"""Leader epochs (KIP-101, KIP-320) of a log whose leader never changes.

Every partition's leader epoch is 0 from its creation, as a fresh Kafka partition's first
leader's is, and it stays 0: no election ever happens here (durability and failover are the
store's, below the log, and they neither lose nor rewrite an acknowledged offset). The Kafka
door sets it in each batch a fetch answers, as Kafka's leader stamps its epoch into what it
appends (the log itself keeps each batch as its producer wrote it, which the HTTP API promises);
it reports it in Metadata and ListOffsets, checks a request's `current_leader_epoch` against it,
and answers OffsetForLeaderEpoch from it, as Kafka's leader epoch cache answers with its one
entry: epoch 0, from the log start offset to the log end.

So a client that checks its position after a reassignment (KIP-320: the Java consumer, franz-go,
librdkafka) finds no truncation, because there never is any.
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


def check_current_epoch(current_leader_epoch: int) -> None:
    """A request's `current_leader_epoch` against the leader's (-1: the client does not say), as
    Kafka's partition checks it: an older one is fenced, a newer one unknown (the client's
    metadata is ahead of this broker, which cannot happen here but is answered as Kafka does)."""
    if current_leader_epoch in (NO_EPOCH, LEADER_EPOCH):
        return
    if current_leader_epoch < LEADER_EPOCH:
        raise FencedLeaderEpoch(
            f"leader epoch {current_leader_epoch} is older than the leader's, {LEADER_EPOCH}"
        )
    raise UnknownLeaderEpoch(
        f"leader epoch {current_leader_epoch} is newer than the leader's, {LEADER_EPOCH}"
    )


@dataclass(frozen=True, slots=True)
class EpochEnd:
    leader_epoch: int
    end_offset: int


async def end_offset_for_epoch(
    db: Store, topic: str, partition: int, epoch: int, current_leader_epoch: int = NO_EPOCH
) -> EpochEnd:
    """The end of `epoch` in the partition's log: the largest epoch at most `epoch` and the
    offset where the next one starts (Kafka's `LeaderEpochFileCache.endOffsetFor` over the one
    entry, epoch 0 from the log start offset):

    - epoch 0, the current one: the log end offset;
    - a later epoch, or -1: undefined (-1, -1), which Kafka answers without an error;
    - an epoch below 0 other than -1: that epoch, ending where epoch 0 starts (the log start).
    """
    async with db.read() as session:
        bounds = await partition_bounds(await session.connection(), topic, partition)
    if bounds is None:
        raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
    check_current_epoch(current_leader_epoch)
    if epoch == LEADER_EPOCH:
        return EpochEnd(LEADER_EPOCH, bounds.high_watermark)
    if epoch == NO_EPOCH or epoch > LEADER_EPOCH:
        return EpochEnd(NO_EPOCH, NO_OFFSET)
    return EpochEnd(epoch, bounds.log_start_offset)
