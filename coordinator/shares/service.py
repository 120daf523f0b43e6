"""Share partitions' calls: acquire records for a member (ShareFetch), acknowledge them, release
what a member holds, take acknowledgements into a transaction and settle them when it ends, and
the admin's view and reset of a group's offsets.

Each call is one unit of work that locks the share partitions it touches, in (topic, partition)
order, after the group's row when it changes membership (`coordinator.shares.membership`) and
after the transaction's rows when a transaction ends: a fixed order, so none of them deadlock.
The rules are `coordinator.shares.inflight`'s; this module loads their state, runs them, and
writes it back. A share partition is created the first time it is assigned or fetched, at the
offset `share.auto.offset.reset` names (Kafka initializes it when the group coordinator first
assigns it).
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from coordinator.core.clock import now_ms
from coordinator.core.errors import CoordinatorError, InvalidRequest
from coordinator.core.settings import Settings
from coordinator.groups.configs import (
    BY_DURATION,
    EARLIEST,
    READ_COMMITTED,
    duration_ms,
    group_configs,
)
from coordinator.groups.errors import GroupIdNotFound
from coordinator.groups.models import SHARE, ConsumerGroup
from coordinator.log.bounds import Bounds, partition_bounds
from coordinator.log.errors import UnknownTopicOrPartition
from coordinator.log.fetch import StoredBatch, batches_covering, batches_from, list_offset_in
from coordinator.log.purgatory import PURGATORY, moved
from coordinator.shares.errors import InvalidRecordState
from coordinator.shares.inflight import RELEASE, Acquired, Limits, LogBatch, ShareState
from coordinator.shares.models import SharePartitionRow
from coordinator.store import Store, store_of

TP = tuple[str, int]

# Batches read from the log per acquisition at most (each holds a record at least).
_BATCHES_PER_ACQUISITION = 64


@dataclass(frozen=True, slots=True)
class AckBatch:
    """Offsets [first, last] acknowledged with one type for all, or one per offset."""

    first: int
    last: int
    types: tuple[int, ...]


@dataclass
class PartitionResult:
    """One share partition's answer: what was acquired, with the batches holding it; or why
    not; and how its acknowledgements went, if it had any."""

    topic: str
    partition: int
    acquired: list[Acquired] = field(default_factory=list)
    batches: list[bytes] = field(default_factory=list)
    error: CoordinatorError | None = None
    acknowledged: bool = False
    ack_error: CoordinatorError | None = None


@dataclass(frozen=True, slots=True)
class GroupRules:
    """What the share rules read of a group's configs."""

    limits: Limits
    read_committed: bool
    reset: str
    session_timeout_ms: int
    heartbeat_interval_ms: int

    @classmethod
    def of(cls, configs: Mapping[str, str]) -> GroupRules:
        return cls(
            Limits(
                int(configs["share.delivery.count.limit"]),
                int(configs["share.record.lock.duration.ms"]),
                int(configs["share.partition.max.record.locks"]),
            ),
            configs["share.isolation.level"] == READ_COMMITTED,
            configs["share.auto.offset.reset"],
            int(configs["share.session.timeout.ms"]),
            int(configs["share.heartbeat.interval.ms"]),
        )


async def rules_of(session: AsyncSession, settings: Settings, group_id: str) -> GroupRules:
    return GroupRules.of(await group_configs(session, settings, group_id))


async def share_group(session: AsyncSession, group_id: str) -> ConsumerGroup:
    """The share group `group_id`; GROUP_ID_NOT_FOUND if there is none (or it is another
    kind of group)."""
    group = await session.get(ConsumerGroup, group_id)
    if group is None or group.protocol_type != SHARE:
        kind = "no group" if group is None else f"a {group.protocol_type or 'consumer'} group"
        raise GroupIdNotFound(f"{group_id!r} is {kind}, not a share group")
    return group


# -- loading and storing ------------------------------------------------------------------------


@dataclass
class Loaded:
    row: SharePartitionRow
    state: ShareState
    bounds: Bounds


async def _initial_offset(
    session: AsyncSession, rules: GroupRules, topic: str, partition: int, bounds: Bounds
) -> int:
    """Where a new share partition starts (share.auto.offset.reset)."""
    if rules.reset == EARLIEST:
        return bounds.log_start_offset
    if rules.reset.startswith(BY_DURATION):
        since = now_ms() - duration_ms(rules.reset[len(BY_DURATION) :])
        offset, _ = await list_offset_in(session, topic, partition, since, False)
        return bounds.high_watermark if offset < 0 else offset
    return bounds.high_watermark


async def _lock(session: AsyncSession, group_id: str, tp: TP) -> SharePartitionRow | None:
    query = (
        select(SharePartitionRow)
        .where(
            SharePartitionRow.group_id == group_id,
            SharePartitionRow.topic == tp[0],
            SharePartitionRow.partition == tp[1],
        )
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    return (await session.scalars(query)).one_or_none()


async def ensure(
    session: AsyncSession, group_id: str, rules: GroupRules, partitions: Iterable[TP]
) -> None:
    """Create the share partitions of `partitions` that the group does not have yet, each at
    its initial offset; partitions that do not exist are left alone."""
    wanted = sorted(set(partitions))
    if not wanted:
        return
    have = set(
        await session.execute(
            select(SharePartitionRow.topic, SharePartitionRow.partition).where(
                SharePartitionRow.group_id == group_id,
                tuple_(SharePartitionRow.topic, SharePartitionRow.partition).in_(wanted),
            )
        )
    )
    connection = await session.connection()
    rows = []
    now = now_ms()
    for topic, partition in wanted:
        if (topic, partition) in have:
            continue
        bounds = await partition_bounds(connection, topic, partition)
        if bounds is None:
            continue
        start = await _initial_offset(session, rules, topic, partition, bounds)
        rows.append(
            {
                "group_id": group_id,
                "topic": topic,
                "partition": partition,
                "start_offset": start,
                "end_offset": start,
                "state_epoch": 0,
                "spans": [],
                "next_deadline_ms": None,
                "updated_ms": now,
            }
        )
    if rows:
        await store_of(session).insert_ignore(
            session, SharePartitionRow, rows, ["group_id", "topic", "partition"]
        )


async def load(session: AsyncSession, group_id: str, tp: TP, rules: GroupRules, now: int) -> Loaded:
    """The share partition locked, its state with what time and the log did to it applied
    (locks run out, records below the log start gone); created first if it is new."""
    bounds = await partition_bounds(await session.connection(), *tp)
    if bounds is None:
        raise UnknownTopicOrPartition(f"{tp[0]}-{tp[1]} does not exist")
    row = await _lock(session, group_id, tp)
    if row is None:
        await ensure(session, group_id, rules, [tp])
        row = await _lock(session, group_id, tp)
        assert row is not None
    state = ShareState.of(row.start_offset, row.end_offset, row.spans)
    state.trim(bounds.log_start_offset)
    state.expire(now, rules.limits)
    return Loaded(row, state, bounds)


def store(row: SharePartitionRow, state: ShareState, now: int) -> None:
    rows = state.rows()
    if (row.start_offset, row.end_offset, row.spans) == (state.start, state.end, rows):
        return
    row.start_offset, row.end_offset, row.spans = state.start, state.end, rows
    row.next_deadline_ms = state.next_deadline()
    row.updated_ms = now


def wake_after_commit(session: AsyncSession, partitions: set[TP]) -> None:
    """Records were released on these partitions: other members' waiting fetches may take them
    (in this process and, through the store, in the others)."""
    if partitions:
        db = store_of(session)
        session.info.setdefault("after_commit", []).append(lambda: moved(db, partitions))


# -- acknowledging ------------------------------------------------------------------------------


def _acknowledged(
    state: ShareState, member: str, batches: Sequence[AckBatch], now: int, limits: Limits
) -> tuple[ShareState, bool]:
    """The state with all of a partition's acknowledgements applied, or INVALID_RECORD_STATE
    and none of them (whether any released records)."""
    applied = copy.deepcopy(state)
    for batch in batches:
        applied.acknowledge(member, batch.first, batch.last, batch.types, now, limits)
    return applied, any(RELEASE in b.types for b in batches)


def _apply_acks(
    loaded: Loaded,
    result: PartitionResult,
    member: str,
    batches: Sequence[AckBatch],
    now: int,
    limits: Limits,
    released: set[TP],
) -> None:
    try:
        loaded.state, releasing = _acknowledged(loaded.state, member, batches, now, limits)
    except InvalidRecordState as refused:
        result.ack_error = refused
        return
    if releasing:
        released.add((result.topic, result.partition))


# -- acquiring ----------------------------------------------------------------------------------


def _fitting(rows: list[StoredBatch], budget: int) -> list[StoredBatch]:
    """The batches within `budget` bytes, but at least up to the first deliverable one."""
    kept: list[StoredBatch] = []
    size = 0
    for row in rows:
        if kept and size + len(row.payload) > budget and any(not b.control for b in kept):
            break
        kept.append(row)
        size += len(row.payload)
    return kept


async def _acquire(
    connection: AsyncConnection,
    loaded: Loaded,
    result: PartitionResult,
    member: str,
    rules: GroupRules,
    max_records: int,
    budget: int,
    whole_batches: bool,
    now: int,
) -> None:
    state, bounds = loaded.state, loaded.bounds
    topic, partition = result.topic, result.partition
    upper = bounds.last_stable_offset if rules.read_committed else bounds.high_watermark
    new: list[StoredBatch] = []
    if state.end < upper:
        limit = max(1, min(_BATCHES_PER_ACQUISITION, max_records))
        rows = await batches_from(connection, topic, partition, state.end, upper, limit)
        new = _fitting(rows, budget)
    batches = [
        LogBatch(
            b.base_offset, b.last_offset, not b.control and not (rules.read_committed and b.aborted)
        )
        for b in new
    ]
    result.acquired = state.acquire(
        member, batches, max_records, now, rules.limits, whole_batches=whole_batches
    )
    payloads: dict[int, bytes] = {}
    new_from = new[0].base_offset if new else None
    for taken in result.acquired:
        if new_from is not None and taken.first >= new_from:
            covering = [
                b for b in new if b.last_offset >= taken.first and b.base_offset <= taken.last
            ]
        else:
            covering = await batches_covering(connection, topic, partition, taken.first, taken.last)
        for b in covering:
            if not b.control:
                payloads[b.base_offset] = b.payload
    result.batches = [payloads[base] for base in sorted(payloads)]


async def fetch(
    db: Store,
    settings: Settings,
    group_id: str,
    member_id: str,
    partitions: Sequence[TP],
    acks: Mapping[TP, Sequence[AckBatch]],
    *,
    max_records: int,
    max_bytes: int,
    whole_batches: bool = True,
    atomic: bool = False,
) -> tuple[list[PartitionResult], int]:
    """ShareFetch: each partition's acknowledgements applied (all of a partition's, or none and
    its error), then records acquired for `member_id` on `partitions`, at most `max_records`
    each (whole batches may pass it), new batches within `max_bytes` for the whole call but at
    least one. The answer is per partition, in (topic, partition) order, with the group's lock
    duration."""
    if max_records < 1:
        raise InvalidRequest(f"max_records: {max_records}, at least 1")
    results: list[PartitionResult] = []
    released: set[TP] = set()
    async with db.write() as session:
        await share_group(session, group_id)
        rules = await rules_of(session, settings, group_id)
        now = now_ms()
        connection = await session.connection()
        budget = max(1, max_bytes)
        for tp in sorted(set(partitions) | set(acks)):
            result = PartitionResult(*tp, acknowledged=tp in acks)
            results.append(result)
            try:
                loaded = await load(session, group_id, tp, rules, now)
            except CoordinatorError as refused:
                if atomic:
                    raise
                result.error = refused
                if result.acknowledged:
                    result.ack_error = refused
                continue
            if tp in acks:
                _apply_acks(loaded, result, member_id, acks[tp], now, rules.limits, released)
                if atomic and result.ack_error is not None:
                    raise InvalidRecordState(f"{tp[0]}-{tp[1]}: {result.ack_error.detail}")
            if tp in partitions and budget > 0:
                await _acquire(
                    connection, loaded, result, member_id, rules, max_records, budget,
                    whole_batches, now,
                )  # fmt: skip
                budget -= sum(len(b) for b in result.batches)
            store(loaded.row, loaded.state, now)
        wake_after_commit(session, released)
    return results, rules.limits.lock_ms


async def acquire_waiting(
    db: Store,
    settings: Settings,
    group_id: str,
    member_id: str,
    partitions: Sequence[TP],
    acks: Mapping[TP, Sequence[AckBatch]],
    *,
    max_records: int,
    max_bytes: int,
    wait_ms: int,
    whole_batches: bool = True,
    stop: asyncio.Event | None = None,
) -> tuple[dict[TP, PartitionResult], int]:
    """`fetch` as a long poll: its acknowledgements applied once, then, while it acquired
    nothing, it waits in the purgatory on `partitions` (woken by appends and by records
    released elsewhere) and acquires again, until `wait_ms` passed or `stop` is set."""
    deadline = time.monotonic() + wait_ms / 1000
    results: dict[TP, PartitionResult] = {}
    first = True
    while True:
        # Registered before the attempt: a move between it and the sleep is not lost.
        with PURGATORY.waiting(partitions) as moved:
            answers, lock_ms = await fetch(
                db,
                settings,
                group_id,
                member_id,
                partitions,
                acks if first else {},
                max_records=max_records,
                max_bytes=max_bytes,
                whole_batches=whole_batches,
            )
            for answer in answers:
                kept = results.get((answer.topic, answer.partition))
                if kept is not None and kept.acknowledged:
                    answer.acknowledged, answer.ack_error = True, kept.ack_error
                results[(answer.topic, answer.partition)] = answer
            first = False
            remaining = deadline - time.monotonic()
            stopped = stop is not None and stop.is_set()
            if any(a.acquired for a in answers) or not partitions or remaining <= 0 or stopped:
                return results, lock_ms
            await _sleep(moved, stop, remaining)


async def _sleep(moved: asyncio.Future[None], stop: asyncio.Event | None, seconds: float) -> None:
    """Until a partition moves, `stop` is set, or `seconds` pass."""
    waits: list[asyncio.Future[Any]] = [moved]
    stopped = None if stop is None else asyncio.ensure_future(stop.wait())
    if stopped is not None:
        waits.append(stopped)
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if stopped is not None:
            stopped.cancel()


async def acknowledge(
    db: Store,
    settings: Settings,
    group_id: str,
    member_id: str,
    acks: Mapping[TP, Sequence[AckBatch]],
    *,
    atomic: bool = False,
) -> tuple[list[PartitionResult], int]:
    """ShareAcknowledge: each partition's acknowledgements, all or none of a partition's; with
    the group's lock duration. `atomic` (the HTTP door's): all or none of them, the first
    refusal raised."""
    results, lock_ms = await fetch(
        db, settings, group_id, member_id, (), acks, max_records=1, max_bytes=0, atomic=atomic
    )
    return results, lock_ms


async def release(
    db: Store, settings: Settings, group_id: str, member_id: str, partitions: Iterable[TP] | None
) -> None:
    """What the member holds on `partitions` (None: all the group's) becomes available again
    (a share session closed)."""
    async with db.write() as session:
        group = await session.get(ConsumerGroup, group_id)
        if group is None or group.protocol_type != SHARE:
            return
        rules = await rules_of(session, settings, group_id)
        await release_in(session, group_id, [member_id], rules, partitions)


async def locked_rows(
    session: AsyncSession, group_id: str, partitions: Iterable[TP] | None
) -> list[SharePartitionRow]:
    query = select(SharePartitionRow).where(SharePartitionRow.group_id == group_id)
    if partitions is not None:
        wanted = sorted(set(partitions))
        if not wanted:
            return []
        query = query.where(
            tuple_(SharePartitionRow.topic, SharePartitionRow.partition).in_(wanted)
        )
    query = query.order_by(SharePartitionRow.topic, SharePartitionRow.partition)
    rows = await session.scalars(query.with_for_update().execution_options(populate_existing=True))
    return list(rows)


async def release_in(
    session: AsyncSession,
    group_id: str,
    members: Sequence[str],
    rules: GroupRules,
    partitions: Iterable[TP] | None = None,
) -> None:
    """`release` of several members, in a unit of work that holds the group's row (a member
    left or expired)."""
    if not members:
        return
    now = now_ms()
    released: set[TP] = set()
    for row in await locked_rows(session, group_id, partitions):
        state = ShareState.of(row.start_offset, row.end_offset, row.spans)
        changed = state.expire(now, rules.limits)
        for member in members:
            changed = state.release_member(member, rules.limits) or changed
        if changed:
            released.add((row.topic, row.partition))
            store(row, state, now)
    wake_after_commit(session, released)


async def expire_locks(db: Store, settings: Settings, now: int | None = None) -> int:
    """The sweep: share partitions whose earliest lock ran out release those records (and wake
    the fetches that wait for them). How many partitions it changed."""
    now = now_ms() if now is None else now
    async with db.write() as session:
        due = (
            await session.execute(
                select(
                    SharePartitionRow.group_id, SharePartitionRow.topic, SharePartitionRow.partition
                )
                .where(SharePartitionRow.next_deadline_ms < now)
                .order_by(
                    SharePartitionRow.group_id, SharePartitionRow.topic, SharePartitionRow.partition
                )
                .limit(500)
            )
        ).all()
        released: set[TP] = set()
        rules_by_group: dict[str, GroupRules] = {}
        for group_id, topic, partition in due:
            rows = await session.scalars(
                select(SharePartitionRow)
                .where(
                    SharePartitionRow.group_id == group_id,
                    SharePartitionRow.topic == topic,
                    SharePartitionRow.partition == partition,
                    SharePartitionRow.next_deadline_ms < now,
                )
                .with_for_update(skip_locked=True)
                .execution_options(populate_existing=True)
            )
            row = rows.one_or_none()
            if row is None:
                continue
            if group_id not in rules_by_group:
                rules_by_group[group_id] = await rules_of(session, settings, group_id)
            state = ShareState.of(row.start_offset, row.end_offset, row.spans)
            if state.expire(now, rules_by_group[group_id].limits):
                released.add((topic, partition))
            store(row, state, now)
            row.next_deadline_ms = state.next_deadline()
        wake_after_commit(session, released)
    return len(released)
