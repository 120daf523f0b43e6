"""Streams groups (KIP-1071, Kafka Streams' `group.protocol=streams`): the group's topology, its
internal topics, and its members' tasks.

A member joins with the application's topology; the coordinator keeps the newest one it was
sent, configures it against the topics (`groups.streams_topology`), creates the internal topics
it needs (repartition and changelog topics, with their configs), and assigns the subtopologies'
tasks to the members exactly as a consumer group's partitions (`groups.consumer`,
`groups.membership`): evenly and sticky, a task handed to a new member only once its owner gave
it up, a member epoch raised at every change, members removed when their session or rebalance
timeout passes. A task is to a streams group what a partition is to a consumer group, so its
rules are those ones, written once. Active tasks only: standby and warm-up tasks are not
assigned (every group config `streams.num.standby.replicas` is taken as 0).

Each heartbeat takes two units of work: the topology's (configured anew against the topics,
which may have changed since), then the membership's.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.clock import now_ms
from coordinator.core.errors import InvalidRequest
from coordinator.core.settings import Settings
from coordinator.groups import consumer
from coordinator.groups import service as groups_service
from coordinator.groups.configs import group_configs
from coordinator.groups.errors import GroupIdNotFound
from coordinator.groups.inputs import JOIN_EPOCH, LEAVE_EPOCH, STATIC_LEAVE_EPOCH, Beat
from coordinator.groups.membership import is_gone, lock_group
from coordinator.groups.models import STREAMS, ConsumerGroup, GroupMember, StreamsGroup
from coordinator.groups.schemas import GroupDescription
from coordinator.groups.streams_topology import (
    SHUTDOWN_APPLICATION,
    STALE_TOPOLOGY,
    Configured,
    TopicInfo,
    Topology,
    configure,
    endpoint_partitions,
)
from coordinator.log import topics as log_topics
from coordinator.log.errors import TopicAlreadyExists
from coordinator.log.models import Partition
from coordinator.store import Store, store_of

TP = tuple[str, int]


@dataclass(frozen=True, slots=True)
class StreamsBeat:
    member_id: str
    member_epoch: int
    rebalance_timeout_ms: int  # -1: unchanged
    topology: Topology | None = None  # on joining
    active_tasks: Sequence[TP] | None = None  # owned now; None: unchanged
    instance_id: str | None = None
    rack_id: str | None = None
    process_id: str | None = None
    user_endpoint: tuple[str, int] | None = None
    client_tags: Mapping[str, str] | None = None
    shutdown_application: bool = False
    endpoint_epoch: int = 0


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int
    partitions: list[TP]


@dataclass(frozen=True, slots=True)
class StreamsAnswer:
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    active_tasks: list[TP] | None  # None: unchanged (what the member said it runs)
    statuses: list[tuple[int, str]]
    endpoint_epoch: int
    endpoints: list[Endpoint] | None  # None: as the member last heard


# -- the topology ---------------------------------------------------------------------------------


async def _partition_counts(session: AsyncSession, topology: Topology) -> dict[str, int]:
    names = sorted(
        {
            t
            for s in topology.subtopologies
            for t in (
                *s.all_sources(),
                *s.repartition_sink_topics,
                *(c.name for c in s.state_changelog_topics),
            )
        }
    )
    rows = await session.execute(
        select(Partition.topic, func.count())
        .where(Partition.topic.in_(names))
        .group_by(Partition.topic)
    )
    return {topic: count for topic, count in rows}


async def _configured(db: Store, topology: Topology) -> Configured:
    async with db.read() as session:
        counts = await _partition_counts(session, topology)
    return configure(topology, counts.get)


async def _create_internal_topics(db: Store, configured: Configured) -> None:
    """The internal topics the topology needs and the store lacks, with their configs, as
    Kafka's group coordinator creates them (one made meanwhile by another member is kept)."""
    for topic in configured.to_create:
        spec = log_topics.TopicSpec(topic.name, topic.partitions, dict(topic.configs) or None)
        with contextlib.suppress(TopicAlreadyExists):
            await log_topics.create_topic(db, spec)


async def _prepare(db: Store, group_id: str, beat: StreamsBeat) -> StreamsGroup | None:
    """The group's topology, newest first (a joining member may bring a newer epoch),
    configured against the topics as they are now, its internal topics created; None for a
    group that is another kind's (the membership refuses it)."""
    async with db.read() as session:
        row = await session.get(StreamsGroup, group_id)
        stored = None if row is None else Topology.of_json(row.topology)
    topology = stored
    if beat.topology is not None and (stored is None or beat.topology.epoch > stored.epoch):
        topology = beat.topology
    if topology is None:
        return None  # a member heartbeating a group with no topology: the membership answers
    configured = await _configured(db, topology)
    if configured.to_create:
        await _create_internal_topics(db, configured)
        configured = await _configured(db, topology)
    async with db.write() as session:
        group = await lock_group(session, group_id, create=beat.member_epoch == JOIN_EPOCH)
        if group is None:
            return None
        if group.protocol_type not in (None, STREAMS):
            live = await session.scalar(
                select(func.count())
                .select_from(GroupMember)
                .where(GroupMember.group_id == group_id)
            )
            if live:
                return None
        now = now_ms()
        current = await session.get(StreamsGroup, group_id, with_for_update=True)
        if current is not None and current.topology_epoch > topology.epoch:
            return current  # a newer one came meanwhile
        values = {
            "group_id": group_id,
            "topology_epoch": topology.epoch,
            "topology": topology.as_json(),
            "task_counts": configured.task_counts,
            "statuses": [list(s) for s in configured.statuses],
            "shutdown": bool(current.shutdown) if current is not None else False,
            "updated_ms": now,
        }
        if beat.shutdown_application:
            values["shutdown"] = True
        if current is None:
            await store_of(session).insert_ignore(session, StreamsGroup, [values], ["group_id"])
            return StreamsGroup(**values)
        changed = (
            current.topology_epoch != topology.epoch
            or current.task_counts != configured.task_counts
            or current.statuses != values["statuses"]
            or current.shutdown != values["shutdown"]
        )
        if changed:
            for name, value in values.items():
                setattr(current, name, value)
        return current


# -- the heartbeat --------------------------------------------------------------------------------


def _metadata(beat: StreamsBeat, topology_epoch: int | None) -> Any:
    def record(member: GroupMember) -> None:
        kept: dict[str, Any] = dict(member.streams or {})
        if beat.process_id is not None:
            kept["process_id"] = beat.process_id
        if beat.user_endpoint is not None:
            kept["user_endpoint"] = list(beat.user_endpoint)
        if beat.client_tags is not None:
            kept["client_tags"] = dict(beat.client_tags)
        if beat.rack_id is not None:
            kept["rack_id"] = beat.rack_id
        if beat.topology is not None:
            kept["topology_epoch"] = beat.topology.epoch
        elif topology_epoch is not None:
            kept.setdefault("topology_epoch", topology_epoch)
        if kept != member.streams:
            member.streams = kept

    return record


def _check(group_id: str, beat: StreamsBeat) -> None:
    """INVALID_REQUEST for a heartbeat no Streams client sends, as Kafka's coordinator words
    it; STREAMS_INVALID_TOPOLOGY for a topology that cannot be run."""
    for value, name in ((group_id, "GroupId"), (beat.member_id, "MemberId")):
        if not value:
            raise InvalidRequest(f"{name} can't be empty.")
    for optional, name in ((beat.instance_id, "InstanceId"), (beat.rack_id, "RackId")):
        if optional == "":
            raise InvalidRequest(f"{name} can't be empty.")
    if beat.member_epoch == JOIN_EPOCH:
        if beat.rebalance_timeout_ms == -1:
            raise InvalidRequest("RebalanceTimeoutMs must be provided in first request.")
        if beat.active_tasks is None or beat.active_tasks:
            raise InvalidRequest("ActiveTasks must be empty when (re-)joining.")
        if beat.topology is None:
            raise InvalidRequest("Topology must be non-null when (re-)joining.")
        beat.topology.check()
    elif beat.topology is not None:
        raise InvalidRequest("Topology can only be provided when (re-)joining.")
    elif beat.member_epoch == STATIC_LEAVE_EPOCH and beat.instance_id is None:
        raise InvalidRequest("InstanceId can't be null.")
    elif beat.member_epoch < STATIC_LEAVE_EPOCH:
        raise InvalidRequest(
            f"MemberEpoch is {beat.member_epoch}, but must be greater than or equal to -2."
        )


async def heartbeat(
    db: Store,
    settings: Settings,
    group_id: str,
    beat: StreamsBeat,
    client_id: str,
    client_host: str,
) -> StreamsAnswer:
    """Join (epoch 0, with the topology), heartbeat, or leave (epoch -1; -2 for a static
    member leaving for now)."""
    _check(group_id, beat)
    row = await _prepare(db, group_id, beat)
    async with db.read() as session:
        configs = await group_configs(session, settings, group_id)
    leaving = beat.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH)
    answer = await consumer.heartbeat(
        db,
        settings,
        group_id,
        Beat(
            beat.member_id,
            LEAVE_EPOCH if beat.member_epoch == LEAVE_EPOCH else beat.member_epoch,
            # Every member runs every subtopology: what it subscribes to is the group's tasks.
            [] if beat.member_epoch == JOIN_EPOCH else None,
            None if beat.active_tasks is None else list(beat.active_tasks),
            max(1, beat.rebalance_timeout_ms),
            # The group's streams.session.timeout.ms (Kafka's: the broker's, not the client's).
            session_timeout_ms=int(configs["streams.session.timeout.ms"]),
        ),
        client_id,
        client_host,
        protocol=STREAMS,
        keep_rebalance_timeout=beat.rebalance_timeout_ms < 0,
        instance_id=beat.instance_id,
        static_leave=beat.member_epoch == STATIC_LEAVE_EPOCH,
        group_type=STREAMS,
        on_member=_metadata(beat, None if row is None else row.topology_epoch),
    )
    if leaving:
        return StreamsAnswer(answer.member_id, answer.member_epoch, 0, None, [], 0, None)
    active: list[TP] | None = [(a.topic, a.partition) for a in answer.assignment]
    if (
        beat.member_epoch != JOIN_EPOCH
        and beat.active_tasks is not None
        and sorted(beat.active_tasks) == sorted(active or [])
    ):
        active = None  # what the member says it runs: unchanged, as Kafka leaves it out
    statuses, endpoint_epoch, endpoints = await _after(db, group_id, beat)
    session_timeout = int(configs["streams.session.timeout.ms"])
    interval = int(configs["streams.heartbeat.interval.ms"])
    return StreamsAnswer(
        answer.member_id,
        answer.member_epoch,
        max(1, min(interval, session_timeout // 3)),
        active,
        statuses,
        endpoint_epoch,
        endpoints,
    )


async def _after(
    db: Store, group_id: str, beat: StreamsBeat
) -> tuple[list[tuple[int, str]], int, list[Endpoint] | None]:
    """What the member is told beside its tasks: the group's statuses (and its own stale
    topology), and where each member's endpoint serves which partitions (Interactive Queries),
    unless it knows them at this epoch already."""
    async with db.read() as session:
        row = await session.get(StreamsGroup, group_id)
        group = await session.get(ConsumerGroup, group_id)
        members = (
            await session.scalars(select(GroupMember).where(GroupMember.group_id == group_id))
        ).all()
    if row is None or group is None:
        return [], 0, None
    statuses = [(int(code), str(detail)) for code, detail in row.statuses]
    me = next((m for m in members if m.member_id == beat.member_id), None)
    mine = (me.streams or {}).get("topology_epoch") if me is not None else None
    if mine is not None and mine < row.topology_epoch:
        statuses.append(
            (
                STALE_TOPOLOGY,
                f"The member's topology epoch {mine} is older than the group's "
                f"{row.topology_epoch}.",
            )
        )
    if row.shutdown:
        statuses.append((SHUTDOWN_APPLICATION, "A member asked the application to shut down."))
    now = now_ms()
    serving = [m for m in members if (m.streams or {}).get("user_endpoint") and not is_gone(m, now)]
    # The map changes when a serving member's tasks do, and every such change raises the
    # group's last member epoch; 0 while no member serves (as Kafka's epoch starts).
    epoch = group.last_member_epoch if serving else 0
    if beat.endpoint_epoch == epoch:
        return statuses, epoch, None
    topology = Topology.of_json(row.topology)
    endpoints = []
    for m in serving:
        host, port = (m.streams or {})["user_endpoint"]
        tasks = [(t, p) for t, p in m.assigned]
        endpoints.append(Endpoint(host, port, endpoint_partitions(topology, tasks)))
    return statuses, epoch, endpoints


# -- reading --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamsView:
    group: GroupDescription
    topology: Topology | None
    members: dict[str, dict[str, Any]]  # member id -> its streams metadata


async def describe(db: Store, group_id: str) -> StreamsView:
    described = await groups_service.describe(db, group_id)
    if described.type != STREAMS:
        raise GroupIdNotFound(f"Group {group_id} is not a streams group.")
    async with db.read() as session:
        row = await session.get(StreamsGroup, group_id)
        members = (
            await session.scalars(select(GroupMember).where(GroupMember.group_id == group_id))
        ).all()
        topology = None
        if row is not None:
            topology = Topology.of_json(row.topology)
            topology = _as_made(topology, await _partition_counts(session, topology))
    return StreamsView(described, topology, {m.member_id: dict(m.streams or {}) for m in members})


def _as_made(topology: Topology, counts: Mapping[str, int]) -> Topology:
    """The topology with each internal topic's partitions as the topic has them, as Kafka
    describes it (a count the topology left to the coordinator is 0 until the topic exists)."""

    def made(t: TopicInfo) -> TopicInfo:
        return dataclasses.replace(t, partitions=counts.get(t.name, t.partitions))

    return dataclasses.replace(
        topology,
        subtopologies=tuple(
            dataclasses.replace(
                s,
                state_changelog_topics=tuple(made(t) for t in s.state_changelog_topics),
                repartition_source_topics=tuple(made(t) for t in s.repartition_source_topics),
            )
            for s in topology.subtopologies
        ),
    )
