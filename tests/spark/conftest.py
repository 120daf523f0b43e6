"""Fixtures of the Spark tests: one `coordinator serve` process (SQLite) and one `local[2,3]`
SparkSession for the whole test session, Spark drivers in child processes, and for the txsql
tests a scratch Postgres target database per module, with Debian's JDBC drivers required (Spark's
JDBC writer is the baseline)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.services import ServiceProcess, create_postgres_database, drop_postgres_database
from tests.support.spark_support import (
    LOCAL_MASTER,
    SPARK_CONF,
    DriverProcess,
    Log,
    require_jdbc_jars,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """One coordinator (SQLite) for every Spark test; tests keep apart by their own names.
    Timed-out transactions are looked for every half second, not every 10."""
    workdir = tmp_path_factory.mktemp("spark-service")
    service = ServiceProcess(
        f"sqlite:///{workdir / 'coordinator.db'}",
        workdir,
        COORDINATOR_TIMEOUT_CHECK_INTERVAL_MS="500",
    )
    service.start()
    yield service
    service.stop()


@pytest.fixture
def log(spark_service: ServiceProcess) -> Iterator[Log]:
    view = Log(spark_service.url)
    yield view
    view.close()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The one `local[2,3]` SparkSession of the test session, `txlog` registered."""
    from jobs.cluster import session
    from sdk.spark import register

    spark = session("txlog-tests", LOCAL_MASTER, conf=SPARK_CONF)
    register(spark)
    yield spark
    spark.stop()


@pytest.fixture
def driver_processes(tmp_path: Path) -> Iterator[Callable[[dict[str, Any], str], DriverProcess]]:
    """Start `tests/support/spark_driver.py` children; any still running when the test ends is
    killed."""
    started: list[DriverProcess] = []

    def start(spec: dict[str, Any], name: str) -> DriverProcess:
        driver = DriverProcess(spec, tmp_path, name).start()
        started.append(driver)
        return driver

    yield start
    for driver in started:
        driver.kill()


@pytest.fixture(scope="module")
def postgres_target() -> Iterator[str]:
    require_jdbc_jars()
    url = create_postgres_database()
    try:
        yield url
    finally:
        drop_postgres_database(url)
