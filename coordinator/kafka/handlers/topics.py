"""CreateTopics, DeleteTopics, DescribeConfigs and IncrementalAlterConfigs: kafka-topics.sh's and
kafka-configs.sh's calls (and AdminClient's), onto the log's topic services, the client-metrics
subscriptions' configs (kafka-client-metrics.sh) onto `coordinator.telemetry`, and groups'
configs (kafka-configs.sh --entity-type groups) onto `coordinator.groups.configs`."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator import deletion
from coordinator.core.acls import Operation
from coordinator.core.quotas import ThrottlingQuotaExceeded
from coordinator.groups import configs as group_configs
from coordinator.kafka.connection import Client
from coordinator.kafka.errors import FAILURES, Refused, outcome
from coordinator.kafka.handlers.cluster import NODE_ID
from coordinator.kafka.wire import Request
from coordinator.log import configs
from coordinator.log import topics as log_topics
from coordinator.telemetry import subscriptions

TOPIC = 2
BROKER = 4
CLIENT_METRICS = 16
GROUP = 32
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
# ConfigSource: DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG; a subscription's CLIENT_METRICS_CONFIG.
_SOURCES = {"TOPIC": 1, "DEFAULT": 5}
_CLIENT_METRICS_SOURCE = 7
_GROUP_SOURCE = 8  # GROUP_CONFIG
# Kafka's ConfigType numbers for the log's config types (DescribeConfigs v3+, KIP-569); a name
# the log does not know is UNKNOWN (0).
_CONFIG_TYPES = {"BOOLEAN": 1, "STRING": 2, "INT": 3, "LONG": 5, "DOUBLE": 6, "LIST": 7}
_NO_TOPIC_ID = uuid.UUID(int=0)


async def create_topics(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    results = []
    throttle_ms = 0
    for topic in body.topics:
        partitions = 1 if topic.num_partitions == -1 else topic.num_partitions
        answer = outcome()
        topic_id = _NO_TOPIC_ID
        factor = 1
        described: list[dict[str, str]] = []
        try:
            client.access.topic_or_cluster(topic.name, Operation.CREATE)
            strict = client.settings.strict_replication_factor
            factor = log_topics.replication_factor(topic.replication_factor, strict=strict)
            if topic.assignments:
                replicas = {a.partition_index: list(a.broker_ids) for a in topic.assignments}
                partitions = log_topics.assigned_partitions(
                    replicas, topic.num_partitions, topic.replication_factor, NODE_ID
                )
            given = {c.name: c.value for c in topic.configs} or None
            spec = log_topics.TopicSpec(topic.name, partitions, given, factor)
            if not body.validate_only:
                await client.quota.admit(client.db, client.access.name, spec.partitions)
            created = await log_topics.create_topic(
                client.db, spec, validate_only=body.validate_only
            )
            topic_id = created.topic_id or _NO_TOPIC_ID
            if request.version >= 5:
                # KIP-525: the new topic's every config, as DescribeConfigs shows it.
                described = configs.describe(spec.checked(), client.settings)
        except FAILURES as failure:
            answer = outcome(failure)
            if isinstance(failure, ThrottlingQuotaExceeded):
                throttle_ms = max(throttle_ms, int(failure.extensions["throttle_time_ms"]))
        ok = answer["error_code"] is ErrorCode.none
        results.append(
            reply(
                "CreatableTopicResult",
                name=topic.name,
                topic_id=topic_id,
                num_partitions=partitions if ok else -1,
                replication_factor=factor if ok else -1,
                configs=None
                if request.version < 5
                else tuple(
                    reply(
                        "CreatableTopicConfigs",
                        name=c["name"],
                        value=c["value"],
                        read_only=False,
                        config_source=_SOURCES[c["source"]],
                        is_sensitive=False,
                    )
                    for c in described
                ),
                **answer,
            )
        )
    return reply.body(topics=tuple(results), throttle_time=throttle_ms)


async def create_partitions(client: Client, request: Request) -> Any:
    """`kafka-topics --alter --partitions N`: a topic's partitions only grow."""
    reply, body = request.reply, request.body
    assert client.access is not None
    results = []
    throttle_ms = 0
    for topic in body.topics:
        answer = outcome()
        try:
            client.access.topic(topic.name, Operation.ALTER)
            # The assignments are the new partitions', in order; they carry no partition index.
            log_topics.on_one_broker(
                {i: list(a.broker_ids) for i, a in enumerate(topic.assignments or ())}, NODE_ID
            )
            added = await log_topics.grow_topic(
                client.db, topic.name, topic.count, validate_only=True
            )
            if not body.validate_only:
                await client.quota.admit(client.db, client.access.name, added)
                await log_topics.grow_topic(client.db, topic.name, topic.count)
        except FAILURES as failure:
            answer = outcome(failure)
            if isinstance(failure, ThrottlingQuotaExceeded):
                throttle_ms = max(throttle_ms, int(failure.extensions["throttle_time_ms"]))
        results.append(reply("CreatePartitionsTopicResult", name=topic.name, **answer))
    return reply.body(results=tuple(results), throttle_time=throttle_ms)


async def delete_topics(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    if hasattr(body, "topics"):
        # Version 6+ (KIP-516): a topic by name or by its id.
        asked = [(t.name, t.topic_id) for t in body.topics]
    else:
        asked = [(name, None) for name in body.topic_names]
    by_id: dict[uuid.UUID, str] = {}
    if hasattr(body, "topics"):
        # Asked by id, or answered with the id of the topic deleted by name (as Kafka does).
        listed = await log_topics.list_topics(client.db)
        by_id = {t.topic_id: t.name for t in listed.topics if t.topic_id is not None}
    id_of = {name: topic_id for topic_id, name in by_id.items()}
    results = []
    for name, topic_id in asked:
        answer = outcome()
        try:
            if name is None:
                if topic_id not in by_id:
                    raise Refused(ErrorCode.unknown_topic_id, f"no topic has id {topic_id}")
                name = by_id[topic_id]
            elif topic_id is None or topic_id == _NO_TOPIC_ID:
                topic_id = id_of.get(name)
            client.access.topic(name, Operation.DELETE)
            await deletion.delete_topic(client.db, name)
        except FAILURES as failure:
            answer = outcome(failure)
        results.append(
            reply(
                "DeletableTopicResult",
                name=name,
                topic_id=topic_id or _NO_TOPIC_ID,
                **answer,
            )
        )
    return reply.body(responses=tuple(results))


async def describe_configs(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    assert client.access is not None
    results = []
    for resource in body.resources:
        entries: list[Any] = []
        answer = outcome()
        try:
            if resource.resource_type == TOPIC:
                client.access.topic(resource.resource_name, Operation.DESCRIBE_CONFIGS)
                listed = await log_topics.describe_configs(
                    client.db, client.settings, resource.resource_name
                )
                keys = set(resource.configuration_keys or ())
                entries = [
                    reply(
                        "DescribeConfigsResourceResult",
                        name=c.name,
                        value=c.value,
                        read_only=False,
                        is_default=c.source == "DEFAULT",
                        config_source=_SOURCES[c.source],
                        is_sensitive=False,
                        synonyms=(),
                        config_type=_config_type(c.name),
                        documentation=None,
                    )
                    for c in listed.configs
                    if not keys or c.name in keys
                ]
            elif resource.resource_type == CLIENT_METRICS:
                client.access.cluster(Operation.DESCRIBE_CONFIGS)
                entries = _set_or_default(
                    reply,
                    await subscriptions.describe(client.db, resource.resource_name),
                    resource.configuration_keys,
                    _CLIENT_METRICS_SOURCE,
                )
            elif resource.resource_type == GROUP:
                client.access.group(resource.resource_name, Operation.DESCRIBE_CONFIGS)
                entries = _set_or_default(
                    reply,
                    await group_configs.describe(
                        client.db, client.settings, resource.resource_name
                    ),
                    resource.configuration_keys,
                    _GROUP_SOURCE,
                )
            elif resource.resource_type != BROKER:
                # The one broker has no configs of its own to show (an empty list, as asked).
                raise Refused(ErrorCode.invalid_request, f"resource type {resource.resource_type}")
        except FAILURES as failure:
            answer = outcome(failure)
        results.append(
            reply(
                "DescribeConfigsResult",
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                configs=tuple(entries),
                **answer,
            )
        )
    return reply.body(results=tuple(results))


def _set_or_default(reply: Any, configs: Any, keys: Any, source: int) -> list[Any]:
    """DescribeConfigs' entries for a resource whose configs are either set on it (`source`) or
    defaults (client metrics subscriptions, groups), those asked for only when `keys` names some."""
    wanted = set(keys or ())
    return [
        reply(
            "DescribeConfigsResourceResult",
            name=c.name,
            value=c.value,
            read_only=False,
            is_default=not c.is_set,
            config_source=source if c.is_set else _SOURCES["DEFAULT"],
            is_sensitive=False,
            synonyms=(),
            config_type=_CONFIG_TYPES[c.type],
            documentation=None,
        )
        for c in configs
        if not wanted or c.name in wanted
    ]


def _config_type(name: str) -> int:
    known = configs.CONFIGS.get(name)
    return 0 if known is None else _CONFIG_TYPES[known.type]


# How a request turns one resource's configs into the domain's change (set, delete).
ChangeOf = Callable[[Client, Any], Awaitable[log_topics.ConfigChange]]


async def _alter_each(
    client: Client, request: Request, change_of: ChangeOf, *, incremental: bool
) -> Any:
    """AlterConfigs and IncrementalAlterConfigs: each topic resource's change (and, when
    incremental, each client-metrics subscription's), applied (or, with validate_only,
    checked), answered on its own."""
    reply, body = request.reply, request.body
    assert client.access is not None
    results = []
    for resource in body.resources:
        answer = outcome()
        try:
            if resource.resource_type == CLIENT_METRICS and incremental:
                client.access.cluster(Operation.ALTER_CONFIGS)
                await _alter_subscription(client, resource, body.validate_only)
                results.append(_altered(reply, resource, outcome()))
                continue
            if resource.resource_type == GROUP and incremental:
                client.access.group(resource.resource_name, Operation.ALTER_CONFIGS)
                await _alter_group(client, resource, body.validate_only)
                results.append(_altered(reply, resource, outcome()))
                continue
            if resource.resource_type != TOPIC:
                raise Refused(
                    ErrorCode.invalid_request,
                    "only topic configs and, incrementally, client-metrics subscriptions and "
                    "group configs can be altered",
                )
            client.access.topic(resource.resource_name, Operation.ALTER_CONFIGS)
            change = await change_of(client, resource)
            await log_topics.alter_configs(
                client.db,
                client.settings,
                resource.resource_name,
                change,
                validate_only=body.validate_only,
            )
        except FAILURES as failure:
            answer = outcome(failure)
        results.append(_altered(reply, resource, answer))
    return reply.body(responses=tuple(results))


def _altered(reply: Any, resource: Any, answer: dict[str, Any]) -> Any:
    return reply(
        "AlterConfigsResourceResponse",
        resource_type=resource.resource_type,
        resource_name=resource.resource_name,
        **answer,
    )


async def _alter_subscription(client: Client, resource: Any, validate_only: bool) -> None:
    """IncrementalAlterConfigs on a client-metrics subscription (kafka-client-metrics.sh):
    Kafka's controller knows no list type for its configs, so no APPEND or SUBTRACT."""

    def not_a_list(name: str, verb: str) -> str:
        return f"Can't {verb} to key {name} because its type is not LIST."

    to_set, to_delete = await _edited(resource, (), _no_current, not_a_list)
    await subscriptions.alter(
        client.db,
        resource.resource_name,
        {name: value or "" for name, value in to_set.items()},  # a null value sets ""
        to_delete,
        validate_only=validate_only,
    )


async def _alter_group(client: Client, resource: Any, validate_only: bool) -> None:
    """IncrementalAlterConfigs on a group's configs (kafka-configs.sh --entity-type groups):
    none of them is a list, so no APPEND or SUBTRACT."""

    def not_a_list(name: str, verb: str) -> str:
        return f"Can't {verb} to key {name} because its type is not LIST."

    to_set, to_delete = await _edited(resource, (), _no_current, not_a_list)
    await group_configs.alter(
        client.db,
        client.settings,
        resource.resource_name,
        to_set,
        to_delete,
        validate_only=validate_only,
    )


async def _no_current() -> Mapping[str, str]:
    raise AssertionError("no list config to edit")  # `_edited` asks only for a list's value


async def _replacing(client: Client, resource: Any) -> log_topics.ConfigChange:
    """Kafka's non-incremental AlterConfigs: the configs given replace all; every other
    config goes back to its default."""
    given = {c.name: c.value for c in resource.configs}
    return log_topics.ConfigChange(given, sorted(set(configs.CONFIGS) - set(given)))


async def _incremental(client: Client, resource: Any) -> log_topics.ConfigChange:
    """IncrementalAlterConfigs on a topic: SET, DELETE, and APPEND / SUBTRACT on list
    configs."""

    async def current() -> Mapping[str, str]:
        listed = await log_topics.describe_configs(
            client.db, client.settings, resource.resource_name
        )
        return {c.name: c.value for c in listed.configs}

    def not_a_list(name: str, verb: str) -> str:
        return (
            f"{name}: APPEND and SUBTRACT are for list configs ({', '.join(sorted(configs.LISTS))})"
        )

    to_set, to_delete = await _edited(resource, configs.LISTS, current, not_a_list)
    return log_topics.ConfigChange(to_set, to_delete)


async def _edited(
    resource: Any,
    lists: Collection[str],
    current: Callable[[], Awaitable[Mapping[str, str]]],
    not_a_list: Callable[[str, str], str],
) -> tuple[dict[str, Any], list[str]]:
    """One resource's IncrementalAlterConfigs operations, in their order: the values to set
    (SET, and APPEND / SUBTRACT on the `lists`, from the values `current` reads, once) and the
    names to delete. APPEND or SUBTRACT on another config is INVALID_CONFIG (`not_a_list`
    says why); an unknown operation INVALID_REQUEST."""
    to_set: dict[str, Any] = {}
    to_delete: list[str] = []
    found: Mapping[str, str] | None = None
    for config in resource.configs:
        if config.config_operation == SET:
            to_set[config.name] = config.value
        elif config.config_operation == DELETE:
            to_delete.append(config.name)
        elif config.config_operation in (APPEND, SUBTRACT):
            if config.name not in lists:
                verb = "APPEND" if config.config_operation == APPEND else "SUBTRACT"
                raise Refused(ErrorCode.invalid_config, not_a_list(config.name, verb))
            if found is None:
                found = await current()
            before = to_set.get(config.name, found[config.name])
            to_set[config.name] = configs.edit_list(
                before, config.value or "", config.config_operation == APPEND
            )
        else:
            raise Refused(
                ErrorCode.invalid_request,
                f"{config.name}: unknown operation {config.config_operation}",
            )
    return to_set, to_delete


async def alter_configs(client: Client, request: Request) -> Any:
    return await _alter_each(client, request, _replacing, incremental=False)


async def incremental_alter_configs(client: Client, request: Request) -> Any:
    return await _alter_each(client, request, _incremental, incremental=True)
