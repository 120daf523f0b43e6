"""Compressed batches cannot make the service inflate without bound (issue 21, item 2): a batch
that would inflate past COORDINATOR_MAX_UNCOMPRESSED_BATCH_BYTES or past its ratio is refused
with nothing written, through both doors; large compressed batches are checked off the event
loop; a JSON fetch's `max_bytes` bounds the records it answers, not only the batches it reads.
On SQLite and on Postgres."""

from __future__ import annotations

import random
import threading
from typing import Any

import httpx
import pytest

from coordinator.log import edge
from sdk import recordbatch as rb
from tests.support.api import assert_problem, create_topic, produce_batch

MiB = 1024 * 1024


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    return {"max_uncompressed_batch_bytes": 4 * MiB, "max_compression_ratio": 50}


def bomb(size: int, codec: int = rb.COMPRESSION_GZIP) -> bytes:
    """One record whose value is `size` zero bytes: compresses to almost nothing."""
    return rb.build([(0, b"k", bytes(size), [])], compression=codec)


async def high_watermark(client: httpx.AsyncClient, topic: str) -> int:
    described = (await client.get(f"/v1/topics/{topic}")).json()
    hw: int = described["partitions"][0]["high_watermark"]
    return hw


@pytest.mark.parametrize("codec", [rb.COMPRESSION_GZIP, rb.COMPRESSION_SNAPPY])
async def test_a_batch_inflating_past_the_absolute_cap_is_refused_and_writes_nothing(
    client: httpx.AsyncClient, codec: int
) -> None:
    await create_topic(client, "t")
    data = bomb(8 * MiB, codec)
    assert len(data) < 1 * MiB  # well under every cap on the compressed size
    response = await produce_batch(client, "t", 0, data)
    assert_problem(response, 413, "RECORD_LIST_TOO_LARGE")
    assert "inflate" in response.json()["detail"]
    assert await high_watermark(client, "t") == 0


@pytest.mark.parametrize("codec", [rb.COMPRESSION_LZ4, rb.COMPRESSION_ZSTD])
async def test_an_lz4_or_zstd_bomb_is_refused_and_writes_nothing(
    client: httpx.AsyncClient, codec: int
) -> None:
    # These codecs cannot tell a stream past the buffer from a broken one: either refusal is
    # right, and nothing is inflated past the cap to find out.
    await create_topic(client, "t")
    response = await produce_batch(client, "t", 0, bomb(8 * MiB, codec))
    assert response.status_code in (400, 413), response.text
    assert response.json()["code"] in ("RECORD_LIST_TOO_LARGE", "CORRUPT_MESSAGE")
    assert await high_watermark(client, "t") == 0


async def test_a_batch_past_the_ratio_is_refused_under_the_absolute_cap(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    # 3 MiB of zeros: under the 4 MiB cap, but far more than 50 times its compressed size
    # (past the 1 MiB every batch may have).
    response = await produce_batch(client, "t", 0, bomb(3 * MiB))
    assert_problem(response, 413, "RECORD_LIST_TOO_LARGE")
    # Within the floor, the same kind of batch is taken.
    response = await produce_batch(client, "t", 0, bomb(512 * 1024))
    assert response.status_code == 200, response.text
    assert await high_watermark(client, "t") == 1


async def test_large_compressed_batches_are_checked_off_the_event_loop(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await create_topic(client, "t")
    threads: list[threading.Thread] = []
    check = rb.check

    def recording(data: bytes, limit: int = rb.MAX_UNCOMPRESSED_BYTES) -> rb.Checked:
        threads.append(threading.current_thread())
        return check(data, limit)

    monkeypatch.setattr(rb, "check", recording)
    noise = random.Random(0).randbytes(128 * 1024)  # gzip cannot shrink it
    large = rb.build([(0, b"k", noise, [])], compression=rb.COMPRESSION_GZIP)
    small = rb.build([(0, b"k", b"v", [])], compression=rb.COMPRESSION_GZIP)
    for data in (large, small):
        assert (await produce_batch(client, "t", 0, data)).status_code == 200
    assert threads[0] is not threading.main_thread()  # inflated and walked on a worker
    assert threads[1] is threading.main_thread()  # a small one is not worth the hop


async def test_json_fetch_max_bytes_bounds_the_records_answered_and_loses_none(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    value = b"x" * 10_000
    data = rb.build([(0, b"k", value, []) for _ in range(100)], compression=rb.COMPRESSION_ZSTD)
    assert len(data) < 20_000  # one small stored batch, a megabyte of records
    assert (await produce_batch(client, "t", 0, data)).status_code == 200
    seen: list[int] = []
    offset = 0
    while offset < 100:
        response = await client.get(
            "/v1/topics/t/partitions/0/records", params={"offset": offset, "max_bytes": 50_000}
        )
        body = response.json()
        records = body["records"]
        assert 1 <= len(records) <= 5  # 10 KB each, 50 KB asked for
        seen += [r["offset"] for r in records]
        assert body["next_offset"] == records[-1]["offset"] + 1
        offset = body["next_offset"]
    assert seen == list(range(100))


async def test_the_first_record_comes_whatever_its_size(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    data = rb.build([(0, b"k", b"y" * 100_000, [])], compression=rb.COMPRESSION_GZIP)
    assert (await produce_batch(client, "t", 0, data)).status_code == 200
    body = (
        await client.get("/v1/topics/t/partitions/0/records", params={"max_bytes": 1024})
    ).json()
    assert [r["offset"] for r in body["records"]] == [0]


def test_the_inflation_limit_is_the_smaller_cap_above_the_floor() -> None:
    from coordinator.core.settings import Settings

    settings = Settings(max_uncompressed_batch_bytes=4 * MiB, max_compression_ratio=50)
    assert edge.inflation_limit(settings, 1000) == 1 * MiB  # the floor
    assert edge.inflation_limit(settings, 40_000) == 2_000_000  # the ratio
    assert edge.inflation_limit(settings, 1 * MiB) == 4 * MiB  # the absolute cap
