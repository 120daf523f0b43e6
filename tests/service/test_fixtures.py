"""The test fixtures' own promise: emptying a store a live service is sweeping never fails."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import pytest

from coordinator.core.settings import Settings
from coordinator.models import Base
from coordinator.store.engines import open_store
from tests.support.services import Backend, empty_tables


async def _until(observer: asyncpg.Connection, query: str) -> object:
    # What is awaited is another server process's state: nothing here could set an Event.
    while not (value := await observer.fetchval(query)):  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    return value


async def test_emptying_survives_a_sweep_locking_its_rows_in_the_other_order(
    postgres_store: Backend,
) -> None:
    # A sweep holds a row of the table the emptying deletes from last, and then wants a row the
    # emptying has deleted already: a deadlock. The sweep, not the emptying, must be the one
    # cancelled.
    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    first, last = "producer_ids", "client_quotas"
    assert tables.index(first) < tables.index(last)
    raw = postgres_store.url.replace("postgresql+asyncpg://", "postgresql://")
    db = open_store(Settings(database_url=postgres_store.url))
    sweep = await asyncpg.connect(raw)
    observer = await asyncpg.connect(raw)
    try:
        await sweep.execute(
            f"INSERT INTO {first} (producer_epoch, created_at) VALUES (0, now());"
            f" INSERT INTO {last} VALUES ('alice', 'producer_byte_rate', 1024)"
        )
        async with sweep.transaction():
            await sweep.fetch(f"SELECT * FROM {last} FOR UPDATE")
            emptying = asyncio.create_task(empty_tables(db))
            # The emptying has deleted every table's rows but those of the last, and waits.
            deleting = (
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND query LIKE 'DO $$ BEGIN DELETE%' AND wait_event_type = 'Lock'"
            )
            await asyncio.wait_for(_until(observer, deleting), 30)
            with pytest.raises(asyncpg.DeadlockDetectedError):
                await sweep.fetch(f"SELECT * FROM {first} FOR UPDATE")
        await asyncio.wait_for(emptying, 30)
        assert await observer.fetchval(f"SELECT count(*) FROM {first}") == 0
        assert await observer.fetchval(f"SELECT count(*) FROM {last}") == 0
    finally:
        with contextlib.suppress(Exception):
            await sweep.close()
        await observer.close()
        await db.dispose()
