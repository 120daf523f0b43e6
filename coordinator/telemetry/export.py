"""The clients' pushed metrics as Prometheus samples, read at scrape time from the store.

Each OpenTelemetry metric becomes a family named as OpenTelemetry's Prometheus exporter names it
(`org.apache.kafka.producer.record.send.rate`: `org_apache_kafka_producer_record_send_rate`); a
monotonic sum is a counter (`_total`), a gauge or another sum a gauge. Every sample carries the
client's `client_instance_id` (as Kafka writes a Uuid, as the client logs it), `client_id`,
`client_software_name` and `client_software_version`, then the data point's own attributes (a
topic, a node id). Clients are asked for cumulative values (GetTelemetrySubscriptions'
`delta_temporality` is false, where Kafka's broker asks for deltas for the OTLP backends its
plugins feed), so a counter's sample is its total, as Prometheus expects. Histograms and
summaries, which Kafka's clients do not push, are left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, MetricsData
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric as OtelMetric
from prometheus_client.core import Metric
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.telemetry.models import ClientTelemetry

_NOT_NAME = re.compile(r"[^a-zA-Z0-9_]")
_CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


def prometheus_name(name: str) -> str:
    cleaned = _NOT_NAME.sub("_", name)
    return f"_{cleaned}" if cleaned[:1].isdigit() else cleaned


def _value(value: AnyValue) -> str:
    kind = value.WhichOneof("value")
    return "" if kind is None else str(getattr(value, kind))


def _point_value(point: object) -> float:
    kind = point.WhichOneof("value")  # type: ignore[attr-defined]
    return float(getattr(point, kind)) if kind else float("nan")


def families(pushes: Iterable[tuple[Mapping[str, str], bytes]]) -> list[Metric]:
    """Families of every client's latest push ((the client's labels, its MetricsData))."""
    found: dict[str, Metric] = {}
    for client, data in pushes:
        for resource in MetricsData.FromString(data).resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    _add(found, client, metric)
    return list(found.values())


def _add(found: dict[str, Metric], client: Mapping[str, str], metric: OtelMetric) -> None:
    """One client's metric into its family (one name, one type: a clash is left out)."""
    kind = metric.WhichOneof("data")
    if kind == "gauge":
        points, counter = metric.gauge.data_points, False
    elif kind == "sum":
        points = metric.sum.data_points
        counter = metric.sum.is_monotonic and metric.sum.aggregation_temporality == _CUMULATIVE
    else:
        return
    name = prometheus_name(metric.name)
    if counter:
        name = name.removesuffix("_total")
    family = found.setdefault(
        name, Metric(name, metric.description or metric.name, "counter" if counter else "gauge")
    )
    if family.type != ("counter" if counter else "gauge"):
        return
    for point in points:
        labels = dict(client)
        for attribute in point.attributes:
            labels.setdefault(prometheus_name(attribute.key), _value(attribute.value))
        family.add_sample(f"{name}_total" if counter else name, labels, _point_value(point))


async def client_families(session: AsyncSession, now_ms: int) -> list[Metric]:
    """The families of every client's latest push that has not expired."""
    rows = await session.execute(
        select(
            ClientTelemetry.client_instance_id,
            ClientTelemetry.client_id,
            ClientTelemetry.software_name,
            ClientTelemetry.software_version,
            ClientTelemetry.metrics,
        )
        .where(ClientTelemetry.expires_at_ms >= now_ms)
        .order_by(ClientTelemetry.client_instance_id)
    )
    return families(
        (
            {
                "client_instance_id": instance,
                "client_id": client_id,
                "client_software_name": software,
                "client_software_version": version,
            },
            data,
        )
        for instance, client_id, software, version, data in rows
    )
