"""The Postgres statements of an append group run on asyncpg under SQLAlchemy's unit of work
(coordinator.log.appends): a connection the store cuts between them is an outage, retriable, the
pool does not hand that connection out again, and nothing of the unit was written; batches are
stored without Postgres compressing them again.

Postgres only: SQLite runs every statement through SQLAlchemy, whose outage handling the store
outage tests cover on both stores.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import text

from coordinator.core.errors import StoreUnavailable
from coordinator.log import appends, produce, recordbatch
from tests.api import create_topic, init_pid, read_all
from tests.conftest import Store
from tests.support import postgres_base_url


@pytest.fixture
def store(postgres_store: Store) -> Store:
    return postgres_store


async def test_a_connection_cut_between_the_lock_and_the_writes_is_an_outage_and_writes_nothing(
    app: Any, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await create_topic(client, "t")
    pid = await init_pid(client)
    lock = appends.lock_partitions
    cut: list[int] = []

    async def lock_then_cut(connection: Any, keys: Any) -> Any:
        locked = await lock(connection, keys)
        if not cut:
            backend = (await connection.get_raw_connection()).driver_connection.get_server_pid()
            admin = await asyncpg.connect(postgres_base_url())
            try:
                await admin.execute("SELECT pg_terminate_backend($1)", backend)
            finally:
                await admin.close()
            cut.append(backend)
        return locked

    monkeypatch.setattr(appends, "lock_partitions", lock_then_cut)
    data = recordbatch.build(
        [(1, None, b"a", [])], producer_id=pid, producer_epoch=0, base_sequence=0
    )
    db, settings = app.state.db, app.state.settings

    with pytest.raises(StoreUnavailable):
        await produce.produce_batch(db, settings, "t", 0, data, None)
    assert await read_all(client, "t") == []

    # The producer's retry is the batch's first write, on a connection the store did not cut.
    appended = await produce.produce_batch(db, settings, "t", 0, data, None)
    assert (appended.base_offset, appended.duplicate) == (0, False)
    assert [r["value"] for r in await read_all(client, "t")] == ["a"]
    assert len(cut) == 1


async def test_batch_payloads_are_stored_as_they_come(app: Any) -> None:
    """Postgres does not try to compress a stored batch again (EXTERNAL storage): producers'
    batches are compressed already or do not compress, and trying costs more than the write."""
    async with app.state.db.read() as session:
        storage = await session.scalar(
            text(
                "SELECT attstorage FROM pg_attribute "
                "WHERE attrelid = 'batches'::regclass AND attname = 'payload'"
            )
        )
    assert storage in ("e", b"e")  # "char": asyncpg answers it as bytes
