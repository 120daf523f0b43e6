"""Small wrappers over the HTTP API that keep the tests about rules, not request plumbing."""

from __future__ import annotations

from typing import Any

import httpx


async def create_topic(client: httpx.AsyncClient, name: str, partitions: int = 1) -> None:
    response = await client.post("/v1/topics", json={"name": name, "partitions": partitions})
    assert response.status_code == 201, response.text


async def init_pid(client: httpx.AsyncClient, transactional_id: str | None = None) -> int:
    response = await client.post("/v1/init-pid", json={"transactional_id": transactional_id})
    assert response.status_code == 200, response.text
    producer_id: int = response.json()["producer_id"]
    return producer_id


def batch(
    values: list[str],
    producer_id: int = -1,
    epoch: int = -1,
    sequence: int = -1,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "producer_id": producer_id,
        "producer_epoch": epoch,
        "base_sequence": sequence,
        "records": [{"value": v} for v in values],
        **extra,
    }


async def produce(
    client: httpx.AsyncClient, topic: str, partition: int, body: dict[str, Any]
) -> httpx.Response:
    return await client.post(f"/v1/topics/{topic}/partitions/{partition}/records", json=body)


async def fetch(
    client: httpx.AsyncClient, topic: str, partition: int = 0, **params: Any
) -> dict[str, Any]:
    response = await client.get(f"/v1/topics/{topic}/partitions/{partition}/records", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def read_all(
    client: httpx.AsyncClient, topic: str, partition: int = 0, **params: Any
) -> list[dict[str, Any]]:
    """Every record from offset 0 up to where the log ends for the isolation level."""
    records: list[dict[str, Any]] = []
    offset = 0
    while True:
        page = await fetch(client, topic, partition, offset=offset, max_records=10_000, **params)
        records.extend(page["records"])
        if page["next_offset"] == offset:
            return records
        offset = page["next_offset"]


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["code"] == code, body
    assert body["status"] == status
    assert isinstance(body["retriable"], bool)
    assert body["detail"]
    return body


async def read_paged(
    client: httpx.AsyncClient, topic: str, partition: int, page_size: int, **params: Any
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every record from offset 0, fetched `page_size` at a time until `next_offset` stops moving;
    also returns the last page, which carries the high watermark and LSO seen at the end."""
    records: list[dict[str, Any]] = []
    offset = 0
    while True:
        page = await fetch(client, topic, partition, offset=offset, max_records=page_size, **params)
        records.extend(page["records"])
        if page["next_offset"] == offset:
            return records, page
        assert page["next_offset"] > offset, page
        offset = page["next_offset"]


RECORD_BATCH = "application/vnd.kafka.record-batch"


async def produce_batch(
    client: httpx.AsyncClient,
    topic: str,
    partition: int,
    data: bytes,
    transactional_id: str | None = None,
) -> httpx.Response:
    """POST one record batch in Kafka's binary format."""
    params = {} if transactional_id is None else {"transactional_id": transactional_id}
    return await client.post(
        f"/v1/topics/{topic}/partitions/{partition}/records",
        content=data,
        params=params,
        headers={"content-type": RECORD_BATCH},
    )


async def fetch_batches(
    client: httpx.AsyncClient, topic: str, partition: int = 0, **params: Any
) -> httpx.Response:
    """GET record batches (binary); asserts a 200 of the record-batch content type."""
    response = await client.get(
        f"/v1/topics/{topic}/partitions/{partition}/records",
        params=params,
        headers={"accept": RECORD_BATCH},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == RECORD_BATCH
    return response
