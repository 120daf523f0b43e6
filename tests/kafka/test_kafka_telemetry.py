"""Client telemetry (KIP-714) through the listener, byte by byte, on SQLite and on Postgres:
client-metrics subscriptions kept as Kafka's CLIENT_METRICS config resources
(IncrementalAlterConfigs, DescribeConfigs, ListConfigResources), GetTelemetrySubscriptions and
PushTelemetry with their refusals, and the pushed metrics shown by `GET /metrics` as Prometheus
samples. Kafka's own Java client and kafka-client-metrics.sh are tried in
tests/kafka/test_kafka_tools.py."""

from __future__ import annotations

import datetime
import gzip
import uuid
from typing import Any

import cramjam
import pytest
from kio.schema.errors import ErrorCode
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as otlp

from coordinator.admin.metrics import render
from coordinator.kafka.server import KafkaListener
from coordinator.telemetry.instances import kafka_uuid
from tests.support.kafka_listener import authenticated, connect, listener
from tests.support.kafka_wire import Connection

__all__ = ["listener"]

CLIENT_METRICS = 16
SET, DELETE, APPEND = 0, 1, 2
ALTER: Any = __import__("kio.schema.incremental_alter_configs.v1.request", fromlist=["x"])
DESCRIBE: Any = __import__("kio.schema.describe_configs.v4.request", fromlist=["x"])


async def _alter(
    connection: Connection, name: str, *ops: tuple[str, int, str | None], validate: bool = False
) -> ErrorCode:
    answer = await connection.call(
        44,
        1,
        resources=(
            ALTER.AlterConfigsResource(
                resource_type=CLIENT_METRICS,
                resource_name=name,
                configs=tuple(
                    ALTER.AlterableConfig(name=n, config_operation=o, value=v) for n, o, v in ops
                ),
            ),
        ),
        validate_only=validate,
    )
    code: ErrorCode = answer.responses[0].error_code
    return code


async def _described(connection: Connection, name: str) -> dict[str, tuple[str, int]]:
    answer = await connection.call(
        32,
        4,
        resources=(
            DESCRIBE.DescribeConfigsResource(
                resource_type=CLIENT_METRICS, resource_name=name, configuration_keys=None
            ),
        ),
        include_synonyms=False,
        include_documentation=False,
    )
    [result] = answer.results
    assert result.error_code == ErrorCode.none
    return {c.name: (c.value, c.config_source) for c in result.configs}


async def _listed(connection: Connection, version: int, *types: int) -> set[tuple[str, int]]:
    fields = {"resource_types": types} if version else {}
    answer = await connection.call(74, version, **fields)
    assert answer.error_code == ErrorCode.none
    return {
        (r.resource_name, getattr(r, "resource_type", CLIENT_METRICS))
        for r in answer.config_resources
    }


async def test_subscriptions_are_client_metrics_config_resources(listener: KafkaListener) -> None:
    connection = await connect(listener)
    metrics = ("metrics", SET, "org.apache.kafka.producer.,org.apache.kafka.consumer.")
    assert await _alter(connection, "producers", metrics, ("interval.ms", SET, "1000")) == (
        ErrorCode.none
    )
    set_and_default = {
        "interval.ms": ("1000", 7),  # CLIENT_METRICS_CONFIG
        "metrics": ("org.apache.kafka.producer.,org.apache.kafka.consumer.", 7),
        "match": ("", 5),  # DEFAULT_CONFIG
    }
    assert await _described(connection, "producers") == set_and_default
    # Refused whole, as Kafka refuses them, and nothing changes.
    assert await _alter(connection, "producers", ("interval.ms", SET, "50")) == (
        ErrorCode.invalid_request
    )
    assert (
        await _alter(connection, "producers", ("colour", SET, "red")) == ErrorCode.invalid_request
    )
    assert (
        await _alter(connection, "producers", ("match", SET, "who=me")) == ErrorCode.invalid_config
    )
    # Kafka's controller knows no list type for these configs: no APPEND.
    assert (
        await _alter(connection, "producers", ("metrics", APPEND, "x.")) == ErrorCode.invalid_config
    )
    assert await _alter(connection, "", metrics) == ErrorCode.invalid_request
    assert await _alter(connection, "checked", metrics, validate=True) == ErrorCode.none
    assert await _described(connection, "producers") == set_and_default
    # A name no subscription has shows the defaults alone.
    assert await _described(connection, "checked") == {
        "interval.ms": ("300000", 5),
        "metrics": ("", 5),
        "match": ("", 5),
    }
    assert await _listed(connection, 0) == {("producers", CLIENT_METRICS)}
    assert await _listed(connection, 1, CLIENT_METRICS) == {("producers", CLIENT_METRICS)}
    assert ("0", 4) in await _listed(connection, 1)  # every type: the broker among them
    # A subscription whose configs are all deleted is gone.
    deleted = await _alter(
        connection, "producers", ("metrics", DELETE, None), ("interval.ms", DELETE, None)
    )
    assert deleted == ErrorCode.none
    assert await _listed(connection, 0) == set()


def _metrics_data(total: float) -> bytes:
    point = otlp.NumberDataPoint(
        as_double=total,
        attributes=[KeyValue(key="topic", value=AnyValue(string_value="payments"))],
    )
    sent = otlp.Metric(
        name="org.apache.kafka.producer.record.send.total",
        description="records sent",
        sum=otlp.Sum(
            data_points=[point],
            is_monotonic=True,
            aggregation_temporality=otlp.AGGREGATION_TEMPORALITY_CUMULATIVE,
        ),
    )
    waiting = otlp.Metric(
        name="org.apache.kafka.producer.buffer.available.bytes",
        gauge=otlp.Gauge(data_points=[otlp.NumberDataPoint(as_int=4096)]),
    )
    data = otlp.MetricsData(
        resource_metrics=[
            otlp.ResourceMetrics(scope_metrics=[otlp.ScopeMetrics(metrics=[sent, waiting])])
        ]
    )
    return data.SerializeToString()


async def _subscribe(connection: Connection, instance_id: uuid.UUID | None = None) -> Any:
    return await connection.call(71, 0, client_instance_id=instance_id)


async def _push(
    connection: Connection, subscribed: Any, codec: int, data: bytes, **more: Any
) -> ErrorCode:
    fields = {
        "client_instance_id": subscribed.client_instance_id,
        "subscription_id": subscribed.subscription_id,
        "terminating": False,
        "compression_type": codec,
        "metrics": data,
        **more,
    }
    answer = await connection.call(72, 0, **fields)
    code: ErrorCode = answer.error_code
    return code


async def _scraped(listener: KafkaListener) -> str:
    async with listener.db.read() as session:
        return (await render(session)).decode()


async def test_a_client_pushes_what_it_is_subscribed_to_and_metrics_show_it(
    listener: KafkaListener,
) -> None:
    connection = await connect(listener)
    versions = await connection.call(
        18, 3, client_software_name="payments-app", client_software_version="1.2"
    )
    assert versions.error_code == ErrorCode.none
    assert {(k.api_key, k.max_version) for k in versions.api_keys} >= {(71, 0), (72, 0), (74, 1)}
    # Nothing is asked of a client no subscription matches.
    other = await _alter(
        connection,
        "others",
        ("metrics", SET, "*"),
        ("interval.ms", SET, "100"),
        ("match", SET, "client_software_name=franz-go"),
    )
    assert other == ErrorCode.none
    nothing = await _subscribe(connection)
    assert nothing.error_code == ErrorCode.none
    assert nothing.requested_metrics == ()
    assert nothing.push_interval == datetime.timedelta(minutes=5)
    assert (
        await _alter(
            connection,
            "payments",
            ("metrics", SET, "org.apache.kafka.producer."),
            ("interval.ms", SET, "100"),
            ("match", SET, "client_software_name=payments-.*,client_id=test"),
        )
        == ErrorCode.none
    )
    instance_id = uuid.uuid4()
    subscribed = await _subscribe(connection, instance_id)
    assert subscribed.error_code == ErrorCode.none
    assert subscribed.client_instance_id == instance_id
    assert subscribed.requested_metrics == ("org.apache.kafka.producer.",)
    assert subscribed.push_interval == datetime.timedelta(milliseconds=100)
    assert subscribed.accepted_compression_types == (4, 3, 1, 2)  # zstd, lz4, gzip, snappy
    assert subscribed.telemetry_max_bytes == listener.settings.telemetry_max_bytes
    assert subscribed.delta_temporality is False  # cumulative, as Prometheus wants
    # A second ask within the interval is throttled.
    assert (await _subscribe(connection, instance_id)).error_code == (
        ErrorCode.throttling_quota_exceeded
    )
    # The first push after the ask is taken at once, the next one early is throttled (the
    # client's next push is at least 100 ms later).
    assert (
        await _push(connection, subscribed, 1, gzip.compress(_metrics_data(41))) == ErrorCode.none
    )
    early = await _push(connection, subscribed, 4, bytes(cramjam.zstd.compress(_metrics_data(42))))
    assert early == ErrorCode.throttling_quota_exceeded
    scraped = await _scraped(listener)
    labels = (
        f'client_id="test",client_instance_id="{kafka_uuid(instance_id)}",'
        'client_software_name="payments-app",client_software_version="1.2"'
    )
    assert (
        f'org_apache_kafka_producer_record_send_total{{{labels},topic="payments"}} 41.0' in scraped
    )
    assert f"org_apache_kafka_producer_buffer_available_bytes{{{labels}}} 4096.0" in scraped
    assert "# TYPE org_apache_kafka_producer_record_send_total counter" in scraped


async def test_pushes_are_refused_as_kafka_refuses_them(listener: KafkaListener) -> None:
    # Each push is a new client instance's first (never early), so only the refusal tried
    # is met.
    connection = await connect(listener)
    assert (
        await _alter(connection, "all", ("metrics", SET, "*"), ("interval.ms", SET, "100"))
        == ErrorCode.none
    )
    subscribed = await _subscribe(connection)
    assert subscribed.client_instance_id not in (None, uuid.UUID(int=0))  # one is given
    data = _metrics_data(1)
    nobody = await connection.call(
        72,
        0,
        client_instance_id=uuid.UUID(int=0),
        subscription_id=1,
        terminating=False,
        compression_type=0,
        metrics=data,
    )
    assert nobody.error_code == ErrorCode.invalid_request
    stale = await _push(
        connection, subscribed, 0, data, subscription_id=subscribed.subscription_id ^ 1
    )
    assert stale == ErrorCode.unknown_subscription_id
    fresh = await _subscribe(connection)
    assert await _push(connection, fresh, 7, data) == ErrorCode.unsupported_compression_type
    huge = b"\0" * (listener.settings.telemetry_max_bytes + 1)
    fresh = await _subscribe(connection)
    assert await _push(connection, fresh, 0, huge) == ErrorCode.telemetry_too_large
    fresh = await _subscribe(connection)
    assert await _push(connection, fresh, 0, b"\xff\xff not protobuf") == ErrorCode.invalid_record
    # A gzip bomb within the size limit is refused at its inflation bound, not inflated.
    bomb = gzip.compress(b"\0" * (20 * listener.settings.telemetry_max_bytes))
    assert len(bomb) < listener.settings.telemetry_max_bytes
    fresh = await _subscribe(connection)
    assert await _push(connection, fresh, 1, bomb) == ErrorCode.invalid_record
    assert "org_apache_kafka" not in await _scraped(listener)
    # A terminating push is the last one taken.
    fresh = await _subscribe(connection)
    assert await _push(
        connection, fresh, 3, bytes(cramjam.lz4.compress(data)), terminating=True
    ) == (ErrorCode.none)
    assert await _push(connection, fresh, 0, data) == ErrorCode.invalid_request
    assert f'client_instance_id="{kafka_uuid(fresh.client_instance_id)}"' in await _scraped(
        listener
    )


@pytest.mark.parametrize("listener", [True], indirect=True)
async def test_subscriptions_take_the_cluster_s_rights(listener: KafkaListener) -> None:
    reader, _ = await authenticated(listener, "reader", "reader-token-1")
    refused = await _alter(reader, "mine", ("metrics", SET, "*"))
    assert refused == ErrorCode.cluster_authorization_failed
    listed = await reader.call(74, 1, resource_types=(CLIENT_METRICS,))
    assert listed.error_code == ErrorCode.cluster_authorization_failed
    # Any client may ask what to push, as on Kafka.
    assert (await _subscribe(reader)).error_code == ErrorCode.none
