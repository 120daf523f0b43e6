"""The txsql protocol without Spark (sdk/spark/_sql.py), on a Postgres and an SQLite target:
attempts stage their rows, the driver's one transaction moves the winners' rows, discards the
losers', writes the input offsets and the commit record; retried commits, crashed and zombie
drivers, late attempts and replayed micro-batches change nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from sqlalchemy import text
from sqlalchemy.types import BigInteger, DateTime, Numeric, Text

from sdk._errors import ConfigError
from sdk.spark import sql_committed_offsets
from sdk.spark._sql import RunFenced, SqlTarget, engine_for, stage_batches
from tests.support.services import create_postgres_database, drop_postgres_database
from tests.support.sql_support import staged

COLUMNS = ("id", "name")
CREATE = [("id", BigInteger()), ("name", Text())]


@pytest.fixture(scope="module", params=["postgres", "sqlite"])
def target_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('txsql') / 'target.db'}"
        return
    url = create_postgres_database()
    try:
        yield url
    finally:
        drop_postgres_database(url)


@pytest.fixture
def dbtable() -> str:
    return f"out_{uuid.uuid4().hex[:8]}"


def query(url: str, sql: str) -> list[tuple[object, ...]]:
    engine = engine_for(url)
    try:
        with engine.connect() as connection:
            return [tuple(r) for r in connection.execute(text(sql)).all()]
    finally:
        engine.dispose()


def rows_of(url: str, dbtable: str) -> list[tuple[object, ...]]:
    return sorted(query(url, f"SELECT id, name FROM {dbtable}"))


def stage(target: SqlTarget, partition: int, attempt: int, ids: range, task: int = 0):  # type: ignore[no-untyped-def]
    attempt_id = target.attempt_id(partition, attempt, task or partition * 10 + attempt)
    batches = [
        pa.record_batch({"id": [i], "name": [f"n{i}"]}) for i in ids
    ]  # one row each: the attempt commits every 3
    return stage_batches(target, attempt_id, partition, batches, batch=3)


def test_the_commit_moves_the_winners_drops_the_losers_and_stores_offsets_in_one_go(
    target_url: str, dbtable: str
) -> None:
    target = SqlTarget.prepare(target_url, dbtable, "job-a", COLUMNS, CREATE)
    lost = stage(target, 1, 0, range(10, 17))  # a retried attempt's first try: 7 rows
    winners = [stage(target, 0, 0, range(0, 10)), stage(target, 1, 1, range(10, 20))]
    assert lost.rows == 7 and staged(target_url, dbtable) == 27
    assert rows_of(target_url, dbtable) == []  # staged rows are not in the target

    result = target.commit(winners, offsets_group="g", offsets={"payments": {0: 20, 1: 5}})

    assert rows_of(target_url, dbtable) == [(i, f"n{i}") for i in range(20)]
    assert (result.rows, result.discarded_rows) == (20, 7)
    assert result.winners == sorted(w.attempt for w in winners)
    assert staged(target_url, dbtable) == 0
    assert sql_committed_offsets(target_url, "g") == {"payments": {0: 20, 1: 5}}
    assert sql_committed_offsets(target_url, "other") == {}
    record = query(target_url, "SELECT job_id, run, rows, discarded_rows FROM txsql_commits")
    assert (("job-a", target.run, 20, 7)) in record
    # The driver's commit retried (its answer lost): nothing moves twice.
    again = target.commit(winners, offsets_group="g", offsets={"payments": {0: 20, 1: 5}})
    assert again.repeated and again.rows == 20
    assert len(rows_of(target_url, dbtable)) == 20


def test_a_failed_commit_changes_nothing(target_url: str, dbtable: str) -> None:
    target = SqlTarget.prepare(target_url, dbtable, "job-b", COLUMNS, CREATE)
    outcome = stage(target, 0, 0, range(5))
    forged = type(outcome)(outcome.partition, outcome.attempt, outcome.rows + 1)
    with pytest.raises(RuntimeError, match="nothing committed"):
        target.commit([forged], offsets_group="g-b", offsets={"t": {0: 5}})
    assert rows_of(target_url, dbtable) == []
    assert staged(target_url, dbtable) == 5
    assert sql_committed_offsets(target_url, "g-b") == {}
    assert target.commit([outcome], offsets_group="g-b", offsets={"t": {0: 5}}).rows == 5


def test_a_rerun_after_a_driver_died_before_its_commit_writes_once_and_fences_the_old_driver(
    target_url: str, dbtable: str
) -> None:
    crashed = SqlTarget.prepare(target_url, dbtable, "job-c", COLUMNS, CREATE)
    old = [stage(crashed, 0, 0, range(10))]
    rerun = SqlTarget.prepare(target_url, dbtable, "job-c", COLUMNS, CREATE)
    assert staged(target_url, dbtable) == 0  # the crashed run's rows are gone
    result = rerun.commit(
        [stage(rerun, 0, 0, range(10))], offsets_group="g-c", offsets={"t": {0: 10}}
    )
    assert result.rows == 10
    # The old driver was only paused: it wakes and commits; it is fenced and changes nothing.
    with pytest.raises(RunFenced):
        crashed.commit(old, offsets_group="g-c", offsets={"t": {0: 99}})
    assert rows_of(target_url, dbtable) == [(i, f"n{i}") for i in range(10)]
    assert sql_committed_offsets(target_url, "g-c") == {"t": {0: 10}}


def test_an_attempt_finishing_after_the_commit_discards_its_rows(
    target_url: str, dbtable: str
) -> None:
    target = SqlTarget.prepare(target_url, dbtable, "job-d", COLUMNS, CREATE)
    target.commit([stage(target, 0, 1, range(4))])
    with pytest.raises(RunFenced):
        stage(target, 0, 0, range(4))  # the straggler of a speculated task
    assert staged(target_url, dbtable) == 0
    assert len(rows_of(target_url, dbtable)) == 4


def test_a_micro_batch_committed_before_is_not_committed_again(
    target_url: str, dbtable: str
) -> None:
    first = SqlTarget.prepare(target_url, dbtable, "job-e", COLUMNS, CREATE)
    first.commit([stage(first, 0, 0, range(3))], batch_id=0)
    replay = SqlTarget.prepare(target_url, dbtable, "job-e", COLUMNS, CREATE)
    result = replay.commit([stage(replay, 0, 0, range(3))], batch_id=0)
    assert result.skipped and result.discarded_rows == 3
    assert len(rows_of(target_url, dbtable)) == 3
    with pytest.raises(RunFenced):
        replay.commit([], batch_id=1)  # the run ended with its skipped commit
    following = SqlTarget.prepare(target_url, dbtable, "job-e", COLUMNS, CREATE)
    assert following.commit([stage(following, 0, 0, range(3, 5))], batch_id=1).rows == 2
    assert len(rows_of(target_url, dbtable)) == 5


def test_an_abort_throws_away_the_runs_staged_rows(target_url: str, dbtable: str) -> None:
    target = SqlTarget.prepare(target_url, dbtable, "job-f", COLUMNS, CREATE)
    stage(target, 0, 0, range(6))
    assert target.abort() == 6
    assert staged(target_url, dbtable) == 0 and rows_of(target_url, dbtable) == []


def test_typed_values_arrive_as_they_were(target_url: str, dbtable: str) -> None:
    columns = ("id", "amount", "at")
    create = [("id", BigInteger()), ("amount", Numeric(18, 2)), ("at", DateTime(timezone=True))]
    if target_url.startswith("sqlite"):
        create[1] = ("amount", Text())  # SQLite has no exact decimal type
    target = SqlTarget.prepare(target_url, dbtable, "job-g", columns, create)
    at = datetime(2026, 11, 24, 15, 0, 1, 250_000, tzinfo=UTC)
    amount = Decimal("1234.56") if target_url.startswith("postgres") else "1234.56"
    arrow = pa.record_batch(
        {"id": [1], "amount": [amount], "at": pa.array([at], pa.timestamp("us", tz="UTC"))}
    )
    outcome = stage_batches(target, target.attempt_id(0, 0, 1), 0, [arrow], batch=10)
    target.commit([outcome])
    ((got_id, got_amount, got_at),) = query(target_url, f"SELECT id, amount, at FROM {dbtable}")
    assert (got_id, str(got_amount)) == (1, "1234.56")
    assert str(got_at).startswith("2026-11-24 15:00:01.25")


def test_bad_targets_are_refused_naming_the_option(target_url: str, dbtable: str) -> None:
    with pytest.raises(ConfigError, match="no table"):
        SqlTarget.prepare(target_url, dbtable, "job-h", COLUMNS)
    SqlTarget.prepare(target_url, dbtable, "job-h", COLUMNS, CREATE)
    with pytest.raises(ConfigError, match=r"\['extra'\]"):
        SqlTarget.prepare(target_url, dbtable, "job-h", ("id", "extra"))
    with pytest.raises(ConfigError, match="dbtable"):
        SqlTarget.prepare(target_url, "a..b", "job-h", COLUMNS)
    with pytest.raises(ConfigError, match="url"):
        SqlTarget.prepare("not a url", dbtable, "job-h", COLUMNS)


def test_committed_offsets_of_a_database_never_written_are_none(tmp_path: Path) -> None:
    assert sql_committed_offsets(f"sqlite:///{tmp_path / 'empty.db'}", "g") == {}
