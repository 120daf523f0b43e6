"""Each rule of the HTTP API's Records section (Produce), on SQLite and on Postgres."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from coordinator.log.sequences import last_sequence_of, next_sequence
from tests.support.api import (
    assert_problem,
    batch,
    create_topic,
    fetch,
    init_pid,
    produce,
    read_all,
)


async def high_watermark(client: httpx.AsyncClient, topic: str, partition: int = 0) -> int:
    response = await client.get(f"/v1/topics/{topic}")
    hw: int = response.json()["partitions"][partition]["high_watermark"]
    return hw


async def test_batch_of_n_records_takes_n_consecutive_offsets(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    pid = await init_pid(client)
    first = await produce(client, "t", 0, batch(["a", "b", "c"], pid, 0, 0))
    second = await produce(client, "t", 0, batch(["d", "e"], pid, 0, 3))
    assert first.json() == {"base_offset": 0, "last_offset": 2, "duplicate": False}
    assert second.json() == {"base_offset": 3, "last_offset": 4, "duplicate": False}
    records = await read_all(client, "t")
    assert [(r["offset"], r["value"]) for r in records] == list(enumerate("abcde"))


async def test_plain_append_without_producer_id_is_not_deduplicated(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    body = {"records": [{"key": "k", "value": "v"}]}
    first = await produce(client, "t", 0, body)
    second = await produce(client, "t", 0, body)
    assert first.json()["duplicate"] is False and second.json()["duplicate"] is False
    assert second.json()["base_offset"] == 1
    assert len(await read_all(client, "t")) == 2


async def test_first_batch_of_an_epoch_starts_at_sequence_zero(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    pid = await init_pid(client)
    response = await produce(client, "t", 0, batch(["a"], pid, 0, 5))
    assert_problem(response, 409, "UNKNOWN_PRODUCER_ID")
    assert await high_watermark(client, "t") == 0


async def test_next_batch_starts_at_last_sequence_plus_one(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    pid = await init_pid(client)
    assert (await produce(client, "t", 0, batch(["a", "b"], pid, 0, 0))).status_code == 200
    assert (await produce(client, "t", 0, batch(["c"], pid, 0, 2))).status_code == 200
    assert (await produce(client, "t", 0, batch(["d"], pid, 0, 3))).status_code == 200
    assert await high_watermark(client, "t") == 4


async def test_retried_batch_is_answered_with_original_offsets_and_not_written(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    pid = await init_pid(client)
    original = await produce(client, "t", 0, batch(["a", "b"], pid, 0, 0))
    retry = await produce(client, "t", 0, batch(["a", "b"], pid, 0, 0))
    assert retry.status_code == 200
    assert retry.json() == {**original.json(), "duplicate": True}
    assert await high_watermark(client, "t") == 2
    assert [r["value"] for r in await read_all(client, "t")] == ["a", "b"]


async def test_any_batch_of_the_current_epoch_is_recognised_not_only_the_last_five(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    pid = await init_pid(client)
    answers = []
    for i in range(12):
        response = await produce(client, "t", 0, batch([f"v{i}"], pid, 0, i))
        answers.append(response.json())
    for i in (0, 3, 6):  # far older than Kafka's five-batch window
        retry = await produce(client, "t", 0, batch([f"v{i}"], pid, 0, i))
        assert retry.json() == {**answers[i], "duplicate": True}
    assert await high_watermark(client, "t") == 12


async def test_sequence_gap_is_out_of_order_and_writes_nothing(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    pid = await init_pid(client)
    await produce(client, "t", 0, batch(["a"], pid, 0, 0))
    response = await produce(client, "t", 0, batch(["c"], pid, 0, 2))
    assert_problem(response, 409, "OUT_OF_ORDER_SEQUENCE_NUMBER")
    assert await high_watermark(client, "t") == 1


async def test_lower_unknown_sequence_is_out_of_order(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    pid = await init_pid(client)
    await produce(client, "t", 0, batch(["a", "b", "c"], pid, 0, 0))
    await produce(client, "t", 0, batch(["d", "e", "f"], pid, 0, 3))
    # Sequence 1 was written, but inside a batch that began at 0: not a batch we know.
    response = await produce(client, "t", 0, batch(["b"], pid, 0, 1))
    assert_problem(response, 409, "OUT_OF_ORDER_SEQUENCE_NUMBER")
    # Same base sequence as a written batch but a different length is not that batch either.
    response = await produce(client, "t", 0, batch(["a", "b"], pid, 0, 0))
    assert_problem(response, 409, "OUT_OF_ORDER_SEQUENCE_NUMBER")
    assert await high_watermark(client, "t") == 6


async def test_an_idempotent_producer_may_raise_its_own_epoch_from_sequence_0(
    client: httpx.AsyncClient,
) -> None:
    # KIP-360 as Kafka's broker takes it (docs/pages/http-api.md is silent): Kafka's Java client
    # raises an idempotent producer's epoch itself after a sequence it cannot resolve, and starts
    # again at sequence 0; the older epoch is refused on that partition from then on.
    await create_topic(client, "t")
    pid = await init_pid(client)
    await produce(client, "t", 0, batch(["a"], pid, 0, 0))
    response = await produce(client, "t", 0, batch(["b"], pid, 1, 1))
    assert_problem(response, 409, "OUT_OF_ORDER_SEQUENCE_NUMBER")
    raised = await produce(client, "t", 0, batch(["b"], pid, 1, 0))
    assert raised.json() == {"base_offset": 1, "last_offset": 1, "duplicate": False}
    response = await produce(client, "t", 0, batch(["c"], pid, 0, 1))
    assert_problem(response, 409, "INVALID_PRODUCER_EPOCH")
    assert await high_watermark(client, "t") == 2


async def test_producer_id_never_issued_is_unknown_producer_id(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    response = await produce(client, "t", 0, batch(["a"], 987654321, 0, 0))
    assert_problem(response, 409, "UNKNOWN_PRODUCER_ID")
    assert await high_watermark(client, "t") == 0


async def test_producer_without_state_on_partition_must_start_at_zero(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=2)
    pid = await init_pid(client)
    await produce(client, "t", 0, batch(["a"], pid, 0, 0))
    # Sequences are per partition: partition 1 has never seen this producer.
    response = await produce(client, "t", 1, batch(["b"], pid, 0, 1))
    assert_problem(response, 409, "UNKNOWN_PRODUCER_ID")
    ok = await produce(client, "t", 1, batch(["b"], pid, 0, 0))
    assert ok.json() == {"base_offset": 0, "last_offset": 0, "duplicate": False}


async def test_unknown_topic_or_partition_is_404(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t", partitions=2)
    assert_problem(
        await produce(client, "nope", 0, batch(["a"])), 404, "UNKNOWN_TOPIC_OR_PARTITION"
    )
    assert_problem(await produce(client, "t", 2, batch(["a"])), 404, "UNKNOWN_TOPIC_OR_PARTITION")
    response = await client.get("/v1/topics/t/partitions/7/records")
    assert_problem(response, 404, "UNKNOWN_TOPIC_OR_PARTITION")


class TestWithSmallBodyLimit:
    @pytest.fixture
    def settings_overrides(self) -> dict[str, Any]:
        return {"max_request_bytes": 4096}

    async def test_batch_over_size_limit_is_413_and_writes_nothing(
        self, client: httpx.AsyncClient
    ) -> None:
        await create_topic(client, "t")
        pid = await init_pid(client)
        response = await produce(client, "t", 0, batch(["x" * 5000], pid, 0, 0))
        assert_problem(response, 413, "RECORD_LIST_TOO_LARGE")
        assert await high_watermark(client, "t") == 0
        # The producer's sequence did not move: the same sequence still starts its first batch.
        assert (await produce(client, "t", 0, batch(["small"], pid, 0, 0))).status_code == 200

    async def test_other_oversized_bodies_are_413_invalid_request(
        self, client: httpx.AsyncClient
    ) -> None:
        response = await client.post("/v1/topics", json={"name": "t" * 5000})
        assert_problem(response, 413, "INVALID_REQUEST")
        assert (await client.get("/v1/topics")).json() == {"topics": []}


async def test_keys_values_and_headers_are_bytes_in_either_encoding(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    raw = bytes(range(256))
    b64 = base64.b64encode(raw).decode()
    await produce(
        client,
        "t",
        0,
        {"encoding": "base64", "records": [{"key": b64, "value": b64, "headers": {"h": b64}}]},
    )
    await produce(
        client, "t", 0, {"records": [{"key": None, "value": "zürich €", "headers": {"x": "y"}}]}
    )
    page = await fetch(client, "t", encoding="base64")
    first, second = page["records"]
    assert base64.b64decode(first["key"]) == raw
    assert base64.b64decode(first["value"]) == raw
    assert base64.b64decode(first["headers"]["h"]) == raw
    assert second["key"] is None
    assert base64.b64decode(second["value"]) == "zürich €".encode()
    text = await fetch(client, "t", offset=1)
    assert text["records"][0]["value"] == "zürich €"
    # Bytes that are not UTF-8 asked for as text: 422 naming the offset.
    response = await client.get("/v1/topics/t/partitions/0/records", params={"offset": 0})
    body = assert_problem(response, 422, "INVALID_REQUEST")
    assert "offset 0" in body["detail"]


async def test_record_timestamps_are_append_time_in_milliseconds(
    client: httpx.AsyncClient,
) -> None:
    import time

    await create_topic(client, "t")
    before = int(time.time() * 1000)
    await produce(client, "t", 0, batch(["a"]))
    after = int(time.time() * 1000)
    (record,) = (await fetch(client, "t"))["records"]
    assert before <= record["timestamp"] <= after


def test_sequences_wrap_after_int32_max_as_in_kafka() -> None:
    assert next_sequence(2**31 - 1) == 0
    assert next_sequence(41) == 42
    assert last_sequence_of(2**31 - 2, 3) == 0
    assert last_sequence_of(0, 5) == 4
