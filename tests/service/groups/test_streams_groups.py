"""Streams groups (KIP-1071) on SQLite and on Postgres, through `coordinator.groups.streams`
(Kafka's wire is their only door): a topology configured and its internal topics made with their
configs, tasks shared evenly and handed over only once given up, missing and wrongly partitioned
topics told as statuses, a newer topology replacing the group's, members leaving or expiring by
the group's `streams.session.timeout.ms`, endpoints for Interactive Queries, the application's
shutdown, epochs fenced, refusals that change nothing, and streams groups kept apart from
consumer groups."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from coordinator.core.errors import InvalidRequest
from coordinator.groups import streams
from coordinator.groups.errors import FencedMemberEpoch, GroupIdNotFound, UnknownMemberId
from coordinator.groups.membership import expire_members
from coordinator.groups.models import StreamsGroup
from coordinator.groups.streams_topology import (
    INCORRECTLY_PARTITIONED_TOPICS,
    MISSING_SOURCE_TOPICS,
    SHUTDOWN_APPLICATION,
    STALE_TOPOLOGY,
    StreamsInvalidTopology,
    Subtopology,
    TopicInfo,
    Topology,
)
from tests.support.api import assert_problem, create_topic
from tests.support.groups import Member, expire

TP = tuple[str, int]
COMPACT = (("cleanup.policy", "compact"),)
KEEP = (("retention.ms", "-1"),)


def totals(epoch: int = 1) -> Topology:
    """StreamsApp's shape: subtopology 0 reads `in` and writes `app-rep`; 1 reads it into a store
    whose changelog is compacted."""
    return Topology(
        epoch,
        (
            Subtopology("0", ("in",), ("app-rep",)),
            Subtopology(
                "1",
                repartition_source_topics=(
                    TopicInfo("app-rep", configs=(("retention.ms", "-1"),)),
                ),
                # -1: the default replication factor, as Kafka Streams sends it.
                state_changelog_topics=(
                    TopicInfo("app-store-changelog", replication_factor=-1, configs=COMPACT),
                ),
            ),
        ),
    )


@dataclass
class StreamsMember:
    """A member as Kafka Streams runs one: joins with its topology, then reports the tasks it
    owns, giving up at once what it is no longer assigned."""

    app: Any
    member_id: str
    group: str = "app"
    topology: Topology = field(default_factory=totals)
    epoch: int = 0
    tasks: set[TP] = field(default_factory=set)
    endpoint: tuple[str, int] | None = None
    endpoint_epoch: int = 0
    last: streams.StreamsAnswer | None = None

    async def beat(self, **changes: Any) -> streams.StreamsAnswer:
        beat = streams.StreamsBeat(
            self.member_id,
            self.epoch,
            60_000,
            self.topology if self.epoch == 0 else None,
            sorted(self.tasks),
            user_endpoint=self.endpoint,
            endpoint_epoch=self.endpoint_epoch,
            process_id=f"process-{self.member_id}",
            **changes,
        )
        db, settings = self.app.state.db, self.app.state.settings
        answer = await streams.heartbeat(db, settings, self.group, beat, "client", "/127.0.0.1")
        self.epoch = answer.member_epoch
        if answer.active_tasks is not None:  # None: unchanged
            self.tasks = set(answer.active_tasks)
        if answer.endpoints is not None:
            self.endpoint_epoch = answer.endpoint_epoch
        self.last = answer
        return answer

    async def leave(self) -> None:
        await streams.heartbeat(
            self.app.state.db,
            self.app.state.settings,
            self.group,
            streams.StreamsBeat(self.member_id, -1, -1),
            "client",
            "/127.0.0.1",
        )


def codes(answer: streams.StreamsAnswer) -> list[int]:
    return [code for code, _ in answer.statuses]


async def settle(members: list[StreamsMember], rounds: int = 6) -> None:
    for _ in range(rounds):
        for m in members:
            await m.beat()
    owned = [t for m in members for t in m.tasks]
    assert len(owned) == len(set(owned)), "a task with two owners"


async def topic_configs(client: httpx.AsyncClient, name: str) -> dict[str, str]:
    answer = await client.get(f"/v1/topics/{name}/configs")
    assert answer.status_code == 200, answer.text
    return {c["name"]: c["value"] for c in answer.json()["configs"] if c["source"] == "TOPIC"}


async def test_a_topology_gets_its_internal_topics_and_its_tasks_are_shared_and_handed_over(
    app: Any, client: httpx.AsyncClient
) -> None:
    await create_topic(client, "in", partitions=4)
    a, b = StreamsMember(app, "a"), StreamsMember(app, "b")

    first = await a.beat()
    assert first.statuses == []  # its internal topics were made in the same heartbeat
    assert first.endpoint_epoch == 0 and first.endpoints is None  # no member serves queries
    for name in ("app-rep", "app-store-changelog"):
        assert (await client.get(f"/v1/topics/{name}")).json()["partitions"].__len__() == 4
    assert await topic_configs(client, "app-store-changelog") == {"cleanup.policy": "compact"}
    assert await topic_configs(client, "app-rep") == {"retention.ms": "-1"}
    everything = {(s, p) for s in ("0", "1") for p in range(4)}
    assert a.tasks == everything

    # b joins: it gets nothing a still owns, only what a says it has given up.
    await b.beat()
    assert b.tasks == set()
    await a.beat()
    assert len(a.tasks) == 4  # told to give up four
    await b.beat()
    assert b.tasks == set()  # a has not said it did
    await a.beat()
    await b.beat()
    assert len(b.tasks) == 4 and a.tasks | b.tasks == everything
    await settle([a, b])
    assert a.tasks | b.tasks == everything and len(a.tasks) == len(b.tasks) == 4

    # a leaves: b runs every task.
    await a.leave()
    await b.beat()
    assert b.tasks == everything
    group = (await client.get("/v1/groups/app")).json()
    assert group["type"] == "streams" and [m["member_id"] for m in group["members"]] == ["b"]


async def test_missing_and_wrongly_partitioned_topics_are_told_and_no_task_is_given(
    app: Any, client: httpx.AsyncClient
) -> None:
    a = StreamsMember(app, "a")
    answer = await a.beat()
    assert codes(answer) == [MISSING_SOURCE_TOPICS] and "in" in answer.statuses[0][1]
    assert a.tasks == set() and a.epoch > 0
    assert (await client.get("/v1/topics/app-rep")).status_code == 404  # nothing made

    await create_topic(client, "in", partitions=2)
    assert (await a.beat()).statuses == []
    assert len(a.tasks) == 4

    # A changelog found with the wrong partition count (an operator's, say) stops the tasks.
    c = StreamsMember(app, "c", group="other", topology=Topology(1, (
        Subtopology("0", ("in",), state_changelog_topics=(TopicInfo("other-changelog"),)),
    )))  # fmt: skip
    await create_topic(client, "other-changelog", partitions=3)
    answer = await c.beat()
    assert codes(answer) == [INCORRECTLY_PARTITIONED_TOPICS] and c.tasks == set()


async def test_a_newer_topology_replaces_the_groups_and_an_older_member_is_told_it_is_stale(
    app: Any, client: httpx.AsyncClient
) -> None:
    await create_topic(client, "in", partitions=2)
    await create_topic(client, "more", partitions=2)
    a = StreamsMember(app, "a")
    await a.beat()
    newer = Topology(2, (*totals().subtopologies, Subtopology("2", ("more",))))
    b = StreamsMember(app, "b", topology=newer)
    await b.beat()
    answer = await a.beat()
    assert codes(answer) == [STALE_TOPOLOGY]
    await settle([a, b])
    assert {s for s, _ in a.tasks | b.tasks} == {"0", "1", "2"}
    # An older topology joining later does not replace the newer one.
    c = StreamsMember(app, "c", topology=totals(epoch=1))
    assert STALE_TOPOLOGY in codes(await c.beat())
    async with app.state.db.read() as session:
        row = await session.get(StreamsGroup, "app")
    assert row is not None and row.topology_epoch == 2


async def test_a_member_past_the_groups_streams_session_timeout_is_removed(
    app: Any, client: httpx.AsyncClient
) -> None:
    await create_topic(client, "in", partitions=2)
    answer = await client.patch(
        "/v1/groups/app/configs", json={"set": {"streams.session.timeout.ms": "6000"}}
    )
    assert answer.status_code == 200, answer.text
    a, b = StreamsMember(app, "a"), StreamsMember(app, "b")
    await a.beat()
    await b.beat()
    await settle([a, b])
    assert a.last is not None and a.last.heartbeat_interval_ms == 2000  # a third of 6000
    await expire(app, "a")
    assert ("app", "a") in await expire_members(app.state.db)
    await b.beat()
    assert len(b.tasks) == 4
    with pytest.raises(UnknownMemberId):
        await a.beat()


async def test_endpoints_map_each_member_to_what_it_serves_once_per_epoch(
    app: Any, client: httpx.AsyncClient
) -> None:
    await create_topic(client, "in", partitions=2)
    a = StreamsMember(app, "a", endpoint=("host-a", 7001))
    b = StreamsMember(app, "b", endpoint=("host-b", 7002))
    await a.beat()
    await b.beat()
    await settle([a, b])
    a.endpoint_epoch = 0  # as a member that knows no endpoints yet
    answer = await a.beat()
    assert answer.endpoints is not None
    served = {(e.host, e.port): set(e.partitions) for e in answer.endpoints}
    assert set(served) == {("host-a", 7001), ("host-b", 7002)}
    expected_a = {(t, p) for s, p in a.tasks for t in (("in",) if s == "0" else ("app-rep",))}
    assert served[("host-a", 7001)] == expected_a
    assert served[("host-a", 7001)] | served[("host-b", 7002)] == {
        (t, p) for t in ("in", "app-rep") for p in range(2)
    }
    # Known at this epoch: not sent again.
    again = await a.beat()
    assert again.endpoints is None and again.endpoint_epoch == answer.endpoint_epoch


async def test_a_member_asking_for_shutdown_is_told_to_every_member(
    app: Any, client: httpx.AsyncClient
) -> None:
    await create_topic(client, "in", partitions=1)
    a, b = StreamsMember(app, "a"), StreamsMember(app, "b")
    await a.beat()
    await b.beat()
    await a.beat(shutdown_application=True)
    assert SHUTDOWN_APPLICATION in codes(await b.beat())
    assert SHUTDOWN_APPLICATION in codes(await a.beat())


async def test_stale_epochs_and_unknown_members_are_fenced(
    app: Any, client: httpx.AsyncClient
) -> None:
    await create_topic(client, "in", partitions=2)
    a = StreamsMember(app, "a")
    await a.beat()
    await a.beat()
    real = a.epoch
    a.epoch = real + 5
    with pytest.raises(FencedMemberEpoch):
        await a.beat()
    a.epoch = real
    await a.beat()
    stranger = StreamsMember(app, "z", epoch=3)
    with pytest.raises(UnknownMemberId):
        await stranger.beat()


async def test_bad_topologies_are_refused_and_change_nothing(
    app: Any, client: httpx.AsyncClient
) -> None:
    await create_topic(client, "in", partitions=2)
    topology = totals()
    refused = [
        (streams.StreamsBeat("a", 0, 60_000, None, []), "Topology must be non-null"),
        (streams.StreamsBeat("", 0, 60_000, topology, []), "MemberId can't be empty"),
        (streams.StreamsBeat("a", 0, 60_000, topology, None), "ActiveTasks must be empty"),
        (streams.StreamsBeat("a", 0, -1, topology, []), "RebalanceTimeoutMs must be provided"),
        (streams.StreamsBeat("a", 3, -1, topology, []), "Topology can only be provided"),
        (streams.StreamsBeat("a", -3, -1), "must be greater than or equal to -2"),
        (streams.StreamsBeat("a", -2, -1), "InstanceId can't be null"),
    ]
    for beat, complaint in refused:
        with pytest.raises(InvalidRequest, match=complaint):
            await streams.heartbeat(app.state.db, app.state.settings, "app", beat, "c", "h")
    twice = Topology(1, (Subtopology("0", ("in",)), Subtopology("0", ("in",))))
    with pytest.raises(StreamsInvalidTopology):
        await StreamsMember(app, "a", topology=twice).beat()
    assert (await client.get("/v1/groups/app")).status_code == 404
    async with app.state.db.read() as session:
        assert await session.get(StreamsGroup, "app") is None


async def test_streams_groups_and_consumer_groups_keep_apart(
    app: Any, client: httpx.AsyncClient
) -> None:
    await create_topic(client, "in", partitions=2)
    await create_topic(client, "t", partitions=1)
    consumer = Member(client, "app", "c")
    await consumer.beat()
    with pytest.raises(GroupIdNotFound):
        await StreamsMember(app, "a").beat()
    await consumer.leave()

    # Empty now, the group may become a streams group; then a consumer is refused.
    a = StreamsMember(app, "a")
    await a.beat()
    assert (await client.get("/v1/groups/app")).json()["type"] == "streams"
    response = await Member(client, "app", "d").send()
    assert_problem(response, 404, "GROUP_ID_NOT_FOUND")

    # Deleted once empty, the group takes its topology with it.
    await a.leave()
    assert (await client.delete("/v1/groups/app")).status_code == 200
    async with app.state.db.read() as session:
        assert await session.get(StreamsGroup, "app") is None
