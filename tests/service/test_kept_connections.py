"""The connections the Postgres engine keeps for the driver's statements
(coordinator.store.postgres.driver.Kept): reused while they are sound, closed when a statement
was cut short on them or the server went away, the pool's when they are all busy, and closed
with the store.

Postgres only: SQLite's statements run in the process.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.core.errors import StoreUnavailable
from coordinator.store.postgres import PostgresStore
from coordinator.store.postgres.driver import on_driver
from tests.support.services import Backend

_PID = "SELECT pg_backend_pid()"
_BACKENDS = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1"


@pytest.fixture
def store(postgres_store: Backend) -> Backend:
    return postgres_store


@pytest.fixture
def db(app: Any) -> PostgresStore:
    store: PostgresStore = app.state.db
    return store


async def _pid(db: PostgresStore) -> int:
    async with db.driver() as connection:
        assert isinstance(connection, asyncpg.Connection)  # a kept one, not the pool's
        rows = await on_driver(connection, _PID)
    pid: int = rows[0][0]
    return pid


async def _alive(db: PostgresStore, pid: int) -> bool:
    async with db.autocommit() as connection:
        rows = await on_driver(
            connection, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid
        )
    return bool(rows[0][0])


async def _until_gone(db: PostgresStore, pid: int) -> None:
    async with asyncio.timeout(10):
        while await _alive(db, pid):  # noqa: ASYNC110 - the server's view, polled
            await asyncio.sleep(0.01)


async def test_a_kept_connection_serves_one_statement_after_another(db: PostgresStore) -> None:
    first = await _pid(db)
    assert await _pid(db) == first


async def test_a_statement_the_server_refuses_leaves_its_connection_kept(db: PostgresStore) -> None:
    first = await _pid(db)
    with pytest.raises(asyncpg.DataError):
        async with db.driver() as connection:
            await on_driver(connection, "SELECT 1 / $1::int", 0)
    assert await _pid(db) == first


async def test_a_statement_cancelled_under_way_takes_its_connection_with_it(
    db: PostgresStore,
) -> None:
    async def sleeping(pids: asyncio.Queue[int]) -> None:
        async with db.driver() as connection:
            pids.put_nowait((await on_driver(connection, _PID))[0][0])
            await on_driver(connection, "SELECT pg_sleep(5)")

    pids: asyncio.Queue[int] = asyncio.Queue()
    task = asyncio.create_task(sleeping(pids))
    cut = await pids.get()
    async with asyncio.timeout(10):  # the sleep has begun on the server
        while True:
            async with db.autocommit() as connection:
                rows = await on_driver(
                    connection, "SELECT query FROM pg_stat_activity WHERE pid = $1", cut
                )
            if rows and "pg_sleep" in rows[0][0]:
                break
            await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    # Never handed out again: the next statement has another.
    assert await _pid(db) != cut


async def test_a_backend_the_server_ends_is_an_outage_then_the_next_statement_connects_again(
    db: PostgresStore,
) -> None:
    cut = await _pid(db)
    async with db.autocommit() as connection:
        await on_driver(connection, "SELECT pg_terminate_backend($1)", cut)
    await _until_gone(db, cut)
    # Whether the driver heard of the end before the next statement or found it by sending
    # one, nothing but a retriable outage is answered, and the statement after it runs.
    try:
        pid = await _pid(db)
    except StoreUnavailable:
        pid = await _pid(db)
    assert pid != cut


async def test_statements_beyond_the_kept_connections_go_on_the_pools(db: PostgresStore) -> None:
    kept = set()
    async with contextlib.AsyncExitStack() as held:
        while True:
            connection = await held.enter_async_context(db.driver())
            if not isinstance(connection, asyncpg.Connection):
                break
            kept.add((await on_driver(connection, _PID))[0][0])
        assert isinstance(connection, AsyncConnection)
        assert len(kept) == 4  # the pool's size is 10: 4 kept, at most half of it
        assert (await on_driver(connection, "SELECT 41 + 1"))[0][0] == 42
    # Given back: the kept ones are handed out again.
    assert await _pid(db) in kept


async def test_the_kept_connections_close_with_the_store(db: PostgresStore) -> None:
    pids = set()
    async with db.driver() as one, db.driver() as two:
        for connection in (one, two):
            pids.add((await on_driver(connection, _PID))[0][0])
    assert len(pids) == 2
    await db.dispose()
    for pid in pids:
        await _until_gone(db, pid)  # asked on a pooled connection: the engine outlives dispose


async def test_a_connection_that_opens_as_the_store_closes_is_not_kept(
    db: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    connect, opened = asyncpg.connect, []
    connecting, go = asyncio.Event(), asyncio.Event()

    async def connect_late(**args: Any) -> asyncpg.Connection:
        connecting.set()
        await go.wait()
        opened.append(await connect(**args))
        return opened[-1]

    async def second() -> Any:
        async with db.driver() as connection:
            return (await on_driver(connection, "SELECT 1"))[0][0], type(connection)

    async with db.driver() as one:
        assert isinstance(one, asyncpg.Connection)
        monkeypatch.setattr(asyncpg, "connect", connect_late)
        statement = asyncio.create_task(second())
        await connecting.wait()
        await db.dispose()
        go.set()
        # The store closed while it connected: it is cut, and the statement takes the pool's.
        assert await statement == (1, AsyncConnection)
    assert opened[0].is_closed()
