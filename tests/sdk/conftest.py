"""Fixtures of the SDK's group tests: the live service per store with short group timeouts (set
by configuration), started once per module and emptied per test. (The live service of the other
SDK tests, shared with the job tests, is the root conftest's `service`.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.sdk_support import Coordinator, LiveService
from tests.support.services import Backend

GROUP_SETTINGS = {
    "group_min_session_timeout_ms": 100,
    "group_check_interval_ms": 100,
    "group_heartbeat_interval_ms": 100,
}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def group_live(request: pytest.FixtureRequest) -> Iterator[LiveService]:
    store: Backend = request.getfixturevalue(f"{request.param}_service_store")
    live = LiveService(store, **GROUP_SETTINGS).start()
    yield live
    live.stop()


@pytest.fixture
def group_service(group_live: LiveService) -> Iterator[Coordinator]:
    """The group-tuned service on this module's store, with empty tables."""
    group_live.empty()
    with Coordinator(group_live) as coordinator:
        yield coordinator
