"""Bring a store's schema to the newest migration (Alembic, shipped in the `migrations` package)."""

from __future__ import annotations

import asyncio
from importlib.resources import files

from alembic import command
from alembic.config import Config


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(files("migrations")))
    # Alembic's ini interpolation treats % specially.
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade_to_head(database_url: str) -> None:
    """Run in a fresh thread's event loop when called from inside one (env.py uses asyncio.run)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        command.upgrade(alembic_config(database_url), "head")
        return
    import threading

    errors: list[BaseException] = []

    def run() -> None:
        try:
            command.upgrade(alembic_config(database_url), "head")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
