"""Produce, for every front door (HTTP JSON, HTTP record batches, Kafka's protocol): a record batch
checked at the edge (`edge`), then appended with whatever else is waiting (`group_commit`), in
one unit of work under its locks (`planning`), by the producer's rules (`sequences`).

A group's unit of work takes its locks in the fixed order, reads the producers' epochs and
states, applies the rules to each batch in order, and writes every accepted batch, producer state
and high watermark in one statement each. A batch that fails its checks fails alone and writes
nothing. A Kafka Produce request's partitions go in one group. Several processes on one store
stay correct: the row locks decide.
"""

from __future__ import annotations

from coordinator.core.clock import now_ms
from coordinator.core.settings import Settings
from coordinator.log.edge import (
    Append,
    Appended,
    acceptable,
    batch_from_json,
    check_batch,
    check_recoding,
)
from coordinator.log.group_commit import append_all, submit_all, topic_codec
from coordinator.log.planning import GroupTransactions, use_transactions
from coordinator.log.schemas import ProduceRequest
from coordinator.store import Store

__all__ = [
    "Append",
    "Appended",
    "GroupTransactions",
    "check_batch",
    "checked_append",
    "produce_batch",
    "produce_json",
    "submit_all",
    "use_transactions",
]


async def produce_batch(
    db: Store,
    settings: Settings,
    topic: str,
    partition: int,
    data: bytes,
    transactional_id: str | None,
) -> Appended:
    """Append one record batch, as the HTTP API's Records section says."""
    append = await checked_append(db, settings, topic, partition, data, transactional_id)
    return _answer((await append_all(db, settings, [append]))[0])


async def checked_append(
    db: Store,
    settings: Settings,
    topic: str,
    partition: int,
    data: bytes,
    transactional_id: str | None,
    leader: tuple[int, int] | None = None,
) -> Append:
    """A batch checked at the edge (`check_batch`), to append: recompressed in the same pass
    for its topic's compression.type where this process knows it (`topic_codec`), so that it
    is inflated once. A Kafka produce names the `leader` (broker, epoch) it was taken under."""
    stored, checked = await check_recoding(
        settings, data, transactional_id, topic_codec(db, settings, topic)
    )
    return Append(topic, partition, stored, checked, transactional_id, len(data), leader)


async def produce_json(
    db: Store, settings: Settings, topic: str, partition: int, body: ProduceRequest
) -> Appended:
    """JSON produce: a batch built at the edge, appended as a binary one is (it skips only the
    walk over its records, which it has just written)."""
    data, checked = batch_from_json(body, now_ms())
    acceptable(checked, body.transactional_id)
    append = Append(topic, partition, data, checked, body.transactional_id)
    return _answer((await append_all(db, settings, [append]))[0])


def _answer(result: Appended | BaseException) -> Appended:
    if isinstance(result, BaseException):
        raise result
    return result
