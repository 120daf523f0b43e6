"""GetTelemetrySubscriptions and PushTelemetry: the instance rules (`instances`) run over the
stored subscriptions, and a push's metrics kept in the store for `GET /metrics`."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.message import DecodeError
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData
from sqlalchemy import delete

from coordinator.core.clock import now_ms
from coordinator.core.errors import InvalidRequest
from coordinator.log.errors import InvalidRecord
from coordinator.store import Store
from coordinator.telemetry import instances as rules
from coordinator.telemetry import subscriptions
from coordinator.telemetry.models import ClientTelemetry
from sdk import recordbatch

# A push inflates to at most this many times its (bounded) size: OTLP compresses a few times
# over; a bomb past it is refused, not inflated.
INFLATE_FACTOR = 16


@dataclass(frozen=True, slots=True)
class Subscribed:
    """GetTelemetrySubscriptions' answer."""

    instance_id: uuid.UUID
    subscription_id: int
    metrics: tuple[str, ...]
    interval_ms: int
    accepted_compression: tuple[int, ...]
    max_bytes: int


async def _instance(
    db: Store, known: rules.Instances, instance_id: uuid.UUID, metadata: Mapping[str, str]
) -> rules.Instance:
    asked = subscriptions.requested(
        await subscriptions.subscriptions(db),
        {**metadata, "client_instance_id": rules.kafka_uuid(instance_id)},
    )
    return known.instance(instance_id, asked, metadata)


async def subscribe(
    db: Store,
    known: rules.Instances,
    instance_id: uuid.UUID | None,
    metadata: Mapping[str, str],
    max_bytes: int,
) -> Subscribed:
    """What the client should push, and how often; a client without an instance id (or with
    the zero one) is given one."""
    if instance_id is None or instance_id == rules.RESERVED[0]:
        instance_id = uuid.uuid4()
    instance = await _instance(db, known, instance_id, metadata)
    rules.check_get(instance, now_ms())
    return Subscribed(
        instance_id,
        instance.subscription_id,
        instance.requested.metrics,
        instance.requested.interval_ms,
        rules.ACCEPTED_COMPRESSION,
        max_bytes,
    )


async def push(
    db: Store,
    known: rules.Instances,
    instance_id: uuid.UUID | None,
    metadata: Mapping[str, str],
    *,
    subscription_id: int,
    terminating: bool,
    compression_type: int,
    metrics: bytes,
    max_bytes: int,
) -> None:
    """Check a push as Kafka does, then keep its metrics as the instance's latest (shown until
    a minute, or three push intervals, after it); metrics that do not inflate or decode as
    OpenTelemetry's MetricsData are INVALID_RECORD, as Kafka answers a receiver's failure."""
    if instance_id is None or instance_id in rules.RESERVED:
        raise InvalidRequest(
            f"Invalid request from the client [{instance_id}], invalid client instance id"
        )
    instance = await _instance(db, known, instance_id, metadata)
    now = now_ms()
    rules.check_push(
        instance,
        now,
        subscription=subscription_id,
        compression_type=compression_type,
        size=len(metrics),
        terminating=terminating,
        max_bytes=max_bytes,
    )
    if not metrics:
        return
    inflated = _inflated(compression_type, metrics, max_bytes * INFLATE_FACTOR)
    row = {
        "client_instance_id": rules.kafka_uuid(instance_id),
        "client_id": metadata.get("client_id", ""),
        "software_name": metadata.get("client_software_name", ""),
        "software_version": metadata.get("client_software_version", ""),
        "source_address": metadata.get("client_source_address", ""),
        "source_port": int(metadata.get("client_source_port") or 0),
        "pushed_at_ms": now,
        "expires_at_ms": now + rules.expiry_ms(instance),
        "metrics": inflated,
    }
    async with db.write() as session:
        await session.execute(delete(ClientTelemetry).where(ClientTelemetry.expires_at_ms < now))
        await db.upsert(session, ClientTelemetry.__table__, [row], ["client_instance_id"])


def _inflated(compression_type: int, metrics: bytes, limit: int) -> bytes:
    try:
        data = recordbatch.inflate_payload(compression_type, metrics, limit)
        MetricsData.FromString(data)
    except (recordbatch.CorruptBatch, DecodeError) as bad:
        raise InvalidRecord(
            f"the pushed metrics are not OpenTelemetry's MetricsData: {bad}"
        ) from bad
    return data
