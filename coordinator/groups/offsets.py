"""A group's committed offsets, written one way. A commit replaces the group's offset of each
partition with the offset, metadata and leader epoch given, stamped with the commit's time:
Kafka's OffsetCommit, and a transaction's offsets when it commits. `commit_from` is that write;
the locking paths run it over rows (`commit_offsets`), the one-statement paths on Postgres (a
member's commit, `groups.committing`; a transaction's end, `transactions.ending`) over their own
rows, in the same statement as the rest."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.groups.models import GroupOffset
from coordinator.store import ROWS_PER_STATEMENT, store_of

# (group id, topic, partition, offset, metadata, leader epoch): one partition's committed offset.
Offset = tuple[str, str, int, int, str | None, int | None]

COLUMNS = ("group_id", "topic", "partition", "offset", "metadata", "leader_epoch", "committed_ms")
_KEY = ["group_id", "topic", "partition"]
_offsets = cast(Table, GroupOffset.__table__)


def replacing(statement: Any) -> Any:
    """An INSERT of group offsets (of rows, or from a SELECT of `COLUMNS`) as a commit: a
    partition's offset, metadata, leader epoch and time replace those it had."""
    replaced = {c: statement.excluded[c] for c in COLUMNS if c not in _KEY}
    return statement.on_conflict_do_update(index_elements=_KEY, set_=replaced)


def commit_from(insert: Callable[[Any], Any], source: Any) -> Any:
    """The commit of the offsets `source` holds (a SELECT of `COLUMNS`, in that order), with the
    dialect's `insert`."""
    return replacing(insert(_offsets).from_select(list(COLUMNS), source))


async def commit_offsets(session: AsyncSession, offsets: Iterable[Offset], now: int) -> None:
    """Commit the offsets in the session's unit of work (for a partition given twice, the last:
    one statement may not update a row twice)."""
    rows = [
        dict(zip(COLUMNS, (*offset, now), strict=True))
        for offset in {offset[:3]: offset for offset in offsets}.values()
    ]
    insert = store_of(session).insert
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[start : start + ROWS_PER_STATEMENT]
        await session.execute(replacing(insert(_offsets).values(chunk)))
