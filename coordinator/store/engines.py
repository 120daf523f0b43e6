"""The engine a database URL names: what the app opens its store with."""

from __future__ import annotations

from coordinator.core.settings import Settings
from coordinator.store.base import Store
from coordinator.store.postgres import PostgresStore
from coordinator.store.sqlite import SqliteStore


def open_store(settings: Settings) -> Store:
    """The store at `settings.database_url`: SQLite for a `sqlite` URL, else Postgres."""
    if settings.database_url.startswith("sqlite"):
        return SqliteStore(settings)
    return PostgresStore(settings)
