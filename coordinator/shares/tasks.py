"""Background work of share groups: members whose session ran out are removed and what they
acquired released; records whose lock ran out are released, and the fetches waiting for records
woken. Runs in every service process, each group and share partition claimed with SKIP LOCKED.
Every call on a share partition applies the same rules on its way, so this only catches the
groups and partitions that nobody calls."""

from __future__ import annotations

import logging

from coordinator.core.periodic import run_periodically
from coordinator.core.settings import Settings
from coordinator.shares.membership import expire_members
from coordinator.shares.service import expire_locks
from coordinator.store import Store

log = logging.getLogger("coordinator.sweeper")


async def sweep_shares_once(db: Store, settings: Settings) -> None:
    removed = await expire_members(db, settings)
    if removed:
        log.info(
            "removed %d timed-out share group member(s): %s",
            len(removed),
            ", ".join(f"{g}/{m}" for g, m in removed[:20]),
        )
    await expire_locks(db, settings)


async def run_share_sweeper(db: Store, settings: Settings) -> None:
    interval = settings.group_check_interval_ms / 1000
    await run_periodically(interval, lambda: sweep_shares_once(db, settings), log)
