"""The log cleaner: retention by time and size, compaction, and producer-state expiry
(docs/pages/http-api.md, "Topic configs" and the producer-state paragraph under InitPid), run by
every service process every `COORDINATOR_LOG_RETENTION_CHECK_INTERVAL_MS`.

Each partition is cleaned in a unit of work of its own, claimed so that two processes never work
on one at once: on Postgres a transaction-scoped advisory lock on the partition, tried without
waiting (a partition another process is cleaning is skipped this round); SQLite's write unit
already excludes every other writer. The claim is not the partition row's lock because appends
hold that one nearly all the time under steady produce, and a cleaner that skipped locked rows
would then never run. Compaction reads and plans first, without row locks; the unit then takes
the partition's lock (the fixed order: partition before its batches, as appends, markers,
delete-records and topic deletion take them) for the short part that writes. Nothing at or
above the LSO is ever removed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, delete, exists, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core import metrics
from coordinator.core.clock import now_ms
from coordinator.core.periodic import run_periodically
from coordinator.core.settings import Settings
from coordinator.log import configs
from coordinator.log.bounds import partition_bounds
from coordinator.log.compaction import Compactor, Plan, Stored, note_keys
from coordinator.log.models import Batch, Partition, ProducerState, Topic
from coordinator.log.topics import move_log_start
from coordinator.producers.models import ProducerId
from coordinator.store import Store

log = logging.getLogger("coordinator.log.cleaner")

# Rows read per query while compacting, and deleted per statement.
_CHUNK = 256
# What the cleaner vacuums after removing batches: the table and its TOAST table (the payloads)
# take nearly all the space; the producer states shrink with expiry.
_VACUUMED = ("batches", "producer_states")


@dataclass(slots=True)
class Removed:
    batches: int = 0
    bytes: int = 0

    def add(self, batches: int, size: int) -> None:
        self.batches += batches
        self.bytes += size


@dataclass(slots=True)
class Round:
    """What one round removed: by retention, by compaction; producer states and ids expired."""

    retention: Removed
    compaction: Removed
    producer_states: int = 0
    producer_ids: int = 0


async def clean_once(db: Store, settings: Settings, now: int | None = None) -> Round:
    """One round over every partition whose topic has something to clean, then the producer
    states and ids that expired."""
    now = now_ms() if now is None else now
    done = Round(Removed(), Removed())
    async with db.read() as session:
        topics = (
            await session.execute(
                select(Topic.name, Topic.configs, Partition.partition)
                .join(Partition, Partition.topic == Topic.name)
                .order_by(Topic.name, Partition.partition)
            )
        ).all()
    for topic, stored, partition in topics:
        cleanup = configs.cleanup_settings(stored, settings)
        if cleanup.has_work:
            await clean_partition(db, topic, partition, cleanup, now, done)
    for cause, removed in (("retention", done.retention), ("compaction", done.compaction)):
        metrics.record_removed(cause, removed.batches, removed.bytes)
    done.producer_states, done.producer_ids = await expire_producers(
        db, now, settings.producer_id_expiration_ms
    )
    if settings.log_cleaner_vacuum and (done.retention.batches or done.compaction.bytes):
        await db.vacuum(*_VACUUMED)
    return done


async def clean_partition(
    db: Store,
    topic: str,
    partition: int,
    cleanup: configs.CleanupSettings,
    now: int,
    done: Round,
) -> None:
    async with db.write() as session:
        if not await db.claim(session, f"{topic}/{partition}"):
            return
        plan, end = None, 0
        if cleanup.compact:
            planned = await _plan_compaction(session, topic, partition, cleanup, now)
            if planned is not None:
                plan, end = planned
        # The partition's lock, then its bounds as they are now.
        await session.execute(
            select(Partition.partition)
            .where(Partition.topic == topic, Partition.partition == partition)
            .with_for_update()
        )
        bounds = await partition_bounds(await session.connection(), topic, partition)
        if bounds is None:
            return  # the topic was deleted meanwhile
        log_start, stable = bounds.log_start_offset, bounds.last_stable_offset
        if cleanup.delete:
            start = await _retention_start(session, topic, partition, cleanup, now, stable)
            if start is not None and start > log_start:
                done.retention.add(*await move_log_start(session, topic, partition, start))
        if plan is not None:
            await _apply(session, topic, partition, plan, end)
            done.compaction.add(len(plan.deleted), plan.removed_bytes)


def _in_partition(topic: str, partition: int) -> tuple[Any, Any]:
    return Batch.topic == topic, Batch.partition == partition


async def _retention_start(
    session: AsyncSession,
    topic: str,
    partition: int,
    cleanup: configs.CleanupSettings,
    now: int,
    stable: int,
) -> int | None:
    """Where retention moves the log start: past every batch that `retention.ms` or
    `retention.bytes` lets go, a prefix of the log, never past the LSO. None: nothing to do."""
    wanted: list[int] = []
    in_partition = _in_partition(topic, partition)
    if cleanup.retention_ms >= 0:
        # The first batch to keep: the oldest one not yet expired, or at the LSO.
        first_kept = await session.scalar(
            select(Batch.base_offset)
            .where(
                *in_partition,
                (Batch.max_timestamp >= now - cleanup.retention_ms) | (Batch.last_offset >= stable),
            )
            .order_by(Batch.base_offset)
            .limit(1)
        )
        wanted.append(stable if first_kept is None else first_kept)
    if cleanup.retention_bytes >= 0:
        # The oldest batch such that it and every newer one fit in `retention.bytes`.
        newest_first = select(
            Batch.base_offset,
            func.sum(Batch.size).over(order_by=Batch.base_offset.desc()).label("kept"),
        ).where(*in_partition)
        inner = newest_first.subquery()
        first_fitting = await session.scalar(
            select(func.min(inner.c.base_offset)).where(inner.c.kept <= cleanup.retention_bytes)
        )
        wanted.append(stable if first_fitting is None else first_fitting)
    if not wanted:
        return None
    return min(max(wanted), stable)


async def _plan_compaction(
    session: AsyncSession,
    topic: str,
    partition: int,
    cleanup: configs.CleanupSettings,
    now: int,
) -> tuple[Plan, int] | None:
    """Plan the compaction of the cleanable range: from the log start up to the LSO or the first
    batch younger than `min.compaction.lag.ms`, whichever comes first. None when nothing new
    entered the range since the last compaction and no kept tombstone is due."""
    row = (
        await session.execute(
            select(Partition.cleaned_offset, Partition.clean_again_at).where(
                Partition.topic == topic, Partition.partition == partition
            )
        )
    ).first()
    bounds = await partition_bounds(await session.connection(), topic, partition)
    if row is None or bounds is None:
        return None
    cleaned, again_at = row
    log_start, end = bounds.log_start_offset, bounds.last_stable_offset
    if cleanup.min_compaction_lag_ms > 0:
        young = await session.scalar(
            select(Batch.base_offset)
            .where(
                *_in_partition(topic, partition),
                Batch.max_timestamp > now - cleanup.min_compaction_lag_ms,
            )
            .order_by(Batch.base_offset)
            .limit(1)
        )
        if young is not None:
            end = min(end, young)
    if end <= cleaned and (again_at is None or now < again_at):
        return None
    newest: dict[bytes, int] = {}
    async for batch in _stored(session, topic, partition, log_start, end, data_only=True):
        note_keys(newest, batch)
    compactor = Compactor(newest, now, cleanup.delete_retention_ms)
    async for batch in _stored(session, topic, partition, log_start, end, data_only=False):
        compactor.visit(batch)
    return compactor.plan, end


async def _stored(
    session: AsyncSession, topic: str, partition: int, start: int, end: int, *, data_only: bool
) -> AsyncIterator[Stored]:
    """The batches of [start, end) in offset order, read a chunk at a time."""
    query = (
        select(
            Batch.base_offset,
            Batch.producer_id,
            Batch.is_transactional,
            Batch.control,
            Batch.aborted,
            Batch.timestamp,
            Batch.payload,
        )
        .where(
            *_in_partition(topic, partition),
            Batch.last_offset >= start,
            Batch.base_offset >= bindparam("cursor"),
            Batch.base_offset < end,
        )
        .order_by(Batch.base_offset)
        .limit(_CHUNK)
    )
    if data_only:
        query = query.where(Batch.control.is_(None), Batch.aborted.is_(False))
    cursor = 0
    while True:
        rows = (await session.execute(query, {"cursor": cursor})).all()
        for row in rows:
            yield Stored(*row)
        if len(rows) < _CHUNK:
            return
        cursor = rows[-1].base_offset + 1


async def _apply(session: AsyncSession, topic: str, partition: int, plan: Plan, end: int) -> None:
    """Write a compaction's plan (rows that retention removed meanwhile are simply gone) and its
    checkpoint."""
    in_partition = _in_partition(topic, partition)
    for i in range(0, len(plan.deleted), _CHUNK):
        chunk = plan.deleted[i : i + _CHUNK]
        await session.execute(delete(Batch).where(*in_partition, Batch.base_offset.in_(chunk)))
    for base_offset, payload, count in plan.rewritten:
        await session.execute(
            update(Batch)
            .where(*in_partition, Batch.base_offset == base_offset)
            .values(payload=payload, size=len(payload), record_count=count)
        )
    await session.execute(
        update(Partition)
        .where(Partition.topic == topic, Partition.partition == partition)
        .values(cleaned_offset=end, clean_again_at=plan.clean_again_at)
    )


async def expire_producers(db: Store, now: int, expiration_ms: int) -> tuple[int, int]:
    """Remove producer state idle for `expiration_ms` with no open transaction on its
    partition, then idempotent producer ids older than that with no state left anywhere.
    Returns (states, ids) removed.

    No lock is needed against a concurrent append of the same producer: on Postgres the DELETE
    re-checks an updated row's idle time and leaves it, and an append that read the state just
    before writes the whole state again. The newest producer id is never removed, so SQLite,
    which hands out the largest id plus one, never issues an id twice."""
    cutoff = now - expiration_ms
    async with db.write() as session:
        states = await session.execute(
            delete(ProducerState).where(
                ProducerState.last_timestamp < cutoff,
                ProducerState.current_txn_first_offset.is_(None),
            )
        )
        has_state = exists().where(ProducerState.producer_id == ProducerId.producer_id)
        newest = select(func.max(ProducerId.producer_id)).scalar_subquery()
        ids = await session.execute(
            delete(ProducerId).where(
                ProducerId.transactional_id.is_(None),
                ProducerId.created_at < datetime.fromtimestamp(cutoff / 1000, UTC),
                ProducerId.producer_id < newest,
                ~has_state,
            )
        )
    return _count(states), _count(ids)


def _count(result: Any) -> int:
    rowcount: int = result.rowcount
    return max(rowcount, 0)


async def run_cleaner(db: Store, settings: Settings) -> None:
    interval = settings.log_retention_check_interval_ms / 1000

    async def one_round() -> None:
        done = await clean_once(db, settings)
        if done.retention.batches or done.compaction.batches or done.compaction.bytes:
            log.info(
                "removed %d batch(es), %d bytes by retention; %d batch(es), %d bytes by compaction",
                done.retention.batches,
                done.retention.bytes,
                done.compaction.batches,
                done.compaction.bytes,
            )
        if done.producer_states or done.producer_ids:
            log.info(
                "expired %d idle producer state(s) and %d producer id(s)",
                done.producer_states,
                done.producer_ids,
            )

    await run_periodically(interval, one_round, log)
