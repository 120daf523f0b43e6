"""A member's offset commit on Postgres (coordinator.groups.committing): its facts read in one
statement, the rule applied to them, and the offsets written by a second that checks nothing it
read changed; whatever the rule refuses, or what changed between the two, is answered by the
locking path. The rule itself runs on both stores in test_groups.

Postgres only: SQLite always takes the locking path.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from coordinator.groups import service
from coordinator.store.postgres import groups as engine
from tests.support.api import assert_problem
from tests.support.groups import Member, member_owning_two
from tests.support.locks import between_the_statements
from tests.support.services import Backend


@pytest.fixture
def store(postgres_store: Backend) -> Backend:
    return postgres_store


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each member's commit was written by the two statements (False: the locks)."""
    written: list[bool] = []
    real = service.commit_as_member

    async def spy(*args: Any, **kwargs: Any) -> bool:
        done = await real(*args, **kwargs)
        written.append(done)
        return done

    monkeypatch.setattr(service, "commit_as_member", spy)
    return written


async def committed(client: httpx.AsyncClient) -> list[tuple[str, int, int]]:
    answer = (await client.get("/v1/groups/g/offsets")).json()["offsets"]
    return [(o["topic"], o["partition"], o["offset"]) for o in answer]


@pytest.fixture
async def member(client: httpx.AsyncClient) -> Member:
    return await member_owning_two(client)


async def test_a_members_commit_goes_in_two_statements(
    client: httpx.AsyncClient, member: Member, statements: list[bool]
) -> None:
    answer = await member.commit(("t", 1, 7), ("t", 0, 5))

    assert answer.status_code == 200, answer.text
    assert [(o["partition"], o["offset"]) for o in answer.json()["offsets"]] == [(0, 5), (1, 7)]
    assert statements == [True]
    assert await committed(client) == [("t", 0, 5), ("t", 1, 7)]
    assert (await member.commit(("t", 0, 9))).status_code == 200
    assert statements == [True, True]
    assert await committed(client) == [("t", 0, 9), ("t", 1, 7)]


async def test_a_commit_the_rule_refuses_is_answered_by_the_locks(
    client: httpx.AsyncClient, member: Member, statements: list[bool]
) -> None:
    assert_problem(
        await member.commit(("t", 0, 5), epoch=member.epoch + 1), 409, "FENCED_MEMBER_EPOCH"
    )
    # No such partition: not owned, checked before the partitions are, as the locks check.
    assert_problem(await member.commit(("t", 9, 5)), 409, "FENCED_MEMBER_EPOCH")
    assert statements == [False, False]
    assert await committed(client) == []


async def test_a_heartbeat_between_the_statements_sends_the_commit_to_the_locks(
    app: Any,
    client: httpx.AsyncClient,
    member: Member,
    statements: list[bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    beat = "UPDATE group_members SET last_heartbeat_ms = last_heartbeat_ms + 1"
    between_the_statements(app, monkeypatch, engine, beat)

    assert (await member.commit(("t", 0, 5))).status_code == 200

    assert statements == [False]  # written by the locking path, which still accepts it
    assert await committed(client) == [("t", 0, 5)]


async def test_a_partition_taken_away_between_the_statements_is_fenced_by_the_locks(
    app: Any,
    client: httpx.AsyncClient,
    member: Member,
    statements: list[bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    revoked = "DELETE FROM group_owned_partitions WHERE topic = 't' AND partition = 1"
    between_the_statements(app, monkeypatch, engine, revoked)

    refused = await member.commit(("t", 0, 5), ("t", 1, 7))

    assert_problem(refused, 409, "FENCED_MEMBER_EPOCH")
    assert statements == [False]
    assert await committed(client) == []
