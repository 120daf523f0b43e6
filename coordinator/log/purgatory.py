"""Fetches waiting for data, by partition (Kafka's fetch purgatory): a long poll that found too
little registers on the partitions it reads and sleeps until one of them moves, or its deadline.
What moves a partition (an append, a transaction's end, from this process or, through the store,
from another) wakes the waiters of exactly that partition.

Each waiter has a future of its own, set once: a wake-up is never lost to another waiter, and one
that comes between a fetch's registration and its sleep is found set when it sleeps (register,
then read, then wait). A process may run several event loops (tests do): a waiter is woken on
its own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Collection, Iterable, Iterator

from coordinator.store import Store

TP = tuple[str, int]


class Purgatory:
    """The waiters of one process, by partition."""

    def __init__(self) -> None:
        self._waiting: dict[TP, set[asyncio.Future[None]]] = {}
        self._lock = threading.Lock()  # appends are reported from any thread or loop

    @contextlib.contextmanager
    def waiting(self, partitions: Collection[TP]) -> Iterator[asyncio.Future[None]]:
        """A future set when any of `partitions` moves, registered for the block's length."""
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            for tp in partitions:
                self._waiting.setdefault(tp, set()).add(woken)
        try:
            yield woken
        finally:
            with self._lock:
                for tp in partitions:
                    waiters = self._waiting.get(tp)
                    if waiters is not None:
                        waiters.discard(woken)
                        if not waiters:
                            del self._waiting[tp]

    def moved(self, partitions: Iterable[TP] | None) -> None:
        """These partitions moved (their high watermark, or their LSO): wake their waiters.
        None: perhaps any did (another process's word was lost): wake every waiter."""
        with self._lock:
            if not self._waiting:
                return
            if partitions is None:
                partitions = list(self._waiting)
            woken = {w for tp in partitions for w in self._waiting.get(tp, ())}
        for waiter in woken:
            loop = waiter.get_loop()
            if not loop.is_closed():
                loop.call_soon_threadsafe(_wake, waiter)

    def watched(self) -> list[TP]:
        """The partitions someone waits on now."""
        with self._lock:
            return list(self._waiting)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


# The process's one purgatory: every door's fetches wait here, every path that moves a
# partition reports it here.
PURGATORY = Purgatory()


def moved(db: Store, partitions: Collection[TP]) -> None:
    """These partitions moved here: wake this process's waiters on them, and tell the other
    processes on the store (`Store.moved`)."""
    if partitions:
        PURGATORY.moved(partitions)
        db.moved(partitions)
