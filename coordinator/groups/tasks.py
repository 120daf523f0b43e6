"""Background work of consumer groups: remove members whose session or rebalance timeout passed,
so their partitions go to the others; end a classic group's phase whose deadline passed with no
request left to end it.

Runs in every service process; each group is claimed with SKIP LOCKED, so any number of processes
share the sweep. Heartbeats remove a group's timed-out members too; this catches groups whose
members all stopped.
"""

from __future__ import annotations

import logging

from coordinator.core.periodic import run_periodically
from coordinator.core.settings import Settings
from coordinator.groups import classic
from coordinator.groups.membership import expire_members
from coordinator.store import Store

log = logging.getLogger("coordinator.sweeper")


async def sweep_groups_once(db: Store, settings: Settings) -> None:
    ticked = await classic.sweep(db, settings)
    if ticked:
        log.info("moved %d classic group(s) on: %s", len(ticked), ", ".join(ticked[:20]))
    removed = await expire_members(db)
    if removed:
        log.info(
            "removed %d timed-out group member(s): %s",
            len(removed),
            ", ".join(f"{g}/{m}" for g, m in removed[:20]),
        )


async def run_group_sweeper(db: Store, settings: Settings) -> None:
    interval = settings.group_check_interval_ms / 1000
    await run_periodically(interval, lambda: sweep_groups_once(db, settings), log)
