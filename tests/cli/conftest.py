"""The admin CLI's tests run it against real `coordinator serve` processes, naming the URL."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's own COORDINATOR_URL/TOKEN must not leak into what a test proves."""
    monkeypatch.delenv("COORDINATOR_URL", raising=False)
    monkeypatch.delenv("COORDINATOR_TOKEN", raising=False)
