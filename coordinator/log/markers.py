"""Control markers: how a transaction's end is written into the partition logs.

A marker is a Kafka control batch (control and transactional attributes, one control record), so
every front door returns the stored bytes as they are. It takes one offset on its partition,
like a record. An abort also flags the producer's
batches of that transaction as aborted, so read_committed readers skip them, and every marker
releases the partition's LSO by clearing the producer's open-transaction offset.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    LargeBinary,
    String,
    Table,
    bindparam,
    case,
    func,
    insert,
    literal,
    not_,
    select,
    true,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.log import purgatory
from coordinator.log.models import CONTROL_ABORT, CONTROL_COMMIT, Batch, Partition, ProducerState
from coordinator.store import Store, store_of
from coordinator.store.sql import pairs_in
from sdk import recordbatch


async def lock_partitions(
    session: AsyncSession, keys: Sequence[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """Lock partition rows in (topic, partition) order, the coordinator's fixed lock order after
    transactional ids, so concurrent ends and appends never deadlock. Returns high watermarks."""
    if not keys:
        return {}
    rows = (
        await session.execute(
            select(Partition.topic, Partition.partition, Partition.high_watermark)
            .where(pairs_in(Partition.topic, Partition.partition, sorted(set(keys))))
            .order_by(Partition.topic, Partition.partition)
            .with_for_update()
        )
    ).all()
    return {(t, p): hw for t, p, hw in rows}


async def write_markers(
    session: AsyncSession,
    producer_id: int,
    producer_epoch: int,
    locked: dict[tuple[str, int], tuple[int, int, int | None]],
    commit: bool,
    timestamp: int,
    also: Sequence[Any] = (),
    returning: Any | None = None,
    params: dict[str, Any] | None = None,
) -> Sequence[Any]:
    """Append a commit or abort marker (a Kafka control batch) of the producer `producer_id` at
    `producer_epoch` to every locked partition: (topic, partition) -> (high watermark, producer
    id, first offset), as the transactions' `lock_transaction_partitions` answers. Each marker
    row keeps the first offset of the transaction it ends there; an abort flags the
    transaction's batches aborted.

    `also` (the caller's own writes ending the transaction) and `returning` (one more, with
    RETURNING, whose rows are answered) run with them, with `params`; they must be statements
    built once (module constants with bind parameters). The store runs `marker_writes` over the
    partitions its way (`Store.run_writes`): on Postgres all of it as one statement of
    data-modifying CTEs, one round trip whatever the number of partitions; on SQLite one
    statement after another."""
    store = store_of(session)
    rows = [
        dict(zip((c for c, _ in ENDING_COLUMNS), (key[0], key[1], *row), strict=True))
        for key, row in locked.items()
    ]
    values = {**marker_params(commit, producer_id, producer_epoch, timestamp), **(params or {})}
    ending, writes = _marker_statements(store)
    answered = await store.run_writes(session, ending, writes, rows, also, values, returning)
    # Fetches waiting on these partitions see the markers (and a new LSO) once they commit.
    hooks = session.info.setdefault("after_commit", [])
    hooks.append(partial(purgatory.moved, store, list(locked)))
    return answered


# The markers' statements over each engine's row source, built once per engine.
_BY_ENGINE: dict[type[Store], tuple[Any, list[Any]]] = {}


def _marker_statements(store: Store) -> tuple[Any, list[Any]]:
    built = _BY_ENGINE.get(type(store))
    if built is None:
        ending = store.source_of("ending", ENDING_COLUMNS)
        built = _BY_ENGINE[type(store)] = (ending, marker_writes(ending, true()))
    return built


def marker_params(
    commit: bool, producer_id: int, producer_epoch: int, timestamp: int
) -> dict[str, Any]:
    """The bind parameters of `marker_writes`: the control batch of the end, built once at base
    offset 0 (each marker's copy takes its partition's high watermark there)."""
    return {
        "m_commit": commit,
        "m_pid": producer_id,
        "m_epoch": producer_epoch,
        "m_timestamp": timestamp,
        "m_payload": recordbatch.build_control(commit, producer_id, producer_epoch, timestamp),
    }


# What the markers' statements read of each partition a transaction ends on, by name and type:
# its high watermark (where the marker goes), the producer whose records the transaction holds
# there, and the offset of the first of them (NULL: none).
ENDING_COLUMNS: list[tuple[str, Any]] = [
    ("topic", String()),
    ("partition", Integer()),
    ("high_watermark", BigInteger()),
    ("producer_id", BigInteger()),
    ("first_offset", BigInteger()),
]


def marker_writes(ending: Any, gate: Any) -> list[Any]:
    """The markers of a transaction's end, each rule once, as statements over
    `ending` (a row source of `ENDING_COLUMNS`: one row per partition) that write only where
    `gate` holds: an abort flags the transaction's batches aborted; a marker goes at each
    partition's high watermark, the control batch `m_payload` with its base offset set there
    (the base offset is outside the batch's CRC); the high watermark moves past it; the
    producer's open-transaction offset is released. The base offset is set in the bytes with
    Postgres's `overlay` and `int8send`, which the SQLite engine defines too. Bind parameters:
    `marker_params`. Every path that ends a transaction writes with these: the locking one
    over the store's row source of the partitions (`write_markers`), Postgres's one-statement
    EndTxn over its locked rows (`transactions.ending`)."""
    commit = bindparam("m_commit", type_=Boolean())
    payload = bindparam("m_payload", type_=LargeBinary())
    hw = ending.c.high_watermark
    marker = {
        "topic": ending.c.topic,
        "partition": ending.c.partition,
        "base_offset": hw,
        "last_offset": hw,
        "producer_id": bindparam("m_pid", type_=BigInteger()),
        "producer_epoch": bindparam("m_epoch", type_=Integer()),
        "base_sequence": literal(-1),
        "last_sequence": literal(-1),
        "timestamp": bindparam("m_timestamp", type_=BigInteger()),
        "max_timestamp": bindparam("m_timestamp", type_=BigInteger()),
        "size": func.length(payload),
        "is_transactional": true(),
        "control": case((commit, CONTROL_COMMIT), else_=CONTROL_ABORT),
        "aborted": not_(commit),
        "first_offset": ending.c.first_offset,
        "record_count": literal(1),
        "payload": func.overlay(payload, func.int8send(hw), 1, 8, type_=LargeBinary()),
    }
    assert list(marker) == [c.name for c in _batches.columns]
    at = (_partitions.c.topic == ending.c.topic, _partitions.c.partition == ending.c.partition)
    of_producer = (
        _states.c.topic == ending.c.topic,
        _states.c.partition == ending.c.partition,
        _states.c.producer_id == ending.c.producer_id,
    )
    return [
        update(_batches)
        .where(
            not_(commit),
            gate,
            _batches.c.topic == ending.c.topic,
            _batches.c.partition == ending.c.partition,
            _batches.c.base_offset >= ending.c.first_offset,
            _batches.c.producer_id == ending.c.producer_id,
            _batches.c.control.is_(None),
        )
        .values(aborted=True),
        insert(_batches).from_select(list(marker), select(*marker.values()).where(gate)),
        update(_partitions).where(*at, gate).values(high_watermark=hw + 1),
        update(_states)
        .where(*of_producer, ending.c.first_offset.is_not(None), gate)
        .values(current_txn_first_offset=None),
    ]


_states = cast(Table, ProducerState.__table__)
_batches = cast(Table, Batch.__table__)
_partitions = cast(Table, Partition.__table__)
