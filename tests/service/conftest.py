"""Fixtures the service's tests of several domains share."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.log import group_commit


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Which path wrote each group: "one statement" or "locks"."""
    taken: list[str] = []
    write_group, write_optimistic = group_commit.write_group, group_commit.write_optimistic

    async def locking(db: Any, settings: Any, batch: Any, seen: Any = None) -> Any:
        taken.append("locks")
        return await write_group(db, settings, batch, seen)

    async def optimistic(db: Any, settings: Any, batch: Any, seen: Any) -> Any:
        written = await write_optimistic(db, settings, batch, seen)
        if written is not None:
            taken.append("one statement")
        return written

    monkeypatch.setattr(group_commit, "write_group", locking)
    monkeypatch.setattr(group_commit, "write_optimistic", optimistic)
    return taken
