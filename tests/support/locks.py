"""Holding Postgres row locks in a test: a unit of work that holds them until told, and waiting
until another session waits for one (its statement's snapshot is taken by then); and a change
committed between a call's read and its gated write."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from sqlalchemy import text


async def waiting_for_a_lock(app: Any) -> None:
    """Until a session of the app's database waits for a row lock: the test's request, when it is
    the only one that can. Each look is a transaction of its own: Postgres keeps one snapshot of
    pg_stat_activity per transaction (stats_fetch_consistency), so looking again in the same one
    would never see a wait that began after the first look."""
    async with app.state.db.engine.connect() as connection:
        for _ in range(500):
            waiting = await connection.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
            )
            await connection.rollback()
            if waiting:
                return
            await asyncio.sleep(0.01)
    raise AssertionError("no session waited for a lock within 5 s")


class Blocking:
    """A unit of work that runs `statements` (holding the row locks they take) until `done()` is
    called inside the block, then commits."""

    def __init__(self, app: Any, *statements: str) -> None:
        self._db, self._statements = app.state.db, statements
        self._release = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        try:
            async with self._db.engine.begin() as connection:
                for statement in self._statements:
                    await connection.execute(text(statement))
                ready.set_result(None)
                await self._release.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    async def __aenter__(self) -> Callable[[], None]:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(ready))
        await ready
        return self._release.set

    async def __aexit__(self, *exc: object) -> None:
        self._release.set()
        assert self._task is not None
        await self._task


def between_the_statements(
    app: Any, monkeypatch: pytest.MonkeyPatch, module: ModuleType, sql: str
) -> None:
    """Commit `sql` in a unit of work of its own just before `module` sends its second statement
    to asyncpg (`on_driver`): between a call's read of its facts and its gated write."""
    real = module.on_driver
    calls = 0

    async def interposed(connection: Any, statement: str, *args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            async with app.state.db.engine.begin() as other:
                await other.execute(text(sql))
        return await real(connection, statement, *args)

    monkeypatch.setattr(module, "on_driver", interposed)
