"""A group's committed offsets, written one way. A commit replaces the group's offset of each
partition with the offset, metadata and leader epoch given, stamped with the commit's time:
Kafka's OffsetCommit, and a transaction's offsets when it commits. The locking paths write it
with `commit_offsets`; the one-statement paths on Postgres (a member's commit,
`groups.committing`; a transaction's end, `transactions.ending`) with `upsert_sql`, the same
write in SQL."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.database import upsert
from coordinator.groups.models import GroupOffset

# (group id, topic, partition, offset, metadata, leader epoch): one partition's committed offset.
Offset = tuple[str, str, int, int, str | None, int | None]

_COLUMNS = ("group_id", "topic", "partition", "offset", "metadata", "leader_epoch")
_KEY = ["group_id", "topic", "partition"]


async def commit_offsets(session: AsyncSession, offsets: Iterable[Offset], now: int) -> None:
    """Commit the offsets in the session's unit of work (for a partition given twice, the last)."""
    await upsert(
        session,
        GroupOffset,
        [{**dict(zip(_COLUMNS, offset, strict=True)), "committed_ms": now} for offset in offsets],
        _KEY,
    )


def upsert_sql(rows: str) -> str:
    """`commit_offsets` as one SQL statement's part: `rows` is a SELECT of the columns group_id,
    topic, partition, offset, metadata, leader_epoch and committed_ms, in that order."""
    return f"""INSERT INTO group_offsets
    (group_id, topic, "partition", "offset", metadata, leader_epoch, committed_ms)
  {rows}
  ON CONFLICT (group_id, topic, "partition") DO UPDATE
  SET "offset" = excluded."offset", metadata = excluded.metadata,
      leader_epoch = excluded.leader_epoch, committed_ms = excluded.committed_ms"""
