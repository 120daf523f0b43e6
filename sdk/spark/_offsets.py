"""Offsets as Spark's Kafka source spells them: `{"topic": {"0": 12}}`, -2 for earliest, -1 for
latest; and the driver-side calls that resolve them against the coordinator.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from sdk._config import AdminConfig
from sdk._errors import ConfigError
from sdk._http import HttpClient, api_path

__all__ = [
    "EARLIEST",
    "LATEST",
    "Offsets",
    "client",
    "committed_offsets",
    "latest_offsets",
    "offsets_json",
    "parse_offsets",
    "partitions_of",
]

EARLIEST = -2
LATEST = -1

Offsets = dict[str, dict[int, int]]


def client(url: str, token: str | None = None, *, timeout_ms: int = 60_000) -> HttpClient:
    """An HTTP client for one-off calls of the Spark integration (driver or task)."""
    config = AdminConfig(
        coordinator_url=url, coordinator_token=token, default_api_timeout_ms=timeout_ms
    )
    return HttpClient(config)


def offsets_json(offsets: Mapping[str, Mapping[int, int]]) -> str:
    """`{"topic": {"0": 12}}`: the JSON form Spark's Kafka options use."""
    return orjson.dumps(
        {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(offsets.items())}
    ).decode()


def parse_offsets(text: str, option: str) -> Offsets:
    """The JSON form back into `{topic: {partition: offset}}`; a ConfigError naming `option`."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(
            f'{option}: not JSON ({exc}); expected e.g. {{"t": {{"0": 12}}}}'
        ) from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{option}: expected a JSON object of topics")
    result: Offsets = {}
    for topic, parts in doc.items():
        if not isinstance(parts, dict):
            raise ConfigError(f"{option}: {topic!r} must map partitions to offsets")
        for partition, offset in parts.items():
            if not str(partition).isdigit() or type(offset) is not int or offset < EARLIEST:
                raise ConfigError(f"{option}: {topic}/{partition}: {offset!r} is not an offset")
            result.setdefault(topic, {})[int(partition)] = offset
    return result


def partitions_of(http: HttpClient, topics: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """Each topic's partitions as `GET /v1/topics/{topic}` describes them."""
    described = {}
    for topic in topics:
        doc = http.call("GET", api_path("topics", topic))
        described[topic] = sorted(doc["partitions"], key=lambda p: p["partition"])
    return described


def latest_offsets(
    url: str,
    topics: Iterable[str],
    *,
    isolation_level: str = "read_committed",
    token: str | None = None,
) -> Offsets:
    """Where each partition ends now: the last stable offset under read_committed, the high
    watermark under read_uncommitted. Pin these as `endingOffsets` so the very offsets read are
    the ones committed with the output."""
    field = "last_stable_offset" if isolation_level == "read_committed" else "high_watermark"
    http = client(url, token)
    try:
        described = partitions_of(http, topics)
    finally:
        http.close()
    return {t: {p["partition"]: p[field] for p in parts} for t, parts in described.items()}


def committed_offsets(
    url: str,
    group: str,
    topics: Iterable[str],
    *,
    token: str | None = None,
    timeout: float = 60.0,
) -> Offsets:
    """The group's committed offsets for every partition of `topics` (EARLIEST where it has
    none), to start a read where the last committed run ended. Waits while a transaction holds
    pending offsets for the group (UNSTABLE_OFFSET_COMMIT), as Kafka's require_stable does."""
    http = client(url, token)
    try:
        described = partitions_of(http, topics)
        result: Offsets = {
            t: {p["partition"]: EARLIEST for p in parts} for t, parts in described.items()
        }
        deadline = time.monotonic() + timeout
        for topic in result:
            # `call` retries UNSTABLE_OFFSET_COMMIT (retriable) until the deadline.
            doc = http.call(
                "GET",
                api_path("groups", group, "offsets"),
                params={"topic": topic, "require_stable": "true"},
                deadline=deadline,
            )
            for entry in doc["offsets"]:
                if entry["partition"] in result[topic]:
                    result[topic][entry["partition"]] = entry["offset"]
        return result
    finally:
        http.close()
