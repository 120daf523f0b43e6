"""Postgres's hot statements on asyncpg itself: prepared once by the driver, no compilation and
no result processing per call, one round trip each whatever the number of rows (arrays and
`unnest`); and several writes composed into one statement as data-modifying CTEs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any, TypeAlias

import asyncpg
from sqlalchemy import column, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.store.base import brief, refuse_nul_in

# SQLSTATEs of a server going away or serving no writes now, not of a statement it refused:
# connection exceptions (08), operator intervention (57P01 shutdown, as a primary's fast stop
# or pg_terminate_backend sends; 57P02 crash; 57P03 not accepting connections yet), a standby's
# read-only transaction (25006, a primary demoted under us), too many connections (53300).
_GONE_STATES = ("08", "57P", "25006", "53300")


def server_gone(exc: BaseException | None) -> bool:
    """The store's server cut the connection or cannot serve it, or the driver lost track of
    it (asyncpg's InternalClientError: a protocol left mid-operation by a cut): whatever ran on
    that connection cannot go on, and a retry on another may succeed."""
    if isinstance(exc, OSError | asyncpg.InterfaceError | asyncpg.InternalClientError):
        return True
    state = getattr(exc, "sqlstate", None)
    return isinstance(state, str) and state.startswith(_GONE_STATES)


# A connection the driver's statements run on: SQLAlchemy's (inside whatever transaction it
# began), or one of the driver's own (`Kept`), where each statement commits by itself.
Driven: TypeAlias = AsyncConnection | asyncpg.Connection


async def on_driver(connection: Driven, sql: str, *args: Any) -> list[Any]:
    """Run `sql` as an asyncpg prepared statement (cached by the driver) on `connection` or
    the driver's connection under it; its rows (none for a write). A connection the store cut
    is invalidated, so the pool never hands it out again (a kept one is dropped), and raised as
    an outage (an OSError is one to the store's outage handling). Text holding a NUL is refused
    first, as the store refuses it for SQLAlchemy's statements."""
    refuse_nul_in(args)
    try:
        if isinstance(connection, asyncpg.Connection):
            return list(await connection.fetch(sql, *args))
        raw = await connection.get_raw_connection()
        driver: asyncpg.Connection = raw.driver_connection
        return list(await driver.fetch(sql, *args))
    except Exception as exc:
        if not server_gone(exc):
            raise
        if isinstance(connection, AsyncConnection):
            await connection.invalidate(exc)
        raise ConnectionError(f"the store connection was lost: {brief(exc)}") from exc


class Kept:
    """Connections of the driver's own for the statements that commit by themselves (the
    one-statement paths, the first statement of a fetch, a NOTIFY): kept open and handed out
    as they are, with no pool checkout and no SQLAlchemy around each statement, which cost more
    than a small statement's own round trip (about 150 µs against 140 for `SELECT 1`). Up to
    `size` per event loop (asyncpg's connections belong to the loop they were made on); when
    all are busy the caller takes a pooled one instead. A connection a statement was cut short
    on (cancelled, or an error that was not the statement's) is closed, not kept; when the
    server went away every kept connection is, as SQLAlchemy's pool recycles its own then."""

    def __init__(self, connect_args: dict[str, Any], size: int) -> None:
        self._args = connect_args
        self._size = size
        self._idle: dict[asyncio.AbstractEventLoop, list[asyncpg.Connection]] = {}
        self._open: dict[asyncio.AbstractEventLoop, set[asyncpg.Connection]] = {}

    async def take(self) -> asyncpg.Connection | None:
        """An idle kept connection, or a new one when fewer than `size` are open on this loop;
        None when they are all busy."""
        loop = asyncio.get_running_loop()
        if loop not in self._open:
            for gone in [each for each in self._open if each.is_closed()]:
                self.drop(gone)  # a loop that closed without closing its connections
        idle = self._idle.setdefault(loop, [])
        while idle:
            connection = idle.pop()
            if not connection.is_closed():
                return connection
            self._open[loop].discard(connection)
        opened = self._open.setdefault(loop, set())
        if len(opened) >= self._size:
            return None
        connection = await asyncpg.connect(**self._args)
        if self._open.get(loop) is not opened:
            connection.terminate()  # closed while it connected: the caller takes the pool's
            return None
        opened.add(connection)
        return connection

    def give_back(self, connection: asyncpg.Connection, failure: BaseException | None) -> None:
        """`connection` after its statement, and the exception it ended with (None: none)."""
        loop = asyncio.get_running_loop()
        refused = isinstance(failure, asyncpg.PostgresError) and not server_gone(failure)
        reusable = not connection.is_closed() and not connection.is_in_transaction()
        if (failure is None or refused) and reusable:
            self._idle.setdefault(loop, []).append(connection)
            return
        self._open.get(loop, set()).discard(connection)
        connection.terminate()
        if isinstance(failure, ConnectionError | OSError) or server_gone(failure):
            self.drop(loop)

    def drop(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Close the kept connections (of `loop`; None: of every loop) at once."""
        for each in [loop] if loop is not None else list(self._open):
            for connection in self._open.pop(each, set()):
                with contextlib.suppress(RuntimeError):  # its loop closed: nothing to cut
                    connection.terminate()
            self._idle.pop(each, None)

    async def close(self) -> None:
        """Close every kept connection: this loop's politely, those of others at once."""
        loop = asyncio.get_running_loop()
        mine = self._open.pop(loop, set())
        self._idle.pop(loop, None)
        self.drop()
        for connection in list(mine):
            try:
                await connection.close(timeout=2)
            except Exception:  # a connection that will not close is cut
                connection.terminate()


class Compiled:
    """A SQLAlchemy statement compiled once for asyncpg: its text, and its parameters in order
    (the literals it binds itself included), so it runs on the driver (`on_driver`) by name."""

    def __init__(self, statement: Any) -> None:
        compiled = statement.compile(dialect=asyncpg_dialect())  # type: ignore[no-untyped-call]
        self.sql: str = compiled.string
        self.order: tuple[str, ...] = tuple(compiled.positiontup or ())
        self.literals: dict[str, Any] = dict(compiled.params)

    def args(self, values: dict[str, Any]) -> list[Any]:
        merged = {**self.literals, **values}
        return [merged[name] for name in self.order]

    async def run(self, connection: Driven, values: dict[str, Any]) -> list[Any]:
        return await on_driver(connection, self.sql, *self.args(values))


_COMPOSED: dict[tuple[int, ...], Any] = {}


def one_statement(writes: Sequence[Any], last: Any) -> Any:
    """`last` with `writes` as its data-modifying CTEs: several writes in one round trip. The
    statements must be built once (module constants with bind parameters): the composition is
    cached by their identity, so it is built and compiled once."""
    key = (*map(id, writes), id(last))
    statement = _COMPOSED.get(key)
    if statement is None:
        statement = last.add_cte(*(w.cte(f"w{i}") for i, w in enumerate(writes)))
        _COMPOSED[key] = statement
    return statement


def rows_of(sql: str, columns: Sequence[str]) -> Any:
    """The SELECT `sql` (its parameters `$n`, sent to the driver as they are) as a row source of
    `columns`, for a statement built with SQLAlchemy and sent as text (`render`)."""
    return text(sql).columns(*(column(c) for c in columns))


def render(statement: Any) -> str:
    """A SQLAlchemy statement over `rows_of` sources, as the text of a driver statement (it may
    bind nothing of its own: its parameters are the sources' `$n`)."""
    compiled = statement.compile(dialect=postgresql.dialect())  # type: ignore[no-untyped-call]
    assert not compiled.params, "a rendered statement binds only its sources' $n parameters"
    return str(compiled)
