"""The SQLite engine's statements of the log: an append group's reads and writes through
SQLAlchemy, the writes as executemany (in process, a statement costs no round trip)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, cast

from sqlalchemy import Table, bindparam, insert, select, update
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.log.appends import (
    STATE_KEY,
    ProducerView,
    batches,
    partitions,
    state_on_conflict,
    states,
)
from coordinator.producers.models import ProducerId
from coordinator.store.sql import pairs_in

_producers = cast(Table, ProducerId.__table__)


async def producer_views(
    connection: AsyncConnection, keys: Collection[tuple[str, int, int]]
) -> dict[tuple[str, int, int], ProducerView]:
    """`Store.producer_views` in two statements: the producers' epochs, then their
    states on the partitions."""
    pids = {pid for _, _, pid in keys}
    epochs = dict(
        (
            await connection.execute(
                select(_producers.c.producer_id, _producers.c.producer_epoch).where(
                    _producers.c.producer_id.in_(pids)
                )
            )
        ).all()
    )
    views = {key: ProducerView(epochs[key[2]]) for key in keys if key[2] in epochs}
    rows = await connection.execute(
        select(
            states.c.topic,
            states.c.partition,
            states.c.producer_id,
            states.c.producer_epoch,
            states.c.last_sequence,
            states.c.current_txn_first_offset,
        ).where(
            pairs_in(states.c.topic, states.c.partition, {(t, p) for t, p, _ in keys}),
            states.c.producer_id.in_(list(epochs)),
        )
    )
    for topic, partition, pid, epoch, last_sequence, open_offset in rows:
        view = views.get((topic, partition, pid))
        if view is not None:
            view.state_epoch, view.last_sequence, view.open_txn_offset = (
                epoch,
                last_sequence,
                open_offset,
            )
    return views


_ADVANCE = (
    update(partitions)
    .where(
        partitions.c.topic == bindparam("at_topic"),
        partitions.c.partition == bindparam("at_partition"),
    )
    .values(high_watermark=bindparam("next_offset"))
)


def _upsert_states_sqlite() -> Any:
    stmt = sqlite.insert(states)
    return stmt.on_conflict_do_update(
        index_elements=STATE_KEY, set_=state_on_conflict(states.c, stmt.excluded)
    )


_UPSERT_STATES_SQLITE = _upsert_states_sqlite()


async def write_appends(
    connection: AsyncConnection,
    rows: list[dict[str, Any]],
    producer_states: list[dict[str, Any]],
    moved: list[tuple[str, int, int]],
) -> None:
    """`Store.write_appends` as executemany statements (in process: no round trips to save)."""
    await connection.execute(insert(batches), rows)
    if producer_states:
        await connection.execute(_UPSERT_STATES_SQLITE, producer_states)
    await connection.execute(
        _ADVANCE, [{"at_topic": t, "at_partition": p, "next_offset": hw} for t, p, hw in moved]
    )
