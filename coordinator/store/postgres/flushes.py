"""Commits that wait for their flush apart from their locks: the Postgres engine's appends.

A commit with `synchronous_commit` on holds its row locks until its WAL is flushed (and, with a
synchronous standby, confirmed there), so the next append to the same partition, which wants
the partition's row, waits for that flush too: one flush after another, each a few ms. An
append's statement therefore commits with `synchronous_commit` off for its own transaction
(`UNFLUSHED`), which frees its locks as soon as its commit record is in the WAL, and its answer
waits for a flush that covers it: `Flusher.flushed`, one small flushed commit (a transactional
logical message: a WAL record and a transaction id, no row) that a process's waiters share. The
WAL is one sequence: a flush takes every commit before it along, and a crash of the store loses
an unflushed tail of it, never a commit with a later one kept. So the next group is planned and
written while the one before it is being flushed, in order; a crash loses the newest groups
whole, none of them answered; and the flushes of a process's appends, and of its processes,
merge into Postgres's own group commit of the WAL.

What a commit not flushed yet wrote is visible to every other transaction at once, so whatever
answers a client from the rows must wait as an append's answer does, or it could show a
record that a crash of the store then takes back (and that another record then replaces at
its offset). A fetch does (`visible_flushed`): its statement says where the WAL was written up
to when it read, and the fetch answers once the WAL is flushed that far.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from coordinator.store.postgres.driver import on_driver

if TYPE_CHECKING:
    from coordinator.store.postgres import PostgresStore

# Appended to an append's statement (the result of one more column, or a scalar subquery):
# `synchronous_commit` off for the statement's own transaction, not its connection's.
UNFLUSHED = "set_config('synchronous_commit', 'off', true)"

# One commit that is flushed as the store's commits are (`synchronous_commit` as configured):
# the end of its message in the WAL, before its commit record. A transactional logical message
# takes a transaction id and writes WAL without a row (so no lock for two processes to queue
# on), at any `wal_level`, and every role may send one.
_FLUSH = "SELECT (pg_logical_emit_message(true, 'coordinator', '') - '0/0'::pg_lsn)::bigint"

# Where the WAL was written up to, as of a statement's snapshot or later, and flushed up to,
# or NULL where a local flush is not what a commit waits for (a synchronous standby must
# confirm it too) or on a standby (which replays only what its primary flushed).
WRITTEN_AND_FLUSHED = """
CASE WHEN pg_is_in_recovery() THEN NULL
     ELSE (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint END,
CASE WHEN pg_is_in_recovery() OR current_setting('synchronous_standby_names') <> '' THEN NULL
     ELSE (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint END
"""


class Flusher:
    """A process's flushes: `flushed()` waits for the next flushed commit that begins after
    the call; the calls made while one is under way share the one after it."""

    def __init__(self, db: PostgresStore) -> None:
        self._db = db
        self._next: asyncio.Future[None] | None = None
        self._running: asyncio.Task[None] | None = None
        # The WAL known flushed up to, by this process's own flushed commits.
        self.durable = 0

    async def flushed(self) -> None:
        """Once every commit made before the call (by any process) is flushed."""
        loop = asyncio.get_running_loop()
        if self._next is None or self._next.get_loop() is not loop:
            self._next = loop.create_future()
        waiting = self._next
        running = self._running
        if running is None or running.done() or running.get_loop() is not loop:
            self._running = loop.create_task(self._run())
        await asyncio.shield(waiting)

    async def visible_flushed(self, written: int | None, flushed: int | None) -> None:
        """Once what a statement saw is flushed: `written` and `flushed` as it read them
        (`WRITTEN_AND_FLUSHED`; NULL on a standby)."""
        if written is None or written <= self.durable:
            return
        if flushed is not None and flushed >= written:
            self.durable = max(self.durable, flushed)
            return
        await self.flushed()

    async def _run(self) -> None:
        while (waiting := self._next) is not None:
            self._next = None
            try:
                async with self._db.autocommit() as connection:
                    found = await on_driver(connection, _FLUSH)
                self.durable = max(self.durable, found[0][0])
            except BaseException as exc:  # noqa: BLE001 - each waiter is told, none is lost
                if not waiting.done():
                    waiting.set_exception(exc)
                    waiting.exception()  # retrieved: a waiter that went away logs nothing
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            if not waiting.done():
                waiting.set_result(None)
