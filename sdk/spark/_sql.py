"""Exactly-once output into a SQL table without two-phase commit, free of Spark's classes: what
the `txsql` data source does in the target database (any SQLAlchemy URL; tested on Postgres and
SQLite).

- A run starts (driver): the job's row in `txsql_jobs` names this run, fencing any older driver
  of the job; the staging table of the job's previous run (a crashed one's) is dropped and this
  run's is created: `{table}__txsql_{run}`, the DataFrame's columns with the target's types plus
  `txsql_attempt` (UNLOGGED on Postgres: what it holds is worth nothing until moved).
- Each task attempt COPYs (Postgres) or INSERTs its rows into the run's staging table, committed
  as it goes: nothing there is visible in the target.
- The driver's commit is ONE transaction of the target database: it checks the job's row still
  names its run (under the row's lock), moves the winning attempts' rows into the target
  (`INSERT ... SELECT`), writes the input offsets (`txsql_offsets`) and a commit record
  (`txsql_commits`), and drops the staging table with the losers' rows (retried, speculative,
  killed attempts). A retried commit finds its record and changes nothing; a micro-batch whose
  id was committed before is not committed again; an attempt still writing after the commit
  finds its table gone and fails.

The next run reads the offsets back with `committed_offsets`. Needs of the database: tables it
may create and drop (a staging table per run beside the target, three small bookkeeping
tables), ordinary transactions; nothing prepared.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy import (
    Column,
    Connection,
    MetaData,
    String,
    Table,
    column,
    func,
    insert,
    inspect,
    select,
    table,
    update,
)
from sqlalchemy.types import TypeEngine

from sdk._errors import ConfigError
from sdk.spark._offsets import Offsets
from sdk.spark._sql_tables import (
    ATTEMPT_COLUMN,
    BOOKKEEPING,
    COMMITS,
    JOBS,
    RunFenced,
    committed_offsets,
    create_tables,
    drop_staging,
    engine_for,
    qualified_name,
    split_table,
    staging_name,
    start_run,
    target_table,
    write_offsets,
)

if TYPE_CHECKING:
    import pyarrow as pa

sql_committed_offsets = committed_offsets  # `sdk.spark`'s name for it, beside txlog's

__all__ = [
    "AttemptOutcome",
    "RunFenced",
    "SqlCommit",
    "SqlTarget",
    "committed_offsets",
    "engine_for",
    "sql_committed_offsets",
    "stage_batches",
]


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
    """The target table and this run's staging table, as the tasks need them: pickled from the
    driver to the executors."""

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
        """Before the tasks write: the target (created from `create` when missing) and the
        bookkeeping tables exist; the job's row names a new run (fencing older drivers); the
        previous run's staging table is dropped and this run's created, in one transaction."""
        schema, name = split_table(dbtable)
        engine = engine_for(url)
        try:
            target = target_table(engine, schema, name, create)
            missing = [c for c in columns if c not in target.columns]
            if missing:
                raise ConfigError(
                    f"columns {missing}: not in table {dbtable!r} "
                    f"(it has {[c.name for c in target.columns]})"
                )
            if ATTEMPT_COLUMN in columns:
                raise ConfigError(f"columns: {ATTEMPT_COLUMN!r} is txsql's own")
            create_tables(engine, BOOKKEEPING)
            prepared = cls(
                url,
                dbtable,
                job_id,
                run or os.urandom(6).hex(),
                tuple(columns),
                tuple(target.columns[c].type for c in columns),
            )
            staging = prepared._staging(engine.dialect.name)
            with engine.begin() as connection:
                previous = start_run(connection, job_id, prepared.run, qualified_name(staging))
                if previous:
                    drop_staging(connection, previous)
                staging.create(connection)
        finally:
            engine.dispose()
        return prepared

    def commit(
        self,
        outcomes: Sequence[AttemptOutcome | None],
        *,
        offsets_group: str | None = None,
        offsets: Offsets | None = None,
        batch_id: int | None = None,
    ) -> SqlCommit:
        """Move the winners' staged rows into the target, write `offsets` for `offsets_group`
        and the commit record, drop the staging table: one transaction."""
        winners = sorted(o.attempt for o in outcomes if o is not None)
        expected = sum(o.rows for o in outcomes if o is not None)
        target = self._target()
        engine = engine_for(self.url)
        staging = self._staging(engine.dialect.name)
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
                if not inspect(connection).has_table(staging.name, schema=staging.schema):
                    raise RunFenced(f"job {self.job_id!r}: run {self.run!r} ended already")
                staged = int(
                    connection.execute(select(func.count()).select_from(staging)).scalar_one()
                )
                replayed = (
                    batch_id is not None
                    and connection.execute(
                        select(COMMITS.c.run).where(
                            COMMITS.c.job_id == self.job_id, COMMITS.c.batch_id == batch_id
                        )
                    ).first()
                )
                if replayed:
                    self._finish(connection, staging)
                    return SqlCommit(0, staged, [], skipped=True)
                moved = 0
                if winners:
                    chosen = select(*(staging.c[c] for c in self.columns)).where(
                        staging.c[ATTEMPT_COLUMN].in_(winners)
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
                now = int(time.time() * 1000)
                write_offsets(connection, offsets_group, offsets or {}, self.job_id, self.run, now)
                connection.execute(
                    insert(COMMITS).values(
                        job_id=self.job_id,
                        run=self.run,
                        batch_id=batch_id,
                        dbtable=self.dbtable,
                        rows=moved,
                        discarded_rows=staged - moved,
                        winners=orjson.dumps(winners).decode(),
                        committed_ms=now,
                    )
                )
                self._finish(connection, staging)
                return SqlCommit(moved, staged - moved, winners)
        finally:
            engine.dispose()

    def abort(self) -> int:
        """Throw away what this run staged (Spark gave up on the job); returns the rows."""
        engine = engine_for(self.url)
        staging = self._staging(engine.dialect.name)
        try:
            with engine.begin() as connection:
                if not inspect(connection).has_table(staging.name, schema=staging.schema):
                    return 0
                if not inspect(connection).has_table(staging.name, schema=staging.schema):
                    raise RunFenced(f"job {self.job_id!r}: run {self.run!r} ended already")
                staged = int(
                    connection.execute(select(func.count()).select_from(staging)).scalar_one()
                )
                self._finish(connection, staging)
                return staged
        finally:
            engine.dispose()

    def _finish(self, connection: Connection, staging: Table) -> None:
        staging.drop(connection)
        connection.execute(
            update(JOBS)
            .where(JOBS.c.job_id == self.job_id, JOBS.c.run == self.run)
            .values(staging=None)
        )

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
        schema, name = split_table(self.dbtable)
        return table(name, *(column(c) for c in self.columns), schema=schema)

    def _staging(self, dialect: str) -> Table:
        schema, name = split_table(self.dbtable)
        return Table(
            staging_name(name, self.run),
            MetaData(),
            Column(ATTEMPT_COLUMN, String(255), nullable=False),
            *(Column(c, t) for c, t in zip(self.columns, self.types, strict=True)),
            schema=schema,
            # Not logged: a crash loses staged rows, and a commit then finds fewer rows than its
            # tasks reported and refuses; nothing ever depends on them before the commit.
            prefixes=["UNLOGGED"] if dialect == "postgresql" else [],
        )


class Stager:
    """One task attempt's rows into the run's staging table, committed every `flush()`."""

    def __init__(self, target: SqlTarget, attempt: str, connection: Connection) -> None:
        self.target, self.attempt, self.connection = target, attempt, connection
        dialect = connection.dialect
        self.staging = target._staging(dialect.name)
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.staged = 0
        self._copy = dialect.name == "postgresql" and dialect.driver == "psycopg"

    def add(self, batch: pa.RecordBatch) -> None:
        self.pending.append(batch)
        self.pending_rows += batch.num_rows

    def flush(self) -> None:
        """Commit the pending rows into the staging table. A table that is gone (the run was
        committed, aborted or replaced while this attempt wrote) is RunFenced."""
        if not self.pending:
            return
        try:
            with self.connection.begin():
                for batch in self.pending:
                    if self._copy:
                        self._copy_batch(batch)
                    else:
                        rows = batch.to_pylist()
                        for row in rows:
                            row[ATTEMPT_COLUMN] = self.attempt
                        self.connection.execute(insert(self.staging), rows)
        except Exception:  # the driver's own error when COPY went straight to psycopg
            if not inspect(self.connection).has_table(
                self.staging.name, schema=self.staging.schema
            ):
                raise RunFenced(f"{self.attempt}: the run ended while this attempt wrote") from None
            raise
        self.staged += self.pending_rows
        self.pending.clear()
        self.pending_rows = 0

    def _copy_batch(self, batch: pa.RecordBatch) -> None:
        """Postgres: COPY, the fastest way in. Arrow's CSV writer renders the batch in C (nulls
        unquoted, strings quoted, as Postgres's CSV reads them); binary and nested columns,
        which CSV cannot carry, go row by row."""
        import pyarrow as pa
        import pyarrow.csv as csv
        from psycopg import sql

        names = [ATTEMPT_COLUMN, *self.target.columns]
        schema = self.staging.schema
        relation = (
            sql.Identifier(schema, self.staging.name)
            if schema
            else sql.Identifier(self.staging.name)
        )
        textual = all(_csv_safe(f.type) for f in batch.schema)
        statement = sql.SQL("COPY {} ({}) FROM STDIN{}").format(
            relation,
            sql.SQL(", ").join(sql.Identifier(n) for n in names),
            sql.SQL(" WITH (FORMAT csv)" if textual else ""),
        )
        raw = self.connection.connection.driver_connection
        assert raw is not None
        with raw.cursor() as cursor, cursor.copy(statement) as copy:
            if textual:
                attempts = pa.repeat(pa.scalar(self.attempt, pa.string()), batch.num_rows)
                rendered = pa.Table.from_arrays([attempts, *batch.columns], names=names)
                sink = io.BytesIO()
                csv.write_csv(rendered, sink, csv.WriteOptions(include_header=False))
                copy.write(sink.getbuffer())
            else:
                for row in batch.to_pylist():
                    copy.write_row([self.attempt, *(row[c] for c in self.target.columns)])

    def committed_already(self) -> bool:
        """Whether the run was committed, aborted or fenced before this attempt finished: a late
        speculative copy, whose rows nobody will move."""
        with self.connection.begin():
            current = self.connection.execute(
                select(JOBS.c.run, JOBS.c.staging).where(JOBS.c.job_id == self.target.job_id)
            ).first()
        return current is None or current[0] != self.target.run or current[1] is None


def _csv_safe(arrow_type: Any) -> bool:
    import pyarrow.types as t

    return not (
        t.is_binary(arrow_type)
        or t.is_large_binary(arrow_type)
        or t.is_nested(arrow_type)
        or t.is_dictionary(arrow_type)
    )


def stage_batches(
    target: SqlTarget,
    attempt: str,
    partition: int,
    batches: Iterable[pa.RecordBatch],
    batch: int,
    stops: Collection[int] = (),
    at_stop: Callable[[int, Stager], None] | None = None,
) -> AttemptOutcome:
    """Stage one task attempt's rows, about `batch` per transaction. `at_stop(rows so far,
    stager)` runs once exactly `stops` rows are in (the tests' fault injection). A late
    attempt (its run committed, aborted or fenced while it wrote) fails with RunFenced."""
    written = 0
    with target.stager(attempt) as stager:
        for arrow in batches:
            start = 0
            while start < arrow.num_rows:
                # Cut the batch where a stop falls inside it.
                cut = min(
                    (s - written for s in stops if written < s <= written + arrow.num_rows - start),
                    default=arrow.num_rows - start,
                )
                piece = arrow.slice(start, cut)
                stager.add(piece)
                start += cut
                written += cut
                if stager.pending_rows >= batch:
                    stager.flush()
                if at_stop is not None and written in stops:
                    at_stop(written, stager)
        stager.flush()
        if stager.committed_already():
            raise RunFenced(f"{attempt}: the job's run ended before this attempt finished")
        return AttemptOutcome(partition, attempt, stager.staged)
