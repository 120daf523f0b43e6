"""Background work of consumer groups: remove members whose session or rebalance timeout passed,
so their partitions go to the others.

Runs in every service process; each group is claimed with SKIP LOCKED, so any number of processes
share the sweep. Heartbeats remove a group's timed-out members too; this catches groups whose
members all stopped.
"""

from __future__ import annotations

import asyncio
import logging

from coordinator.core.database import Database
from coordinator.core.settings import Settings
from coordinator.groups.membership import expire_members

log = logging.getLogger("coordinator.sweeper")


async def run_group_sweeper(db: Database, settings: Settings) -> None:
    interval = settings.group_check_interval_ms / 1000
    while True:
        await asyncio.sleep(interval)
        try:
            removed = await expire_members(db)
            if removed:
                log.info(
                    "removed %d timed-out group member(s): %s",
                    len(removed),
                    ", ".join(f"{g}/{m}" for g, m in removed[:20]),
                )
        except asyncio.CancelledError:
            raise
        except Exception:
            # The store may be down for a while; the next round tries again.
            log.exception("group sweep failed")
