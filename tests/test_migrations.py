"""Migrations are the only way the schema changes: upgrading an empty store to head gives exactly
the models' schema, on SQLite and on Postgres, and `coordinator migrate` does it."""

from __future__ import annotations

import asyncio
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
from tests.support import create_postgres_database, drop_postgres_database


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
