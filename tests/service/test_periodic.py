"""Background rounds (`coordinator.core.periodic`): a process that stops lets the round under way
finish, so no query is cut off halfway (its connection would go back to the pool mid-rollback,
and the service's log would show the traceback), and starts no other."""

from __future__ import annotations

import asyncio
import logging

import pytest

from coordinator.core.periodic import run_periodically


async def test_a_round_under_way_finishes_before_the_task_stops() -> None:
    started, finished = asyncio.Event(), []

    async def work() -> None:
        started.set()
        await asyncio.sleep(0.2)
        finished.append(True)

    task = asyncio.create_task(run_periodically(0.001, work, logging.getLogger("test")))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished == [True]


async def test_a_failing_round_is_logged_and_the_next_one_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rounds: list[int] = []
    again = asyncio.Event()

    async def work() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 1:
            raise RuntimeError("the first round fails")
        again.set()

    task = asyncio.create_task(run_periodically(0.001, work, logging.getLogger("test")))
    await asyncio.wait_for(again.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rounds[:2] == [0, 1]
    assert "background round failed" in caplog.text
