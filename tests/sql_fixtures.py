"""Fixtures of the txsql Spark tests: a scratch Postgres target database per test module, with
Debian's JDBC drivers required (Spark's JDBC writer is the baseline). Loaded with
`pytest_plugins = ["tests.sql_fixtures"]`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.spark_support import require_jdbc_jars
from tests.support import create_postgres_database, drop_postgres_database


@pytest.fixture(scope="module")
def postgres_target() -> Iterator[str]:
    require_jdbc_jars()
    url = create_postgres_database()
    try:
        yield url
    finally:
        drop_postgres_database(url)
