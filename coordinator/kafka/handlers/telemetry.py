"""Client telemetry (KIP-714): GetTelemetrySubscriptions and PushTelemetry onto
`coordinator.telemetry`, and ListConfigResources, which lists the config resources of the types
asked (kafka-client-metrics.sh --list asks for the client-metrics subscriptions)."""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core.acls import Operation
from coordinator.groups import configs as group_configs
from coordinator.kafka.connection import Client
from coordinator.kafka.errors import FAILURES, error_code
from coordinator.kafka.handlers.cluster import NODE_ID
from coordinator.kafka.wire import Request
from coordinator.log import topics as log_topics
from coordinator.telemetry import service, subscriptions

# ConfigResource types (Kafka's ConfigResource.Type ids).
TOPIC, BROKER, CLIENT_METRICS, GROUP = 2, 4, 16, 32


def _metadata(client: Client) -> dict[str, str]:
    """The client as a subscription's `match` sees it (ClientMetricsInstanceMetadata)."""
    return {
        "client_id": client.client_id,
        "client_software_name": client.software_name,
        "client_software_version": client.software_version,
        "client_source_address": client.client_host,
        "client_source_port": str(client.client_port),
    }


async def get_telemetry_subscriptions(client: Client, request: Request) -> Any:
    reply = request.reply
    try:
        subscribed = await service.subscribe(
            client.db,
            client.telemetry,
            request.body.client_instance_id,
            _metadata(client),
            client.settings.telemetry_max_bytes,
        )
    except FAILURES as failure:
        return reply.body(
            error_code=error_code(failure),
            client_instance_id=None,
            subscription_id=0,
            accepted_compression_types=(),
            push_interval=datetime.timedelta(0),
            telemetry_max_bytes=0,
            delta_temporality=False,
            requested_metrics=(),
        )
    return reply.body(
        error_code=ErrorCode.none,
        client_instance_id=subscribed.instance_id,
        subscription_id=subscribed.subscription_id,
        accepted_compression_types=subscribed.accepted_compression,
        push_interval=datetime.timedelta(milliseconds=subscribed.interval_ms),
        telemetry_max_bytes=subscribed.max_bytes,
        # Cumulative values, which Prometheus expects (`coordinator.telemetry.export`).
        delta_temporality=False,
        requested_metrics=subscribed.metrics,
    )


async def push_telemetry(client: Client, request: Request) -> Any:
    body = request.body
    try:
        await service.push(
            client.db,
            client.telemetry,
            body.client_instance_id,
            {**_metadata(client)},
            subscription_id=body.subscription_id,
            terminating=body.terminating,
            compression_type=body.compression_type,
            metrics=body.metrics,
            max_bytes=client.settings.telemetry_max_bytes,
        )
    except FAILURES as failure:
        return request.reply.body(error_code=error_code(failure))
    return request.reply.body(error_code=ErrorCode.none)


async def list_config_resources(client: Client, request: Request) -> Any:
    """Version 0 (ListClientMetricsResources) lists the client-metrics subscriptions; version 1
    the resources of the types asked (none: every type kept here), groups among them: those
    that exist and those with configs set (KIP-1142)."""
    reply = request.reply
    assert client.access is not None
    asked = set(getattr(request.body, "resource_types", ()) or ())
    if request.version == 0:
        asked = {CLIENT_METRICS}
    try:
        client.access.cluster(Operation.DESCRIBE_CONFIGS)
        found: list[tuple[str, int]] = []
        if not asked or TOPIC in asked:
            listed = await log_topics.list_topics(client.db)
            found += [(t.name, TOPIC) for t in listed.topics]
        if not asked or BROKER in asked:
            found.append((str(NODE_ID), BROKER))
        if not asked or CLIENT_METRICS in asked:
            found += [(n, CLIENT_METRICS) for n in await subscriptions.list_names(client.db)]
        if request.version >= 1 and (not asked or GROUP in asked):
            found += [(n, GROUP) for n in await group_configs.list_names(client.db)]
    except FAILURES as failure:
        return reply.body(error_code=error_code(failure), config_resources=())
    return reply.body(
        error_code=ErrorCode.none,
        config_resources=tuple(
            reply("ConfigResource", resource_name=name, resource_type=kind) for name, kind in found
        ),
    )
