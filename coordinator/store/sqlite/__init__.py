"""The SQLite engine: the embedded default, a local file. One writer at a time (SQLite's own
lock, and this process's writers queue for it in turn), readers beside it (WAL); statements run
in process, so no round trip is worth saving: every call takes its domain's locking path, and a
set of rows is written by executemany."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar

from sqlalchemy import bindparam, event, select
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine

from coordinator.core.errors import CoordinatorError
from coordinator.core.settings import Settings
from coordinator.log.appends import ProducerView
from coordinator.log.fetch import (
    FetchAsk,
    Fetched,
    KafkaFetch,
    PartitionAsk,
    fetch_each,
    fetch_portably,
)
from coordinator.log.models import Topic
from coordinator.store.base import Store
from coordinator.store.sqlite import log


def _int8send(value: int) -> bytes:
    return value.to_bytes(8, "big", signed=True)


def _overlay(data: bytes, placing: bytes, start: int, count: int) -> bytes:
    return data[: start - 1] + placing + data[start - 1 + count :]


def _engine(url: str, *, immediate: bool) -> AsyncEngine:
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
        # The two Postgres functions the statements of a transaction's markers set a batch's
        # base offset with (`log.markers.marker_writes`).
        dbapi_connection.create_function("int8send", 1, _int8send, deterministic=True)
        dbapi_connection.create_function("overlay", 4, _overlay, deterministic=True)

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


class SqliteStore(Store):
    """Write units begin with `BEGIN IMMEDIATE`, so two writers never both read and then fail to
    upgrade their lock; reads use a second engine with plain deferred transactions, which WAL
    lets run beside the writer."""

    remote: ClassVar[bool] = False

    def __init__(self, settings: Settings) -> None:
        url = settings.database_url
        super().__init__(url, _engine(url, immediate=True), _engine(url, immediate=False))
        self.settings = settings
        self.writers = 1
        # SQLite's busy handler retries a locked database by sleeping, which lets one writer
        # starve; writers of this process queue here instead, first come first served. Other
        # processes still meet SQLite's own lock, which is what keeps the data correct.
        self._write_turn = asyncio.Lock()

    @asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        async with self._write_turn:
            yield

    def insert(self, table: Any) -> Any:
        return sqlite.insert(table)

    def source_of(self, name: str, columns: Sequence[tuple[str, Any]]) -> Any:
        """One row of parameters (`{name}_{column}`): `run_writes` runs each write once per
        row, as executemany."""
        return select(*(bindparam(f"{name}_{c}", type_=t).label(c) for c, t in columns)).subquery(
            name
        )

    async def run_writes(
        self,
        session: AsyncSession,
        source: Any,
        per_row: Sequence[Any],
        rows: Sequence[dict[str, Any]],
        once: Sequence[Any],
        params: dict[str, Any],
        returning: Any | None = None,
    ) -> Sequence[Any]:
        if rows:
            each = [
                {**params, **{f"{source.name}_{c}": value for c, value in row.items()}}
                for row in rows
            ]
            for write in per_row:
                await session.execute(write, each)
        for write in once:
            await session.execute(write, params)
        return () if returning is None else (await session.execute(returning, params)).all()

    async def claim(self, session: AsyncSession, what: str) -> bool:
        return True  # the write unit holds SQLite's one write lock

    async def topic_names(self, ids: Collection[uuid.UUID]) -> dict[uuid.UUID, str]:
        async with self.read() as session:
            rows = await session.execute(
                select(Topic.topic_id, Topic.name).where(Topic.topic_id.in_(list(ids)))
            )
            return {topic_id: name for topic_id, name in rows}

    async def producer_views(
        self, connection: AsyncConnection, keys: Collection[tuple[str, int, int]]
    ) -> dict[tuple[str, int, int], ProducerView]:
        return await log.producer_views(connection, keys)

    async def write_appends(
        self,
        connection: AsyncConnection,
        rows: list[dict[str, Any]],
        states: list[dict[str, Any]],
        moved: list[tuple[str, int, int]],
    ) -> None:
        await log.write_appends(connection, rows, states, moved)

    async def fetch(self, ask: FetchAsk) -> Fetched:
        async with self.read() as session:
            return await fetch_portably(session, ask)

    async def fetch_partitions(
        self, asks: Sequence[PartitionAsk], rules: KafkaFetch
    ) -> list[Fetched | CoordinatorError]:
        """One partition after another (in process: no round trip to save)."""
        return await fetch_each(self, asks, rules)
