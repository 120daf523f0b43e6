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
from sqlalchemy import text

from coordinator.groups import committing, service
from tests.support.api import assert_problem, create_topic
from tests.support.groups import Member
from tests.support.services import Store


@pytest.fixture
def store(postgres_store: Store) -> Store:
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
    await create_topic(client, "t", partitions=2)
    member = Member(client, "g", "a")
    await member.beat()
    await member.beat()
    assert member.owned == {("t", 0), ("t", 1)}
    return member


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


def _between_the_statements(app: Any, monkeypatch: pytest.MonkeyPatch, sql: str) -> None:
    """Run `sql` in its own unit of work once the commit has read its facts."""
    real = committing.on_driver
    calls = 0

    async def interposed(connection: Any, statement: str, *args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            async with app.state.db.engine.begin() as other:
                await other.execute(text(sql))
        return await real(connection, statement, *args)

    monkeypatch.setattr(committing, "on_driver", interposed)


async def test_a_heartbeat_between_the_statements_sends_the_commit_to_the_locks(
    app: Any,
    client: httpx.AsyncClient,
    member: Member,
    statements: list[bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    beat = "UPDATE group_members SET last_heartbeat_ms = last_heartbeat_ms + 1"
    _between_the_statements(app, monkeypatch, beat)

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
    _between_the_statements(app, monkeypatch, revoked)

    refused = await member.commit(("t", 0, 5), ("t", 1, 7))

    assert_problem(refused, 409, "FENCED_MEMBER_EPOCH")
    assert statements == [False]
    assert await committed(client) == []
