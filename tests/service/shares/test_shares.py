"""Share groups over HTTP on SQLite and on Postgres (docs/pages/http-api.md, Share groups): a
record handed to one member at a time, acknowledged or delivered again, its state kept in the
store: members sharing a partition, release and redelivery, lock expiry, the delivery-count
limit, a member that leaves or expires, read_committed, where a new share partition starts,
offsets reset and deleted, group types kept apart, restarts, long polls woken by appends.

Time is made to pass by moving deadlines into the past in the store (no sleeps)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sqlalchemy import select, text

from coordinator.app import create_app
from coordinator.log.purgatory import PURGATORY
from coordinator.shares.membership import expire_members
from coordinator.shares.models import SharePartitionRow
from coordinator.shares.service import expire_locks
from tests.support.api import assert_problem, batch, create_topic, init_pid, produce
from tests.support.services import make_settings


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    return {"share_min_delivery_count_limit": 1}


class ShareMember:
    """A share group member driven by HTTP calls."""

    def __init__(self, client: httpx.AsyncClient, group: str, member_id: str) -> None:
        self.client, self.group, self.member_id = client, group, member_id
        self.epoch = 0
        self.assignment: set[tuple[str, int]] = set()

    async def beat(self, topics: list[str] | None = None) -> httpx.Response:
        body: dict[str, Any] = {"member_id": self.member_id, "member_epoch": self.epoch}
        if self.epoch == 0:
            body["subscribed_topics"] = topics or ["t"]
        response = await self.client.post(f"/v1/share-groups/{self.group}/heartbeat", json=body)
        if response.status_code == 200:
            answer = response.json()
            self.epoch = answer["member_epoch"]
            if answer["assignment"] is not None:
                self.assignment = {(a["topic"], a["partition"]) for a in answer["assignment"]}
        return response

    async def join(self, topics: list[str] | None = None) -> None:
        response = await self.beat(topics)
        assert response.status_code == 200, response.text

    async def fetch(self, **body: Any) -> list[dict[str, Any]]:
        response = await self.client.post(
            f"/v1/share-groups/{self.group}/fetch", json={"member_id": self.member_id, **body}
        )
        assert response.status_code == 200, response.text
        records: list[dict[str, Any]] = response.json()["records"]
        return records

    async def ack(self, kind: str, *offsets: int, partition: int = 0) -> httpx.Response:
        return await self.client.post(
            f"/v1/share-groups/{self.group}/acknowledge",
            json={
                "member_id": self.member_id,
                "acknowledgements": [
                    {"topic": "t", "partition": partition, "first_offset": o, "type": kind}
                    for o in offsets
                ],
            },
        )

    async def leave(self) -> None:
        response = await self.client.post(
            f"/v1/share-groups/{self.group}/heartbeat",
            json={"member_id": self.member_id, "member_epoch": -1},
        )
        assert response.status_code == 200, response.text


async def set_configs(client: httpx.AsyncClient, group: str = "s", **configs: str) -> None:
    values = {k.replace("_", "."): v for k, v in configs.items()}
    response = await client.patch(f"/v1/groups/{group}/configs", json={"set": values})
    assert response.status_code == 200, response.text


async def filled(client: httpx.AsyncClient, count: int = 5, partitions: int = 1) -> None:
    await create_topic(client, "t", partitions=partitions)
    await set_configs(client, share_auto_offset_reset="earliest")
    for p in range(partitions):
        response = await produce(client, "t", p, batch([f"v{p}-{i}" for i in range(count)]))
        assert response.status_code == 200, response.text


def offsets_of(records: list[dict[str, Any]]) -> list[int]:
    return [r["offset"] for r in records]


async def expire_all_locks(app: Any) -> None:
    """Every acquired record's lock deadline moved into the past, then the sweep run."""
    async with app.state.db.write() as session:
        for row in await session.scalars(select(SharePartitionRow)):
            row.spans = [[*s[:5], 1 if s[5] is not None else None, *s[6:]] for s in row.spans]
            row.next_deadline_ms = 1 if row.next_deadline_ms is not None else None
    await expire_locks(app.state.db, app.state.settings)


async def test_members_share_a_partition_and_each_record_goes_to_one(
    client: httpx.AsyncClient,
) -> None:
    await filled(client)
    a, b = ShareMember(client, "s", "a"), ShareMember(client, "s", "b")
    await a.join()
    await b.join()
    assert a.assignment == b.assignment == {("t", 0)}  # one partition, shared by both
    got = await a.fetch()
    assert offsets_of(got) == [0, 1, 2, 3, 4] and {r["delivery_count"] for r in got} == {1}
    assert await b.fetch() == []  # all acquired by a
    assert (await a.ack("accept", 0, 1, 2)).status_code == 200
    # b may not acknowledge what a holds; nothing changes.
    assert_problem(await b.ack("accept", 3), 409, "INVALID_RECORD_STATE")
    assert (await a.ack("release", 3, 4)).status_code == 200
    again = await b.fetch()
    assert offsets_of(again) == [3, 4] and {r["delivery_count"] for r in again} == {2}
    group = (await client.get("/v1/share-groups/s")).json()
    assert group["state"] == "Stable" and len(group["members"]) == 2
    assert group["offsets"] == [{"topic": "t", "partition": 0, "start_offset": 3, "lag": 2}]


async def test_an_acknowledgement_is_all_or_nothing(client: httpx.AsyncClient) -> None:
    await filled(client)
    a = ShareMember(client, "s", "a")
    await a.join()
    await a.fetch()
    response = await a.ack("accept", 0, 9)  # 9 is not in flight
    assert "9" in assert_problem(response, 409, "INVALID_RECORD_STATE")["detail"]
    assert (await a.ack("accept", 0)).status_code == 200  # 0 was not accepted by the refusal


async def test_a_lock_that_runs_out_delivers_the_records_again(
    client: httpx.AsyncClient, app: Any
) -> None:
    await filled(client)
    a, b = ShareMember(client, "s", "a"), ShareMember(client, "s", "b")
    await a.join()
    await b.join()
    await a.fetch()
    await expire_all_locks(app)
    got = await b.fetch()
    assert offsets_of(got) == [0, 1, 2, 3, 4] and {r["delivery_count"] for r in got} == {2}
    # a's acknowledgement comes too late: b holds them now.
    assert_problem(await a.ack("accept", 0), 409, "INVALID_RECORD_STATE")


async def test_records_are_archived_at_the_delivery_limit(client: httpx.AsyncClient) -> None:
    await filled(client, count=1)
    await set_configs(client, share_delivery_count_limit="2")
    a = ShareMember(client, "s", "a")
    await a.join()
    for delivery in (1, 2):
        [record] = await a.fetch()
        assert record["delivery_count"] == delivery
        assert (await a.ack("release", 0)).status_code == 200
    assert await a.fetch() == []  # archived: never delivered again
    offsets = (await client.get("/v1/share-groups/s")).json()["offsets"]
    assert offsets == [{"topic": "t", "partition": 0, "start_offset": 1, "lag": 0}]


async def test_reject_archives_and_renew_keeps_the_lock(
    client: httpx.AsyncClient, app: Any
) -> None:
    await filled(client, count=3)
    a, b = ShareMember(client, "s", "a"), ShareMember(client, "s", "b")
    await a.join()
    await b.join()
    await a.fetch()
    assert (await a.ack("reject", 0)).status_code == 200
    assert (await a.ack("renew", 2)).status_code == 200
    async with app.state.db.write() as session:  # 1's lock runs out, not 2's (renewed)
        row = (await session.scalars(select(SharePartitionRow))).one()
        assert [s[0] for s in row.spans] == [1, 2]
        row.spans = [[*s[:5], 1 if s[0] == 1 else s[5], *s[6:]] for s in row.spans]
        row.next_deadline_ms = 1
    await expire_locks(app.state.db, app.state.settings)
    assert offsets_of(await b.fetch()) == [1]  # 0 rejected, 2 still a's
    assert (await a.ack("accept", 2)).status_code == 200


async def test_a_member_that_leaves_releases_what_it_holds(client: httpx.AsyncClient) -> None:
    await filled(client)
    a, b = ShareMember(client, "s", "a"), ShareMember(client, "s", "b")
    await a.join()
    await b.join()
    await a.fetch()
    await a.leave()
    got = await b.fetch()
    assert offsets_of(got) == [0, 1, 2, 3, 4] and {r["delivery_count"] for r in got} == {2}


async def test_a_member_whose_session_runs_out_is_removed_and_its_records_released(
    client: httpx.AsyncClient, app: Any
) -> None:
    await filled(client)
    a, b = ShareMember(client, "s", "a"), ShareMember(client, "s", "b")
    await a.join()
    await b.join()
    await a.fetch()
    async with app.state.db.write() as session:
        await session.execute(
            text("UPDATE share_group_members SET session_deadline_ms = 1 WHERE member_id = 'a'")
        )
    assert await expire_members(app.state.db, app.state.settings) == [("s", "a")]
    assert offsets_of(await b.fetch()) == [0, 1, 2, 3, 4]
    assert_problem(await a.beat(), 409, "UNKNOWN_MEMBER_ID")
    members = (await client.get("/v1/share-groups/s")).json()["members"]
    assert [m["member_id"] for m in members] == ["b"]


async def test_heartbeats_check_the_member_and_its_epoch(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    a = ShareMember(client, "s", "a")
    response = await client.post(
        "/v1/share-groups/s/heartbeat", json={"member_id": "a", "member_epoch": 0}
    )
    assert_problem(response, 422, "INVALID_REQUEST")  # joining names its topics
    await a.join()
    a.epoch += 5
    assert_problem(await a.beat(), 409, "FENCED_MEMBER_EPOCH")
    stranger = ShareMember(client, "s", "nobody")
    stranger.epoch = 1
    assert_problem(await stranger.beat(), 409, "UNKNOWN_MEMBER_ID")


async def test_read_committed_waits_for_the_lso_and_never_delivers_an_abort(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    await set_configs(
        client, share_auto_offset_reset="earliest", share_isolation_level="read_committed"
    )
    pid = await init_pid(client, "tx")

    async def transactional(values: list[str], sequence: int, epoch: int) -> None:
        body = batch(values, pid, epoch, sequence, transactional_id="tx")
        response = await produce(client, "t", 0, body)
        assert response.status_code == 200, response.text

    async def end(commit: bool, epoch: int) -> None:
        response = await client.post(
            "/v1/transactions/tx/end",
            json={"producer_id": pid, "producer_epoch": epoch, "commit": commit},
        )
        assert response.status_code == 200, response.text

    a = ShareMember(client, "s", "a")
    await a.join()
    await transactional(["c0", "c1"], 0, 0)
    assert await a.fetch() == []  # open: past the LSO
    await end(True, 0)
    await transactional(["a0", "a1"], 0, 1)
    await end(False, 1)
    await transactional(["c2"], 0, 2)
    await end(True, 2)
    got = await a.fetch()
    assert [r["value"] for r in got] == ["c0", "c1", "c2"]


@pytest.mark.parametrize(("reset", "expected"), [("earliest", ["old", "new"]), ("latest", ["new"])])
async def test_a_new_share_partition_starts_where_the_reset_config_says(
    client: httpx.AsyncClient, reset: str, expected: list[str]
) -> None:
    await create_topic(client, "t")
    await set_configs(client, share_auto_offset_reset=reset)
    await produce(client, "t", 0, batch(["old"]))
    a = ShareMember(client, "s", "a")
    await a.join()  # the share partition starts here, as it is first assigned
    await produce(client, "t", 0, batch(["new"]))
    assert [r["value"] for r in await a.fetch()] == expected


async def test_by_duration_starts_at_the_first_record_that_recent(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    await set_configs(client, share_auto_offset_reset="by_duration:PT1H")
    old = {"records": [{"value": "old", "timestamp": 1_000}]}
    assert (await produce(client, "t", 0, old)).status_code == 200
    await produce(client, "t", 0, batch(["recent"]))
    a = ShareMember(client, "s", "a")
    await a.join()
    assert [r["value"] for r in await a.fetch()] == ["recent"]


async def test_offsets_are_reset_and_deleted_only_while_the_group_is_empty(
    client: httpx.AsyncClient,
) -> None:
    await filled(client)
    a = ShareMember(client, "s", "a")
    await a.join()
    await a.fetch()
    await a.ack("accept", 0, 1, 2, 3, 4)
    reset = {"offsets": [{"topic": "t", "partition": 0, "offset": 2}]}
    assert_problem(
        await client.post("/v1/share-groups/s/offsets", json=reset), 409, "NON_EMPTY_GROUP"
    )
    await a.leave()
    response = await client.post("/v1/share-groups/s/offsets", json=reset)
    assert response.status_code == 200, response.text
    assert response.json()["offsets"] == [
        {"topic": "t", "partition": 0, "start_offset": 2, "lag": 3}
    ]
    b = ShareMember(client, "s", "b")
    await b.join()
    assert offsets_of(await b.fetch()) == [2, 3, 4]
    await b.leave()
    deleted = await client.delete("/v1/share-groups/s/offsets", params={"topic": "t"})
    assert deleted.status_code == 200 and deleted.json()["offsets"] == []
    missing = await client.delete("/v1/share-groups/s/offsets", params={"topic": "nope"})
    assert_problem(missing, 404, "UNKNOWN_TOPIC_OR_PARTITION")


async def test_a_share_group_id_is_no_consumer_groups_and_the_other_way_round(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    await ShareMember(client, "s", "a").join()
    consumer = await client.post(
        "/v1/groups/s/heartbeat",
        json={"member_id": "c", "member_epoch": 0, "subscribed_topics": ["t"]},
    )
    assert_problem(consumer, 404, "GROUP_ID_NOT_FOUND")
    commit = await client.post(
        "/v1/groups/s/offsets", json={"offsets": [{"topic": "t", "partition": 0, "offset": 0}]}
    )
    assert_problem(commit, 404, "GROUP_ID_NOT_FOUND")
    assert_problem(await client.get("/v1/groups/s"), 404, "GROUP_ID_NOT_FOUND")
    committed = await client.post(
        "/v1/groups/c/offsets", json={"offsets": [{"topic": "t", "partition": 0, "offset": 0}]}
    )
    assert committed.status_code == 200
    assert_problem(await ShareMember(client, "c", "a").beat(), 404, "GROUP_ID_NOT_FOUND")
    listed = (await client.get("/v1/share-groups")).json()["groups"]
    assert listed == [{"group_id": "s", "state": "Stable", "members": 1}]


async def test_deleting_the_topic_or_the_group_takes_its_share_state(
    client: httpx.AsyncClient, app: Any
) -> None:
    await filled(client)
    a = ShareMember(client, "s", "a")
    await a.join()
    await a.fetch()
    assert_problem(await client.delete("/v1/share-groups/s"), 409, "NON_EMPTY_GROUP")
    assert (await client.delete("/v1/topics/t")).status_code == 200
    async with app.state.db.read() as session:
        assert (await session.scalars(select(SharePartitionRow))).all() == []
    await a.leave()
    assert (await client.delete("/v1/share-groups/s")).status_code == 200
    assert_problem(await client.get("/v1/share-groups/s"), 404, "GROUP_ID_NOT_FOUND")


async def test_the_state_is_the_stores_a_restarted_service_goes_on_from_it(
    client: httpx.AsyncClient, store: Any
) -> None:
    await filled(client)
    a = ShareMember(client, "s", "a")
    await a.join()
    await a.fetch()
    await a.ack("accept", 0, 1)
    restarted = create_app(make_settings(store, share_min_delivery_count_limit=1))
    transport = httpx.ASGITransport(app=restarted)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as again:
            member = ShareMember(again, "s", "a")
            member.epoch = a.epoch
            assert (await member.ack("accept", 2, 3, 4)).status_code == 200  # still a's
            group = (await again.get("/v1/share-groups/s")).json()
            assert group["offsets"] == [{"topic": "t", "partition": 0, "start_offset": 5, "lag": 0}]
    finally:
        await restarted.state.db.dispose()


async def test_long_polls_on_two_partitions_wake_at_their_own_appends(
    client: httpx.AsyncClient,
) -> None:
    """Two members waiting on different partitions: an append to one wakes its waiter at once,
    the other waits on."""
    await create_topic(client, "t", partitions=2)
    a, b = ShareMember(client, "s", "a"), ShareMember(client, "s", "b")
    await a.join()
    await b.join()
    slow = 25_000
    on = [[{"topic": "t", "partition": p}] for p in (0, 1)]
    waiting_a = asyncio.ensure_future(a.fetch(partitions=on[0], max_wait_ms=slow))
    waiting_b = asyncio.ensure_future(b.fetch(partitions=on[1], max_wait_ms=slow))
    deadline = asyncio.get_running_loop().time() + 10
    while set(PURGATORY.watched()) != {("t", 0), ("t", 1)}:  # both asleep in the purgatory
        assert asyncio.get_running_loop().time() < deadline, PURGATORY.watched()
        await asyncio.sleep(0.01)
    await produce(client, "t", 1, batch(["for b"]))
    got_b = await asyncio.wait_for(waiting_b, 10)
    assert [r["value"] for r in got_b] == ["for b"]
    assert not waiting_a.done()
    await produce(client, "t", 0, batch(["for a"]))
    assert [r["value"] for r in await asyncio.wait_for(waiting_a, 10)] == ["for a"]
