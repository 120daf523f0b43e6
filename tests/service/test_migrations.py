"""Migrations are the only way the schema changes: upgrading an empty store to head gives exactly
the models' schema, on SQLite and on Postgres, and `coordinator migrate` does it."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from coordinator.core.migrate import upgrade_to_head
from coordinator.core.settings import Settings
from coordinator.models import Base
from tests.support.services import create_postgres_database, drop_postgres_database


def _compare(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, Base.metadata))


def drift(url: str) -> list[Any]:
    async def run() -> list[Any]:
        engine = create_async_engine(url)
        try:
            async with engine.connect() as connection:
                return await connection.run_sync(_compare)
        finally:
            await engine.dispose()

    return asyncio.run(run())


@pytest.fixture(params=["sqlite", "postgres"])
def empty_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        yield Settings(database_url=f"sqlite:///{tmp_path / 'empty.db'}").database_url
        return
    url = create_postgres_database()
    try:
        yield Settings(database_url=url).database_url
    finally:
        drop_postgres_database(url)


def test_upgrading_an_empty_store_to_head_matches_the_models(empty_store: str) -> None:
    upgrade_to_head(empty_store)
    assert drift(empty_store) == []
    # Running it again is a no-op.
    upgrade_to_head(empty_store)
    assert drift(empty_store) == []


def test_coordinator_migrate_command_brings_a_store_to_head(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    result = subprocess.run(
        [sys.executable, "-m", "coordinator", "migrate", "--database-url", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert drift(Settings(database_url=url).database_url) == []


def _migration(name: str) -> Any:
    """A migration module by file name (their names start with a digit: not importable as is)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "migrations" / "versions" / name
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _old_rows(encode: Any) -> list[dict[str, Any]]:
    """Batch rows of the format before record batches: offsets 0-1 plain (null key, null value,
    binary bytes, headers), 2 committed (pid 5), 3-4 aborted (pid 6), 5 and 6 their markers
    (empty payloads), 7 plain text."""

    def row(offset: int, count: int, pid: int, payload: bytes, **extra: Any) -> dict[str, Any]:
        return {
            "topic": "t",
            "partition": 0,
            "base_offset": offset,
            "last_offset": offset + count - 1,
            "producer_id": pid,
            "producer_epoch": 0 if pid >= 0 else -1,
            "base_sequence": 0 if pid >= 0 else -1,
            "last_sequence": count - 1 if pid >= 0 else -1,
            "timestamp": 1_700_000_000_000 + offset,
            "is_transactional": pid >= 0,
            "control": None,
            "aborted": False,
            "record_count": count,
            "payload": payload,
            **extra,
        }

    return [
        row(0, 2, -1, encode([(None, b"\x00\xff", [("h", b"\x01\x02")]), (b"k", None, [])])),
        row(2, 1, 5, encode([(b"k5", b"committed", [])])),
        row(
            3,
            2,
            6,
            encode([(b"k6", b"aborted1", []), (None, b"aborted2", [("x", b"")])]),
            aborted=True,
        ),
        {**row(5, 1, 5, b""), "base_sequence": -1, "last_sequence": -1, "control": 1},
        {
            **row(6, 1, 6, b""),
            "base_sequence": -1,
            "last_sequence": -1,
            "control": 0,
            "aborted": True,
        },
        row(7, 1, -1, encode([(None, "zürich".encode(), [])])),
    ]


def test_record_batch_migration_reads_every_old_record_back_unchanged(empty_store: str) -> None:
    from datetime import UTC, datetime

    import httpx
    from alembic import command
    from sqlalchemy import column as column_of
    from sqlalchemy import insert
    from sqlalchemy import table as table_of_columns

    from coordinator.app import create_app
    from coordinator.core.migrate import alembic_config
    from coordinator.log import fetch as log_fetch
    from coordinator.log.models import Batch, Partition
    from sdk import recordbatch as rb

    def table_of(name: str, *columns: str) -> Any:
        return table_of_columns(name, *(column_of(c) for c in columns))

    migration = _migration("2026_11_24_1100_record_batches.py")
    command.upgrade(alembic_config(empty_store), migration.down_revision)
    rows = _old_rows(migration.encode_v1)

    async def fill() -> None:
        engine = create_async_engine(empty_store)
        try:
            async with engine.begin() as connection:
                topic = {"name": "t", "partitions": 1, "created_at": datetime.now(UTC)}
                # The topics table as it was then (the model's has columns added since).
                topics = table_of("topics", "name", "partitions", "created_at")
                await connection.execute(insert(topics), [topic])
                await connection.execute(
                    insert(Partition.__table__),
                    [{"topic": "t", "partition": 0, "log_start_offset": 0, "high_watermark": 8}],
                )
                columns = {c.name for c in Batch.__table__.columns} - {
                    "max_timestamp", "size", "first_offset"
                }  # fmt: skip
                table = Batch.__table__
                old = [{k: v for k, v in r.items() if k in columns} for r in rows]
                await connection.execute(insert(table), old)
        finally:
            await engine.dispose()

    asyncio.run(fill())
    upgrade_to_head(empty_store)
    assert drift(empty_store) == []

    async def read() -> None:
        app = create_app(Settings(database_url=empty_store))
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
                path = "/v1/topics/t/partitions/0/records"
                params = {"encoding": "base64", "max_records": 100}
                seen = {}
                for level in ("read_uncommitted", "read_committed"):
                    answer = await client.get(path, params={**params, "isolation_level": level})
                    assert answer.status_code == 200, answer.text
                    seen[level] = [
                        (r["offset"], r["timestamp"], r["key"], r["value"], r["headers"])
                        for r in answer.json()["records"]
                    ]
                binary = await client.get(
                    path, headers={"accept": "application/vnd.kafka.record-batch"}
                )
                everything = await log_fetch.fetch_batches(
                    app.state.db, "t", 0, 0, max_bytes=10**6, read_committed=False,
                    include_control=True, include_aborted=True,
                )  # fmt: skip
                aborted = await log_fetch.aborted_transactions(app.state.db, "t", 0, 0, 8)
        finally:
            await app.state.db.dispose()

        def b64(raw: bytes | None) -> str | None:
            return None if raw is None else base64.b64encode(raw).decode()

        expected = []
        for r in rows:
            if r["control"] is not None:
                continue
            records = migration.decode_v1(r["payload"])
            for i, (key, value, headers) in enumerate(records):
                entry = (r["base_offset"] + i, r["timestamp"], b64(key), b64(value),
                         {n: b64(v) for n, v in headers})  # fmt: skip
                expected.append((entry, r["aborted"]))
        assert seen["read_uncommitted"] == [e for e, _ in expected]
        assert seen["read_committed"] == [e for e, aborted in expected if not aborted]
        stored = [rb.check(b).header for b in everything.batches]
        assert [(h.base_offset, h.is_control, h.producer_id) for h in stored] == [
            (0, False, -1), (2, False, 5), (3, False, 6), (5, True, 5), (6, True, 6), (7, False, -1)
        ]  # fmt: skip
        assert [rb.control_type(b) for b in everything.batches[3:5]] == [1, 0]
        assert aborted == [(6, 3)]
        committed = [
            (r.offset, r.value)
            for pos, h in rb.iter_batches(binary.content, verify=True)
            for r in rb.records(binary.content, pos, h)
        ]
        assert committed == [(0, b"\x00\xff"), (1, None), (2, b"committed"), (7, "zürich".encode())]

    asyncio.run(read())
