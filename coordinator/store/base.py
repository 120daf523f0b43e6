"""The store's protocol and what both engines share: units of work, outages, refused text.

A domain holds a `Store` and asks it; it never asks which database it is on. What differs by
engine (the hot statements, the one-statement paths, how a connection is made) is a method each
engine implements (`coordinator.store.postgres`, `coordinator.store.sqlite`); the rules those
statements apply are the domains', given to the engines as functions and statement parts.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import event
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from coordinator.core.errors import StoreUnavailable, UnstorableText

if TYPE_CHECKING:
    import uuid

    from coordinator.core.errors import CoordinatorError
    from coordinator.core.settings import Settings
    from coordinator.groups.committing import CommitRule, MemberCommit
    from coordinator.groups.consumer import Renewal, SteadyRule
    from coordinator.log.appends import ConditionalAppends, ProducerView, WrittenIfUnchanged
    from coordinator.log.fetch import FetchAsk, Fetched, KafkaFetch, PartitionAsk
    from coordinator.store.postgres.replicas import Replicas
    from coordinator.transactions.offsets import OffsetsRule, TxnOffsets
    from coordinator.transactions.states import State

log = logging.getLogger("coordinator.store")

# Rows per statement of a multi-row write: within both stores' bound-parameter limits (32766)
# for tables of up to 32 columns.
ROWS_PER_STATEMENT = 1000


def _refuse_nul(
    _connection: Any, _cursor: Any, _statement: str, parameters: Any, _context: Any, many: bool
) -> None:
    """No text with a NUL reaches either store: one rule for every statement, so a name, an id or
    a metadata string that holds one is a 400 / INVALID_REQUEST through both doors, never a 500
    (Postgres refuses the byte) or a silent difference between the stores (SQLite keeps it)."""
    for row in parameters if many else (parameters,):
        refuse_nul_in(row.values() if isinstance(row, dict) else row or ())


def refuse_nul_in(values: Iterable[Any]) -> None:
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


def brief(exc: BaseException) -> str:
    cause = getattr(exc, "orig", None) or exc
    return f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"[:200]


def store_of(session: AsyncSession) -> Store:
    """The store whose unit of work `session` is (every unit of work knows its store)."""
    store: Store = session.info["store"]
    return store


class Store:
    """The store: `write()` and `read()` yield a session inside one database transaction; the
    rest is what the domains ask of it, each engine answering its own way.

    The one-statement paths (`add_partitions_at_once`, `end_at_once`, ...) are how an engine
    whose statements travel to a server saves round trips on the hot calls: each applies the
    domain's rules to the rows it locks, or to facts it read and whose versions it checks, and
    answers None (or False) when it wrote nothing and the domain's locking path must decide. An
    engine with no such path (SQLite's) answers so at once."""

    # Statements travel to a server, each a round trip (so saving them is worth a cache of what
    # the process saw written: `coordinator.log.produce`'s optimistic appends).
    remote: ClassVar[bool]
    # Units of work that may write at once (an append group each).
    writers: int
    # Hot standbys that may serve fetches (Postgres only).
    replicas: Replicas | None = None
    # The settings the store was opened with: what a rule deep in a unit of work reads of them
    # (a share group's defaults, when a transaction's end settles its acknowledgements).
    settings: Settings

    def __init__(self, url: str, engine: AsyncEngine, read_engine: AsyncEngine) -> None:
        self.url = url
        self.engine = engine
        self.read_engine = read_engine
        self._outage = False  # logged once when it begins, once when it ends
        for each in {engine, read_engine}:
            event.listen(each.sync_engine, "before_cursor_execute", _refuse_nul)
        info = {"store": self}
        self._writes = async_sessionmaker(engine, expire_on_commit=False, info=info)
        self._reads = async_sessionmaker(read_engine, expire_on_commit=False, info=info)

    # -- units of work ----------------------------------------------------------------------------

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
    async def read(self) -> AsyncIterator[AsyncSession]:
        async with self._outages(), self._reads() as session, session.begin():
            yield session

    @asynccontextmanager
    async def autocommit(self) -> AsyncIterator[AsyncConnection]:
        """A pooled connection under no transaction of its own: each statement sent to its
        driver is its own unit of work. Outages as in `write()`."""
        async with self._outages(), self.engine.connect() as connection:
            yield connection

    @asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        """Held for the length of a write unit (an engine whose writers must queue)."""
        yield

    @asynccontextmanager
    async def _outages(self) -> AsyncIterator[None]:
        """Translate a lost or refused connection into `StoreUnavailable`, logging one WARNING
        when an outage begins and one when the store answers again (not one per request). The
        pool drops the connection the store cut (SQLAlchemy invalidates it), so none is reused
        mid-operation."""
        try:
            yield
        except self._outage_errors() as exc:
            if not self._is_outage(exc):
                raise
            if not self._outage:
                self._outage = True
                log.warning("the store is unavailable (%s); answering retriable errors", brief(exc))
            raise StoreUnavailable(
                "the store is unavailable; retry shortly", {"cause": brief(exc)}
            ) from None
        if self._outage:
            self._outage = False
            log.warning("the store answers again")

    def _outage_errors(self) -> tuple[type[BaseException], ...]:
        """The exceptions that may mean an outage (`_is_outage` tells)."""
        return (DBAPIError, OSError)

    def _is_outage(self, exc: BaseException) -> bool:
        """A connection that was refused, lost, or closed under a statement, or a server going
        away (not a statement the store refused: those are the caller's)."""
        if isinstance(exc, DBAPIError):
            return (
                bool(exc.connection_invalidated)
                or isinstance(exc, OperationalError | InterfaceError)
                or self.server_gone(exc.orig)
            )
        return self.server_gone(exc)

    def server_gone(self, exc: BaseException | None) -> bool:
        """The driver's error `exc` means the server cannot serve this connection any more."""
        return isinstance(exc, OSError)

    async def vacuum(self, *tables: str) -> None:
        """Give the space of deleted rows back for reuse, where the engine does not by itself."""

    async def dispose(self) -> None:
        await self.engine.dispose()
        if self.read_engine is not self.engine:
            await self.read_engine.dispose()

    # -- SQL that differs by dialect ------------------------------------------------------------

    def insert(self, table: Any) -> Any:
        """The dialect's INSERT of `table`, with its ON CONFLICT clauses."""
        raise NotImplementedError

    async def upsert(
        self, session: AsyncSession, table: Any, rows: Sequence[dict[str, Any]], keys: list[str]
    ) -> None:
        """INSERT ... ON CONFLICT (keys) DO UPDATE: every row in one statement (per
        ROWS_PER_STATEMENT). Rows sharing keys: the last one wins, as if each had been written
        in turn (one statement may not update a row twice)."""
        if not rows:
            return
        last = list({tuple(row[k] for k in keys): row for row in rows}.values())
        for start in range(0, len(last), ROWS_PER_STATEMENT):
            stmt = self.insert(table).values(last[start : start + ROWS_PER_STATEMENT])
            updates = {c: stmt.excluded[c] for c in last[0] if c not in keys}
            await session.execute(stmt.on_conflict_do_update(index_elements=keys, set_=updates))

    async def insert_ignore(
        self, session: AsyncSession, table: Any, rows: Sequence[dict[str, Any]], keys: list[str]
    ) -> int:
        """INSERT ... ON CONFLICT (keys) DO NOTHING for many rows: how many were inserted."""
        inserted = 0
        for start in range(0, len(rows), ROWS_PER_STATEMENT):
            statement = (
                self.insert(table)
                .values(list(rows[start : start + ROWS_PER_STATEMENT]))
                .on_conflict_do_nothing(index_elements=keys)
                .execution_options(preserve_rowcount=True)
            )
            result = await session.execute(statement)
            inserted += int(getattr(result, "rowcount", 0) or 0)
        return inserted

    def source_of(self, name: str, columns: Sequence[tuple[str, Any]]) -> Any:
        """A row source named `name` of `columns` ((name, type)) for `run_writes`: the rows
        given there."""
        raise NotImplementedError

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
        """Run `per_row` (statements over the row source `source`, of `source_of`) for `rows`,
        then `once` and `returning` (RETURNING rows, answered), all with `params`; the
        statements must be built once (module constants). One rule for a set of rows, each
        engine running it its way."""
        raise NotImplementedError

    async def claim(self, session: AsyncSession, what: str) -> bool:
        """Claim `what` (a partition to clean, the cluster's placement) for this unit of work,
        unless another process's unit of work holds it (then False: it is skipped this round)."""
        raise NotImplementedError

    # -- the log ---------------------------------------------------------------------------------

    async def topic_names(self, ids: Collection[uuid.UUID]) -> dict[uuid.UUID, str]:
        """The name of each topic in `ids` that exists."""
        raise NotImplementedError

    async def producer_views(
        self, connection: AsyncConnection, keys: Collection[tuple[str, int, int]]
    ) -> dict[tuple[str, int, int], ProducerView]:
        """Each (topic, partition, producer id)'s view; a producer id never issued is left out.
        Run after the partitions' locks, as statements of their own, so they see what the
        previous append committed."""
        raise NotImplementedError

    async def write_appends(
        self,
        connection: AsyncConnection,
        rows: list[dict[str, Any]],
        states: list[dict[str, Any]],
        moved: list[tuple[str, int, int]],
    ) -> None:
        """Write an append group's batch rows, its producers' states (one row per key, as
        `log.appends.state_on_conflict` says) and each partition's new high watermark (topic,
        partition, offset); the caller holds the partitions' locks."""
        raise NotImplementedError

    async def write_appends_if_unchanged(
        self, planned: ConditionalAppends
    ) -> WrittenIfUnchanged | None:
        """An append group planned on what the process saw written, in one statement that
        commits by itself if the locked rows are still what it saw; what it found and wrote,
        or None when nothing was written."""
        return None

    async def fetch(self, ask: FetchAsk) -> Fetched:
        """A partition's batches as the log's rules take them (`log.fetch.Filling`)."""
        raise NotImplementedError

    async def fetch_partitions(
        self, asks: Sequence[PartitionAsk], rules: KafkaFetch
    ) -> list[Fetched | CoordinatorError]:
        """Kafka's Fetch of several partitions, filled by `rules` in order: each partition's
        answer, or the error that refused it alone."""
        raise NotImplementedError

    def moved(self, partitions: Collection[tuple[str, int]]) -> None:
        """These partitions moved here (appended to, or a transaction ended on them): tell the
        other processes on the store, whose fetches may wait on them (`listen_moves`)."""

    async def listen_moves(
        self, moved: Callable[[Collection[tuple[str, int]] | None], None]
    ) -> None:
        """Call `moved` with the partitions other processes on the store say moved (None:
        perhaps any), until cancelled; an engine whose processes cannot tell each other
        returns at once."""

    # -- the one-statement paths ----------------------------------------------------------------

    async def add_partitions_at_once(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        keys: list[tuple[str, int]],
        now: int,
    ) -> bool:
        """AddPartitions by the transaction's own producer (`transactions.service`), or with no
        `keys` an AddOffsets of no offsets (the transaction starts, nothing else): False when
        nothing was written."""
        return False

    async def end_at_once(
        self, values: dict[str, Any], raise_epoch: bool
    ) -> list[tuple[str, int]] | None:
        """EndTxn by the transaction's own producer (`transactions.ending`): the partitions it
        ended, or None when nothing was written."""
        return None

    async def add_offsets_at_once(self, ask: TxnOffsets, rule: OffsetsRule) -> State | None:
        """A transaction's offsets (`transactions.offsets`): the state they left it in, or
        None when nothing was written."""
        return None

    async def commit_as_member(self, commit: MemberCommit, rule: CommitRule) -> bool:
        """A member's offset commit (`groups.committing`): False when nothing was written."""
        return False

    async def renew_if_steady(
        self, group_id: str, member_id: str, now: int, steady: SteadyRule, renewal: Renewal
    ) -> list[tuple[str, int]] | None:
        """A steady member's heartbeat (`groups.consumer`): its assignment, or None when
        nothing was written."""
        return None
