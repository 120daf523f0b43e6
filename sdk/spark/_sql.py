"""Exactly-once output into a SQL table without two-phase commit, free of Spark's classes: what
the `txsql` data source does in the target database (any SQLAlchemy URL; tested on Postgres and
SQLite).

- A run starts (driver): the job's row in `txsql_jobs` names this run, fencing any older driver
  of the job; rows an earlier crashed run left in the staging table are deleted.
- Each task attempt inserts its rows into the staging table (the target's columns plus
  `txsql_job` and `txsql_attempt`), committed as it goes: nothing there is visible in the
  target.
- The driver's commit is ONE transaction of the target database: it checks the job's row still
  names its run (under the row's lock), moves the winning attempts' rows into the target
  (`INSERT ... SELECT`), deletes every staged row of the job (the losers': retried, speculative,
  killed attempts), writes the input offsets (`txsql_offsets`) and a commit record
  (`txsql_commits`). A retried commit finds its record and changes nothing; a micro-batch whose
  id was committed before is not committed again.

The next run reads the offsets back with `committed_offsets`. Needs of the database: tables it
may create (the staging table beside the target, three small bookkeeping tables), ordinary
transactions; nothing prepared.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    column,
    create_engine,
    delete,
    event,
    insert,
    inspect,
    select,
    table,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.pool import NullPool
from sqlalchemy.types import TypeEngine

from sdk._errors import ConfigError
from sdk.spark._offsets import Offsets

__all__ = [
    "AttemptOutcome",
    "RunFenced",
    "SqlCommit",
    "SqlTarget",
    "committed_offsets",
    "engine_for",
]

JOB_COLUMN, ATTEMPT_COLUMN = "txsql_job", "txsql_attempt"
IDENTIFIER_MAX = 63  # Postgres's limit; SQLite has none

BOOKKEEPING = MetaData()
JOBS = Table(
    "txsql_jobs",
    BOOKKEEPING,
    Column("job_id", String(128), primary_key=True),
    Column("run", String(64), nullable=False),
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
    """A newer run of the job started after this one: this run's output is not committed."""


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


def _split(dbtable: str) -> tuple[str | None, str]:
    schema, _, name = dbtable.rpartition(".")
    if not name or not all(part.strip() for part in dbtable.split(".")):
        raise ConfigError(f"dbtable: {dbtable!r} is not a table name (`table` or `schema.table`)")
    return (schema or None), name


def staging_name(name: str) -> str:
    """`{table}__txsql_staging`, or a hashed name when that is too long for Postgres."""
    plain = f"{name}__txsql_staging"
    if len(plain) <= IDENTIFIER_MAX:
        return plain
    return f"txsql_staging_{hashlib.sha1(name.encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class AttemptOutcome:
    """A task attempt's staged rows, on their way to the driver's commit."""

    partition: int
    attempt: str  # `{run}/{partition}.{attempt}.{task attempt id}`
    rows: int


@dataclass
class SqlCommit:
    rows: int = 0  # moved into the target
    discarded_rows: int = 0  # staged by losing attempts, thrown away
    winners: list[str] = field(default_factory=list)
    repeated: bool = False  # a retried commit: it had happened, nothing changed
    skipped: bool = False  # the micro-batch was committed before: nothing moved


@dataclass(frozen=True)
class SqlTarget:
    """The target table as the tasks need it: pickled from the driver to the executors."""

    url: str
    dbtable: str
    job_id: str
    run: str
    columns: tuple[str, ...]  # the DataFrame's columns, all in the target
    types: tuple[TypeEngine[Any], ...]  # the target's types of those columns

    # -- the driver ------------------------------------------------------------------------------

    @classmethod
    def prepare(
        cls,
        url: str,
        dbtable: str,
        job_id: str,
        columns: Sequence[str],
        create: Sequence[tuple[str, TypeEngine[Any]]] = (),
        run: str | None = None,
    ) -> SqlTarget:
        """Before the tasks write: the target (created from `create` when missing), its staging
        table and the bookkeeping tables exist; the job's row names a new run (fencing older
        drivers); staged rows of earlier runs of the job are deleted."""
        schema, name = _split(dbtable)
        engine = engine_for(url)
        try:
            target = _target(engine, schema, name, create)
            missing = [c for c in columns if c not in target.columns]
            if missing:
                raise ConfigError(
                    f"columns {missing}: not in table {dbtable!r} "
                    f"(it has {[c.name for c in target.columns]})"
                )
            for reserved in (JOB_COLUMN, ATTEMPT_COLUMN):
                if reserved in target.columns:
                    raise ConfigError(f"dbtable: column {reserved!r} is txsql's own")
            _create_all(engine, BOOKKEEPING)
            staging = _ensure_staging(engine, target)
            run = run or os.urandom(6).hex()
            with engine.begin() as connection:
                _start_run(connection, job_id, run)
                connection.execute(delete(staging).where(staging.c[JOB_COLUMN] == job_id))
        finally:
            engine.dispose()
        return cls(
            url,
            dbtable,
            job_id,
            run,
            tuple(columns),
            tuple(target.columns[c].type for c in columns),
        )

    def commit(
        self,
        outcomes: Sequence[AttemptOutcome | None],
        *,
        offsets_group: str | None = None,
        offsets: Offsets | None = None,
        batch_id: int | None = None,
    ) -> SqlCommit:
        """Move the winners' staged rows into the target, drop every other staged row of the
        job, write `offsets` for `offsets_group` and the commit record: one transaction."""
        winners = sorted(o.attempt for o in outcomes if o is not None)
        expected = sum(o.rows for o in outcomes if o is not None)
        staging, target = self._staging(), self._target()
        engine = engine_for(self.url)
        try:
            with engine.begin() as connection:
                current = connection.execute(
                    select(JOBS.c.run).where(JOBS.c.job_id == self.job_id).with_for_update()
                ).scalar()
                if current != self.run:
                    raise RunFenced(
                        f"job {self.job_id!r}: run {current!r} started after run {self.run!r}; "
                        "this run's output is discarded"
                    )
                done = connection.execute(
                    select(COMMITS.c.rows, COMMITS.c.discarded_rows, COMMITS.c.winners).where(
                        COMMITS.c.job_id == self.job_id, COMMITS.c.run == self.run
                    )
                ).first()
                if done is not None:
                    return SqlCommit(done[0], done[1], orjson.loads(done[2]), repeated=True)
                ours = staging.c[JOB_COLUMN] == self.job_id
                if (
                    batch_id is not None
                    and connection.execute(
                        select(COMMITS.c.run).where(
                            COMMITS.c.job_id == self.job_id, COMMITS.c.batch_id == batch_id
                        )
                    ).first()
                ):
                    discarded = connection.execute(delete(staging).where(ours)).rowcount
                    return SqlCommit(0, discarded, [], skipped=True)
                moved = 0
                if winners:
                    chosen = select(*(staging.c[c] for c in self.columns)).where(
                        ours, staging.c[ATTEMPT_COLUMN].in_(winners)
                    )
                    moved = connection.execute(
                        insert(target).from_select(list(self.columns), chosen),
                        execution_options={"preserve_rowcount": True},
                    ).rowcount
                if moved != expected:
                    raise RuntimeError(
                        f"job {self.job_id!r}: {moved} staged rows of the winning attempts, "
                        f"their tasks reported {expected}; nothing committed"
                    )
                discarded = connection.execute(delete(staging).where(ours)).rowcount - moved
                now = int(time.time() * 1000)
                for topic, partitions in sorted((offsets or {}).items()):
                    for partition, offset in sorted(partitions.items()):
                        if offsets_group is None or offset < 0:
                            continue
                        key = (
                            (OFFSETS.c.group_id == offsets_group)
                            & (OFFSETS.c.topic == topic)
                            & (OFFSETS.c.partition == partition)
                        )
                        connection.execute(delete(OFFSETS).where(key))
                        connection.execute(
                            insert(OFFSETS).values(
                                group_id=offsets_group,
                                topic=topic,
                                partition=partition,
                                offset=offset,
                                job_id=self.job_id,
                                run=self.run,
                                committed_ms=now,
                            )
                        )
                connection.execute(
                    insert(COMMITS).values(
                        job_id=self.job_id,
                        run=self.run,
                        batch_id=batch_id,
                        dbtable=self.dbtable,
                        rows=moved,
                        discarded_rows=discarded,
                        winners=orjson.dumps(winners).decode(),
                        committed_ms=now,
                    )
                )
                return SqlCommit(moved, discarded, winners)
        finally:
            engine.dispose()

    def abort(self) -> int:
        """Throw away what this run staged (Spark gave up on the job)."""
        staging = self._staging()
        engine = engine_for(self.url)
        try:
            with engine.begin() as connection:
                return int(
                    connection.execute(
                        delete(staging).where(
                            staging.c[JOB_COLUMN] == self.job_id,
                            staging.c[ATTEMPT_COLUMN].startswith(f"{self.run}/"),
                        )
                    ).rowcount
                )
        finally:
            engine.dispose()

    # -- the tasks -------------------------------------------------------------------------------

    def attempt_id(self, partition: int, attempt: int, task_attempt_id: int) -> str:
        return f"{self.run}/{partition}.{attempt}.{task_attempt_id}"

    @contextmanager
    def stager(self, attempt: str) -> Iterator[Stager]:
        engine = engine_for(self.url)
        try:
            with engine.connect() as connection:
                yield Stager(self, attempt, connection)
        finally:
            engine.dispose()

    # -- plumbing --------------------------------------------------------------------------------

    def _target(self) -> Any:
        schema, name = _split(self.dbtable)
        return table(name, *(column(c) for c in self.columns), schema=schema)

    def _staging(self) -> Table:
        schema, name = _split(self.dbtable)
        return Table(
            staging_name(name),
            MetaData(),
            Column(JOB_COLUMN, String(128)),
            Column(ATTEMPT_COLUMN, String(255)),
            *(Column(c, t) for c, t in zip(self.columns, self.types, strict=True)),
            schema=schema,
        )


class Stager:
    """One task attempt's inserts into the staging table, committed every `flush()`."""

    def __init__(self, target: SqlTarget, attempt: str, connection: Connection) -> None:
        self.target, self.attempt, self.connection = target, attempt, connection
        self.staging = target._staging()
        self.pending: list[dict[str, Any]] = []
        self.staged = 0
        self._copy = connection.dialect.name == "postgresql" and connection.dialect.driver == (
            "psycopg"
        )

    def add(self, values: Sequence[Any]) -> None:
        row = dict(zip(self.target.columns, values, strict=True))
        row[JOB_COLUMN] = self.target.job_id
        row[ATTEMPT_COLUMN] = self.attempt
        self.pending.append(row)

    def flush(self) -> None:
        """Commit the pending rows into the staging table."""
        if not self.pending:
            return
        with self.connection.begin():
            if self._copy:
                self._copy_rows()
            else:
                self.connection.execute(insert(self.staging), self.pending)
        self.staged += len(self.pending)
        self.pending.clear()

    def _copy_rows(self) -> None:
        """Postgres: COPY, the fastest way in (a stream, no statement per row)."""
        from psycopg import sql

        names = [JOB_COLUMN, ATTEMPT_COLUMN, *self.target.columns]
        schema, _ = _split(self.target.dbtable)
        name = self.staging.name
        relation = sql.Identifier(schema, name) if schema else sql.Identifier(name)
        statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
            relation, sql.SQL(", ").join(sql.Identifier(n) for n in names)
        )
        raw = self.connection.connection.driver_connection
        assert raw is not None
        with raw.cursor() as cursor, cursor.copy(statement) as copy:
            for row in self.pending:
                copy.write_row([row[n] for n in names])

    def committed_already(self) -> bool:
        """Whether the run was committed (or fenced) before this attempt finished: a late
        speculative copy, whose rows nobody will move."""
        with self.connection.begin():
            current = self.connection.execute(
                select(JOBS.c.run).where(JOBS.c.job_id == self.target.job_id)
            ).scalar()
            done = self.connection.execute(
                select(COMMITS.c.run).where(
                    COMMITS.c.job_id == self.target.job_id, COMMITS.c.run == self.target.run
                )
            ).first()
        return current != self.target.run or done is not None

    def discard(self) -> None:
        with self.connection.begin():
            self.connection.execute(
                delete(self.staging).where(
                    self.staging.c[JOB_COLUMN] == self.target.job_id,
                    self.staging.c[ATTEMPT_COLUMN] == self.attempt,
                )
            )


def stage_rows(
    target: SqlTarget,
    attempt: str,
    partition: int,
    rows: Iterable[Sequence[Any]],
    batch: int,
    after_row: Callable[[int, Stager], None] | None = None,
) -> AttemptOutcome:
    """Stage one task attempt's rows, `batch` per transaction (`after_row(rows so far,
    stager)`: the tests' fault injection). A late attempt (its run was committed or fenced
    while it wrote) discards its rows and fails."""
    with target.stager(attempt) as stager:
        for written, values in enumerate(rows, start=1):
            stager.add(values)
            if len(stager.pending) >= batch:
                stager.flush()
            if after_row is not None:
                after_row(written, stager)
        stager.flush()
        if stager.committed_already():
            stager.discard()
            raise RunFenced(f"{attempt}: the job's run ended before this attempt finished")
        return AttemptOutcome(partition, attempt, stager.staged)


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


# -- schema ---------------------------------------------------------------------------------------


def _create_all(engine: Engine, metadata: MetaData) -> None:
    """CREATE TABLE IF NOT EXISTS, tolerating another writer creating them at the same time."""
    try:
        metadata.create_all(engine, checkfirst=True)
    except DBAPIError:
        metadata.create_all(engine, checkfirst=True)  # lost a race: now they exist


def _target(
    engine: Engine, schema: str | None, name: str, create: Sequence[tuple[str, TypeEngine[Any]]]
) -> Table:
    """The target table, reflected; created first from `create` (name, type) when missing, as
    Spark's JDBC writer creates it from the DataFrame's schema."""
    if not inspect(engine).has_table(name, schema=schema):
        if not create:
            raise ConfigError(f"dbtable: no table {name!r} in the target database")
        metadata = MetaData()
        Table(name, metadata, *(Column(n, t) for n, t in create), schema=schema)
        _create_all(engine, metadata)
    return Table(name, MetaData(), schema=schema, autoload_with=engine)


def _ensure_staging(engine: Engine, target: Table) -> Table:
    """The staging table: the target's columns (no constraints) plus job and attempt; columns
    the target gained since are added."""
    name = staging_name(target.name)
    metadata = MetaData()
    staging = Table(
        name,
        metadata,
        Column(JOB_COLUMN, String(128), nullable=False),
        Column(ATTEMPT_COLUMN, String(255), nullable=False),
        *(Column(c.name, c.type, nullable=True) for c in target.columns),
        Index(f"ix_{name}"[:IDENTIFIER_MAX], JOB_COLUMN, ATTEMPT_COLUMN),
        schema=target.schema,
    )
    if not inspect(engine).has_table(name, schema=target.schema):
        _create_all(engine, metadata)
        return staging
    have = {c["name"] for c in inspect(engine).get_columns(name, schema=target.schema)}
    with engine.begin() as connection:
        for c in target.columns:
            if c.name not in have:
                ddl = c.type.compile(dialect=engine.dialect)
                quoted = engine.dialect.identifier_preparer
                connection.exec_driver_sql(
                    f"ALTER TABLE {quoted.format_table(staging)} "
                    f"ADD COLUMN {quoted.quote(c.name)} {ddl}"
                )
    return staging


def _start_run(connection: Connection, job_id: str, run: str) -> None:
    """The job's row names `run` from now on (a first run of a new job races on the key)."""
    now = int(time.time() * 1000)
    changed = connection.execute(
        update(JOBS).where(JOBS.c.job_id == job_id).values(run=run, started_ms=now)
    ).rowcount
    if changed:
        return
    try:
        with connection.begin_nested():
            connection.execute(insert(JOBS).values(job_id=job_id, run=run, started_ms=now))
    except IntegrityError:
        connection.execute(
            update(JOBS).where(JOBS.c.job_id == job_id).values(run=run, started_ms=now)
        )
