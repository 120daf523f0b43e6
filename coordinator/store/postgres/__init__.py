"""The Postgres engine: the production store. A pool of asyncpg connections, shared by every unit
of work; the hot calls on prepared statements sent to the driver itself, one round trip each,
on connections kept for them (`driver`), and the one-statement paths that apply the domains'
rules to the rows they lock; fetches from hot standbys (`replicas`)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import asyncpg
from sqlalchemy import bindparam, func, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, create_async_engine

from coordinator.core.errors import CoordinatorError
from coordinator.core.settings import Settings
from coordinator.groups.committing import CommitRule, MemberCommit
from coordinator.groups.consumer import Renewal, SteadyRule
from coordinator.log.appends import ConditionalAppends, ProducerView, WrittenIfUnchanged
from coordinator.log.fetch import FetchAsk, Fetched, KafkaFetch, PartitionAsk
from coordinator.store.base import Store
from coordinator.store.postgres import appends, fetch, groups, moves, transactions
from coordinator.store.postgres.driver import Driven, Kept, on_driver, one_statement, server_gone
from coordinator.store.postgres.replicas import Replicas
from coordinator.transactions.offsets import OffsetsRule, TxnOffsets
from coordinator.transactions.states import State

# The cleaner's claim of a partition: an advisory lock of this class (its namespace among the
# store's advisory locks), on the partition's name.
_CLAIM_CLASS = 0x4C4F47  # "LOG": what `claim` holds (a partition to clean, the placement)
_NAMES_BY_ID = "SELECT topic_id, name FROM topics WHERE topic_id = ANY($1::uuid[])"
# The connections a process keeps for the driver's statements (`driver.Kept`), per event loop,
# beside the pool's (at most half the pool's size).
_KEPT = 4


def _driver_args(engine: Any) -> dict[str, Any]:
    """What asyncpg connects with for `engine`'s URL, as SQLAlchemy's dialect reads it (without
    the options SQLAlchemy's own adapter takes)."""
    _, args = engine.dialect.create_connect_args(engine.url)
    own = ("async_creator_fn", "prepared_statement_cache_size", "prepared_statement_name_func")
    for name in own:
        args.pop(name, None)
    return dict(args)


class PostgresStore(Store):
    remote: ClassVar[bool] = True

    def __init__(self, settings: Settings) -> None:
        engine = create_async_engine(
            settings.database_url, pool_size=settings.pool_size, max_overflow=settings.pool_size
        )
        super().__init__(settings.database_url, engine, engine)
        self.settings = settings
        self.writers = settings.append_groups_in_flight
        self._relay = moves.Relay(self)
        self._kept = Kept(_driver_args(engine), min(_KEPT, settings.pool_size // 2))
        self.replicas = (
            Replicas.of(settings.read_replica_urls, settings.pool_size, settings.replica_max_lag_ms)
            if settings.read_replica_urls
            else None
        )

    def _outage_errors(self) -> tuple[type[BaseException], ...]:
        return (*super()._outage_errors(), asyncpg.InternalClientError)

    def server_gone(self, exc: BaseException | None) -> bool:
        return server_gone(exc)

    async def vacuum(self, *tables: str) -> None:
        """`VACUUM (SKIP_LOCKED)` the tables, outside any transaction, so the space of deleted
        rows is reused even where autovacuum is off or slow; a table another process is
        vacuuming is skipped."""
        async with self.engine.connect() as connection:
            autocommit = await connection.execution_options(isolation_level="AUTOCOMMIT")
            await autocommit.exec_driver_sql(f"VACUUM (SKIP_LOCKED) {', '.join(tables)}")

    @asynccontextmanager
    async def driver(self) -> AsyncIterator[Driven]:
        """`autocommit()` for statements sent to the driver alone: one of the connections the
        process keeps for them (`driver.Kept`), or a pooled one when those are all busy."""
        async with self._outages():
            kept = await self._kept.take()
            if kept is None:
                async with self.engine.connect() as connection:
                    yield connection
                return
            try:
                yield kept
            except BaseException as exc:
                self._kept.give_back(kept, exc)
                raise
            self._kept.give_back(kept, None)

    async def dispose(self) -> None:
        await self._relay.close()
        await self._kept.close()
        if self.replicas is not None:
            await self.replicas.dispose()
        await super().dispose()

    def insert(self, table: Any) -> Any:
        return postgresql.insert(table)

    def source_of(self, name: str, columns: Sequence[tuple[str, Any]]) -> Any:
        """One array parameter per column (`{name}_{column}`), unnested: one statement text
        whatever the number of rows, so it compiles once."""
        return select(
            *(func.unnest(bindparam(f"{name}_{c}", type_=ARRAY(t))).label(c) for c, t in columns)
        ).subquery(name)

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
        """All of it as one statement of data-modifying CTEs: one round trip."""
        writes = [*per_row, *once]
        statement = one_statement(writes, returning if returning is not None else writes.pop())
        arrays = {
            f"{source.name}_{column.name}": [row[column.name] for row in rows]
            for column in source.columns
        }
        result = await session.execute(statement, {**arrays, **params})
        return result.all() if returning is not None else ()

    async def claim(self, session: AsyncSession, what: str) -> bool:
        claimed = await session.scalar(
            text("SELECT pg_try_advisory_xact_lock(:class, hashtext(:key))"),
            {"class": _CLAIM_CLASS, "key": what},
        )
        return bool(claimed)

    def moved(self, partitions: Collection[tuple[str, int]]) -> None:
        self._relay.moved(partitions)

    async def listen_moves(self, moved: moves.Moved) -> None:
        await moves.listen(self, moved)

    async def topic_names(self, ids: Collection[uuid.UUID]) -> dict[uuid.UUID, str]:
        # In the one round trip of a statement that commits by itself (a fetch names its topics
        # by id on every request).
        async with self.driver() as connection:
            rows = await on_driver(connection, _NAMES_BY_ID, list(ids))
        return {topic_id: name for topic_id, name in rows}

    async def producer_views(
        self, connection: AsyncConnection, keys: Collection[tuple[str, int, int]]
    ) -> dict[tuple[str, int, int], ProducerView]:
        return await appends.producer_views(connection, keys)

    async def write_appends(
        self,
        connection: AsyncConnection,
        rows: list[dict[str, Any]],
        states: list[dict[str, Any]],
        moved: list[tuple[str, int, int]],
    ) -> None:
        await appends.write_appends(connection, rows, states, moved)

    async def write_appends_if_unchanged(
        self, planned: ConditionalAppends
    ) -> WrittenIfUnchanged | None:
        async with self.driver() as connection:
            return await appends.write_if_unchanged(connection, planned)

    async def fetch(self, ask: FetchAsk) -> Fetched:
        return await fetch.fetch(self, ask)

    async def fetch_partitions(
        self, asks: Sequence[PartitionAsk], rules: KafkaFetch
    ) -> list[Fetched | CoordinatorError]:
        return await fetch.fetch_partitions(self, asks, rules)

    async def add_partitions_at_once(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        keys: list[tuple[str, int]],
        now: int,
    ) -> bool:
        async with self.driver() as connection:
            return await transactions.add_partitions(
                connection, transactional_id, producer_id, epoch, keys, now
            )

    async def end_at_once(
        self, values: dict[str, Any], raise_epoch: bool
    ) -> list[tuple[str, int]] | None:
        async with self.driver() as connection:
            return await transactions.end(connection, values, raise_epoch)

    async def add_offsets_at_once(self, ask: TxnOffsets, rule: OffsetsRule) -> State | None:
        async with self.driver() as connection:
            return await transactions.add_offsets(connection, ask, rule)

    async def commit_as_member(self, commit: MemberCommit, rule: CommitRule) -> bool:
        async with self.driver() as connection:
            return await groups.commit_as_member(connection, commit, rule)

    async def renew_if_steady(
        self, group_id: str, member_id: str, now: int, steady: SteadyRule, renewal: Renewal
    ) -> list[tuple[str, int]] | None:
        async with self.driver() as connection:
            return await groups.renew_if_steady(
                connection, group_id, member_id, now, steady, renewal
            )
