"""A transaction's offsets on Postgres (coordinator.transactions.offsets): the facts of the
transaction and of the committing member read in one statement, the rules applied to them, and
the offsets written into the transaction by a second that checks the transaction's caller and
state again on its locked row, and that the group's rows are the versions read; whatever the
rules refuse, or a group that changed between the two, is answered by the locking path. The
rules themselves run on both stores in test_transactions and test_groups.

Postgres only: SQLite always takes the locking path.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from coordinator.store.postgres import transactions as engine
from coordinator.transactions import service
from coordinator.transactions.states import State
from tests.support.api import assert_problem, create_topic
from tests.support.groups import Member, member_owning_two
from tests.support.locks import between_the_statements
from tests.support.services import Backend
from tests.support.txn import Instance, started


@pytest.fixture
def store(postgres_store: Backend) -> Backend:
    return postgres_store


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[State | None]:
    """What each AddOffsets' two statements returned: the state, or None for the locks."""
    seen: list[State | None] = []
    real = service.add_in_two_statements

    async def spy(*args: Any, **kwargs: Any) -> State | None:
        state = await real(*args, **kwargs)
        seen.append(state)
        return state

    monkeypatch.setattr(service, "add_in_two_statements", spy)
    return seen


async def group_offsets(client: httpx.AsyncClient) -> list[tuple[str, int, int]]:
    answer = (await client.get("/v1/groups/g/offsets")).json()["offsets"]
    return [(o["topic"], o["partition"], o["offset"]) for o in answer]


@pytest.fixture
async def member(client: httpx.AsyncClient) -> Member:
    return await member_owning_two(client)


async def add(
    producer: Instance, member: Member | None, *offsets: tuple[str, int, int], epoch: int = 0
) -> httpx.Response:
    identity = {} if member is None else {"member_id": member.member_id}
    if member is not None:
        identity["member_epoch"] = epoch or member.epoch  # type: ignore[assignment]
    return await producer.client.post(
        f"/v1/transactions/{producer.path_id}/offsets",
        json={
            **producer.caller(),
            **identity,
            "group_id": "g",
            "offsets": [{"topic": t, "partition": p, "offset": o} for t, p, o in offsets],
        },
    )


async def add_with_a_change_between(
    app: Any,
    client: httpx.AsyncClient,
    member: Member,
    monkeypatch: pytest.MonkeyPatch,
    change: str,
) -> tuple[Instance, httpx.Response]:
    """A transaction begun, then offsets added with `change` committed between their two
    statements."""
    producer = await started(client, "x")
    between_the_statements(app, monkeypatch, engine, change)
    return producer, await add(producer, member, ("t", 0, 5))


async def committed_once(producer: Instance, client: httpx.AsyncClient) -> None:
    assert (await producer.end(commit=True)).status_code == 200
    assert await group_offsets(client) == [("t", 0, 5)]


async def test_a_members_offsets_join_the_transaction_in_two_statements(
    client: httpx.AsyncClient, member: Member, statements: list[State | None]
) -> None:
    producer = await started(client, "x")

    first = await add(producer, member, ("t", 1, 7), ("t", 0, 5))
    again = await add(producer, member, ("t", 0, 9))

    assert (first.status_code, again.status_code) == (200, 200), first.text
    assert first.json() == {"state": "Ongoing"}
    assert statements == [State.ONGOING, State.ONGOING]
    described = await producer.describe()
    assert described["state"] == "Ongoing" and described["started_at"] is not None
    assert await group_offsets(client) == []  # not before the commit
    assert (await producer.end(commit=True)).status_code == 200
    assert await group_offsets(client) == [("t", 0, 9), ("t", 1, 7)]


async def test_offsets_without_a_member_go_in_two_statements_and_the_group_alone_in_one(
    client: httpx.AsyncClient, statements: list[State | None]
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "x")
    assert (await add(producer, None, ("t", 0, 3))).status_code == 200  # creates the group
    assert statements == [None]

    # AddOffsetsToTxn, the group alone: an AddPartitions' one statement (test_adding_postgres).
    assert (await add(producer, None)).status_code == 200
    assert (await add(producer, None, ("t", 0, 4))).status_code == 200

    assert statements == [None, State.ONGOING]
    assert (await producer.end(commit=True)).status_code == 200
    assert await group_offsets(client) == [("t", 0, 4)]


async def test_what_the_rules_refuse_is_answered_by_the_locks(
    client: httpx.AsyncClient, member: Member, statements: list[State | None]
) -> None:
    producer = await started(client, "x")
    producer.epoch += 1
    assert_problem(await add(producer, member, ("t", 0, 5)), 409, "INVALID_PRODUCER_EPOCH")
    producer.epoch -= 1
    refused = await add(producer, member, ("t", 0, 5), epoch=member.epoch + 1)
    assert_problem(refused, 409, "FENCED_MEMBER_EPOCH")
    assert_problem(await add(producer, member, ("t", 9, 5)), 409, "FENCED_MEMBER_EPOCH")

    assert statements == [None, None, None]
    assert (await producer.describe())["state"] == "Empty"


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE group_members SET last_heartbeat_ms = last_heartbeat_ms + 1",
        "UPDATE consumer_groups SET group_epoch = group_epoch",
    ],
    ids=["member", "group"],
)
async def test_a_group_row_changed_between_the_statements_sends_the_call_to_the_locks(
    app: Any,
    client: httpx.AsyncClient,
    member: Member,
    statements: list[State | None],
    monkeypatch: pytest.MonkeyPatch,
    change: str,
) -> None:
    producer, added = await add_with_a_change_between(app, client, member, monkeypatch, change)

    assert added.status_code == 200
    assert statements == [None]  # written by the locking path, which still accepts it
    await committed_once(producer, client)


@pytest.mark.parametrize(
    "change",
    [
        # What an append that joins the transaction does to it, as librdkafka's Produce may
        # while its offsets are on their way: the offsets wait for its lock, then are written.
        "UPDATE transactions SET updated_ms = updated_ms + 1",
        "UPDATE producer_ids SET producer_epoch = producer_epoch",
    ],
    ids=["transaction", "producer"],
)
async def test_a_transaction_still_its_callers_after_a_change_takes_the_offsets_in_two_statements(
    app: Any,
    client: httpx.AsyncClient,
    member: Member,
    statements: list[State | None],
    monkeypatch: pytest.MonkeyPatch,
    change: str,
) -> None:
    producer, added = await add_with_a_change_between(app, client, member, monkeypatch, change)

    assert added.status_code == 200
    assert statements == [State.ONGOING]  # checked on the row as the write locked it
    described = await producer.describe()
    assert described["state"] == "Ongoing" and described["started_at"] is not None
    await committed_once(producer, client)


async def test_a_producer_fenced_between_the_statements_is_refused_by_the_locks(
    app: Any,
    client: httpx.AsyncClient,
    member: Member,
    statements: list[State | None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fence = "UPDATE producer_ids SET producer_epoch = producer_epoch + 1"
    producer, refused = await add_with_a_change_between(app, client, member, monkeypatch, fence)

    assert_problem(refused, 409, "PRODUCER_FENCED")
    assert statements == [None]
    assert (await producer.describe())["state"] == "Empty"
    assert await group_offsets(client) == []


async def test_a_partition_taken_away_between_the_statements_is_fenced_by_the_locks(
    app: Any,
    client: httpx.AsyncClient,
    member: Member,
    statements: list[State | None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = await started(client, "x")
    revoked = "DELETE FROM group_owned_partitions WHERE topic = 't' AND partition = 1"
    between_the_statements(app, monkeypatch, engine, revoked)

    refused = await add(producer, member, ("t", 0, 5), ("t", 1, 7))

    assert_problem(refused, 409, "FENCED_MEMBER_EPOCH")
    assert statements == [None]
    assert (await producer.describe())["state"] == "Empty"
