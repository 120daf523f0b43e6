"""`coordinator serve` with its Kafka listener, as Kafka's clients meet it, per module and store."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.support.services import ServiceProcess, free_port, serve_on_fresh_store


@dataclass
class Broker:
    service: ServiceProcess
    bootstrap: str
    # One client for a module's HTTP calls: a client per call costs tens of milliseconds of CPU.
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = self.service.client(timeout=30)

    @property
    def url(self) -> str:
        return self.service.url


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Broker]:
    port = free_port()
    for service in serve_on_fresh_store(
        request.param,
        tmp_path_factory.mktemp("kafka"),
        "kafka",
        COORDINATOR_KAFKA_LISTENER=f"127.0.0.1:{port}",
        COORDINATOR_GROUP_MIN_SESSION_TIMEOUT_MS="1000",
        # A classic group's first rebalance waits less than Kafka's 3 s for more members.
        COORDINATOR_GROUP_INITIAL_REBALANCE_DELAY_MS="200",
        # KIP-848 members learn of a new assignment at their next heartbeat: 1 s, not 5 s.
        COORDINATOR_GROUP_HEARTBEAT_INTERVAL_MS="1000",
        # A transaction that outlives its timeout is aborted within 0.2 s of it, not 10 s.
        COORDINATOR_TIMEOUT_CHECK_INTERVAL_MS="200",
        # Share groups: members learn of assignments within 1 s, and a group may lock its
        # records for as little as 1 s (Kafka's bounds: 5 s and 15 s).
        COORDINATOR_SHARE_HEARTBEAT_INTERVAL_MS="1000",
        COORDINATOR_SHARE_MIN_HEARTBEAT_INTERVAL_MS="500",
        COORDINATOR_SHARE_MIN_RECORD_LOCK_DURATION_MS="1000",
    ):
        broker = Broker(service, f"127.0.0.1:{port}")
        yield broker
        broker.http.close()


def create_topic(broker: Broker, partitions: int = 1, **configs: str) -> str:
    name = f"k{uuid.uuid4().hex[:10]}"
    body: dict[str, Any] = {"name": name, "partitions": partitions}
    if configs:
        body["configs"] = configs
    assert broker.http.post("/v1/topics", json=body).status_code == 201
    return name


def http_values(broker: Broker, topic: str, partition: int, committed: bool = True) -> list[str]:
    isolation = "read_committed" if committed else "read_uncommitted"
    values: list[str] = []
    offset = 0
    while True:
        response = broker.http.get(
            f"/v1/topics/{topic}/partitions/{partition}/records",
            params={"offset": offset, "isolation_level": isolation},
        )
        assert response.status_code == 200, response.text
        body = response.json()
        values += [r["value"] for r in body["records"]]
        if body["next_offset"] == offset or not body["records"]:
            return values
        offset = body["next_offset"]


def http_produce(broker: Broker, topic: str, partition: int, values: list[str]) -> None:
    response = broker.http.post(
        f"/v1/topics/{topic}/partitions/{partition}/records",
        json={"records": [{"key": v, "value": v} for v in values]},
    )
    assert response.status_code == 200, response.text
