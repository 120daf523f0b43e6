"""The effects' background work: remove keys past `COORDINATOR_EFFECT_RETENTION_MS`, every
`COORDINATOR_EFFECT_RETENTION_CHECK_INTERVAL_MS`, on every service process (rows claimed with
SKIP LOCKED, see `service.expire`)."""

from __future__ import annotations

import logging

from coordinator.core.periodic import run_periodically
from coordinator.core.settings import Settings
from coordinator.effects import service
from coordinator.store import Store

log = logging.getLogger("coordinator.effects")


async def expire_once(db: Store, settings: Settings) -> None:
    removed = await service.expire(db, settings.effect_retention_ms)
    if removed:
        log.info("removed %d expired side-effect key(s)", removed)


async def run_expiry(db: Store, settings: Settings) -> None:
    interval = settings.effect_retention_check_interval_ms / 1000
    await run_periodically(interval, lambda: expire_once(db, settings), log)
