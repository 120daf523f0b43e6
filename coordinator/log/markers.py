"""Control markers: how a transaction's end is written into the partition logs.

A marker is a Kafka control batch (control and transactional attributes, one control record), so
every front door returns the stored bytes as they are. It takes one offset on its partition,
like a record. An abort also flags the producer's
batches of that transaction as aborted, so read_committed readers skip them, and every marker
releases the partition's LSO by clearing the producer's open-transaction offset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Integer,
    String,
    Table,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.database import one_statement, pairs_in
from coordinator.log.models import CONTROL_ABORT, CONTROL_COMMIT, Batch, Partition, ProducerState
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
    producer_epoch: int,
    locked: dict[tuple[str, int], tuple[int, int, int | None]],
    commit: bool,
    timestamp: int,
    also: Sequence[Any] = (),
    returning: Any | None = None,
    params: dict[str, Any] | None = None,
) -> Sequence[Any]:
    """Append a commit or abort marker (a Kafka control batch) to every locked partition:
    (topic, partition) -> (high watermark, producer id, first offset), as the transactions'
    `lock_transaction_partitions` answers. Each marker row keeps the first offset of the
    transaction it ends there; an abort flags the transaction's batches aborted.

    `also` (the caller's own writes ending the transaction) and `returning` (one more, with
    RETURNING, whose rows are answered) run with them, with `params`; they must be statements
    built once (module constants with bind parameters). On Postgres all of it travels as one
    statement of data-modifying CTEs over array parameters, one round trip whatever the number
    of partitions, compiled once; SQLite, in process, runs them one by one."""
    rows = _marker_rows(producer_epoch, locked, commit, timestamp)
    extra = params or {}
    if (await session.connection()).dialect.name == "postgresql":
        writes = [*_POSTGRES_WRITES, *also]
        statement = one_statement(writes, returning if returning is not None else writes.pop())
        arrays = {f"{name}_{c}": [row[c] for row in rows[name]] for name, c in _ARRAY_COLUMNS}
        result = await session.execute(statement, {**arrays, **extra})
        return result.all() if returning is not None else ()
    for statement, name in _SQLITE_WRITES:
        if rows[name]:
            await session.execute(statement, rows[name])
    for write in also:
        await session.execute(write, extra)
    if returning is None:
        return ()
    return (await session.execute(returning, extra)).all()


def _marker_rows(
    producer_epoch: int,
    locked: dict[tuple[str, int], tuple[int, int, int | None]],
    commit: bool,
    timestamp: int,
) -> dict[str, list[dict[str, Any]]]:
    """The rows each write of the markers takes, by write."""
    markers, advancing, releasing, aborting = [], [], [], []
    for (topic, partition), (hw, producer_id, first) in locked.items():
        payload = recordbatch.build_control(
            commit, producer_id, producer_epoch, timestamp, base_offset=hw
        )
        markers.append(
            {
                "topic": topic,
                "partition": partition,
                "base_offset": hw,
                "last_offset": hw,
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "base_sequence": -1,
                "last_sequence": -1,
                "timestamp": timestamp,
                "max_timestamp": timestamp,
                "size": len(payload),
                "is_transactional": True,
                "control": CONTROL_COMMIT if commit else CONTROL_ABORT,
                "aborted": not commit,
                "first_offset": first,
                "record_count": 1,
                "payload": payload,
            }
        )
        advancing.append({"t": topic, "p": partition, "hw": hw + 1})
        if first is not None:
            releasing.append({"t": topic, "p": partition, "pid": producer_id})
            if not commit:
                aborting.append({"t": topic, "p": partition, "first": first, "pid": producer_id})
    return {
        "marking": markers,
        "advancing": advancing,
        "releasing": releasing,
        "aborting": aborting,
    }


_states = cast(Table, ProducerState.__table__)
_batches = cast(Table, Batch.__table__)
_partitions = cast(Table, Partition.__table__)

# SQLite's statements, run as executemany (Core tables: an executemany with its own WHERE).
_SQLITE_WRITES = [
    (
        update(_batches)
        .where(
            _batches.c.topic == bindparam("t"),
            _batches.c.partition == bindparam("p"),
            _batches.c.base_offset >= bindparam("first"),
            _batches.c.producer_id == bindparam("pid"),
            _batches.c.control.is_(None),
        )
        .values(aborted=True),
        "aborting",
    ),
    (insert(_batches), "marking"),
    (
        update(_partitions)
        .where(_partitions.c.topic == bindparam("t"), _partitions.c.partition == bindparam("p"))
        .values(high_watermark=bindparam("hw")),
        "advancing",
    ),
    (
        update(_states)
        .where(
            _states.c.topic == bindparam("t"),
            _states.c.partition == bindparam("p"),
            _states.c.producer_id == bindparam("pid"),
        )
        .values(current_txn_first_offset=None),
        "releasing",
    ),
]


def _rows(name: str, columns: Sequence[tuple[str, Any]]) -> Any:
    """Rows as a Postgres subquery of `unnest` over one array parameter per column
    (`{name}_{column}`): one statement text whatever the number of rows, so it compiles once."""
    return select(
        *(func.unnest(bindparam(f"{name}_{c}", type_=ARRAY(t))).label(c) for c, t in columns)
    ).subquery(name)


_MARKER_COLUMNS = [(c.name, c.type) for c in _batches.columns]
_ROW_COLUMNS: dict[str, list[tuple[str, Any]]] = {
    "marking": _MARKER_COLUMNS,
    "advancing": [("t", String()), ("p", Integer()), ("hw", BigInteger())],
    "releasing": [("t", String()), ("p", Integer()), ("pid", BigInteger())],
    "aborting": [("t", String()), ("p", Integer()), ("first", BigInteger()), ("pid", BigInteger())],
}
_ARRAY_COLUMNS = [(name, c) for name, columns in _ROW_COLUMNS.items() for c, _ in columns]
_aborting = _rows("aborting", _ROW_COLUMNS["aborting"])
_marking = _rows("marking", _ROW_COLUMNS["marking"])
_advancing = _rows("advancing", _ROW_COLUMNS["advancing"])
_releasing = _rows("releasing", _ROW_COLUMNS["releasing"])
# Postgres: every write of the markers, for any number of partitions (empty arrays: no rows).
_POSTGRES_WRITES = [
    update(_batches)
    .where(
        _batches.c.topic == _aborting.c.t,
        _batches.c.partition == _aborting.c.p,
        _batches.c.base_offset >= _aborting.c.first,
        _batches.c.producer_id == _aborting.c.pid,
        _batches.c.control.is_(None),
    )
    .values(aborted=True),
    insert(_batches).from_select([c for c, _ in _MARKER_COLUMNS], select(_marking)),
    update(_partitions)
    .where(_partitions.c.topic == _advancing.c.t, _partitions.c.partition == _advancing.c.p)
    .values(high_watermark=_advancing.c.hw),
    update(_states)
    .where(
        _states.c.topic == _releasing.c.t,
        _states.c.partition == _releasing.c.p,
        _states.c.producer_id == _releasing.c.pid,
    )
    .values(current_txn_first_offset=None),
]
