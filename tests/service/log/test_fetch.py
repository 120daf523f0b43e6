"""Each rule of the HTTP API's Records section (Fetch) for plain appends, on SQLite and on Postgres.

These tests open no transaction, so both isolation levels must see every record below the high
watermark, and the last stable offset is the high watermark.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from tests.support.api import assert_problem, batch, create_topic, fetch, produce

ISOLATION_LEVELS = [None, "read_committed", "read_uncommitted"]


def records_path(topic: str, partition: int = 0) -> str:
    return f"/v1/topics/{topic}/partitions/{partition}/records"


def level(isolation_level: str | None) -> dict[str, Any]:
    """Query parameters asking for `isolation_level`, or none at all for the default."""
    return {} if isolation_level is None else {"isolation_level": isolation_level}


async def fill(
    client: httpx.AsyncClient, topic: str, sizes: list[int], partition: int = 0
) -> list[str]:
    """Append one plain batch per size; returns every value written, in offset order."""
    values: list[str] = []
    for size in sizes:
        chunk = [f"v{len(values) + i}" for i in range(size)]
        response = await produce(client, topic, partition, batch(chunk))
        assert response.status_code == 200, response.text
        values.extend(chunk)
    return values


async def describe_partition(client: httpx.AsyncClient, topic: str, partition: int) -> Any:
    return (await client.get(f"/v1/topics/{topic}")).json()["partitions"][partition]


@pytest.mark.parametrize("isolation_level", ISOLATION_LEVELS)
async def test_without_transactions_every_level_sees_every_record_below_the_high_watermark(
    client: httpx.AsyncClient, isolation_level: str | None
) -> None:
    await create_topic(client, "t")
    values = await fill(client, "t", [2, 3, 1])
    page = await fetch(client, "t", offset=0, **level(isolation_level))
    assert [(r["offset"], r["value"]) for r in page["records"]] == list(enumerate(values))
    assert page["next_offset"] == 6
    assert page["high_watermark"] == 6
    assert page["last_stable_offset"] == 6


async def test_next_offset_is_the_high_watermark_once_nothing_remains(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    await fill(client, "t", [3, 2])
    first = await fetch(client, "t", offset=0)
    assert first["next_offset"] == first["high_watermark"] == 5
    # The next fetch starts there and sees exactly what was appended since: no gap, no repeat.
    await fill(client, "t", [2])
    second = await fetch(client, "t", offset=first["next_offset"])
    assert [r["offset"] for r in second["records"]] == [5, 6]
    assert second["next_offset"] == second["high_watermark"] == 7


@pytest.mark.parametrize("isolation_level", ISOLATION_LEVELS)
async def test_fetch_at_the_high_watermark_returns_no_records_and_next_offset_equals_offset(
    client: httpx.AsyncClient, isolation_level: str | None
) -> None:
    await create_topic(client, "t")
    await fill(client, "t", [4])
    page = await fetch(client, "t", offset=4, **level(isolation_level))
    assert page == {
        "records": [],
        "next_offset": 4,
        "high_watermark": 4,
        "last_stable_offset": 4,
        "log_start_offset": 0,
    }


async def test_fetch_from_an_empty_partition_returns_nothing_at_offset_zero(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    page = await fetch(client, "t")
    assert page == {
        "records": [],
        "next_offset": 0,
        "high_watermark": 0,
        "last_stable_offset": 0,
        "log_start_offset": 0,
    }


async def test_max_records_bounds_the_page_and_next_offset_follows_its_last_record(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    await fill(client, "t", [5])
    page = await fetch(client, "t", offset=0, max_records=2)
    assert [r["offset"] for r in page["records"]] == [0, 1]
    assert page["next_offset"] == 2
    # The high watermark is the partition's, not the end of the page.
    assert page["high_watermark"] == 5
    rest = await fetch(client, "t", offset=2, max_records=10)
    assert [r["offset"] for r in rest["records"]] == [2, 3, 4]
    assert rest["next_offset"] == 5


async def test_max_records_defaults_to_500(client: httpx.AsyncClient) -> None:
    # The HTTP API's query template: `max_records=500`.
    await create_topic(client, "t")
    await fill(client, "t", [501])
    page = await fetch(client, "t")
    assert len(page["records"]) == 500
    assert page["next_offset"] == 500


async def test_max_records_up_to_10000_is_honoured(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    await fill(client, "t", [10_001])
    page = await fetch(client, "t", max_records=10_000)
    assert [r["offset"] for r in page["records"]] == list(range(10_000))
    assert page["next_offset"] == 10_000
    last = await fetch(client, "t", offset=10_000, max_records=10_000)
    assert [(r["offset"], r["value"]) for r in last["records"]] == [(10_000, "v10000")]
    assert last["next_offset"] == 10_001


@pytest.mark.parametrize("max_records", [0, 10_001])
async def test_max_records_outside_1_to_10000_is_invalid_request(
    client: httpx.AsyncClient, max_records: int
) -> None:
    await create_topic(client, "t")
    await fill(client, "t", [1])
    response = await client.get(records_path("t"), params={"max_records": max_records})
    body = assert_problem(response, 422, "INVALID_REQUEST")
    assert "max_records" in body["detail"]


@pytest.mark.parametrize("max_records", [1, 2, 3, 7])
async def test_paging_gives_every_offset_exactly_once_in_order(
    client: httpx.AsyncClient, max_records: int
) -> None:
    await create_topic(client, "t")
    values = await fill(client, "t", [1, 3, 2, 5, 1])
    seen: list[tuple[int, str]] = []
    offset = 0
    while True:
        page = await fetch(client, "t", offset=offset, max_records=max_records)
        offsets = [r["offset"] for r in page["records"]]
        if not offsets:
            assert page["next_offset"] == offset == page["high_watermark"]
            break
        assert len(offsets) <= max_records
        assert offsets == list(range(offset, offset + len(offsets)))
        assert page["next_offset"] == offsets[-1] + 1
        seen.extend((r["offset"], r["value"]) for r in page["records"])
        offset = page["next_offset"]
    assert seen == list(enumerate(values))


@pytest.mark.parametrize(
    ("offset", "max_records", "expected"),
    [
        (1, 500, [1, 2, 3, 4, 5, 6]),  # inside the first batch
        (2, 1, [2]),  # the last record of a batch
        (4, 2, [4, 5]),  # inside the second batch
        (6, 500, [6]),  # the last record of the log
    ],
)
async def test_fetch_from_the_middle_of_a_batch_starts_at_that_record(
    client: httpx.AsyncClient, offset: int, max_records: int, expected: list[int]
) -> None:
    await create_topic(client, "t")
    values = await fill(client, "t", [3, 4])  # offsets 0-2 and 3-6
    page = await fetch(client, "t", offset=offset, max_records=max_records)
    assert [(r["offset"], r["value"]) for r in page["records"]] == [
        (o, values[o]) for o in expected
    ]
    assert page["next_offset"] == expected[-1] + 1


async def test_answer_carries_the_partitions_high_watermark_and_last_stable_offset(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t", partitions=2)
    await fill(client, "t", [2, 1], partition=1)
    for partition in (0, 1):
        described = await describe_partition(client, "t", partition)
        page = await fetch(client, "t", partition, offset=0, max_records=1)
        assert page["high_watermark"] == described["high_watermark"]
        assert page["last_stable_offset"] == described["last_stable_offset"]
    assert (await fetch(client, "t", 1))["high_watermark"] == 3
    assert (await fetch(client, "t", 0))["high_watermark"] == 0


async def test_partitions_are_separate_logs(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t", partitions=2)
    await produce(client, "t", 0, batch(["a0", "b0"]))
    await produce(client, "t", 1, batch(["a1"]))
    await create_topic(client, "t2")
    await produce(client, "t2", 0, batch(["other"]))
    zero = await fetch(client, "t", 0)
    one = await fetch(client, "t", 1)
    assert [(r["offset"], r["value"]) for r in zero["records"]] == [(0, "a0"), (1, "b0")]
    assert [(r["offset"], r["value"]) for r in one["records"]] == [(0, "a1")]


async def test_headers_round_trip_in_both_encodings(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    headers = {"trace-id": "abc-123", "zürich": "€ 5", "empty": "", "Case": "upper"}
    body = {
        "records": [
            {"key": "k", "value": "v", "headers": headers},
            {"key": "k", "value": "w"},
            {"key": "k", "value": "x", "headers": {"only": "one"}},
        ]
    }
    assert (await produce(client, "t", 0, body)).status_code == 200
    text = await fetch(client, "t")
    assert [r["headers"] for r in text["records"]] == [headers, {}, {"only": "one"}]
    raw = await fetch(client, "t", encoding="base64")
    decoded = {k: base64.b64decode(v).decode() for k, v in raw["records"][0]["headers"].items()}
    assert decoded == headers


async def test_binary_header_values_round_trip_as_base64(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    raw = bytes(range(256))
    b64 = base64.b64encode(raw).decode()
    body = {"encoding": "base64", "records": [{"value": None, "headers": {"bin": b64, "e": ""}}]}
    assert (await produce(client, "t", 0, body)).status_code == 200
    (record,) = (await fetch(client, "t", encoding="base64"))["records"]
    assert record["headers"] == {"bin": b64, "e": ""}


@pytest.mark.parametrize("encoding", ["utf8", "base64"])
async def test_null_key_and_value_round_trip_and_are_not_empty_strings(
    client: httpx.AsyncClient, encoding: str
) -> None:
    await create_topic(client, "t")
    body = {
        "records": [
            {"key": None, "value": None},
            {"key": "", "value": ""},
            {"value": "v"},  # key omitted: null
            {"key": "k"},  # value omitted: null (a tombstone)
        ]
    }
    assert (await produce(client, "t", 0, body)).status_code == 200
    page = await fetch(client, "t", encoding=encoding)

    def written(text: str | None) -> str | None:
        if text is None or encoding == "utf8":
            return text
        return base64.b64encode(text.encode()).decode()

    assert [(r["key"], r["value"]) for r in page["records"]] == [
        (None, None),
        ("", ""),
        (None, written("v")),
        (written("k"), None),
    ]


async def test_text_written_as_utf8_reads_back_as_its_utf8_bytes_in_base64(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    text = "zürich € 🚀 \u0000 end"
    await produce(client, "t", 0, {"records": [{"key": "ключ", "value": text}]})
    (as_text,) = (await fetch(client, "t", encoding="utf8"))["records"]
    assert (as_text["key"], as_text["value"]) == ("ключ", text)
    (as_bytes,) = (await fetch(client, "t", encoding="base64"))["records"]
    assert base64.b64decode(as_bytes["key"]) == "ключ".encode()
    assert base64.b64decode(as_bytes["value"]) == text.encode()


async def test_bytes_written_as_base64_that_are_utf8_read_back_as_text(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    value = "naïve ☃".encode()
    body = {"encoding": "base64", "records": [{"value": base64.b64encode(value).decode()}]}
    await produce(client, "t", 0, body)
    (record,) = (await fetch(client, "t"))["records"]
    assert record["value"] == "naïve ☃"


@pytest.mark.parametrize(
    "record",
    [
        {"key": "/w==", "value": "YQ=="},
        {"key": "YQ==", "value": "gA=="},
        {"key": "YQ==", "value": "YQ==", "headers": {"h": "wyg="}},
    ],
    ids=["key", "value", "header"],
)
async def test_record_not_valid_utf8_asked_for_as_utf8_is_422_naming_its_offset(
    client: httpx.AsyncClient, record: dict[str, Any]
) -> None:
    await create_topic(client, "t")
    await fill(client, "t", [2])
    await produce(client, "t", 0, {"encoding": "base64", "records": [record]})
    response = await client.get(records_path("t"), params={"offset": 0})
    body = assert_problem(response, 422, "INVALID_REQUEST")
    assert "offset 2" in body["detail"]
    # The records before it can still be read as text, and it can be read as base64.
    before = await fetch(client, "t", offset=0, max_records=2)
    assert [r["value"] for r in before["records"]] == ["v0", "v1"]
    (raw,) = (await fetch(client, "t", offset=2, encoding="base64"))["records"]
    assert (raw["key"], raw["value"]) == (record["key"], record["value"])


async def test_records_carry_their_append_timestamp_in_milliseconds(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    await fill(client, "t", [2, 1])
    records = (await fetch(client, "t"))["records"]
    for record in records:
        assert isinstance(record["timestamp"], int)
        # Milliseconds: after 2020-01-01 and before 2100-01-01.
        assert 1_577_836_800_000 < record["timestamp"] < 4_102_444_800_000
    # Records of one batch were appended together.
    assert records[0]["timestamp"] == records[1]["timestamp"]


@pytest.mark.parametrize("isolation_level", ISOLATION_LEVELS)
@pytest.mark.parametrize("accept", ["application/json", "application/vnd.kafka.record-batch"])
async def test_offset_beyond_the_high_watermark_is_416_giving_both_bounds(
    client: httpx.AsyncClient, isolation_level: str | None, accept: str
) -> None:
    await create_topic(client, "t")
    await fill(client, "t", [3])
    response = await client.get(
        records_path("t"),
        params={"offset": 4, **level(isolation_level)},
        headers={"accept": accept},
    )
    body = assert_problem(response, 416, "OFFSET_OUT_OF_RANGE")
    assert "log start offset is 0" in body["detail"]
    assert "high watermark 3" in body["detail"]


@pytest.mark.parametrize(
    ("topic", "partition"),
    [("nope", 0), ("t", 2), ("t", 3), ("t", 2**31 - 1), ("T", 0)],
)
@pytest.mark.parametrize("isolation_level", ISOLATION_LEVELS)
async def test_unknown_topic_or_partition_is_404(
    client: httpx.AsyncClient, topic: str, partition: int, isolation_level: str | None
) -> None:
    await create_topic(client, "t", partitions=2)
    response = await client.get(records_path(topic, partition), params=level(isolation_level))
    body = assert_problem(response, 404, "UNKNOWN_TOPIC_OR_PARTITION")
    assert body["retriable"] is False
    assert topic in body["detail"]
