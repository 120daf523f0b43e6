"""Background work that every service process runs on a timer (sweeps of timed-out
transactions, expired keys). Correct with any number of processes because the work claims its
rows in the database (SKIP LOCKED), not because one process runs it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from coordinator.core.errors import StoreUnavailable


async def run_periodically(
    interval_s: float, work: Callable[[], Awaitable[None]], log: logging.Logger
) -> None:
    """Run `work` every `interval_s` seconds until cancelled; a round that fails (the store may
    be down for a while) is logged and the next one tries again."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except StoreUnavailable:
            pass  # the store logged the outage once; the next round tries again
        except Exception:
            log.exception("background round failed")
