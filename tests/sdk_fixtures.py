"""Fixtures of the SDK tests: the live service per store (started once per session, stopped
before its store is dropped; tables emptied per test). Loaded by SDK test modules with
`pytest_plugins = ["tests.sdk_fixtures"]`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.conftest import Store
from tests.sdk_support import Coordinator, LiveService


@pytest.fixture(scope="session")
def sqlite_live(sqlite_service_store: Store) -> Iterator[LiveService]:
    live = LiveService(sqlite_service_store).start()
    yield live
    live.stop()


@pytest.fixture(scope="session")
def postgres_live(postgres_service_store: Store) -> Iterator[LiveService]:
    live = LiveService(postgres_service_store).start()
    yield live
    live.stop()


@pytest.fixture
def service(store: Store, request: pytest.FixtureRequest) -> Iterator[Coordinator]:
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
