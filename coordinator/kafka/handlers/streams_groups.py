"""KIP-1071's streams groups over Kafka's wire (StreamsGroupHeartbeat v0, StreamsGroupDescribe
v0): Kafka Streams' `group.protocol=streams`. Thin over `coordinator.groups.streams`, translating
the topology and the task lists."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core.acls import Operation
from coordinator.core.errors import InvalidRequest
from coordinator.groups import streams
from coordinator.groups.inputs import JOIN_EPOCH
from coordinator.groups.streams_topology import (
    StreamsInvalidTopology,
    Subtopology,
    TopicInfo,
    Topology,
)
from coordinator.kafka.connection import Client, kafka_host
from coordinator.kafka.errors import FAILURES, error_code, message
from coordinator.kafka.handlers.consumer_groups import by_topic, failed_description
from coordinator.kafka.wire import Request, milliseconds
from coordinator.log import topics as log_topics

TP = tuple[str, int]
# What the client is told besides its tasks, as Kafka answers with no warm-up tasks: a warm-up
# task's caught-up lag (none is ever assigned), and how often it sends its changelog offsets.
_ACCEPTABLE_RECOVERY_LAG = 0
_TASK_OFFSET_INTERVAL_MS = 60_000


def _topic_info(t: Any) -> TopicInfo:
    return TopicInfo(
        t.name,
        t.partitions,
        t.replication_factor,
        tuple((kv.key, kv.value) for kv in t.topic_configs),
    )


def _topology(topology: Any, topics: list[str]) -> Topology:
    """The request's topology; a subtopology's source topics by pattern are the topics that
    match now (anchored at both ends, as Kafka matches; Python's `re`, where Kafka uses Java's
    regular expressions)."""
    subtopologies = []
    for s in topology.subtopologies:
        sources = list(s.source_topics)
        for pattern in s.source_topic_regex:
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise StreamsInvalidTopology(f"source topic pattern {pattern!r}: {exc}") from None
            sources += [t for t in topics if compiled.fullmatch(t) and t not in sources]
        groups = tuple(
            tuple(
                [*(s.source_topics[i] for i in g.source_topics),
                 *(s.repartition_source_topics[i].name for i in g.repartition_source_topics)]
            )
            for g in s.copartition_groups
        )  # fmt: skip
        subtopologies.append(
            Subtopology(
                s.subtopology_id,
                tuple(sources),
                tuple(s.repartition_sink_topics),
                tuple(_topic_info(t) for t in s.state_changelog_topics),
                tuple(_topic_info(t) for t in s.repartition_source_topics),
                groups,
            )
        )
    return Topology(topology.epoch, tuple(subtopologies))


def _tasks(tasks: Any) -> list[TP] | None:
    if tasks is None:
        return None
    return [(t.subtopology_id, p) for t in tasks for p in t.partitions]


def _task_ids(reply: Any, tasks: Iterable[TP]) -> tuple[Any, ...]:
    return tuple(
        reply("TaskIds", subtopology_id=sub, partitions=tuple(parts))
        for sub, parts in by_topic(tasks).items()
    )


def _check_task_lists(body: Any) -> None:
    """The standby and warm-up task lists, which the coordinator never assigns, as Kafka checks
    them (the active tasks are the service's to check)."""
    if body.member_epoch == JOIN_EPOCH:
        others = ((body.standby_tasks, "StandbyTasks"), (body.warmup_tasks, "WarmupTasks"))
        for tasks, name in others:
            if tasks is None or tasks:
                raise InvalidRequest(f"{name} must be empty when (re-)joining.")
    lists = (body.active_tasks, body.standby_tasks, body.warmup_tasks)
    if any(t is not None for t in lists) and any(t is None for t in lists):
        raise InvalidRequest("If one task-type is non-null, all must be non-null.")


async def streams_group_heartbeat(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    try:
        client.access.group(body.group_id, Operation.READ)
        client.cluster.coordinate(body.group_id)
        topology = None
        if body.topology is not None:
            try:
                listed = await log_topics.list_topics(client.db)
                topology = _topology(body.topology, sorted(t.name for t in listed.topics))
            except IndexError:
                raise StreamsInvalidTopology(
                    "a co-partition group names a source topic the subtopology does not have"
                ) from None
        if topology is not None:
            client.access.join(
                body.group_id, {t for s in topology.subtopologies for t in s.source_topics}
            )
        _check_task_lists(body)
        endpoint = body.user_endpoint
        beat = streams.StreamsBeat(
            body.member_id,
            body.member_epoch,
            milliseconds(body.rebalance_timeout),
            topology,
            _tasks(body.active_tasks),
            body.instance_id,
            body.rack_id,
            body.process_id,
            None if endpoint is None else (endpoint.host, endpoint.port),
            None if body.client_tags is None else {kv.key: kv.value for kv in body.client_tags},
            body.shutdown_application,
            body.endpoint_information_epoch,
        )
        answer = await streams.heartbeat(
            client.db,
            client.settings,
            body.group_id,
            beat,
            *client.as_member,
        )
    except FAILURES as failure:
        return reply.body(
            error_code=error_code(failure),
            error_message=message(failure),
            member_id="",
            member_epoch=0,
            heartbeat_interval=0,
            acceptable_recovery_lag=0,
            task_offset_interval=0,
            status=(),
            active_tasks=None,
            standby_tasks=None,
            warmup_tasks=None,
            endpoint_information_epoch=0,
            partitions_by_user_endpoint=None,
        )
    endpoints = None
    if answer.endpoints is not None:
        endpoints = tuple(
            reply(
                "EndpointToPartitions",
                user_endpoint=reply("Endpoint", host=e.host, port=e.port),
                active_partitions=tuple(
                    reply("TopicPartition", topic=topic, partitions=tuple(parts))
                    for topic, parts in by_topic(e.partitions).items()
                ),
                standby_partitions=(),
            )
            for e in answer.endpoints
        )
    leaving = body.member_epoch < 0
    active = answer.active_tasks
    told = active is not None
    return reply.body(
        error_code=ErrorCode.none,
        error_message=None,
        member_id=answer.member_id,
        member_epoch=answer.member_epoch,
        heartbeat_interval=answer.heartbeat_interval_ms,
        acceptable_recovery_lag=_ACCEPTABLE_RECOVERY_LAG,
        task_offset_interval=0 if leaving else _TASK_OFFSET_INTERVAL_MS,
        status=tuple(
            reply("Status", status_code=code, status_detail=detail)
            for code, detail in answer.statuses
        ),
        active_tasks=None if active is None else _task_ids(reply, active),
        standby_tasks=() if told else None,
        warmup_tasks=() if told else None,
        endpoint_information_epoch=answer.endpoint_epoch,
        partitions_by_user_endpoint=endpoints,
    )


def _topic_info_out(reply: Any, t: TopicInfo) -> Any:
    return reply(
        "TopicInfo",
        name=t.name,
        partitions=t.partitions,
        replication_factor=t.replication_factor,
        topic_configs=tuple(reply("KeyValue", key=k, value=v) for k, v in t.configs),
    )


async def streams_group_describe(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None

    def assignment(tasks: Iterable[Any]) -> Any:
        return reply(
            "Assignment",
            active_tasks=_task_ids(reply, [(t.topic, t.partition) for t in tasks]),
            standby_tasks=(),
            warmup_tasks=(),
        )

    described = []
    for group_id in body.group_ids:
        try:
            client.access.group(group_id, Operation.DESCRIBE)
            view = await streams.describe(client.db, group_id)
        except FAILURES as failure:
            described.append(failed_description(reply, group_id, failure, topology=None))
            continue
        topology = view.topology
        described.append(
            reply(
                "DescribedGroup",
                error_code=ErrorCode.none,
                error_message=None,
                group_id=group_id,
                group_state=view.group.state,
                group_epoch=view.group.group_epoch,
                assignment_epoch=view.group.assignment_epoch,
                topology=None
                if topology is None
                else reply(
                    "Topology",
                    epoch=topology.epoch,
                    subtopologies=tuple(
                        reply(
                            "Subtopology",
                            subtopology_id=s.id,
                            source_topics=s.source_topics,
                            repartition_sink_topics=s.repartition_sink_topics,
                            state_changelog_topics=tuple(
                                _topic_info_out(reply, t) for t in s.state_changelog_topics
                            ),
                            repartition_source_topics=tuple(
                                _topic_info_out(reply, t) for t in s.repartition_source_topics
                            ),
                        )
                        for s in topology.subtopologies
                    ),
                ),
                members=tuple(
                    _member(reply, m, view.members.get(m.member_id, {}), assignment)
                    for m in view.group.members
                ),
                authorized_operations=client.group_operations(
                    group_id, body.include_authorized_operations
                ),
            )
        )
    return reply.body(groups=tuple(described))


def _member(reply: Any, m: Any, meta: dict[str, Any], assignment: Any) -> Any:
    endpoint = meta.get("user_endpoint")
    return reply(
        "Member",
        member_id=m.member_id,
        member_epoch=m.member_epoch,
        instance_id=m.group_instance_id,
        rack_id=meta.get("rack_id"),
        client_id=m.client_id,
        client_host=kafka_host(m.client_host),
        topology_epoch=meta.get("topology_epoch", 0),
        process_id=meta.get("process_id", ""),
        user_endpoint=None
        if endpoint is None
        else reply("Endpoint", host=endpoint[0], port=endpoint[1]),
        client_tags=tuple(
            reply("KeyValue", key=k, value=v)
            for k, v in sorted(meta.get("client_tags", {}).items())
        ),
        task_offsets=(),
        task_end_offsets=(),
        assignment=assignment(m.assignment),
        target_assignment=assignment(m.target_assignment),
        is_classic=False,
    )
