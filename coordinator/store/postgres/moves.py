"""How the processes on one Postgres tell each other which partitions moved (appended to, or a
transaction ended on them), so a fetch waiting in one process wakes when another writes: NOTIFY
on one channel, LISTEN in every process.

A process sends one NOTIFY at a time, outside the units of work that moved the partitions (their
commits never wait on the notification queue's lock), coalescing whatever moved while one was
under way: under load one notification carries many groups' partitions. A listener that lost its
connection wakes every waiter once it is back, since moves in the gap went unheard; a lost
notification only makes a waiting fetch answer at its deadline, as Kafka's may.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Collection
from functools import partial
from typing import TYPE_CHECKING, Any

from coordinator.store.postgres.driver import on_driver

if TYPE_CHECKING:
    from coordinator.store.postgres import PostgresStore

log = logging.getLogger("coordinator.store")

CHANNEL = "coordinator_moved"
# Postgres takes payloads under 8000 bytes; past this, "every partition" is said instead.
_MAX_PAYLOAD = 7000
_EVERY = "*"
# How long a listener waits before it connects again after losing its connection.
_RECONNECT_S = 1.0

TP = tuple[str, int]
# What a listener is told: the partitions that moved, or None for every partition.
Moved = Callable[[Collection[TP] | None], None]


def encode(partitions: Collection[TP]) -> str:
    payload = "\n".join(f"{topic}\t{partition}" for topic, partition in partitions)
    return payload if len(payload.encode()) <= _MAX_PAYLOAD else _EVERY


def decode(payload: str) -> list[TP] | None:
    if payload == _EVERY:
        return None
    moved = []
    for line in payload.split("\n"):
        topic, _, partition = line.partition("\t")
        moved.append((topic, int(partition)))
    return moved


class Relay:
    """A process's NOTIFYs, one at a time per event loop."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self._pending: set[TP] = set()
        self._lock = threading.Lock()
        self._senders: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}

    def moved(self, partitions: Collection[TP]) -> None:
        with self._lock:
            self._pending.update(partitions)
        loop = asyncio.get_running_loop()
        sender = self._senders.get(loop)
        if sender is None or sender.done():
            self._senders = {lp: t for lp, t in self._senders.items() if not t.done()}
            self._senders[loop] = loop.create_task(self._send(), name="coordinator-moves")

    async def close(self) -> None:
        """Finish the NOTIFY under way on this loop (the store is being disposed of)."""
        sender = self._senders.pop(asyncio.get_running_loop(), None)
        if sender is not None:
            await asyncio.gather(sender, return_exceptions=True)

    async def _send(self) -> None:
        while True:
            with self._lock:
                batch, self._pending = self._pending, set()
            if not batch:
                return
            try:
                async with self._store.driver() as connection:
                    await on_driver(connection, "SELECT pg_notify($1, $2)", CHANNEL, encode(batch))
            except Exception as exc:  # the waiters elsewhere answer at their deadlines
                log.debug("could not tell the other processes what moved: %s", exc)


def _set(event: asyncio.Event, _connection: Any) -> None:
    event.set()


async def listen(store: PostgresStore, moved: Moved) -> None:
    """Until cancelled: LISTEN on a connection of its own, calling `moved` with each
    notification's partitions; on a lost connection, connect again and wake every waiter."""
    first = True
    while True:
        lost = asyncio.Event()
        try:
            async with store.engine.connect() as connection:
                raw = await connection.get_raw_connection()
                driver: Any = raw.driver_connection

                def heard(_connection: Any, _pid: int, _channel: str, payload: str) -> None:
                    moved(decode(payload))

                await driver.add_listener(CHANNEL, heard)
                driver.add_termination_listener(partial(_set, lost))
                if not first:
                    moved(None)  # what moved while this process was not listening is unknown
                first = False
                await lost.wait()
        except Exception as exc:
            log.debug("listening for moves failed (%s); again in %.0f s", exc, _RECONNECT_S)
        await asyncio.sleep(_RECONNECT_S)
