"""ApiVersions, Metadata, FindCoordinator, DescribeCluster and DescribeTopicPartitions: the
brokers of the store's cluster as this process sees them (`coordinator.cluster.view`), the
leader and epoch of each partition, and the coordinator of each key. Alone, the listener is
the one broker (node 0), leader of every partition and coordinator of every key."""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core.acls import Operation
from coordinator.core.errors import StoreUnavailable
from coordinator.kafka.connection import NOT_ASKED, Client
from coordinator.kafka.errors import FAILURES, error_code
from coordinator.kafka.wire import SUPPORTED, Reply, Request
from coordinator.log import topics as log_topics
from coordinator.log.errors import InvalidTopic, TopicAlreadyExists

NODE_ID = 0
CLUSTER_ID = "txn-coordinator"
_NO_TOPIC_ID = uuid.UUID(int=0)


def _api_keys(reply: Reply) -> tuple[Any, ...]:
    return tuple(
        reply("ApiVersion", api_key=key, min_version=low, max_version=high)
        for key, (low, high) in sorted(SUPPORTED.items())
    )


# Features finalized as Kafka 4 advertises them (ApiVersions v3+), where this listener serves
# what they stand for: group.version 1 is KIP-848's consumer groups (ConsumerGroupHeartbeat).
# Finalized at these levels, as a Kafka 4 cluster's. transaction.version 2 (KIP-890 part 2): a
# client that sees it adds partitions by producing (Produce 12), commits offsets without
# AddOffsetsToTxn (TxnOffsetCommit 5) and takes the epoch each EndTxn (5) raises; each request is
# answered by the version it comes with, so a client of version 1 goes on as before. share.version
# 1 is KIP-932's share groups (ShareGroupHeartbeat, ShareFetch); streams.version 1 KIP-1071's
# streams groups (StreamsGroupHeartbeat).
FEATURES = {"group.version": 1, "share.version": 1, "streams.version": 1, "transaction.version": 2}


async def api_versions(client: Client, request: Request) -> Any:
    reply = request.reply
    if request.version >= 3:  # KIP-511: what the client is, for KIP-714's matching
        client.software_name = request.body.client_software_name
        client.software_version = request.body.client_software_version
    if request.version < 3:
        return reply.body(error_code=ErrorCode.none, api_keys=_api_keys(reply))
    return reply.body(
        error_code=ErrorCode.none,
        api_keys=_api_keys(reply),
        supported_features=tuple(
            reply("SupportedFeatureKey", name=name, min_version=0, max_version=level)
            for name, level in sorted(FEATURES.items())
        ),
        finalized_features_epoch=1,
        finalized_features=tuple(
            reply(
                "FinalizedFeatureKey", name=name, max_version_level=level, min_version_level=level
            )
            for name, level in sorted(FEATURES.items())
        ),
        zk_migration_ready=False,
    )


def unsupported_api_versions() -> Any:
    """An ApiVersions request of a version not served: answered in version 0, as Kafka's broker
    answers it, with the versions of ApiVersions alone (all a client needs to ask again)."""
    reply = Reply(18, 0)
    low, high = SUPPORTED[18]
    return reply.body(
        error_code=ErrorCode.unsupported_version,
        api_keys=(reply("ApiVersion", api_key=18, min_version=low, max_version=high),),
    )


async def _auto_create(client: Client, request: Request, name: str) -> tuple[ErrorCode, int]:
    """Kafka's auto.create.topics.enable for a topic a Metadata request names: created with
    num.partitions partitions when the setting is on, the request allows it (version 4 on asks;
    before, it always did) and the principal may CREATE it (on the cluster or the topic: else
    TOPIC_AUTHORIZATION_FAILED, as Kafka answers); else UNKNOWN_TOPIC_OR_PARTITION."""
    settings = client.settings
    allowed = getattr(request.body, "allow_auto_topic_creation", True)
    assert client.access is not None
    spec = log_topics.TopicSpec(name, settings.num_partitions)
    try:
        spec.checked()
    except InvalidTopic:
        return ErrorCode.invalid_topic_exception, 0  # a name no topic may have, as Kafka says
    if not (settings.auto_create_topics_enable and allowed):
        return ErrorCode.unknown_topic_or_partition, 0
    try:
        client.access.topic_or_cluster(name, Operation.CREATE)
        await client.quota.admit(client.db, client.access.name, spec.partitions)
        await log_topics.create_topic(client.db, spec)
    except TopicAlreadyExists:
        pass  # another client's request created it meanwhile
    except FAILURES as failure:
        return error_code(failure), 0
    described = await log_topics.describe_topic(client.db, name)
    return ErrorCode.none, len(described.partitions)


async def metadata(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    all_topics = body.topics is None or (request.version == 0 and not body.topics)
    try:
        listed = await log_topics.list_topics(client.db)
        if not client.cluster.knows((t.name, t.partitions) for t in listed.topics):
            await client.cluster.refresh(client.db)  # a topic created since the last beat
    except StoreUnavailable:
        if all_topics:
            raise  # no answer can say "all topics, none known": the client retries elsewhere
        listed = None
    known = {t.name: t.partitions for t in listed.topics} if listed else {}
    factors = {t.name: t.replication_factor for t in listed.topics} if listed else {}
    ids = {t.name: t.topic_id or _NO_TOPIC_ID for t in listed.topics} if listed else {}
    by_id = {topic_id: name for name, topic_id in ids.items()}
    unknown_ids: list[uuid.UUID] = []
    refused_ids: list[uuid.UUID] = []
    if all_topics:
        names = sorted(name for name in known if client.access.visible_topic(name))
    else:
        names = []
        for asked in body.topics:
            if asked.name is not None:
                names.append(asked.name)
            elif request.version >= 12 and asked.topic_id in by_id:
                # Metadata v12+ may name a topic by its id alone (KIP-516).
                names.append(by_id[asked.topic_id])
            elif request.version >= 12:
                if listed is not None:
                    unknown_ids.append(asked.topic_id)
            else:
                # Below v12 a topic cannot be asked for by its id, nor answered without a name.
                refused_ids.append(asked.topic_id)
    topics = [
        reply(
            "MetadataResponseTopic",
            error_code=ErrorCode.unknown_topic_id,
            name=None,
            topic_id=topic_id,
            is_internal=False,
            topic_authorized_operations=NOT_ASKED,
            partitions=(),
        )
        for topic_id in unknown_ids
    ] + [
        reply(
            "MetadataResponseTopic",
            error_code=ErrorCode.invalid_request,
            name="",
            topic_id=topic_id,
            is_internal=False,
            topic_authorized_operations=NOT_ASKED,
            partitions=(),
        )
        for topic_id in refused_ids
    ]
    for name in names:
        if not client.access.visible_topic(name):
            error, partitions = ErrorCode.topic_authorization_failed, 0
        elif listed is None:
            # The store is out: Kafka's retriable "no leader now", not "no such topic".
            error, partitions = ErrorCode.leader_not_available, 0
        elif name not in known:
            error, partitions = await _auto_create(client, request, name)
            if error is ErrorCode.none:
                created = await log_topics.list_topics(client.db)
                ids.update((t.name, t.topic_id or _NO_TOPIC_ID) for t in created.topics)
        else:
            error, partitions = ErrorCode.none, known[name]
        topics.append(
            reply(
                "MetadataResponseTopic",
                error_code=error,
                name=name,
                topic_id=ids.get(name, _NO_TOPIC_ID),
                is_internal=False,
                topic_authorized_operations=(
                    client.access.topic_operations(name)
                    if getattr(body, "include_topic_authorized_operations", False)
                    else NOT_ASKED
                ),
                partitions=tuple(
                    _partition(
                        reply, "MetadataResponsePartition", client, name, i, factors.get(name, 1)
                    )
                    for i in range(partitions)
                ),
            )
        )
    brokers = tuple(
        reply("MetadataResponseBroker", node_id=b.broker_id, host=host, port=port, rack=b.rack)
        for b in client.cluster.live
        for host, port in [client.cluster.address(b, client.host, client.port)]
    )
    return reply.body(
        brokers=brokers,
        cluster_id=CLUSTER_ID,
        controller_id=_controller(client),
        topics=tuple(topics),
    )


def _controller(client: Client) -> int:
    """The controller Kafka's clients are told of (admin calls go to it): the lowest live
    broker, every broker being able to serve them."""
    return client.cluster.live[0].broker_id


def _replicas(client: Client, leader: int, factor: int) -> tuple[int, ...]:
    """As many replicas as the topic's stated factor (the copies are the store's): the leader,
    then the live brokers after it in turn (one broker repeated, alone)."""
    ids = [b.broker_id for b in client.cluster.live]
    start = ids.index(leader) if leader in ids else 0
    return tuple(ids[(start + i) % len(ids)] for i in range(factor))


def _partition(
    reply: Reply, entity: str, client: Client, topic: str, index: int, factor: int, **more: Any
) -> Any:
    """A partition as Metadata (`entity` MetadataResponsePartition) and DescribeTopicPartitions
    answer it: its leader, epoch and replicas (`more`: the fields only one of them has)."""
    leader, epoch = client.cluster.leader(topic, index)
    replicas = _replicas(client, leader, factor)
    return reply(
        entity,
        # A leader that died and whose move is not placed yet: Kafka's "election under way".
        error_code=ErrorCode.none if leader >= 0 else ErrorCode.leader_not_available,
        partition_index=index,
        leader_id=leader,
        leader_epoch=epoch,
        replica_nodes=replicas,
        isr_nodes=replicas if leader >= 0 else (),
        offline_replicas=(),
        **more,
    )


async def find_coordinator(client: Client, request: Request) -> Any:
    """The live broker that coordinates each key (`cluster.placement.coordinator_of`): groups,
    share groups and transactional ids alike."""
    reply, body = request.reply, request.body

    def where(key: str) -> dict[str, Any]:
        broker = client.cluster.coordinator(key)
        host, port = client.cluster.address(broker, client.host, client.port)
        return {"node_id": broker.broker_id, "host": host, "port": port}

    if reply.has("FindCoordinatorResponse", "coordinators"):
        return reply.body(
            coordinators=tuple(
                reply(
                    "Coordinator",
                    key=key,
                    error_code=ErrorCode.none,
                    error_message=None,
                    **where(key),
                )
                for key in body.coordinator_keys
            )
        )
    return reply.body(error_code=ErrorCode.none, error_message=None, **where(body.key))


async def describe_cluster(client: Client, request: Request) -> Any:
    """KIP-919's DescribeCluster: the live brokers, the lowest of them told as the controller."""
    reply = request.reply
    if getattr(request.body, "endpoint_type", 1) != 1:  # 1: brokers; 2: controllers
        return reply.body(
            error_code=ErrorCode.unsupported_endpoint_type,
            error_message="only the brokers' endpoints (1) are described",
            endpoint_type=request.body.endpoint_type,
            cluster_id=CLUSTER_ID,
            controller_id=-1,
            brokers=(),
            cluster_authorized_operations=NOT_ASKED,
        )
    return reply.body(
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=1,
        cluster_id=CLUSTER_ID,
        controller_id=_controller(client),
        brokers=tuple(
            reply("DescribeClusterBroker", broker_id=b.broker_id, host=host, port=port, rack=b.rack)
            for b in client.cluster.live
            for host, port in [client.cluster.address(b, client.host, client.port)]
        ),
        cluster_authorized_operations=NOT_ASKED,
    )


async def describe_topic_partitions(client: Client, request: Request) -> Any:
    """KIP-966's DescribeTopicPartitions (what Kafka 4's AdminClient and `kafka-topics
    --describe` ask instead of Metadata): the topics asked for (every visible one when none is),
    by name, from the cursor on, at most `response_partition_limit` partitions in all, with a
    cursor at the first partition left out. As Metadata answers them: each partition's leader
    and epoch, as many replicas as the topic's stated factor."""
    reply, body = request.reply, request.body
    assert client.access is not None
    listed = {t.name: t for t in (await log_topics.list_topics(client.db)).topics}
    if not client.cluster.knows((t.name, t.partitions) for t in listed.values()):
        await client.cluster.refresh(client.db)
    asked = sorted({t.name for t in body.topics}) if body.topics else None
    names = (
        asked if asked is not None else sorted(n for n in listed if client.access.visible_topic(n))
    )
    cursor = body.cursor
    if cursor is not None and asked is not None and cursor.topic_name not in asked:
        # As Kafka refuses it: every topic asked for answered INVALID_REQUEST.
        return reply.body(
            topics=tuple(_topic_refused(reply, n, ErrorCode.invalid_request) for n in asked),
            next_cursor=None,
        )
    if cursor is not None:
        names = [n for n in names if n >= cursor.topic_name]
    budget = max(1, body.response_partition_limit)
    topics: list[Any] = []
    next_cursor = None
    for name in names:
        if name not in listed or not client.access.visible_topic(name):
            code = (
                ErrorCode.topic_authorization_failed
                if name in listed
                else ErrorCode.unknown_topic_or_partition
            )
            topics.append(_topic_refused(reply, name, code))
            continue
        topic = listed[name]
        first = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        if budget == 0:
            next_cursor = reply("Cursor", topic_name=name, partition_index=first)
            break
        shown = range(first, min(topic.partitions, first + budget))
        budget -= len(shown)
        topics.append(
            reply(
                "DescribeTopicPartitionsResponseTopic",
                error_code=ErrorCode.none,
                name=name,
                topic_id=topic.topic_id or _NO_TOPIC_ID,
                is_internal=False,
                partitions=tuple(
                    _partition(
                        reply,
                        "DescribeTopicPartitionsResponsePartition",
                        client,
                        name,
                        i,
                        topic.replication_factor,
                        eligible_leader_replicas=(),
                        last_known_elr=(),
                    )
                    for i in shown
                ),
                topic_authorized_operations=client.access.topic_operations(name),
            )
        )
        if shown.stop < topic.partitions:
            next_cursor = reply("Cursor", topic_name=name, partition_index=shown.stop)
            break
    return reply.body(topics=tuple(topics), next_cursor=next_cursor)


def _topic_refused(reply: Any, name: str, code: ErrorCode) -> Any:
    return reply(
        "DescribeTopicPartitionsResponseTopic",
        error_code=code,
        name=name,
        topic_id=_NO_TOPIC_ID,
        is_internal=False,
        partitions=(),
        topic_authorized_operations=NOT_ASKED,
    )
