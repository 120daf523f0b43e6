"""Reads from Postgres hot standbys, as Kafka's consumers fetch from followers (KIP-392).

`COORDINATOR_READ_REPLICA_URLS` lists standbys of the store's primary. A fetch, through either
door, may be served by one of them: its one statement reads the partition's bounds (log start,
high watermark, LSO) and its batches in one snapshot of the standby, so the answer is exactly
what the primary held at one past moment, and read_committed stays exact (a standby never holds
what the primary had not committed, and an aborted or still-open transaction's records are
below no LSO of that snapshot).

A standby is used only while it is caught up within `COORDINATOR_REPLICA_MAX_LAG_MS`: every
`COORDINATOR_REPLICA_CHECK_INTERVAL_MS` each process samples the primary's WAL position and
each standby's replayed position; a standby's lag is how long ago the primary stood where the
standby stands now. A standby further behind, or one that does not answer, is left alone until
it catches up, and its reads go to the primary. A fetch asking for an offset past what the
standby holds (a consumer that fetched from the primary a moment ago) goes to the primary too.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from coordinator.core.metrics import FETCH_SOURCES
from coordinator.core.periodic import run_periodically

if TYPE_CHECKING:
    from coordinator.core.settings import Settings
    from coordinator.store import Store

log = logging.getLogger("coordinator.replicas")

# How long the primary's sampled positions are kept: a standby behind all of them is that far
# behind at least.
_HISTORY_S = 600.0


def lsn_value(lsn: str) -> int:
    """A WAL position as Postgres prints it (`16/B374D848`) as a number."""
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


@dataclass
class Replica:
    url: str
    engine: AsyncEngine
    lag_s: float = math.inf  # unknown until the first check
    reachable: bool = False

    def usable(self, max_lag_s: float) -> bool:
        return self.reachable and self.lag_s <= max_lag_s


@dataclass
class Replicas:
    replicas: list[Replica]
    max_lag_s: float
    # (monotonic time, the primary's WAL position) of the recent checks, oldest first.
    _primary: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)
    _turn: itertools.count[int] = field(default_factory=itertools.count)

    @classmethod
    def of(cls, urls: list[str], pool_size: int, max_lag_ms: int) -> Replicas:
        engines = [
            Replica(url, create_async_engine(url, pool_size=pool_size, max_overflow=pool_size))
            for url in urls
        ]
        return cls(engines, max_lag_ms / 1000)

    def pick(self) -> Replica | None:
        """A standby caught up within the bound, in turn; None: read from the primary."""
        usable = [r for r in self.replicas if r.usable(self.max_lag_s)]
        if not usable:
            return None
        return usable[next(self._turn) % len(usable)]

    @asynccontextmanager
    async def connection(self, replica: Replica) -> AsyncIterator[AsyncConnection]:
        """A connection to `replica`; a failure marks it unreachable until the next check."""
        try:
            async with replica.engine.connect() as connection:
                yield connection
        except Exception:
            replica.reachable = False
            raise

    async def check(self, primary: AsyncConnection) -> None:
        """One round: the primary's WAL position, then each standby's replayed position."""
        now = time.monotonic()
        position = (await primary.exec_driver_sql("SELECT pg_current_wal_lsn()::text")).scalar()
        assert position is not None
        self._primary.append((now, lsn_value(position)))
        while self._primary and self._primary[0][0] < now - _HISTORY_S:
            self._primary.popleft()
        for replica in self.replicas:
            was = replica.usable(self.max_lag_s)
            try:
                async with replica.engine.connect() as connection:
                    replayed = (
                        await connection.execute(text("SELECT pg_last_wal_replay_lsn()::text"))
                    ).scalar()
            except Exception as exc:
                replica.reachable = False
                if was:
                    log.warning("read replica %s does not answer: %s", _host(replica.url), exc)
                continue
            replica.reachable = replayed is not None  # None: not a standby (promoted)
            replica.lag_s = self._lag(lsn_value(replayed), now) if replayed else math.inf
            if was != replica.usable(self.max_lag_s):
                state = "serves reads" if not was else "is behind; its reads go to the primary"
                log.warning("read replica %s %s (lag %.3f s)", _host(replica.url), state,
                            replica.lag_s)  # fmt: skip

    def _lag(self, replayed: int, now: float) -> float:
        """How long ago the primary was where the standby is now: 0 when it is there already."""
        newest_behind = None
        for sampled_at, position in reversed(self._primary):
            if position <= replayed:
                newest_behind = sampled_at
                break
        if newest_behind is None:
            return math.inf
        # Caught up with the newest sample: as fresh as the checks can tell.
        if newest_behind == self._primary[-1][0]:
            return 0.0
        # Behind the sample after it: it has been behind since that one was taken.
        after = next(t for t, _ in self._primary if t > newest_behind)
        return now - after

    async def dispose(self) -> None:
        for replica in self.replicas:
            await replica.engine.dispose()


async def watch_replicas(db: Store, settings: Settings) -> None:
    """The background task of a process with read replicas: a check every interval."""
    replicas = db.replicas
    assert replicas is not None

    async def check() -> None:
        async with db.autocommit() as connection:
            await replicas.check(connection)

    await run_periodically(settings.replica_check_interval_ms / 1000, check, log)


# The counter's two children, bound once: the count is on every fetch.
_FROM_REPLICA = FETCH_SOURCES.labels(source="replica")
_FROM_PRIMARY = FETCH_SOURCES.labels(source="primary")


def count_fetch(*, replica: bool) -> None:
    """A Postgres fetch, by where it was read."""
    (_FROM_REPLICA if replica else _FROM_PRIMARY).inc()


def _host(url: str) -> str:
    return url.rpartition("@")[2]
