"""txsql's bookkeeping in the target database: the tables that name each job's current run, its
commits and its input offsets, and the statements that create, start, stage and drop; apart from
the commit protocol (`sdk.spark._sql`)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    delete,
    event,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.pool import NullPool
from sqlalchemy.types import TypeEngine

from sdk._errors import ConfigError
from sdk.spark._offsets import Offsets

if TYPE_CHECKING:
    pass

__all__ = [
    "ATTEMPT_COLUMN",
    "COMMITS",
    "JOBS",
    "OFFSETS",
    "RunFenced",
    "committed_offsets",
    "engine_for",
    "staging_name",
]

ATTEMPT_COLUMN = "txsql_attempt"
IDENTIFIER_MAX = 63  # Postgres's limit; SQLite has none

BOOKKEEPING = MetaData()
JOBS = Table(
    "txsql_jobs",
    BOOKKEEPING,
    Column("job_id", String(128), primary_key=True),
    Column("run", String(64), nullable=False),
    # The run's staging table (schema-qualified), null once committed or aborted.
    Column("staging", String(255), nullable=True),
    Column("started_ms", BigInteger, nullable=False),
)
COMMITS = Table(
    "txsql_commits",
    BOOKKEEPING,
    Column("job_id", String(128), primary_key=True),
    Column("run", String(64), primary_key=True),
    Column("batch_id", BigInteger, nullable=True),
    Column("dbtable", String(255), nullable=False),
    Column("rows", BigInteger, nullable=False),
    Column("discarded_rows", BigInteger, nullable=False),
    Column("winners", Text, nullable=False),
    Column("committed_ms", BigInteger, nullable=False),
    UniqueConstraint("job_id", "batch_id", name="uq_txsql_commits_job_batch"),
)
OFFSETS = Table(
    "txsql_offsets",
    BOOKKEEPING,
    Column("group_id", String(255), primary_key=True),
    Column("topic", String(249), primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("offset", BigInteger, nullable=False),
    Column("job_id", String(128), nullable=False),
    Column("run", String(64), nullable=False),
    Column("committed_ms", BigInteger, nullable=False),
)


class RunFenced(RuntimeError):
    """A newer run of the job started after this one, or this run was committed already: this
    attempt's or driver's output is not (or no longer) wanted."""


def plain_url(url: str) -> str:
    """A plain `postgresql://` URL gets psycopg 3 (SQLAlchemy would pick psycopg2)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigError(f"url: {url!r} is not a database URL (e.g. postgresql://h/db)")
    if scheme in ("postgresql", "postgres"):
        return f"postgresql+psycopg://{rest}"
    return url


def engine_for(url: str) -> Engine:
    """An engine without a pool (tasks and drivers connect once per piece of work). SQLite
    writers begin with `BEGIN IMMEDIATE`, so two never both read and then fail to upgrade."""
    try:
        engine = create_engine(
            plain_url(url),
            poolclass=NullPool,
            **({"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}),
        )
    except Exception as exc:  # a malformed URL or an unknown dialect
        raise ConfigError(f"url: {exc}") from None
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection: Any, _: Any) -> None:
            dbapi_connection.isolation_level = None

        @event.listens_for(engine, "begin")
        def _begin(connection: Connection) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def split_table(dbtable: str) -> tuple[str | None, str]:
    schema, _, name = dbtable.rpartition(".")
    if not name or not all(part.strip() for part in dbtable.split(".")):
        raise ConfigError(f"dbtable: {dbtable!r} is not a table name (`table` or `schema.table`)")
    return (schema or None), name


def staging_name(name: str, run: str) -> str:
    """`{table}__txsql_{run}`, or a hashed name when that is too long for Postgres."""
    plain = f"{name}__txsql_{run}"
    if len(plain) <= IDENTIFIER_MAX:
        return plain
    return f"txsql_{hashlib.sha1(name.encode()).hexdigest()[:16]}_{run}"


def committed_offsets(url: str, group: str) -> Offsets:
    """The input offsets committed with the output for `group` (none before a first commit):
    where the next run starts reading."""
    engine = engine_for(url)
    try:
        with engine.connect() as connection:
            if not inspect(connection).has_table(OFFSETS.name):
                return {}
            rows = connection.execute(
                select(OFFSETS.c.topic, OFFSETS.c.partition, OFFSETS.c.offset).where(
                    OFFSETS.c.group_id == group
                )
            ).all()
    finally:
        engine.dispose()
    result: Offsets = {}
    for topic, partition, offset in rows:
        result.setdefault(topic, {})[partition] = offset
    return result


def create_tables(engine: Engine, metadata: MetaData) -> None:
    """CREATE TABLE IF NOT EXISTS, tolerating another writer creating them at the same time."""
    try:
        metadata.create_all(engine, checkfirst=True)
    except DBAPIError:
        metadata.create_all(engine, checkfirst=True)  # lost a race: now they exist


def target_table(
    engine: Engine, schema: str | None, name: str, create: Sequence[tuple[str, TypeEngine[Any]]]
) -> Table:
    """The target table, reflected; created first from `create` (name, type) when missing, as
    Spark's JDBC writer creates it from the DataFrame's schema."""
    if not inspect(engine).has_table(name, schema=schema):
        if not create:
            raise ConfigError(f"dbtable: no table {name!r} in the target database")
        metadata = MetaData()
        Table(name, metadata, *(Column(n, t) for n, t in create), schema=schema)
        create_tables(engine, metadata)
    return Table(name, MetaData(), schema=schema, autoload_with=engine)


def qualified_name(staging: Table) -> str:
    return f"{staging.schema}.{staging.name}" if staging.schema else staging.name


def drop_staging(connection: Connection, qualified: str) -> None:
    """Drop a staging table named in `txsql_jobs`, if it is still there."""
    schema, name = split_table(qualified)
    if inspect(connection).has_table(name, schema=schema):
        Table(name, MetaData(), schema=schema).drop(connection)


def start_run(connection: Connection, job_id: str, run: str, staging: str) -> str | None:
    """The job's row names `run` and its staging table from now on (a first run of a new job
    races on the key); returns the staging table of the run before, if it was left behind."""
    now = int(time.time() * 1000)
    previous = connection.execute(
        select(JOBS.c.staging).where(JOBS.c.job_id == job_id).with_for_update()
    ).first()
    values = {"run": run, "staging": staging, "started_ms": now}
    if previous is not None:
        connection.execute(update(JOBS).where(JOBS.c.job_id == job_id).values(**values))
        left: str | None = previous[0]
        return left
    try:
        with connection.begin_nested():
            connection.execute(insert(JOBS).values(job_id=job_id, **values))
        return None
    except IntegrityError:
        return start_run(connection, job_id, run, staging)


def write_offsets(
    connection: Connection,
    group: str | None,
    offsets: Offsets,
    job_id: str,
    run: str,
    now: int,
) -> None:
    """The group's input offsets, replaced partition by partition (portable: no upsert)."""
    if group is None:
        return
    for topic, partitions in sorted(offsets.items()):
        for partition, offset in sorted(partitions.items()):
            if offset < 0:
                continue
            key = (
                (OFFSETS.c.group_id == group)
                & (OFFSETS.c.topic == topic)
                & (OFFSETS.c.partition == partition)
            )
            connection.execute(delete(OFFSETS).where(key))
            connection.execute(
                insert(OFFSETS).values(
                    group_id=group,
                    topic=topic,
                    partition=partition,
                    offset=offset,
                    job_id=job_id,
                    run=run,
                    committed_ms=now,
                )
            )
