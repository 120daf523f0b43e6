"""What the txsql Spark tests share: Spark's JDBC writer options for a SQLAlchemy URL's
database, and plain SQL looks at what a job left in the target. The fixtures live in
`tests/spark/conftest.py`."""

from __future__ import annotations

import json
from collections import Counter

from sqlalchemy import inspect

from sdk.spark._sql import engine_for


def jdbc_options(url: str, dbtable: str, **extra: str) -> dict[str, str]:
    """Spark's JDBC writer options for the same Postgres database a SQLAlchemy URL names."""
    rest = url.partition("://")[2]
    user, _, where = rest.rpartition("@")
    return {
        "url": f"jdbc:postgresql://{where}?user={user}",
        "driver": "org.postgresql.Driver",
        "dbtable": dbtable,
        **extra,
    }


def query(url: str, sql: str) -> list[tuple[object, ...]]:
    engine = engine_for(url)
    try:
        with engine.connect() as connection:
            return [tuple(r) for r in connection.exec_driver_sql(sql).all()]
    finally:
        engine.dispose()


def ids(url: str, dbtable: str) -> Counter[int]:
    return Counter(int(str(r[0])) for r in query(url, f"SELECT id FROM {dbtable}"))


def commit_record(url: str, job: str) -> tuple[int, int, list[str]]:
    ((rows, discarded, winners),) = query(
        url, f"SELECT rows, discarded_rows, winners FROM txsql_commits WHERE job_id = '{job}'"
    )
    return int(str(rows)), int(str(discarded)), json.loads(str(winners))


def create_ledger(url: str, dbtable: str) -> str:
    engine = engine_for(url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql(f"CREATE TABLE {dbtable} (id BIGINT, value TEXT)")
    finally:
        engine.dispose()
    return dbtable


def staged(url: str, dbtable: str) -> int:
    """Rows in the target's staging tables (one per run still open; 0 when there is none)."""
    engine = engine_for(url)
    try:
        names = [n for n in inspect(engine).get_table_names() if n.startswith(f"{dbtable}__txsql_")]
    finally:
        engine.dispose()
    return sum(int(str(query(url, f"SELECT count(*) FROM {n}")[0][0])) for n in names)
