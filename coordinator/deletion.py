"""Deleting a topic: its partitions, records and producer state (the log's), the open
transactions that include its partitions, aborted and their producers fenced (the
transactions'), and the groups' offsets and share partitions on it, in one unit of work. Above
the domains, since it spans them; both doors call it, and its HTTP route is here."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import delete, select
from starlette.responses import Response

from coordinator.core.acls import Operation
from coordinator.core.auth import AccessDep
from coordinator.core.clock import now_ms
from coordinator.core.dependencies import DB
from coordinator.core.responses import json_response
from coordinator.groups.models import GroupOffset
from coordinator.log.errors import UnknownTopicOrPartition
from coordinator.log.markers import lock_partitions
from coordinator.log.models import Batch, Partition, ProducerState, Topic
from coordinator.log.routes import TopicPath
from coordinator.log.schemas import DeletedTopic
from coordinator.shares.models import SharePartitionRow
from coordinator.store import Store
from coordinator.transactions.aborts import abort_and_fence
from coordinator.transactions.errors import ConcurrentTransactions
from coordinator.transactions.finishing import BY_ADMIN
from coordinator.transactions.locks import lock_including, partitions_of
from coordinator.transactions.models import TransactionOffset, TransactionShareAck

# A deletion retries when a transaction joins the topic between its lookup and its locks.
_DELETE_ATTEMPTS = 5


class _TransactionJoined(Exception):
    """A transaction took a partition of the topic being deleted before its locks were held."""


async def delete_topic(db: Store, name: str) -> DeletedTopic:
    """Delete a topic with its partitions, records, producer state and group offsets, in one
    step; an open transaction including one of its partitions is aborted first, in the same
    step, and its producer fenced (the operator's abort). Pending transactional offsets of the
    topic are dropped with it."""
    for _ in range(_DELETE_ATTEMPTS):
        try:
            async with db.write() as session:
                exists = await session.scalar(select(Topic.name).where(Topic.name == name))
                if exists is None:
                    raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
                now = now_ms()
                # The fixed lock order: transactional ids, then partitions in order.
                including = await lock_including(session, name)
                own = await session.execute(
                    select(Partition.topic, Partition.partition).where(Partition.topic == name)
                )
                keys = [(t, p) for t, p in own] + await partitions_of(session, including)
                await lock_partitions(session, keys)
                joined = {
                    locked.txn.transactional_id for locked in await lock_including(session, name)
                }
                if joined - {locked.txn.transactional_id for locked in including}:
                    raise _TransactionJoined
                for locked in including:
                    await abort_and_fence(session, locked, BY_ADMIN, now)
                for model in (
                    GroupOffset,
                    TransactionOffset,
                    SharePartitionRow,
                    TransactionShareAck,
                    Batch,
                    ProducerState,
                    Partition,
                ):
                    await session.execute(delete(model).where(model.topic == name))
                await session.execute(delete(Topic).where(Topic.name == name))
            return DeletedTopic(name=name)
        except _TransactionJoined:
            continue
    raise ConcurrentTransactions(
        f"transactions kept joining {name!r} while it was being deleted; try again"
    )


# The log's router has the other /v1/topics routes; this one spans the domains.
router = APIRouter(prefix="/v1/topics", tags=["topics and records"])


# Named as when the route was the log's, so its OpenAPI operation id stays.
@router.delete("/{topic}", response_model=DeletedTopic, name="delete_topic")
async def delete_topic_route(topic: TopicPath, db: DB, access: AccessDep) -> Response:
    """Delete the topic, aborting (and fencing) open transactions that include it."""
    access.topic(topic, Operation.DELETE)
    return json_response(await delete_topic(db, topic))
