"""Consumer group membership (docs/pages/http-api.md, Consumer groups): joining, even and sticky
assignment, partitions handed over only after their owner gave them up, member epochs, session and
rebalance timeouts, and the groups' descriptions, listing and deletion; on SQLite and on Postgres.

Timeouts are made to pass by moving a member's deadline into the past in the store (no sleeps)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from coordinator.groups.membership import expire_members
from tests.support.api import assert_problem, create_topic
from tests.support.groups import Member, expire, settle, settled_pair, tps, wire

SIX = {("t", p) for p in range(6)}


async def describe(client: httpx.AsyncClient, group: str = "g") -> dict[str, Any]:
    response = await client.get(f"/v1/groups/{group}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def assert_no_partition_has_two_owners(members: list[Member]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for m in members:
        for tp in m.owned:
            assert tp not in seen, f"{tp} owned by {seen[tp]} and {m.member_id}"
            seen[tp] = m.member_id


async def test_two_then_three_members_split_six_partitions_evenly(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=6)
    a, b, c = (Member(client, "g", name) for name in "abc")
    assert await a.beat() == SIX
    await b.beat()
    await settle([a, b])
    assert (len(a.owned), len(b.owned)) == (3, 3)
    assert a.owned | b.owned == SIX
    await c.beat()
    await settle([a, b, c])
    assert sorted(len(m.owned) for m in (a, b, c)) == [2, 2, 2]
    assert a.owned | b.owned | c.owned == SIX
    assert_no_partition_has_two_owners([a, b, c])
    group = await describe(client)
    assert group["state"] == "Stable"
    assert {m["member_id"]: tps(m["assignment"]) for m in group["members"]} == {
        m.member_id: m.owned for m in (a, b, c)
    }


async def test_assignment_is_sticky_only_the_new_members_share_moves(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=6)
    a, b = await settled_pair(client)
    kept = {m.member_id: set(m.owned) for m in (a, b)}
    c = Member(client, "g", "c")
    await c.beat()
    await settle([a, b, c])
    for m in (a, b):
        assert m.owned <= kept[m.member_id]  # nothing moved between a and b
    assert len(c.owned) == 2


async def test_a_partition_moves_only_after_its_owner_gave_it_up(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=2)
    a, b = Member(client, "g", "a"), Member(client, "g", "b")
    assert await a.beat() == {("t", 0), ("t", 1)}
    assert await b.beat() == set()  # a owns both; the target gives b one of them
    epoch = a.epoch
    response = await a.send()  # still owning both: told to give one up, with a new epoch
    answer = response.json()
    assert answer["member_epoch"] > epoch
    (kept,) = tps(answer["assignment"])
    (moving,) = {("t", 0), ("t", 1)} - {kept}
    a.epoch = answer["member_epoch"]
    # Until a's heartbeat leaves it out, b never gets it, however often it asks.
    for _ in range(3):
        assert await b.beat() == set()
        assert (await a.send()).status_code == 200  # still listing it
    group = await describe(client)
    assert group["state"] == "Reconciling"
    a.owned = {kept}
    await a.beat()
    assert await b.beat() == {moving}
    assert (await describe(client))["state"] == "Stable"


async def test_member_epoch_rises_when_its_assignment_changes_and_stale_epochs_are_fenced(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=2)
    a = Member(client, "g", "a")
    await a.beat()
    first = a.epoch
    assert first > 0
    await a.beat()
    assert a.epoch == first  # nothing changed: the same epoch
    b = Member(client, "g", "b")
    await b.beat()
    await a.beat()  # told to give one up
    assert a.epoch > first
    # An answer lost: the previous epoch is accepted, with no partition it was not given.
    previous = await a.send(member_epoch=first, owned_partitions=wire(a.owned))
    assert previous.status_code == 200, previous.text
    assert previous.json()["member_epoch"] == a.epoch
    for stale in [e for e in range(1, a.epoch + 2) if e not in (first, a.epoch)]:
        assert_problem(await a.send(member_epoch=stale), 409, "FENCED_MEMBER_EPOCH")
    claims = await a.send(owned_partitions=wire(a.owned | {("t", 9)}))
    assert_problem(claims, 409, "FENCED_MEMBER_EPOCH")
    stranger = Member(client, "g", "nobody", epoch=5)
    assert_problem(await stranger.send(), 409, "UNKNOWN_MEMBER_ID")
    assert_problem(
        await Member(client, "no-such-group", "x", epoch=1).send(), 409, "UNKNOWN_MEMBER_ID"
    )


async def test_leaving_frees_the_partitions_at_once(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t", partitions=4)
    a, b = await settled_pair(client)
    leave = await a.leave()
    assert leave.status_code == 200
    assert leave.json()["member_epoch"] == -1 and leave.json()["assignment"] == []
    assert await b.beat() == {("t", p) for p in range(4)}
    assert_problem(await Member(client, "g", "a", epoch=-1).send(), 409, "UNKNOWN_MEMBER_ID")
    group = await describe(client)
    assert [m["member_id"] for m in group["members"]] == ["b"]


async def test_a_member_past_its_session_timeout_is_removed_and_its_partitions_move(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t", partitions=4)
    a, b = await settled_pair(client)
    await expire(app, "a")
    # The next heartbeat of anyone in the group removes it; its partitions go to b.
    await b.beat()
    assert await b.beat() == {("t", p) for p in range(4)}
    response = await a.send()
    assert_problem(response, 409, "UNKNOWN_MEMBER_ID")
    # It joins again with epoch 0, having lost its partitions, and gets its share back.
    a.epoch, a.owned = 0, set()
    await a.beat()
    await settle([a, b])
    assert len(a.owned) == len(b.owned) == 2


async def test_the_sweeper_removes_members_of_a_group_nobody_heartbeats(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t", partitions=2)
    a, b = Member(client, "g", "a"), Member(client, "g", "b")
    await a.beat()
    await b.beat()
    await expire(app, "a")
    await expire(app, "b")
    assert (await describe(client))["state"] == "Empty"
    assert sorted(await expire_members(app.state.db)) == [("g", "a"), ("g", "b")]
    assert await expire_members(app.state.db) == []
    group = await describe(client)
    assert group["members"] == [] and group["state"] == "Empty"


async def test_a_member_keeping_a_partition_past_its_rebalance_timeout_is_removed(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t", partitions=2)
    a, b = Member(client, "g", "a"), Member(client, "g", "b")
    await a.beat()
    await b.beat()
    told = await a.send(rebalance_timeout_ms=60_000)  # told to give one up; keeps both
    assert told.status_code == 200
    a.epoch = told.json()["member_epoch"]
    await expire(app, "a", "revoke_deadline_ms")
    assert_problem(await a.send(), 409, "UNKNOWN_MEMBER_ID")
    assert await b.beat() == {("t", 0), ("t", 1)}


async def test_a_rejoining_member_loses_its_partitions_and_its_old_epochs(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=2)
    a = Member(client, "g", "a")
    await a.beat()
    old = a.epoch
    a.epoch, a.owned = 0, set()
    await a.beat()
    assert a.epoch > old and a.owned == {("t", 0), ("t", 1)}
    assert_problem(await a.send(member_epoch=old), 409, "FENCED_MEMBER_EPOCH")


async def test_a_topic_created_after_subscribing_is_assigned_at_the_next_heartbeat(
    client: httpx.AsyncClient,
) -> None:
    a = Member(client, "g", "a", topics=["later"])
    assert await a.beat() == set()
    epoch = (await describe(client))["group_epoch"]
    await create_topic(client, "later", partitions=3)
    assert await a.beat() == {("later", p) for p in range(3)}
    assert (await describe(client))["group_epoch"] == epoch + 1


async def test_changing_the_subscription_moves_the_partitions(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t", partitions=2)
    await create_topic(client, "u", partitions=2)
    a, b = Member(client, "g", "a", topics=["t", "u"]), Member(client, "g", "b", topics=["t"])
    await a.beat()
    await b.beat()
    await settle([a, b])
    assert {tp[0] for tp in b.owned} == {"t"}
    await a.beat(subscribed_topics=["u"])
    await settle([a, b])
    assert a.owned == {("u", 0), ("u", 1)} and b.owned == {("t", 0), ("t", 1)}


async def test_concurrent_heartbeats_never_give_a_partition_two_owners(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=12)
    members = [Member(client, "g", f"m{i}") for i in range(5)]
    for _ in range(6):
        await asyncio.gather(*(m.beat() for m in members))
        assert_no_partition_has_two_owners(members)
    await settle(members)
    assert sorted(len(m.owned) for m in members) == [2, 2, 2, 3, 3]
    assert set().union(*(m.owned for m in members)) == {("t", p) for p in range(12)}


async def test_heartbeat_bodies_are_checked(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    joins = await client.post("/v1/groups/g/heartbeat", json={"member_id": "a", "member_epoch": 0})
    assert_problem(joins, 422, "INVALID_REQUEST")
    assert "subscribed_topics" in joins.json()["detail"]
    for body, field in (
        ({"member_id": "", "member_epoch": 0, "subscribed_topics": []}, "member_id"),
        ({"member_id": "a", "member_epoch": -2, "subscribed_topics": []}, "member_epoch"),
        ({"member_id": "a", "member_epoch": 0, "subscribed_topics": ["bad name"]}, "subscribed"),
        (
            {"member_id": "a", "member_epoch": 0, "subscribed_topics": [], "session_timeout_ms": 1},
            "session_timeout_ms",
        ),
        ({"member_id": "a", "member_epoch": "1"}, "member_epoch"),
    ):
        response = await client.post("/v1/groups/g/heartbeat", json=body)
        assert response.status_code in (400, 422), response.text
        assert field in assert_problem(response, response.status_code, "INVALID_REQUEST")["detail"]
    assert (await client.get("/v1/groups")).json()["groups"] == []


# -- offset commits and their fencing (KIP-447) ------------------------------------------------


async def committed(client: httpx.AsyncClient, group: str = "g") -> dict[tuple[str, int], int]:
    response = await client.get(f"/v1/groups/{group}/offsets")
    assert response.status_code == 200, response.text
    return {(o["topic"], o["partition"]): o["offset"] for o in response.json()["offsets"]}


async def test_a_member_commits_only_partitions_it_owns_at_an_epoch_it_had(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=2)
    a, b = Member(client, "g", "a"), Member(client, "g", "b")
    await a.beat()
    granted = a.epoch
    await b.beat()
    await settle([a, b])
    (mine,) = a.owned
    (theirs,) = b.owned
    assert (await a.commit((*mine, 5))).status_code == 200
    # An epoch it had while owning the partition: a commit sent before a heartbeat raised it.
    assert (await a.commit((*mine, 6), epoch=granted)).status_code == 200
    for refused in (
        await a.commit((*theirs, 7)),  # not its partition
        await a.commit((*mine, 7), epoch=a.epoch + 1),  # an epoch it never had
        await a.commit((*mine, 7), epoch=0),
        await a.commit((*mine, 7), (*theirs, 7)),  # one of them not its own: nothing commits
    ):
        assert_problem(refused, 409, "FENCED_MEMBER_EPOCH")
    assert_problem(
        await Member(client, "g", "z", epoch=1).commit((*mine, 7)), 409, "UNKNOWN_MEMBER_ID"
    )
    assert await committed(client) == {mine: 6}


async def test_a_commit_with_an_epoch_older_than_the_grant_is_fenced(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=2)
    a = Member(client, "g", "a", topics=[])
    await a.beat()
    before = a.epoch
    await a.beat(subscribed_topics=["t"])
    assert a.owned == {("t", 0), ("t", 1)} and a.epoch > before
    assert_problem(await a.commit(("t", 0, 1), epoch=before), 409, "FENCED_MEMBER_EPOCH")


async def test_a_commit_without_member_identity_is_accepted_only_while_the_group_has_no_members(
    client: httpx.AsyncClient, app: Any
) -> None:
    await create_topic(client, "t", partitions=1)

    async def plain(offset: int) -> httpx.Response:
        return await client.post(
            "/v1/groups/g/offsets",
            json={"offsets": [{"topic": "t", "partition": 0, "offset": offset}]},
        )

    assert (await plain(1)).status_code == 200
    a = Member(client, "g", "a")
    await a.beat()
    assert_problem(await plain(2), 409, "UNKNOWN_MEMBER_ID")
    assert await committed(client) == {("t", 0): 1}
    await expire(app, "a")  # a member whose session ran out is no member, swept or not
    assert (await plain(3)).status_code == 200
    half = await client.post(
        "/v1/groups/g/offsets",
        json={"member_id": "a", "offsets": [{"topic": "t", "partition": 0, "offset": 4}]},
    )
    assert "member_epoch" in assert_problem(half, 422, "INVALID_REQUEST")["detail"]


async def test_a_zombie_members_transactional_commit_and_heartbeat_are_refused(
    client: httpx.AsyncClient, app: Any
) -> None:
    """KIP-447: a member paused past its session timeout wakes up; its offsets cannot join its
    transaction, its heartbeat is refused, and its transaction commits no offsets."""
    from tests.support.txn import started

    await create_topic(client, "t", partitions=2)
    zombie, other = Member(client, "g", "zombie"), Member(client, "g", "other")
    await zombie.beat()
    txn = await started(client, "zombie-txn")
    offsets = {"topic": "t", "partition": 0, "offset": 10}
    joined = await client.post(
        "/v1/transactions/zombie-txn/offsets",
        json={
            **txn.caller(),
            "group_id": "g",
            "member_id": "zombie",
            "member_epoch": zombie.epoch,
            "offsets": [offsets],
        },
    )
    assert joined.status_code == 200, joined.text  # while it owns t-0: accepted
    assert (await txn.end(commit=True)).status_code == 200
    assert await committed(client) == {("t", 0): 10}

    await expire(app, "zombie")  # paused past its session timeout
    assert await other.beat() == {("t", 0), ("t", 1)}
    assert (await other.commit(("t", 0, 20))).status_code == 200

    # It wakes up inside a new transaction with output, and tries to add its offsets.
    await create_topic(client, "out")
    assert (await txn.add(("out", 0))).status_code == 200
    assert (await txn.produce("out", 0, "output")).status_code == 200
    late = await client.post(
        "/v1/transactions/zombie-txn/offsets",
        json={
            **txn.caller(),
            "group_id": "g",
            "member_id": "zombie",
            "member_epoch": zombie.epoch,
            "offsets": [{**offsets, "offset": 15}],
        },
    )
    assert_problem(late, 409, "UNKNOWN_MEMBER_ID")
    assert (await txn.describe())["groups"] == []
    assert_problem(await zombie.send(), 409, "UNKNOWN_MEMBER_ID")
    ended = await txn.end(commit=True)
    assert ended.status_code == 200, ended.text
    assert ended.json()["state"] == "CompleteCommit"
    assert await committed(client) == {("t", 0): 20}


async def test_a_transactional_commit_of_a_partition_given_to_another_is_fenced(
    client: httpx.AsyncClient,
) -> None:
    from tests.support.txn import started

    await create_topic(client, "t", partitions=2)
    a, b = Member(client, "g", "a"), Member(client, "g", "b")
    await a.beat()
    stale_epoch = a.epoch
    await b.beat()
    await settle([a, b])
    (given_away,) = b.owned
    txn = await started(client, "a-txn")
    refused = await client.post(
        "/v1/transactions/a-txn/offsets",
        json={
            **txn.caller(),
            "group_id": "g",
            "member_id": "a",
            "member_epoch": stale_epoch,
            "offsets": [{"topic": given_away[0], "partition": given_away[1], "offset": 3}],
        },
    )
    assert_problem(refused, 409, "FENCED_MEMBER_EPOCH")
    assert (await txn.describe())["state"] == "Empty"
    # Without identity (Kafka's TxnOffsetCommit v0-v2) the producer's epoch fences the commit,
    # not the group's members, as Kafka exempts it (docs/pages/http-api.md, Consumer groups).
    without_identity = await txn.offsets("g", ("t", 0, 1))
    assert without_identity.status_code == 200, without_identity.text


# -- describe, list, delete ------------------------------------------------------------------------


async def test_describe_shows_members_assignment_and_lag_list_counts_members(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=2)
    for p, values in ((0, 5), (1, 3)):
        response = await client.post(
            f"/v1/topics/t/partitions/{p}/records",
            json={"records": [{"value": str(i)} for i in range(values)]},
        )
        assert response.status_code == 200
    a = Member(client, "g", "a")
    await a.beat(client_id="reader-1")
    assert (await a.commit(("t", 0, 2), ("t", 1, 3))).status_code == 200
    group = await describe(client)
    assert group["state"] == "Stable" and group["type"] == "consumer"
    (member,) = group["members"]
    assert member["member_id"] == "a" and member["client_id"] == "reader-1"
    assert member["member_epoch"] == a.epoch and member["subscribed_topics"] == ["t"]
    assert tps(member["assignment"]) == tps(member["target_assignment"]) == a.owned
    assert member["last_heartbeat_at"].endswith("Z")
    assert group["offsets"] == [
        {
            "topic": "t",
            "partition": 0,
            "offset": 2,
            "high_watermark": 5,
            "lag": 3,
            "member_id": "a",
        },
        {
            "topic": "t",
            "partition": 1,
            "offset": 3,
            "high_watermark": 3,
            "lag": 0,
            "member_id": "a",
        },
    ]
    offsets_only = await client.post(
        "/v1/groups/spark-job/offsets",
        json={"offsets": [{"topic": "t", "partition": 0, "offset": 1}]},
    )
    assert offsets_only.status_code == 200
    listed = (await client.get("/v1/groups")).json()["groups"]
    assert listed == [
        {"group_id": "g", "state": "Stable", "type": "consumer", "members": 1},
        {"group_id": "spark-job", "state": "Empty", "type": None, "members": 0},
    ]
    assert_problem(await client.get("/v1/groups/nothing-here"), 404, "GROUP_ID_NOT_FOUND")


async def test_delete_refuses_a_group_with_members_and_removes_an_empty_one(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    a = Member(client, "g", "a")
    await a.beat()
    assert (await a.commit(("t", 0, 1))).status_code == 200
    assert_problem(await client.delete("/v1/groups/g"), 409, "NON_EMPTY_GROUP")
    assert await committed(client) == {("t", 0): 1}
    await a.leave()
    deleted = await client.delete("/v1/groups/g")
    assert deleted.status_code == 200 and deleted.json() == {"group_id": "g"}
    assert await committed(client) == {}
    assert_problem(await client.get("/v1/groups/g"), 404, "GROUP_ID_NOT_FOUND")
    assert_problem(await client.delete("/v1/groups/g"), 404, "GROUP_ID_NOT_FOUND")


async def test_rebalances_members_and_lag_are_in_the_metrics(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t", partitions=2)
    await client.post("/v1/topics/t/partitions/0/records", json={"records": [{"value": "x"}] * 4})

    def value(text: str, name: str) -> float:
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{name} not in the metrics")

    before = value((await client.get("/metrics")).text, "coordinator_group_rebalances_total")
    a, b = await settled_pair(client)
    owner = a if ("t", 0) in a.owned else b
    assert (await owner.commit(("t", 0, 1))).status_code == 200
    text = (await client.get("/metrics")).text
    assert value(text, "coordinator_group_rebalances_total") == before + 2
    assert 'coordinator_group_members{group="g"} 2.0' in text
    assert 'coordinator_group_lag{group="g",partition="0",topic="t"} 3.0' in text
    assert 'coordinator_group_epoch{group="g"} 2.0' in text


@pytest.mark.parametrize("session_timeout_ms", [100, 2_000_000])
async def test_a_session_timeout_outside_the_bounds_is_refused(
    client: httpx.AsyncClient, session_timeout_ms: int
) -> None:
    a = Member(client, "g", "a")
    response = await a.send(session_timeout_ms=session_timeout_ms)
    assert "session_timeout_ms" in assert_problem(response, 422, "INVALID_REQUEST")["detail"]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_migration_gives_every_group_with_offsets_its_row(backend: str, tmp_path: Any) -> None:
    from alembic import command
    from sqlalchemy.ext.asyncio import create_async_engine

    from coordinator.core.migrate import alembic_config
    from coordinator.core.settings import Settings
    from tests.support.services import create_postgres_database, drop_postgres_database

    url = f"sqlite:///{tmp_path / 'old.db'}" if backend == "sqlite" else create_postgres_database()

    async def execute(*statements: str) -> list[tuple[Any, ...]]:
        engine = create_async_engine(async_url)
        try:
            async with engine.begin() as connection:
                rows: list[tuple[Any, ...]] = []
                for statement in statements:
                    result = await connection.execute(text(statement))
                    rows = [tuple(r) for r in result] if result.returns_rows else rows
                return rows
        finally:
            await engine.dispose()

    try:
        async_url = Settings(database_url=url).database_url
        command.upgrade(alembic_config(async_url), "5d1c0a7e1b11")  # the revision before groups
        asyncio.run(
            execute(
                "INSERT INTO group_offsets VALUES ('committed', 't', 0, 5, NULL, 1000), "
                "('committed', 't', 1, 6, NULL, 2000)",
                "INSERT INTO transactions (transactional_id, producer_id, state, timeout_ms, "
                "updated_ms) VALUES ('tx', 1, 'Ongoing', 60000, 0)",
                "INSERT INTO transaction_offsets VALUES ('tx', 'pending', 't', 0, 1, NULL)",
            )
        )
        command.upgrade(alembic_config(async_url), "head")
        rows = asyncio.run(
            execute(
                "SELECT group_id, protocol_type, group_epoch, updated_ms FROM consumer_groups "
                "ORDER BY group_id"
            )
        )
        assert rows == [("committed", None, 0, 2000), ("pending", None, 0, 0)]
    finally:
        if backend == "postgres":
            drop_postgres_database(url)
