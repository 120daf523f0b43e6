"""A Kafka connection's next fetch, read ahead while its last answer is on the way
(`ReadAhead`): the rules of when one is read, which fetch takes it, and what memory holds it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from coordinator.core.errors import CoordinatorError
from coordinator.core.memory import request_memory
from coordinator.log.fetch import Fetched, PartitionAsk, fetch_partitions
from coordinator.store import Store


def _size(results: Sequence[Fetched | CoordinatorError]) -> int:
    return sum(len(b) for r in results if isinstance(r, Fetched) for b in r.batches)


# How long a fetch read ahead waits for the reader's next fetch before it is dropped.
READ_AHEAD_TTL_S = 5.0


@dataclass(frozen=True, slots=True)
class _Next:
    """The fetch a reader is expected to send next: the last one's, from where it stopped."""

    asks: tuple[PartitionAsk, ...]
    max_bytes: int | None
    limit: int
    read_committed: bool


class ReadAhead:
    """One reader's next Kafka fetch, read while its last answer is on its way to it (Kafka's
    broker has the page cache's read-ahead; a consumer keeps one fetch out to a broker, so
    each fetch's read would otherwise wait for the round trip of the one before).

    A fetch that answered data while more lay below its partitions' high watermarks (the LSO
    under read_committed) starts reading the fetch that asks the same partitions, budgets and
    isolation from where each stopped. The next fetch takes that read when it asks exactly
    that and it holds at least its `min_bytes`, else it reads afresh and the read ahead is
    dropped. What was read ahead is what the log held when it was read: batches below the
    bounds of that moment stay as they were (a fetch answered then would have said the same),
    and only bounds that lag. A read ahead is held under the process's request memory when
    it fits (`RequestMemory.try_hold`), never making a request wait, and is dropped after
    `READ_AHEAD_TTL_S` unused, or when its connection closes (`close`)."""

    def __init__(self) -> None:
        self._next: _Next | None = None
        self._reading: asyncio.Task[_Held | None] | None = None
        self._expiry: asyncio.TimerHandle | None = None

    async def fetch_partitions(
        self,
        db: Store,
        asks: Sequence[PartitionAsk],
        max_bytes: int | None,
        limit: int,
        *,
        read_committed: bool,
        min_bytes: int,
    ) -> list[Fetched | CoordinatorError]:
        """`fetch_partitions`, from the read ahead when it is this fetch's and holds at least
        `min_bytes`; then, when this one answers at once, the next is read ahead."""
        asked = _Next(tuple(asks), max_bytes, limit, read_committed)
        ready = await self._take(asked)
        if ready is not None and _size(ready) >= min_bytes:
            results = ready
        else:
            results = await fetch_partitions(
                db, asks, max_bytes, limit, read_committed=read_committed
            )
        if _size(results) >= min_bytes:
            self._read_next(db, asked, results)
        return results

    def close(self) -> None:
        """Its reader is gone: a read under way stops, one done is given back."""
        reading = self._reading
        self._forget()
        if reading is not None:
            reading.cancel()

    def _forget(self) -> None:
        """Drop the read ahead: one under way finishes (a statement cut short would cost its
        connection) and gives its memory back."""
        reading, self._reading, self._next = self._reading, None, None
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if reading is not None and reading.done():
            _give_back(reading)
        elif reading is not None:
            reading.add_done_callback(_give_back)

    async def _take(self, asked: _Next) -> list[Fetched | CoordinatorError] | None:
        if self._reading is None or self._next != asked:
            self._forget()
            return None
        reading = self._reading
        self._reading = None
        self._forget()
        held = await reading
        if held is None:
            return None
        held.release()
        return held.results

    def _read_next(
        self, db: Store, asked: _Next, results: Sequence[Fetched | CoordinatorError]
    ) -> None:
        asks, more = [], False
        for ask, result in zip(asked.asks, results, strict=True):
            if isinstance(result, Fetched) and result.batches:
                upper = result.last_stable_offset if asked.read_committed else result.high_watermark
                more = more or result.next_offset < upper
                ask = PartitionAsk(ask.topic, ask.partition, result.next_offset, ask.max_bytes)
            asks.append(ask)
        if not more:
            return
        loop = asyncio.get_running_loop()
        self._next = replace(asked, asks=tuple(asks))
        self._reading = loop.create_task(_read(db, self._next), name="coordinator-read-ahead")
        self._expiry = loop.call_later(READ_AHEAD_TTL_S, self._forget)


@dataclass(slots=True)
class _Held:
    """A fetch read ahead, and what gives its request memory back."""

    results: list[Fetched | CoordinatorError]
    release: Callable[[], None]


async def _read(db: Store, ahead: _Next) -> _Held | None:
    """The fetch `ahead`, held under the request memory; None when it failed or does not fit
    (the fetch that asks it then reads afresh, and meets a failure itself)."""
    try:
        results = await fetch_partitions(
            db, ahead.asks, ahead.max_bytes, ahead.limit, read_committed=ahead.read_committed
        )
    except Exception:
        return None
    release = request_memory().try_hold(_size(results))
    return None if release is None else _Held(results, release)


def _give_back(reading: asyncio.Task[_Held | None]) -> None:
    if not reading.cancelled() and (held := reading.result()) is not None:
        held.release()
