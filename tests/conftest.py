"""Fixtures: every store test runs once on SQLite and once on Postgres.

Each store is built by `alembic upgrade head` once per session (so the migrations are what the
tests run on); every test starts from empty tables. The in-process app of most tests runs no
background work; the live services (uvicorn in a thread, sweeps included) get stores of their own,
so their sweeps never touch another test's rows or meet its emptying.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from coordinator.app import create_app
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


def _sqlite(tmp_path_factory: pytest.TempPathFactory, name: str) -> Store:
    path = tmp_path_factory.mktemp(name) / "coordinator.db"
    url = f"sqlite:///{path}"
    upgrade_to_head(Settings(database_url=url).database_url)
    return Store("sqlite", url)


@contextmanager
def _postgres() -> Iterator[Store]:
    url = create_postgres_database()
    try:
        upgrade_to_head(Settings(database_url=url).database_url)
        yield Store("postgres", url)
    finally:
        drop_postgres_database(url)


@pytest.fixture(scope="session")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return _sqlite(tmp_path_factory, "sqlite")


@pytest.fixture(scope="session")
def postgres_store() -> Iterator[Store]:
    with _postgres() as store:
        yield store


@pytest.fixture(scope="session")
def sqlite_service_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """The store of the live services (see the module's docstring)."""
    return _sqlite(tmp_path_factory, "sqlite-service")


@pytest.fixture(scope="session")
def postgres_service_store() -> Iterator[Store]:
    """The store of the live services (see the module's docstring)."""
    with _postgres() as store:
        yield store


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> Store:
    result: Store = request.getfixturevalue(f"{request.param}_store")
    return result


async def empty_tables(db: Database) -> None:
    """Empty every table. On Postgres a live service's sweep may be reading two of the tables
    while TRUNCATE locks them one by one, in another order: a deadlock. TRUNCATE then waits
    longer than the sweep before it looks for one, so the sweep is the one cancelled (its round
    fails, is logged, and runs again next interval) and the emptying goes on."""
    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    async with db.write() as session:
        if db.is_sqlite:
            for table in tables:
                await session.execute(text(f"DELETE FROM {table}"))
        else:
            await session.execute(text("SET LOCAL deadlock_timeout = '10s'"))
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
    try:
        await empty_tables(application.state.db)
        yield application
    finally:
        await application.state.db.dispose()


@pytest.fixture
async def client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://coordinator") as c:
        yield c


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
