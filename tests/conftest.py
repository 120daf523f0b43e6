"""Fixtures: every store test runs once on SQLite and once on Postgres.

Each store is built by `alembic upgrade head` once per session (so the migrations are what the
tests run on); every test starts from empty tables. The in-process app of most tests runs no
background work; the live services (uvicorn in a thread, sweeps included) get stores of their own,
so their sweeps never touch another test's rows or meet its emptying.
"""

from __future__ import annotations

import compileall
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordinator.app import create_app
from coordinator.core.migrate import upgrade_to_head
from coordinator.core.settings import Settings
from tests.support.sdk_support import Coordinator, LiveService
from tests.support.services import (
    Backend,
    create_postgres_database,
    drop_postgres_database,
    empty_tables,
    make_settings,
)

# The JVMs the tests start (Spark's drivers and executors, Kafka's clients, tools, Streams and
# broker) live seconds and handle little data: with the C1 compiler alone they spend a quarter
# less CPU than when C2 compiles too (Spark's driver-kill tests: 192 against 256 core-seconds),
# and the suite is CPU-bound on two cores. They load tens of thousands of classes, all from
# Spark's, Kafka's and Maven Central's jars: without verifying their bytecode a Spark session
# starts on 11.4 core-seconds instead of 13.4. Each JVM notes the options on its stderr. Set
# here, at the import of this file, so xdist's workers and every process they start inherit it.
os.environ.setdefault(
    "JDK_JAVA_OPTIONS",
    "-XX:TieredStopAtLevel=1 -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote",
)

# The project's own packages, compiled to bytecode once, before xdist's workers start: where
# PYTHONDONTWRITEBYTECODE is set (as on the CI machine), every process the tests start (a service
# started 90 times, a module imported alone 170 times, the fault tool's workers, Spark's Python)
# would otherwise compile each module it imports from its source again, 0.2 to 0.3 core-seconds
# a service start. Byte-compiling writes the caches whatever that variable says.
_PACKAGES = ("coordinator", "sdk", "jobs", "tests", "bench")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller did it
    root = Path(__file__).resolve().parents[1]
    for package in _PACKAGES:
        compileall.compile_dir(root / package, quiet=1)


# The files that take longest (a minute or more each, `--durations` says which) run first:
# `pytest -n 3 --dist loadfile --no-loadscope-reorder` hands out whole files in collection order
# (xdist would otherwise order them by their number of tests, leaving the long files of few
# tests for last), so a long file left for last would keep one worker busy while the others wait.
FIRST = (
    "tests/fault/",
    "tests/spark/",
    "tests/jobs/",
    "tests/service/transactions/test_transactions_model.py",
    "tests/kafka/test_kafka_mirror.py",
    "tests/kafka/test_kafka_connect.py",
    "tests/kafka/test_java_client.py",
    "tests/kafka/test_kafka_streams.py",
    "tests/service/test_schema.py",
    "tests/sdk/test_sdk_install.py",
    "tests/kafka/test_kafka_matrix.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return next((i for i, first in enumerate(FIRST) if path.startswith(first)), len(FIRST))

    items.sort(key=rank)  # stable: within a rank, files and tests keep their order


BACKENDS = ["sqlite", "postgres"]


def _sqlite(tmp_path_factory: pytest.TempPathFactory, name: str) -> Backend:
    path = tmp_path_factory.mktemp(name) / "coordinator.db"
    url = f"sqlite:///{path}"
    upgrade_to_head(Settings(database_url=url).database_url)
    return Backend("sqlite", url)


@contextmanager
def _postgres() -> Iterator[Backend]:
    url = create_postgres_database()
    try:
        upgrade_to_head(Settings(database_url=url).database_url)
        yield Backend("postgres", url)
    finally:
        drop_postgres_database(url)


@pytest.fixture(scope="session")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> Backend:
    return _sqlite(tmp_path_factory, "sqlite")


@pytest.fixture(scope="session")
def postgres_store() -> Iterator[Backend]:
    with _postgres() as store:
        yield store


@pytest.fixture(scope="session")
def sqlite_service_store(tmp_path_factory: pytest.TempPathFactory) -> Backend:
    """The store of the live services (see the module's docstring)."""
    return _sqlite(tmp_path_factory, "sqlite-service")


@pytest.fixture(scope="session")
def postgres_service_store() -> Iterator[Backend]:
    """The store of the live services (see the module's docstring)."""
    with _postgres() as store:
        yield store


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> Backend:
    result: Backend = request.getfixturevalue(f"{request.param}_store")
    return result


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    """Override in a test module to start the app with other settings."""
    return {}


@pytest.fixture
async def app(store: Backend, settings_overrides: dict[str, Any]) -> AsyncIterator[Any]:
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


# -- the live service the SDK and job tests run against ------------------------------------------


@pytest.fixture(scope="session")
def sqlite_live(sqlite_service_store: Backend) -> Iterator[LiveService]:
    live = LiveService(sqlite_service_store).start()
    yield live
    live.stop()


@pytest.fixture(scope="session")
def postgres_live(postgres_service_store: Backend) -> Iterator[LiveService]:
    live = LiveService(postgres_service_store).start()
    yield live
    live.stop()


@pytest.fixture
def service(store: Backend, request: pytest.FixtureRequest) -> Iterator[Coordinator]:
    """The running service on this test's store, with empty tables."""
    live: LiveService = request.getfixturevalue(f"{store.backend}_live")
    live.empty()
    with Coordinator(live) as coordinator:
        yield coordinator


@pytest.fixture
def start_service(service: Coordinator) -> Iterator[Callable[..., Coordinator]]:
    """Start another coordinator on the same (emptied) store with other settings, e.g.
    `start_service(timeout_check_interval_ms=50)`; stopped when the test ends."""
    started: list[tuple[LiveService, Coordinator]] = []

    def start(**settings: Any) -> Coordinator:
        live = LiveService(service.live.store, **settings).start()
        coordinator = Coordinator(live)
        started.append((live, coordinator))
        return coordinator

    yield start
    for live, coordinator in started:
        coordinator.http.close()
        live.stop()
