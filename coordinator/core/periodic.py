"""Background work that every service process runs on a timer (sweeps of timed-out
transactions, expired keys). Correct with any number of processes because the work claims its
rows in the database (SKIP LOCKED), not because one process runs it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from coordinator.core.errors import StoreUnavailable

# How long a stopping process lets a round that is under way finish.
FINISH_ROUND_S = 10.0


async def run_periodically(
    interval_s: float, work: Callable[[], Awaitable[None]], log: logging.Logger
) -> None:
    """Run `work` every `interval_s` seconds until cancelled; a round that fails (the store may
    be down for a while) is logged and the next one tries again. Cancelled during a round (the
    process is stopping), the round is let finish first (up to FINISH_ROUND_S), so a query is not
    cut off halfway and its connection goes back to the pool cleanly."""
    while True:
        await asyncio.sleep(interval_s)
        round_ = asyncio.ensure_future(_one_round(work, log))
        try:
            await asyncio.shield(round_)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(round_, FINISH_ROUND_S)
            raise


async def _one_round(work: Callable[[], Awaitable[None]], log: logging.Logger) -> None:
    try:
        await work()
    except StoreUnavailable:
        pass  # the store logged the outage once; the next round tries again
    except Exception:
        log.exception("background round failed")
