"""Fixtures: every store test runs once on SQLite and once on Postgres.

Each store is built by `alembic upgrade head` once per session (so the migrations are what the
tests run on); every test starts from empty tables.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from coordinator.core.app import create_app
from coordinator.core.database import Database
from coordinator.core.migrate import upgrade_to_head
from coordinator.core.settings import Settings
from coordinator.models import Base
from tests.support import create_postgres_database, drop_postgres_database

BACKENDS = ["sqlite", "postgres"]


@dataclass
class Store:
    backend: str
    url: str


@pytest.fixture(scope="session")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    path = tmp_path_factory.mktemp("sqlite") / "coordinator.db"
    url = f"sqlite:///{path}"
    upgrade_to_head(Settings(database_url=url).database_url)
    return Store("sqlite", url)


@pytest.fixture(scope="session")
def postgres_store() -> Iterator[Store]:
    url = create_postgres_database()
    try:
        upgrade_to_head(Settings(database_url=url).database_url)
        yield Store("postgres", url)
    finally:
        drop_postgres_database(url)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> Store:
    result: Store = request.getfixturevalue(f"{request.param}_store")
    return result


async def empty_tables(db: Database) -> None:
    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    async with db.write() as session:
        if db.is_sqlite:
            for table in tables:
                await session.execute(text(f"DELETE FROM {table}"))
        else:
            await session.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))


def make_settings(store: Store, **overrides: Any) -> Settings:
    return Settings(database_url=store.url, **overrides)


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    """Override in a test module to start the app with other settings."""
    return {}


@pytest.fixture
async def app(store: Store, settings_overrides: dict[str, Any]) -> AsyncIterator[Any]:
    application = create_app(make_settings(store, **settings_overrides))
    await empty_tables(application.state.db)
    yield application
    await application.state.db.dispose()


@pytest.fixture
async def client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://coordinator") as c:
        yield c


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
