"""A steady member's heartbeat on Postgres (coordinator.groups.consumer): its facts read in one
statement, `steady` applied to them, and the session renewed by a second that checks nothing it
read changed; every other heartbeat (a join, a rebalance, a subscription change, a member whose
partitions move) and what changed between the two are the locking path's. The heartbeat's rules
run on both stores in test_groups.

Postgres only: SQLite always takes the locking path.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from coordinator.groups import consumer
from coordinator.store.postgres import groups as engine
from tests.support.api import create_topic
from tests.support.groups import Member, member_owning_two
from tests.support.locks import between_the_statements
from tests.support.services import Backend


@pytest.fixture
def store(postgres_store: Backend) -> Backend:
    return postgres_store


@pytest.fixture
def renewed(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each heartbeat tried in two statements was written by them."""
    written: list[bool] = []
    real = consumer.renew_if_steady

    async def spy(*args: Any, **kwargs: Any) -> Any:
        assignment = await real(*args, **kwargs)
        written.append(assignment is not None)
        return assignment

    monkeypatch.setattr(consumer, "renew_if_steady", spy)
    return written


async def last_heartbeat(app: Any, member_id: str) -> tuple[int, int]:
    async with app.state.db.engine.connect() as connection:
        row = (
            await connection.execute(
                text(
                    "SELECT last_heartbeat_ms, session_deadline_ms FROM group_members "
                    "WHERE member_id = :m"
                ),
                {"m": member_id},
            )
        ).one()
    return row[0], row[1]


async def test_a_steady_members_heartbeat_goes_in_two_statements(
    app: Any, client: httpx.AsyncClient, renewed: list[bool]
) -> None:
    member = await member_owning_two(client)
    renewed.clear()
    before = await last_heartbeat(app, "a")
    epoch = member.epoch

    assert await member.beat(session_timeout_ms=20_000) == {("t", 0), ("t", 1)}
    assert await member.beat(owned_partitions=None, subscribed_topics=["t"]) == member.owned

    assert renewed == [True, True]
    assert member.epoch == epoch
    beat_at, deadline = await last_heartbeat(app, "a")
    assert beat_at >= before[0] and deadline >= beat_at + 20_000 - 1  # the last asked for 45 s
    described = (await client.get("/v1/groups/g")).json()
    assert described["state"] == "Stable"


async def test_a_rebalance_sends_each_member_to_the_locks_until_it_is_steady_again(
    client: httpx.AsyncClient, renewed: list[bool]
) -> None:
    a = await member_owning_two(client)
    b = Member(client, "g", "b")
    await b.beat()  # joins: the target gives it one of a's partitions
    renewed.clear()

    assert len(await a.beat()) == 1  # told to give one up: the locks answer
    await a.beat()  # reports it gave it up: the locks free it
    await b.beat()  # granted what a gave up: the locks
    await a.beat()
    await b.beat()  # both steady now

    assert renewed == [False, False, False, True, True]
    assert a.owned | b.owned == {("t", 0), ("t", 1)} and not a.owned & b.owned


async def test_what_is_not_steady_is_answered_by_the_locks(
    client: httpx.AsyncClient, renewed: list[bool]
) -> None:
    member = await member_owning_two(client)
    await create_topic(client, "u")
    renewed.clear()

    grown = await member.beat(subscribed_topics=["t", "u"])  # a new subscription: a rebalance
    claims = await member.send(owned_partitions=[{"topic": "w", "partition": 0}])

    assert grown == {("t", 0), ("t", 1), ("u", 0)}
    assert claims.status_code == 409, claims.text  # what it does not own: fenced by the locks
    assert renewed == [False, False]


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE consumer_groups SET updated_ms = updated_ms + 1",
        "UPDATE group_members SET client_id = 'x'",
        "UPDATE group_owned_partitions SET granted_epoch = granted_epoch",
    ],
    ids=["group", "member", "owned"],
)
async def test_a_row_changed_between_the_statements_sends_the_heartbeat_to_the_locks(
    app: Any,
    client: httpx.AsyncClient,
    renewed: list[bool],
    monkeypatch: pytest.MonkeyPatch,
    change: str,
) -> None:
    member = await member_owning_two(client)
    renewed.clear()
    between_the_statements(app, monkeypatch, engine, change)

    assert await member.beat() == {("t", 0), ("t", 1)}

    assert renewed == [False]  # renewed by the locking path, which still accepts it


STEADY = consumer.SteadyFacts(
    consumer_group=True,
    member_epoch=3,
    consumer_member=True,
    session_deadline_ms=1_000,
    revoke_deadline_ms=None,
    subscribed_topics=["t"],
    assigned=[("t", 0), ("t", 1)],
    owned={("t", 0), ("t", 1)},
    target={("t", 0), ("t", 1)},
    others_gone=0,
    partition_counts={"t": 2},
    counted={"t": 2},
)


@pytest.mark.parametrize(
    ("changed", "call"),
    [
        ({"consumer_group": False}, {}),  # a classic group
        ({"consumer_member": False}, {}),  # a classic member of a consumer group
        ({"others_gone": 1}, {}),  # another member to remove
        ({"session_deadline_ms": 999}, {}),  # its own session ran out
        ({"revoke_deadline_ms": 2_000}, {}),  # it has partitions to give up
        ({}, {"member_epoch": 2}),  # the previous epoch
        ({}, {"owned_partitions": [("t", 2)]}),  # claims what it does not own
        ({}, {"subscribed_topics": ["t", "u"]}),  # a new subscription
        ({"target": {("t", 0)}}, {}),  # the target moved a partition away
        ({"owned": {("t", 0)}}, {}),  # a partition to grant
        ({"assigned": [("t", 0)]}, {}),  # not told its assignment yet
        ({"partition_counts": {"t": 3}}, {}),  # a subscribed topic grew
    ],
)
def test_a_heartbeat_is_steady_only_when_the_locks_would_change_nothing_else(
    changed: dict[str, Any], call: dict[str, Any]
) -> None:
    asked: dict[str, Any] = {
        "member_epoch": 3,
        "subscribed_topics": ["t"],
        "owned_partitions": [("t", 1)],
        "now": 1_000,
    }
    assert consumer.steady(STEADY, **asked)
    assert consumer.steady(STEADY, 3, None, None, 1_000)  # a heartbeat that sends neither
    assert not consumer.steady(replace(STEADY, **changed), **{**asked, **call})
