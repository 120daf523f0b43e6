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


async def test_emptying_survives_a_sweep_reading_its_tables_in_the_other_order(
    postgres_store: Backend,
) -> None:
    # The deadlock CI met: a sweep holds the table TRUNCATE locks last and then reads the one it
    # locked first. The sweep, not the emptying, must be the one cancelled.
    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    raw = postgres_store.url.replace("postgresql+asyncpg://", "postgresql://")
    db = open_store(Settings(database_url=postgres_store.url))
    sweep = await asyncpg.connect(raw)
    observer = await asyncpg.connect(raw)
    try:
        async with sweep.transaction():
            await sweep.fetch(f"SELECT * FROM {tables[-1]}")
            emptying = asyncio.create_task(empty_tables(db))
            # TRUNCATE holds every table but that one, and waits for it.
            truncating = (
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND query LIKE 'TRUNCATE%' AND wait_event_type = 'Lock'"
            )
            await asyncio.wait_for(_until(observer, truncating), 30)
            with pytest.raises(asyncpg.DeadlockDetectedError):
                await sweep.fetch(f"SELECT * FROM {tables[0]}")
        await asyncio.wait_for(emptying, 30)
    finally:
        with contextlib.suppress(Exception):
            await sweep.close()
        await observer.close()
        await db.dispose()
