"""One async SQLAlchemy engine per store, and the unit of work every request runs in.

SQLite (the embedded default) allows one writer at a time: write units begin with
`BEGIN IMMEDIATE`, so two writers never both read and then fail to upgrade their lock; reads use
a second engine with plain deferred transactions, which WAL lets run beside the writer. Postgres
serialises appends with row locks taken inside the unit (see `coordinator.log.produce`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from sqlalchemy import BigInteger, Integer, LargeBinary, MetaData, and_, event, or_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

from coordinator.core.errors import StoreUnavailable, UnstorableText
from coordinator.core.replicas import Replicas
from coordinator.core.settings import Settings

log = logging.getLogger("coordinator.store")

# A 64-bit key that SQLite still treats as its rowid alias (so it autoincrements).
BigIntKey = BigInteger().with_variant(Integer(), "sqlite")


class FreeText(TypeDecorator[str]):
    """Text a client may fill with anything, a NUL included (Kafka's offset-commit metadata):
    kept as its UTF-8 bytes, since Postgres text cannot hold a NUL. Rows written as text before
    the column held bytes read back as they are."""

    impl = LargeBinary
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> bytes | None:
        return None if value is None else value.encode("utf-8")

    def process_result_value(self, value: bytes | str | None, dialect: Any) -> str | None:
        if value is None or isinstance(value, str):
            return value
        return bytes(value).decode("utf-8")


NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


def _sqlite_engine(url: str, *, immediate: bool) -> AsyncEngine:
    engine = create_async_engine(url, connect_args={"timeout": 60})

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _: Any) -> None:
        # Take transaction control away from the driver so we can say BEGIN IMMEDIATE ourselves.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # FULL: an acknowledged append survives a power cut, not only a killed process.
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA busy_timeout=60000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _refuse_nul(
    _connection: Any, _cursor: Any, _statement: str, parameters: Any, _context: Any, many: bool
) -> None:
    """No text with a NUL reaches either store: one rule for every statement, so a name, an id or
    a metadata string that holds one is a 400 / INVALID_REQUEST through both doors, never a 500
    (Postgres refuses the byte) or a silent difference between the stores (SQLite keeps it)."""
    for row in parameters if many else (parameters,):
        _refuse_nul_in(row.values() if isinstance(row, dict) else row or ())


def _refuse_nul_in(values: Iterable[Any]) -> None:
    """`_refuse_nul` for one statement's parameters (text, or arrays of text)."""
    for value in values:
        if isinstance(value, str):
            if "\0" in value:
                _unstorable(value)
        elif isinstance(value, list | tuple):
            for item in value:
                if isinstance(item, str) and "\0" in item:
                    _unstorable(item)


def _unstorable(value: str) -> None:
    raise UnstorableText(f"text may not hold a NUL character: {value[:64]!r}")


def _is_outage(exc: BaseException) -> bool:
    """A connection that was refused, lost, or closed under a statement, or a server going away
    (not a statement the store refused: those are the caller's)."""
    if isinstance(exc, DBAPIError):
        return (
            bool(exc.connection_invalidated)
            or isinstance(exc, OperationalError | InterfaceError)
            or _server_gone(exc.orig)
        )
    return _server_gone(exc)


# SQLSTATEs of a server going away or serving no writes now, not of a statement it refused:
# connection exceptions (08), operator intervention (57P01 shutdown, as a primary's fast stop
# or pg_terminate_backend sends; 57P02 crash; 57P03 not accepting connections yet), a standby's
# read-only transaction (25006, a primary demoted under us), too many connections (53300).
_GONE_STATES = ("08", "57P", "25006", "53300")


def _server_gone(exc: BaseException | None) -> bool:
    """The store's server cut the connection or cannot serve it, or the driver lost track of
    it (asyncpg's InternalClientError: a protocol left mid-operation by a cut): whatever ran on
    that connection cannot go on, and a retry on another may succeed."""
    if isinstance(exc, OSError | asyncpg.InterfaceError | asyncpg.InternalClientError):
        return True
    state = getattr(exc, "sqlstate", None)
    return isinstance(state, str) and state.startswith(_GONE_STATES)


def _brief(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    return f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"[:200]


class Database:
    """The store: `write()` and `read()` yield a session inside one database transaction."""

    def __init__(self, settings: Settings) -> None:
        self.url = settings.database_url
        self.is_sqlite = settings.is_sqlite
        if self.is_sqlite:
            self.engine = _sqlite_engine(self.url, immediate=True)
            self.read_engine = _sqlite_engine(self.url, immediate=False)
        else:
            self.engine = create_async_engine(
                self.url, pool_size=settings.pool_size, max_overflow=settings.pool_size
            )
            self.read_engine = self.engine
        self.replicas = (
            Replicas.of(settings.read_replica_urls, settings.pool_size, settings.replica_max_lag_ms)
            if settings.read_replica_urls and not self.is_sqlite
            else None
        )
        # SQLite's busy handler retries a locked database by sleeping, which lets one writer
        # starve; writers of this process queue here instead, first come first served. Other
        # processes still meet SQLite's own lock, which is what keeps the data correct.
        self._write_turn = asyncio.Lock() if self.is_sqlite else None
        self._outage = False  # logged once when it begins, once when it ends
        for engine in {self.engine, self.read_engine}:
            event.listen(engine.sync_engine, "before_cursor_execute", _refuse_nul)
        self._writes = async_sessionmaker(self.engine, expire_on_commit=False)
        self._reads = async_sessionmaker(self.read_engine, expire_on_commit=False)

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncSession]:
        """A unit of work: commits when the block ends normally, rolls back when it raises.
        Callables in `session.info["after_commit"]` run once the commit succeeded. A store that
        cannot be reached is `StoreUnavailable` (retriable), whatever statement met it."""
        async with self._outages(), self._turn(), self._writes() as session:
            async with session.begin():
                yield session
            for hook in session.info.pop("after_commit", ()):
                hook()

    @asynccontextmanager
    async def _outages(self) -> AsyncIterator[None]:
        """Translate a lost or refused connection into `StoreUnavailable`, logging one WARNING
        when an outage begins and one when the store answers again (not one per request). The
        pool drops the connection the store cut (SQLAlchemy invalidates it), so none is reused
        mid-operation."""
        try:
            yield
        except (DBAPIError, OSError, asyncpg.InternalClientError) as exc:
            if not _is_outage(exc):
                raise
            if not self._outage:
                self._outage = True
                log.warning(
                    "the store is unavailable (%s); answering retriable errors", _brief(exc)
                )
            raise StoreUnavailable(
                "the store is unavailable; retry shortly", {"cause": _brief(exc)}
            ) from None
        if self._outage:
            self._outage = False
            log.warning("the store answers again")

    @asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        if self._write_turn is None:
            yield
            return
        async with self._write_turn:
            yield

    @asynccontextmanager
    async def autocommit(self) -> AsyncIterator[AsyncConnection]:
        """A pooled connection (Postgres) under no transaction of its own: a statement sent to
        its driver (`on_driver`) is its own unit of work, committed in the one round trip that
        runs it. Outages as in `write()`."""
        async with self._outages(), self.engine.connect() as connection:
            yield connection

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        async with self._outages(), self._reads() as session, session.begin():
            yield session

    async def vacuum(self, *tables: str) -> None:
        """Postgres: `VACUUM (SKIP_LOCKED)` the tables, outside any transaction, so the space of
        deleted rows is reused even where autovacuum is off or slow; a table another process is
        vacuuming is skipped. SQLite reuses freed pages by itself."""
        if self.is_sqlite:
            return
        async with self.engine.connect() as connection:
            autocommit = await connection.execution_options(isolation_level="AUTOCOMMIT")
            await autocommit.exec_driver_sql(f"VACUUM (SKIP_LOCKED) {', '.join(tables)}")

    async def dispose(self) -> None:
        if self.replicas is not None:
            await self.replicas.dispose()
        await self.engine.dispose()
        if self.read_engine is not self.engine:
            await self.read_engine.dispose()


async def on_driver(connection: AsyncConnection, sql: str, *args: Any) -> list[Any]:
    """Run `sql` as an asyncpg prepared statement (cached by the driver) on the connection under
    `connection`, inside whatever transaction SQLAlchemy began on it; its rows (none for a
    write). For the hot statements: no compilation, no result processing. A connection the store
    cut is invalidated, so the pool never hands it out again, and raised as an outage (an
    OSError is one to `Database`'s outage handling). Text holding a NUL is refused first, as
    `_refuse_nul` refuses it for SQLAlchemy's statements."""
    _refuse_nul_in(args)
    try:
        raw = await connection.get_raw_connection()
        driver: asyncpg.Connection = raw.driver_connection
        return list(await driver.fetch(sql, *args))
    except Exception as exc:
        if not _server_gone(exc):
            raise
        await connection.invalidate(exc)
        raise ConnectionError(f"the store connection was lost: {_brief(exc)}") from exc


# Rows per statement of a multi-row write: within both stores' bound-parameter limits (32766)
# for tables of up to 32 columns.
ROWS_PER_STATEMENT = 1000


async def upsert(
    session: AsyncSession,
    table: Any,
    rows: Sequence[dict[str, Any]],
    keys: list[str],
) -> None:
    """INSERT ... ON CONFLICT (keys) DO UPDATE, in the session's dialect: every row in one
    statement (per ROWS_PER_STATEMENT). Rows sharing keys: the last one wins, as if each had
    been written in turn (one statement may not update a row twice)."""
    if not rows:
        return
    last = list({tuple(row[k] for k in keys): row for row in rows}.values())
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    for start in range(0, len(last), ROWS_PER_STATEMENT):
        stmt = dialect.insert(table).values(last[start : start + ROWS_PER_STATEMENT])
        updates = {c: stmt.excluded[c] for c in last[0] if c not in keys}
        await session.execute(stmt.on_conflict_do_update(index_elements=keys, set_=updates))


def insert_ignore(
    session: AsyncSession, table: Any, rows: list[dict[str, Any]], keys: list[str]
) -> Any:
    """INSERT ... ON CONFLICT (keys) DO NOTHING for many rows, in the session's dialect."""
    if session.get_bind().dialect.name == "postgresql":
        pg_stmt = postgresql.insert(table).on_conflict_do_nothing(index_elements=keys)
        return session.execute(pg_stmt, rows)
    lite_stmt = sqlite.insert(table).on_conflict_do_nothing(index_elements=keys)
    return session.execute(lite_stmt, rows)


_COMPOSED: dict[tuple[int, ...], Any] = {}


def one_statement(writes: Sequence[Any], last: Any) -> Any:
    """`last` with `writes` as its data-modifying CTEs (Postgres): several writes in one round
    trip. The statements must be built once (module constants with bind parameters): the
    composition is cached by their identity, so it is built and compiled once."""
    key = (*map(id, writes), id(last))
    statement = _COMPOSED.get(key)
    if statement is None:
        statement = last.add_cte(*(w.cte(f"w{i}") for i, w in enumerate(writes)))
        _COMPOSED[key] = statement
    return statement


def pairs_in(first: Any, second: Any, pairs: Iterable[tuple[Any, Any]]) -> Any:
    """`(first, second) IN pairs` as one `first = a AND second IN (...)` per distinct `a`: Postgres
    plans a row-value IN list as nested comparisons, and a few thousand pairs (a topic's
    partitions) exhaust its stack. `pairs` must not be empty."""
    grouped: dict[Any, list[Any]] = {}
    for a, b in pairs:
        grouped.setdefault(a, []).append(b)
    return or_(*(and_(first == a, second.in_(bs)) for a, bs in grouped.items()))
