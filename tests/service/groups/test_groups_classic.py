"""Kafka's classic group protocol as Kafka's coordinator runs it (`coordinator.groups.classic`),
through the domain's calls, on SQLite and on Postgres: the JoinGroup barrier, the leader that
gets every member's metadata, SyncGroup carrying its assignment, the protocol vote, removal of
members that do not join in time, static membership, leaving, and KIP-447 by generation.

Deadlines are made to pass by moving them into the past in the store (no sleeps); a parked
request is proven parked by the group's state (it cannot have answered before the group moved).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from coordinator.groups import classic, classic_rules
from coordinator.groups.errors import (
    FencedInstanceId,
    IllegalGeneration,
    InconsistentGroupProtocol,
    MemberIdRequired,
    RebalanceInProgress,
    UnknownMemberId,
)
from tests.support.api import assert_problem, create_topic


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    # No initial wait: the first member's rebalance ends at once, so each test decides who
    # joins when.
    return {"group_initial_rebalance_delay_ms": 0}


def joining(
    member_id: str = "",
    *,
    protocols: tuple[tuple[str, bytes], ...] = (("range", b"sub"),),
    instance: str | None = None,
    require_known: bool = False,
) -> classic_rules.JoinRequest:
    return classic_rules.JoinRequest(
        group_id="g",
        member_id=member_id,
        group_instance_id=instance,
        protocols=tuple(classic_rules.Protocol(n, m) for n, m in protocols),
        subscribed_topics=["t"],
        session_timeout_ms=10_000,
        rebalance_timeout_ms=60_000,
        client_id="c",
        client_host="h",
        require_known_member_id=require_known,
    )


class Group:
    """The domain's calls for group "g" on the app's store."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.db, self.settings = app.state.db, app.state.settings

    async def join(self, request: classic_rules.JoinRequest) -> classic_rules.JoinAnswer:
        return await classic.join(self.db, self.settings, request, [])

    async def sync(
        self,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes] | None = None,
        instance: str | None = None,
    ) -> bytes:
        synced = await classic.sync(
            self.db,
            self.settings,
            "g",
            member_id,
            instance,
            generation,
            None,
            assignments or {},
        )
        return synced.assignment

    async def beat(self, member_id: str, generation: int, instance: str | None = None) -> None:
        await classic.heartbeat(
            self.db, self.settings, "g", member_id, instance, generation, "c", "h"
        )

    async def state(self, client: httpx.AsyncClient) -> str:
        return str((await client.get("/v1/groups/g")).json()["state"])

    async def stable_pair(self) -> tuple[classic_rules.JoinAnswer, classic_rules.JoinAnswer]:
        """a alone, then b joining and a joining again: both in generation 2, a leading."""
        a = await self.join(joining())
        await self.sync(a.member_id, a.generation, {a.member_id: b"a-all"})
        b_joins = asyncio.create_task(self.join(joining()))
        await self.until_rebalancing(a.member_id, a.generation)
        a2 = await self.join(joining(a.member_id))
        b = await b_joins
        await self.sync(a2.member_id, a2.generation, {a2.member_id: b"to-a", b.member_id: b"to-b"})
        return a2, b

    async def until_rebalancing(self, member_id: str, generation: int) -> None:
        """Heartbeat until the group answers REBALANCE_IN_PROGRESS (a poll with a deadline)."""
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            try:
                await self.beat(member_id, generation)
            except RebalanceInProgress:
                return
            assert asyncio.get_running_loop().time() < deadline, "no rebalance began"
            await asyncio.sleep(0.01)


@pytest.fixture
def group(app: Any) -> Group:
    return Group(app)


async def test_a_join_waits_until_every_member_joined_and_the_leader_gets_all_metadata(
    client: httpx.AsyncClient, group: Group
) -> None:
    await create_topic(client, "t", partitions=4)
    a = await group.join(joining(protocols=(("range", b"meta-a"),)))
    assert (a.generation, a.leader) == (1, a.member_id)
    assert [(m.member_id, m.metadata) for m in a.members] == [(a.member_id, b"meta-a")]
    await group.sync(a.member_id, 1, {a.member_id: b"all"})
    b_joins = asyncio.create_task(group.join(joining(protocols=(("range", b"meta-b"),))))
    await group.until_rebalancing(a.member_id, 1)
    assert await group.state(client) == "Reconciling"  # PreparingRebalance: waits for a
    assert not b_joins.done()
    a2 = await group.join(joining(a.member_id, protocols=(("range", b"meta-a"),)))
    b = await b_joins
    assert a2.generation == b.generation == 2
    assert a2.leader == b.leader == a.member_id
    assert {(m.member_id, m.metadata) for m in a2.members} == {
        (a.member_id, b"meta-a"),
        (b.member_id, b"meta-b"),
    }
    assert b.members == []  # followers learn nothing of the others


async def test_a_follower_waits_for_the_leaders_assignment_and_gets_its_own(
    client: httpx.AsyncClient, group: Group
) -> None:
    a = await group.join(joining())
    await group.sync(a.member_id, 1, {a.member_id: b"all"})
    b_joins = asyncio.create_task(group.join(joining()))
    await group.until_rebalancing(a.member_id, 1)
    a2 = await group.join(joining(a.member_id))
    b = await b_joins
    b_syncs = asyncio.create_task(group.sync(b.member_id, 2))
    await parked(group.app, b.member_id, "sync")
    assert await group.state(client) == "Assigning"  # CompletingRebalance: b waits for a
    assert not b_syncs.done()
    assert await group.sync(a2.member_id, 2, {a2.member_id: b"to-a", b.member_id: b"to-b"}) == (
        b"to-a"
    )
    assert await b_syncs == b"to-b"
    assert await group.state(client) == "Stable"
    await group.beat(b.member_id, 2)


async def test_the_protocol_is_chosen_by_the_members_vote_among_the_common_ones(
    group: Group,
) -> None:
    a = await group.join(joining(protocols=(("range", b""), ("roundrobin", b""))))
    await group.sync(a.member_id, 1)
    b_joins = asyncio.create_task(group.join(joining(protocols=(("roundrobin", b""),))))
    await group.until_rebalancing(a.member_id, 1)
    a2 = await group.join(joining(a.member_id, protocols=(("range", b""), ("roundrobin", b""))))
    assert (await b_joins).protocol_name == a2.protocol_name == "roundrobin"
    with pytest.raises(InconsistentGroupProtocol):
        await group.join(joining(protocols=(("sticky", b""),)))


async def parked(app: Any, member_id: str, call: str = "join") -> None:
    """Until the member's JoinGroup (or SyncGroup) is parked in the store (a poll with a
    deadline)."""
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        async with app.state.db.read() as session:
            awaiting = await session.scalar(
                text("SELECT awaiting FROM group_members WHERE member_id = :m"), {"m": member_id}
            )
        if awaiting == call:
            return
        assert asyncio.get_running_loop().time() < deadline, f"{member_id} never parked"
        await asyncio.sleep(0.01)


async def test_a_member_that_does_not_join_again_in_time_is_removed(app: Any, group: Group) -> None:
    a, b = await group.stable_pair()
    c_joins = asyncio.create_task(group.join(joining()))
    await group.until_rebalancing(b.member_id, 2)
    b_joins = asyncio.create_task(group.join(joining(b.member_id)))
    await parked(app, b.member_id)
    # a never joins: the rebalance timeout passes, and a parked JoinGroup ends the phase.
    async with app.state.db.write() as session:
        await session.execute(text("UPDATE consumer_groups SET phase_deadline_ms = 0"))
    b3, c = await b_joins, await c_joins
    assert b3.generation == c.generation == 3
    assert {m.member_id for m in b3.members} == {b.member_id, c.member_id}  # b leads now
    with pytest.raises(UnknownMemberId):
        await group.beat(a.member_id, 2)


async def test_the_sweeper_removes_a_member_whose_session_passed_and_rebalances(
    app: Any, client: httpx.AsyncClient, group: Group
) -> None:
    a, b = await group.stable_pair()
    async with app.state.db.write() as session:
        await session.execute(
            text("UPDATE group_members SET session_deadline_ms = 0 WHERE member_id = :m"),
            {"m": b.member_id},
        )
    assert await classic.sweep(group.db, group.settings) == ["g"]
    assert await classic.sweep(group.db, group.settings) == []
    with pytest.raises(RebalanceInProgress):
        await group.beat(a.member_id, 2)
    a3 = await group.join(joining(a.member_id))
    assert a3.generation == 3 and [m.member_id for m in a3.members] == [a.member_id]


async def test_a_new_member_is_given_its_id_first_where_the_version_requires_it(
    group: Group,
) -> None:
    with pytest.raises(MemberIdRequired) as required:
        await group.join(joining(require_known=True))
    given = required.value.member_id
    assert given.startswith("c-")
    answer = await group.join(joining(given, require_known=True))
    assert (answer.member_id, answer.generation) == (given, 1)


async def test_a_heartbeat_of_an_old_generation_is_an_illegal_generation(group: Group) -> None:
    a, _ = await group.stable_pair()
    with pytest.raises(IllegalGeneration):
        await group.beat(a.member_id, 1)
    await group.beat(a.member_id, 2)


async def test_a_static_member_back_under_a_new_id_keeps_its_assignment_without_a_rebalance(
    group: Group,
) -> None:
    a = await group.join(joining(instance="s-a"))
    b_joins = asyncio.create_task(group.join(joining(instance="s-b")))
    await group.until_rebalancing(a.member_id, 1)
    a2 = await group.join(joining(a.member_id, instance="s-a"))
    b = await b_joins
    await group.sync(a2.member_id, 2, {a2.member_id: b"to-a", b.member_id: b"to-b"})
    # b restarts: it joins with no member id and its instance id.
    b_again = await group.join(joining(instance="s-b"))
    assert b_again.member_id != b.member_id
    assert b_again.generation == 2 and b_again.members == []
    assert await group.sync(b_again.member_id, 2, instance="s-b") == b"to-b"
    await group.beat(a2.member_id, 2, instance="s-a")  # no rebalance for a
    with pytest.raises(FencedInstanceId):
        await group.beat(b.member_id, 2, instance="s-b")


async def test_leaving_rebalances_the_others(client: httpx.AsyncClient, group: Group) -> None:
    a, b = await group.stable_pair()
    answers = await classic.leave(
        group.db, group.settings, "g", [(b.member_id, None), ("nobody", None)], "c", "h"
    )
    assert answers[0] is None and isinstance(answers[1], UnknownMemberId)
    with pytest.raises(RebalanceInProgress):
        await group.beat(a.member_id, 2)
    a3 = await group.join(joining(a.member_id))
    assert a3.generation == 3 and [m.member_id for m in a3.members] == [a.member_id]


async def test_offsets_of_a_classic_group_are_fenced_by_its_generation(
    client: httpx.AsyncClient, group: Group
) -> None:
    await create_topic(client, "t")
    a, _ = await group.stable_pair()

    async def commit(generation: int) -> httpx.Response:
        return await client.post(
            "/v1/groups/g/offsets",
            json={
                "offsets": [{"topic": "t", "partition": 0, "offset": 1}],
                "member_id": a.member_id,
                "member_epoch": generation,
            },
        )

    assert (await commit(2)).status_code == 200
    assert_problem(await commit(1), 409, "ILLEGAL_GENERATION")


async def test_a_rest_member_cannot_join_a_classic_group_that_has_members(
    client: httpx.AsyncClient, group: Group
) -> None:
    await create_topic(client, "t")
    await group.join(joining())
    response = await client.post(
        "/v1/groups/g/heartbeat",
        json={"member_id": "rest", "member_epoch": 0, "subscribed_topics": ["t"]},
    )
    assert_problem(response, 404, "GROUP_ID_NOT_FOUND")
    description = (await client.get("/v1/groups/g")).json()
    assert description["type"] == "classic"
