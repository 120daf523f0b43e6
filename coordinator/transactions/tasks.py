"""The coordinator's background work: abort timed-out transactions, expire idle ids.

Runs in every service process; correctness comes from the rows it claims (SKIP LOCKED), not from
there being one sweeper, so any number of processes may share a store.
"""

from __future__ import annotations

import logging

from coordinator.core.periodic import run_periodically
from coordinator.core.settings import Settings
from coordinator.store import Store
from coordinator.transactions import aborts

log = logging.getLogger("coordinator.sweeper")


async def sweep_once(db: Store, settings: Settings) -> None:
    aborted = await aborts.abort_timed_out(db)
    if aborted:
        log.info("aborted %d timed-out transaction(s): %s", len(aborted), ", ".join(aborted[:20]))
    expired = await aborts.expire_idle(db, settings.transactional_id_expiration_ms)
    if expired:
        log.info("expired %d idle transactional id(s)", expired)


async def run_sweeper(db: Store, settings: Settings) -> None:
    interval = settings.timeout_check_interval_ms / 1000
    await run_periodically(interval, lambda: sweep_once(db, settings), log)
