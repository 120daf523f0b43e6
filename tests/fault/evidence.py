"""What the store held at the end of a run that found anomalies, saved beside its history
(`evidence.jsonl`) before the database is dropped: every batch of the run's topics (offsets,
producer, epoch, sequences, the transactional, control and aborted flags, and the values it
holds), the producers' states on each partition, the transactions, their partitions and pending
offsets, and the epochs the coordinator timed out. The history says what the clients saw; this
says what the store made of it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from sdk import recordbatch

_TABLES = {
    "producer_state": "SELECT * FROM producer_states ORDER BY topic, partition, producer_id",
    "transaction": "SELECT * FROM transactions ORDER BY transactional_id",
    "transaction_partition": "SELECT * FROM transaction_partitions ORDER BY 1, 2, 3",
    "transaction_offset": "SELECT * FROM transaction_offsets ORDER BY 1, 2, 3, 4",
    "timed_out_epoch": "SELECT * FROM timed_out_epochs ORDER BY 1, 2, 3",
    "producer_id": "SELECT * FROM producer_ids ORDER BY producer_id",
    "partition": "SELECT * FROM partitions ORDER BY topic, partition",
}
_BATCHES = (
    "SELECT topic, partition, base_offset, last_offset, producer_id, producer_epoch,"
    " base_sequence, last_sequence, is_transactional, control, aborted, first_offset,"
    " record_count, payload FROM batches ORDER BY topic, partition, base_offset"
)


def save(url: str, out: Path) -> Path:
    """Write the store's evidence at `url` (a Postgres URL) to `out/evidence.jsonl`."""
    path = out / "evidence.jsonl"
    rows = asyncio.run(_read(url.replace("postgresql+asyncpg://", "postgresql://")))
    with path.open("wb") as file:
        for row in rows:
            file.write(orjson.dumps(row, default=str) + b"\n")
    return path


async def _read(url: str) -> list[dict[str, Any]]:
    import asyncpg

    connection = await asyncpg.connect(url)
    try:
        rows: list[dict[str, Any]] = []
        for kind, sql in _TABLES.items():
            rows += [{"kind": kind, **dict(r)} for r in await connection.fetch(sql)]
        for record in await connection.fetch(_BATCHES):
            batch = dict(record)
            payload = batch.pop("payload")
            batch["values"] = _values(payload) if batch["control"] is None else []
            rows.append({"kind": "batch", **batch})
        return rows
    finally:
        await connection.close()


def _values(payload: bytes) -> list[str | None]:
    try:
        return [
            None if r.value is None else r.value.decode(errors="replace")
            for r in recordbatch.records(payload)
        ]
    except recordbatch.CorruptBatch as exc:
        return [f"<{exc}>"]
