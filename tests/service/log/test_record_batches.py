"""The HTTP API's "Record batches: Kafka's binary format", on SQLite and on Postgres: binary produce
and fetch, both formats reading and writing the same log, every bad batch refused with nothing
written, topic configs that the produce path obeys."""

from __future__ import annotations

import base64
import struct
import time
from typing import Any

import httpx
import pytest
from crc32c import crc32c

from coordinator.log.configs import ACTED_ON, CONFIGS
from sdk import recordbatch as rb
from tests.support.api import (
    assert_problem,
    create_topic,
    fetch,
    fetch_batches,
    init_pid,
    produce,
    produce_batch,
    read_all,
)
from tests.support.txn import started

CODECS = list(rb.CODECS.values())


def records_of(data: bytes) -> list[tuple[int, bytes | None, bytes | None]]:
    return [
        (r.offset, r.key, r.value)
        for pos, header in rb.iter_batches(data, verify=True)
        for r in rb.records(data, pos, header)
    ]


async def high_watermark(client: httpx.AsyncClient, topic: str, partition: int = 0) -> int:
    described = (await client.get(f"/v1/topics/{topic}")).json()
    hw: int = described["partitions"][partition]["high_watermark"]
    return hw


def built(values: list[bytes | None], codec: int = 0, **header: Any) -> bytes:
    now = int(time.time() * 1000)
    return rb.build([(now, b"k", v, [("h", b"1")]) for v in values], compression=codec, **header)


@pytest.mark.parametrize("codec", CODECS)
async def test_binary_produce_then_both_fetch_formats_agree(
    client: httpx.AsyncClient, codec: int
) -> None:
    await create_topic(client, "t")
    pid = await init_pid(client)
    data = rb.build(
        [(1_700_000_000_000 + i, None if i == 1 else b"k%d" % i, bytes([i, 255]), [("h", b"\x00")])
         for i in range(3)],
        compression=codec, producer_id=pid, producer_epoch=0, base_sequence=0,
    )  # fmt: skip
    response = await produce_batch(client, "t", 0, data)
    assert response.json() == {"base_offset": 0, "last_offset": 2, "duplicate": False}
    # The stored bytes are the producer's, base offset aside: compressed batches stay compressed.
    answer = await fetch_batches(client, "t")
    assert answer.content[8:] == data[8:]
    assert answer.headers["next-offset"] == "3"
    assert answer.headers["high-watermark"] == "3"
    assert answer.headers["last-stable-offset"] == "3"
    assert answer.headers["log-start-offset"] == "0"
    page = await fetch(client, "t", encoding="base64")
    assert [
        (r["offset"], r["key"], base64.b64decode(r["value"]), r["headers"], r["timestamp"])
        for r in page["records"]
    ] == [
        (i, None if i == 1 else base64.b64encode(b"k%d" % i).decode(), bytes([i, 255]),
         {"h": "AA=="}, 1_700_000_000_000 + i)
        for i in range(3)
    ]  # fmt: skip
    # A retry is answered with the original offsets and writes nothing.
    again = await produce_batch(client, "t", 0, data)
    assert again.json() == {"base_offset": 0, "last_offset": 2, "duplicate": True}
    assert await high_watermark(client, "t") == 3


async def test_json_produce_is_fetched_as_a_record_batch(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    await produce(client, "t", 0, {"records": [{"value": "a"}, {"key": "k", "value": None}]})
    stamped = {"records": [{"value": "b", "timestamp": 1234, "headers": {"x": "y"}}]}
    await produce(client, "t", 0, stamped)
    data = (await fetch_batches(client, "t")).content
    assert records_of(data) == [(0, None, b"a"), (1, b"k", None), (2, None, b"b")]
    (second_pos, second), _ = list(rb.iter_batches(data))[1], None
    (record,) = rb.records(data, second_pos, second)
    assert (record.timestamp, record.headers) == (1234, [("x", b"y")])  # CreateTime
    assert not second.log_append_time


async def test_fetch_from_inside_a_batch_returns_the_whole_batch(client: httpx.AsyncClient) -> None:
    await create_topic(client, "t")
    await produce_batch(client, "t", 0, built([b"a", b"b", b"c"]))
    await produce_batch(client, "t", 0, built([b"d"]))
    answer = await fetch_batches(client, "t", offset=1)
    assert [o for o, _, _ in records_of(answer.content)] == [0, 1, 2, 3]
    assert answer.headers["next-offset"] == "4"
    # JSON skips the records below the offset asked for.
    assert [r["offset"] for r in (await fetch(client, "t", offset=1))["records"]] == [1, 2, 3]


async def test_max_bytes_bounds_the_answer_but_one_batch_always_comes(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    for value in (b"x" * 300, b"y" * 300, b"z" * 300):
        await produce_batch(client, "t", 0, built([value]))
    one = await fetch_batches(client, "t", max_bytes=1)
    assert [o for o, _, _ in records_of(one.content)] == [0]
    assert one.headers["next-offset"] == "1"
    two = await fetch_batches(client, "t", max_bytes=one.content.__len__() + 1)
    assert [o for o, _, _ in records_of(two.content)] == [0, 1]
    rest = await fetch_batches(client, "t", offset=2, max_bytes=10**6)
    assert [o for o, _, _ in records_of(rest.content)] == [2]
    assert rest.headers["next-offset"] == "3"
    end = await fetch_batches(client, "t", offset=3)
    assert end.content == b"" and end.headers["next-offset"] == "3"


async def test_binary_fetch_leaves_out_markers_and_what_read_committed_may_not_see(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    committed = await started(client, "c")
    aborted = await started(client, "a")
    open_ = await started(client, "o")
    assert (await committed.produce("t", 0, "c1")).status_code == 200  # 0
    assert (await aborted.produce("t", 0, "a1")).status_code == 200  # 1
    assert (await committed.end(commit=True)).status_code == 200  # marker 2
    assert (await aborted.end(commit=False)).status_code == 200  # marker 3
    await produce(client, "t", 0, {"records": [{"value": "plain"}]})  # 4
    assert (await open_.produce("t", 0, "o1")).status_code == 200  # 5, still open
    committed_view = await fetch_batches(client, "t")
    assert [v for _, _, v in records_of(committed_view.content)] == [b"c1", b"plain"]
    assert committed_view.headers["last-stable-offset"] == "5"
    assert committed_view.headers["next-offset"] == "5"
    everything = await fetch_batches(client, "t", isolation_level="read_uncommitted")
    assert [v for _, _, v in records_of(everything.content)] == [b"c1", b"a1", b"plain", b"o1"]
    for _, header in rb.iter_batches(everything.content):
        assert not header.is_control


async def test_markers_are_stored_as_kafka_control_batches(
    client: httpx.AsyncClient, app: Any
) -> None:
    from coordinator.log import fetch as log_fetch

    await create_topic(client, "t")
    producer = await started(client, "p")
    assert (await producer.produce("t", 0, "a", "b")).status_code == 200
    pid, epoch = producer.pid, producer.epoch
    assert (await producer.end(commit=False)).status_code == 200
    fetched = await log_fetch.fetch_batches(
        app.state.db, "t", 0, 0, max_bytes=10**6, read_committed=False,
        include_control=True, include_aborted=True,
    )  # fmt: skip
    marker = fetched.batches[-1]
    header = rb.check(marker).header
    assert header.is_control and header.is_transactional and header.base_offset == 2
    assert (header.producer_id, header.producer_epoch) == (pid, epoch)
    assert rb.control_type(marker) == rb.CONTROL_ABORT
    # Kafka's read_committed clients filter themselves, given the aborted transactions.
    assert await log_fetch.aborted_transactions(app.state.db, "t", 0, 0, 3) == [(pid, 0)]
    assert await log_fetch.aborted_transactions(app.state.db, "t", 0, 3, 3) == []


async def test_a_kafka_fetch_answers_its_batches_and_exactly_their_aborted_transactions(
    client: httpx.AsyncClient, app: Any
) -> None:
    """Kafka's door fetches markers and aborted batches too, with the aborted transactions of
    what it returns (`aborted_list`): the same whether the batches come in one chunk or need
    more than one (FETCH_CHUNK), and whatever the byte budget leaves out."""
    from coordinator.log import fetch as log_fetch

    await create_topic(client, "t")
    producer = await started(client, "p")
    aborted: list[tuple[int, int]] = []
    for round_ in range(3):  # 3 x (a batch, its marker, 30 plain batches): past one chunk
        aborted.append((producer.pid, (await read_high_watermark(client))))
        assert (await producer.produce("t", 0, f"a{round_}")).status_code == 200
        assert (await producer.end(commit=False)).status_code == 200
        for i in range(30):
            await produce(client, "t", 0, {"records": [{"value": f"p{round_}.{i}"}]})
    stored = 3 * 32
    assert stored > log_fetch.FETCH_CHUNK

    async def kafka_fetch(offset: int, max_bytes: int) -> Any:
        return await log_fetch.fetch_batches(
            app.state.db, "t", 0, offset, max_bytes=max_bytes, read_committed=True,
            include_control=True, include_aborted=True, fit=True, aborted_list=True,
        )  # fmt: skip

    whole = await kafka_fetch(0, 10**6)
    assert len(whole.batches) == stored and whole.next_offset == stored
    assert [rb.read_header(b).base_offset for b in whole.batches] == list(range(stored))
    assert whole.aborted == aborted
    # Within a budget of three batches, past the second transaction's marker: none.
    cut = await kafka_fetch(34, sum(len(b) for b in whole.batches[34:37]))
    assert [rb.read_header(b).base_offset for b in cut.batches] == [34, 35, 36]
    assert cut.next_offset == 37 and cut.aborted == []
    # From the marker (its transaction began before it) or from the transaction's batch.
    assert (await kafka_fetch(33, 1)).aborted == [aborted[1]]
    second = await kafka_fetch(32, 10**6)
    assert second.aborted == aborted[1:]
    assert second.aborted == await log_fetch.aborted_transactions(
        app.state.db, "t", 0, 32, second.next_offset
    )
    assert (await kafka_fetch(stored, 10**6)).aborted == []


async def read_high_watermark(client: httpx.AsyncClient) -> int:
    partitions = (await client.get("/v1/topics/t")).json()["partitions"]
    high_watermark: int = partitions[0]["high_watermark"]
    return high_watermark


def _reframed(data: bytes, **changes: int) -> bytes:
    """`data` with header fields changed and the CRC made right again."""
    fields = {"attributes": (21, ">h"), "producer_id": (43, ">q"), "base_sequence": (53, ">i")}
    out = bytearray(data)
    for name, value in changes.items():
        offset, fmt = fields[name]
        struct.pack_into(fmt, out, offset, value)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[21:])))
    return bytes(out)


GOOD = rb.build([(1, b"k", b"v", [])])


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"not a batch, but long enough to hold a header of 61 bytes!!!!!!", id="junk"),
        pytest.param(GOOD[:-1], id="truncated"),
        pytest.param(GOOD + GOOD, id="two-batches"),
        pytest.param(GOOD[:30] + bytes([GOOD[30] ^ 1]) + GOOD[31:], id="bad-crc"),
        pytest.param(GOOD[:16] + b"\x01" + GOOD[17:], id="magic-1"),
        pytest.param(_reframed(GOOD, attributes=6), id="codec-6"),
        pytest.param(_reframed(GOOD, attributes=rb.COMPRESSION_ZSTD), id="not-compressed"),
    ],
)  # fmt: skip
async def test_malformed_batch_is_400_corrupt_message_and_writes_nothing(
    client: httpx.AsyncClient, data: bytes
) -> None:
    await create_topic(client, "t")
    assert_problem(await produce_batch(client, "t", 0, data), 400, "CORRUPT_MESSAGE")
    assert await high_watermark(client, "t") == 0


async def test_batches_a_producer_may_not_send_are_400_invalid_record(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    await create_topic(client, "c")
    patch = await client.patch("/v1/topics/c/configs", json={"set": {"cleanup.policy": "compact"}})
    assert patch.status_code == 200
    producer = await started(client, "x")
    txn = rb.build([(1, b"k", b"v", [])], producer_id=producer.pid, producer_epoch=0,
                   base_sequence=0, transactional=True)  # fmt: skip
    refused = [
        (await produce_batch(client, "t", 0, rb.build_control(True, 1, 0, 1)), "t"),
        (await produce_batch(client, "t", 0, txn), "t"),  # transactional, no transactional_id
        (await produce_batch(client, "t", 0, GOOD, transactional_id="x"), "t"),  # the reverse
        (await produce_batch(client, "c", 0, rb.build([(1, None, b"v", [])])), "c"),  # keyless
        (await produce_batch(client, "t", 0, _reframed(GOOD, producer_id=5)), "t"),  # seq -1
    ]
    for response, topic in refused:
        assert_problem(response, 400, "INVALID_RECORD")
        assert await high_watermark(client, topic) == 0
    # A keyed record on the compacted topic goes in; the transactional batch with its id too.
    assert (await produce_batch(client, "c", 0, GOOD)).status_code == 200
    assert (await produce_batch(client, "t", 0, txn, transactional_id="x")).status_code == 200
    keyless_json = await produce(client, "c", 0, {"records": [{"key": None, "value": "v"}]})
    assert_problem(keyless_json, 400, "INVALID_RECORD")


async def test_log_append_time_topic_stamps_batches_and_keeps_them_valid(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v1/topics",
        json={"name": "t", "partitions": 1, "configs": {"message.timestamp.type": "LogAppendTime"}},
    )
    assert response.status_code == 201, response.text
    before = int(time.time() * 1000)
    await produce_batch(client, "t", 0, rb.build([(5, None, b"a", []), (6, None, b"b", [])]))
    await produce(client, "t", 0, {"records": [{"value": "c", "timestamp": 7}]})
    after = int(time.time() * 1000)
    data = (await fetch_batches(client, "t")).content
    for pos, header in rb.iter_batches(data, verify=True):  # CRCs recomputed
        assert header.log_append_time and before <= header.max_timestamp <= after
        assert all(r.timestamp == header.max_timestamp for r in rb.records(data, pos, header))
    stamps = {r["timestamp"] for r in (await fetch(client, "t"))["records"]}
    assert all(before <= s <= after for s in stamps)


async def test_max_message_bytes_refuses_larger_batches_with_413(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v1/topics", json={"name": "t", "configs": {"max.message.bytes": 200}}
    )
    assert response.status_code == 201, response.text
    assert_problem(
        await produce_batch(client, "t", 0, built([b"x" * 200])), 413, "RECORD_LIST_TOO_LARGE"
    )
    assert_problem(
        await produce(client, "t", 0, {"records": [{"value": "x" * 200}]}),
        413,
        "RECORD_LIST_TOO_LARGE",
    )
    assert (await produce_batch(client, "t", 0, built([b"x"]))).status_code == 200
    assert await high_watermark(client, "t") == 1


async def test_max_message_bytes_holds_for_the_batch_as_its_topic_recompresses_it(
    client: httpx.AsyncClient,
) -> None:
    # Small as gzip, large uncompressed: Kafka checks the batch it validated too.
    response = await client.post(
        "/v1/topics",
        json={
            "name": "t",
            "configs": {"max.message.bytes": 2000, "compression.type": "uncompressed"},
        },
    )
    assert response.status_code == 201, response.text
    small = built([b"x"])
    assert (await produce_batch(client, "t", 0, small)).status_code == 200
    grows = built([b"\0" * 20_000], codec=rb.COMPRESSION_GZIP)
    assert len(grows) < 2000
    for _ in range(2):  # the topic's configs not seen yet by the process, then seen
        assert_problem(await produce_batch(client, "t", 0, grows), 413, "RECORD_LIST_TOO_LARGE")
    assert await high_watermark(client, "t") == 1


async def test_binary_transactional_produce_joins_the_transaction(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    producer = await started(client, "tx")
    data = rb.build(
        [(1, b"k", b"v", [])],
        producer_id=producer.pid,
        producer_epoch=0,
        base_sequence=0,
        transactional=True,
        compression=rb.COMPRESSION_ZSTD,
    )
    assert (await produce_batch(client, "t", 0, data, transactional_id="tx")).status_code == 200
    assert (await producer.describe())["state"] == "Ongoing"
    assert await read_all(client, "t") == []  # not committed yet
    assert (await producer.end(commit=True)).status_code == 200
    assert [r["value"] for r in await read_all(client, "t")] == ["v"]


# -- topic configs ------------------------------------------------------------------------------


def configs_of(body: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["name"]: (c["value"], c["source"]) for c in body["configs"]}


async def test_topic_configs_have_defaults_and_take_what_is_set(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/topics",
        json={"name": "t", "configs": {"retention.ms": 1000, "cleanup.policy": "delete,compact"}},
    )
    assert response.json() == {"name": "t", "partitions": 1}
    described = configs_of((await client.get("/v1/topics/t/configs")).json())
    # The configs the coordinator acts on; every other config Kafka defines is listed too.
    assert {name: described[name] for name in ACTED_ON} == {
        "cleanup.policy": ("compact,delete", "TOPIC"),
        "compression.type": ("producer", "DEFAULT"),
        "delete.retention.ms": ("86400000", "DEFAULT"),
        "max.message.bytes": ("8388608", "DEFAULT"),
        "message.timestamp.type": ("CreateTime", "DEFAULT"),
        "min.compaction.lag.ms": ("0", "DEFAULT"),
        "retention.bytes": ("-1", "DEFAULT"),
        "retention.ms": ("1000", "TOPIC"),
    }
    assert described["segment.bytes"] == ("1073741824", "DEFAULT")
    assert set(described) == set(CONFIGS)
    patched = await client.patch(
        "/v1/topics/t/configs",
        json={"set": {"retention.bytes": "5000"}, "delete": ["retention.ms"]},
    )
    assert patched.status_code == 200
    assert configs_of(patched.json())["retention.bytes"] == ("5000", "TOPIC")
    assert configs_of(patched.json())["retention.ms"] == ("604800000", "DEFAULT")
    assert patched.json() == (await client.get("/v1/topics/t/configs")).json()


@pytest.mark.parametrize(
    ("configs", "named"),
    [
        ({"retention.mss": 1}, "retention.mss"),
        ({"retention.ms": -2}, "retention.ms"),
        ({"retention.ms": "soon"}, "retention.ms"),
        ({"retention.ms": 1.5}, "retention.ms"),
        ({"retention.ms": True}, "retention.ms"),
        ({"cleanup.policy": "shred"}, "cleanup.policy"),
        ({"cleanup.policy": "compact,compact"}, "cleanup.policy"),
        ({"message.timestamp.type": "logappendtime"}, "message.timestamp.type"),
        ({"max.message.bytes": 2**31}, "max.message.bytes"),
        ({"min.compaction.lag.ms": -1}, "min.compaction.lag.ms"),
        ({"compression.type": "brotli"}, "compression.type"),
        ({"min.cleanable.dirty.ratio": 2}, "min.cleanable.dirty.ratio"),
        ({"preallocate": "maybe"}, "preallocate"),
    ],
)
async def test_bad_configs_are_400_invalid_config_naming_them_and_change_nothing(
    client: httpx.AsyncClient, configs: dict[str, Any], named: str
) -> None:
    response = await client.post("/v1/topics", json={"name": "t", "configs": configs})
    assert named in assert_problem(response, 400, "INVALID_CONFIG")["detail"]
    assert (await client.get("/v1/topics")).json() == {"topics": []}
    await create_topic(client, "t")
    before = (await client.get("/v1/topics/t/configs")).json()
    patch = {"set": {"retention.bytes": 10, **configs}}
    response = await client.patch("/v1/topics/t/configs", json=patch)
    assert named in assert_problem(response, 400, "INVALID_CONFIG")["detail"]
    assert (await client.get("/v1/topics/t/configs")).json() == before


async def test_deleting_an_unknown_config_or_configs_of_an_unknown_topic(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    response = await client.patch("/v1/topics/t/configs", json={"delete": ["nope"]})
    assert "nope" in assert_problem(response, 400, "INVALID_CONFIG")["detail"]
    for response in (
        await client.get("/v1/topics/u/configs"),
        await client.patch("/v1/topics/u/configs", json={"set": {"retention.ms": 1}}),
    ):
        assert_problem(response, 404, "UNKNOWN_TOPIC_OR_PARTITION")


async def test_every_kafka_topic_config_is_taken_and_stored(client: httpx.AsyncClient) -> None:
    """Kafka's tools set configs the coordinator does not act on (segments, flushing): they
    are accepted, stored and described, as Kafka's broker takes every config it defines."""
    response = await client.post(
        "/v1/topics",
        json={"name": "t", "configs": {"segment.bytes": "1048576", "preallocate": "true"}},
    )
    assert response.status_code == 201, response.text
    described = configs_of((await client.get("/v1/topics/t/configs")).json())
    assert described["segment.bytes"] == ("1048576", "TOPIC")
    assert described["preallocate"] == ("true", "TOPIC")


@pytest.mark.parametrize("codec", ["uncompressed", "gzip", "snappy", "lz4", "zstd"])
async def test_compression_type_recompresses_every_batch_as_kafka_does(
    client: httpx.AsyncClient, codec: str
) -> None:
    response = await client.post(
        "/v1/topics", json={"name": "t", "configs": {"compression.type": codec}}
    )
    assert response.status_code == 201, response.text
    pid = await init_pid(client)
    sent = rb.build(
        [(1, b"k", b"v" * 500, []), (2, b"k2", b"w", [("h", b"1")])],
        compression=rb.COMPRESSION_LZ4 if codec != "lz4" else rb.COMPRESSION_GZIP,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=0,
    )
    assert (await produce_batch(client, "t", 0, sent)).status_code == 200
    stored = await fetch_batches(client, "t", 0)
    header = rb.read_header(stored.content)
    wanted = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[codec]
    assert header.compression == wanted
    assert (header.producer_id, header.base_sequence) == (pid, 0)
    assert records_of(stored.content) == [(0, b"k", b"v" * 500), (1, b"k2", b"w")]
    # A retry of the same batch is still recognised as the duplicate it is.
    again = await produce_batch(client, "t", 0, sent)
    assert again.json()["duplicate"] is True


@pytest.mark.parametrize("codec", ["gzip", "snappy", "zstd"])
async def test_a_batch_recompressed_for_its_topic_is_inflated_once(
    app: Any, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, codec: str
) -> None:
    """Once the process has seen the topic's configs (an append wrote to it), a batch in
    another codec is recompressed as it is checked, in the one inflation."""
    response = await client.post(
        "/v1/topics", json={"name": "t", "configs": {"compression.type": codec}}
    )
    assert response.status_code == 201, response.text
    pid = await init_pid(client)
    inflations = []
    inflate = rb.inflate
    monkeypatch.setattr(rb, "inflate", lambda *a: inflations.append(a[0]) or inflate(*a))
    for sequence in (0, 2, 4):
        sent = rb.build(
            [(1, b"k", b"v" * 50_000, []), (2, b"k2", b"w", [])],
            compression=rb.COMPRESSION_LZ4,
            producer_id=pid,
            producer_epoch=0,
            base_sequence=sequence,
        )
        assert (await produce_batch(client, "t", 0, sent)).status_code == 200
    if app.state.db.remote:
        # The first batch taught the process the topic's configs: the next two, once each.
        assert inflations == [rb.COMPRESSION_LZ4] * 4
    else:
        # SQLite plans no append ahead of its unit of work: each is inflated twice.
        assert inflations == [rb.COMPRESSION_LZ4] * 6
    stored = await fetch_batches(client, "t", 0)
    wanted = rb.CODECS[codec]
    assert [h.compression for _, h in rb.iter_batches(stored.content)] == [wanted] * 3
    assert [v for _, _, v in records_of(stored.content)] == [b"v" * 50_000, b"w"] * 3


async def test_a_name_holding_a_nul_is_refused_before_any_statement(app: Any) -> None:
    """Postgres refuses the byte in text: no statement of either store may meet it, those sent
    straight to the driver included (a fetch is one on Postgres), or a 5xx would follow."""
    from coordinator.core.errors import UnstorableText
    from coordinator.log import fetch as log_fetch

    with pytest.raises(UnstorableText):
        await log_fetch.fetch_batches(app.state.db, "t\0", 0, 0, max_bytes=1, read_committed=True)
