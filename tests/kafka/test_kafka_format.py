"""Proof that the format is Kafka's and not merely ours, on SQLite and on Postgres: batches built
by kafka-python (an independent, maintained implementation of Kafka's record batch, with its own
codec stack: zlib, python-snappy in xerial framing, lz4 frames, zstandard) go through the service
with every codec and come back, in both formats, to kafka-python's reader unchanged; and random
records go through every combination of the two formats in and out and come back identical."""

from __future__ import annotations

import base64
import itertools
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from tests.support.api import create_topic, fetch, fetch_batches, init_pid, produce, produce_batch

# kafka-python's codec numbers are Kafka's: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.
KAFKA_CODECS = [0, 1, 2, 3, 4]

Headers = list[tuple[str, bytes]]
Rec = tuple[int, bytes | None, bytes | None, Headers]


def kafka_python_batch(
    records: list[Rec], codec: int, pid: int = -1, epoch: int = -1, sequence: int = -1
) -> bytes:
    builder = DefaultRecordBatchBuilder(2, codec, False, pid, epoch, sequence, 10**8)
    for i, (timestamp, key, value, headers) in enumerate(records):
        builder.append(i, timestamp, key, value, headers)
    return bytes(builder.build())


def kafka_python_read(data: bytes) -> list[tuple[int, int, bytes | None, bytes | None, Headers]]:
    """Every record of a fetch answer, read by kafka-python, CRCs checked."""
    out = []
    pos = 0
    while pos < len(data):
        length = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
        batch = DefaultRecordBatch(bytearray(data[pos : pos + length]))
        assert batch.validate_crc()
        out += [
            (r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in batch
        ]
        pos += length
    return out


async def test_kafka_pythons_batches_round_trip_with_every_codec(
    client: httpx.AsyncClient,
) -> None:
    await create_topic(client, "t")
    pid = await init_pid(client)
    expected = []
    sequence = 0
    for codec in KAFKA_CODECS:
        records: list[Rec] = [
            (1_700_000_000_000 + 10 * codec + i, None if i == 0 else b"key-%d" % i,
             None if i == 2 else bytes([codec, i, 0, 255]) * (i + 1),
             [("trace", b"\x00\x01"), ("codec", str(codec).encode())] if i % 2 else [])
            for i in range(4)
        ]  # fmt: skip
        data = kafka_python_batch(records, codec, pid, 0, sequence)
        answer = await produce_batch(client, "t", 0, data)
        assert answer.status_code == 200, answer.text
        base = answer.json()["base_offset"]
        expected += [(base + i, *r) for i, r in enumerate(records)]
        sequence += len(records)
    # Binary out, read by kafka-python: every key, value, header, timestamp and offset.
    binary = (await fetch_batches(client, "t")).content
    assert kafka_python_read(binary) == expected
    # JSON out: the same.
    page = await fetch(client, "t", encoding="base64")
    assert [_from_json(r) for r in page["records"]] == expected


def _b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _from_json(r: dict[str, Any]) -> tuple[int, int, bytes | None, bytes | None, Headers]:
    headers = [(n, base64.b64decode(v)) for n, v in r["headers"].items()]
    return (r["offset"], r["timestamp"], _unb64(r["key"]), _unb64(r["value"]), headers)


_topics = itertools.count()
_bytes = st.one_of(st.none(), st.binary(max_size=40))
_headers = st.dictionaries(st.text(max_size=6), st.binary(max_size=10), max_size=3)
_records = st.lists(
    st.tuples(st.integers(0, 2**41), _bytes, _bytes, _headers), min_size=1, max_size=6
)


@settings(
    max_examples=15,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    batches=st.lists(
        st.tuples(_records, st.sampled_from(["json", *KAFKA_CODECS])), min_size=1, max_size=4
    )
)
async def test_random_records_survive_every_combination_of_formats(
    client: httpx.AsyncClient, batches: list[tuple[list[Any], Any]]
) -> None:
    topic = f"h{next(_topics)}"  # the tables are not emptied between examples
    await create_topic(client, topic)
    expected: list[tuple[int, int, bytes | None, bytes | None, Headers]] = []
    for records, way in batches:
        rows: list[Rec] = [(t, k, v, list(h.items())) for t, k, v, h in records]
        if way == "json":
            body = {
                "encoding": "base64",
                "records": [
                    {"key": _b64(k), "value": _b64(v), "timestamp": t,
                     "headers": {n: _b64(hv) for n, hv in h}}
                    for t, k, v, h in rows
                ],
            }  # fmt: skip
            answer = await produce(client, topic, 0, body)
        else:
            answer = await produce_batch(client, topic, 0, kafka_python_batch(rows, way))
        assert answer.status_code == 200, answer.text
        base = answer.json()["base_offset"]
        expected += [(base + i, t, k, v, h) for i, (t, k, v, h) in enumerate(rows)]
    binary = (await fetch_batches(client, topic)).content
    assert kafka_python_read(binary) == expected
    page = await fetch(client, topic, encoding="base64", max_records=10_000)
    assert [_from_json(r) for r in page["records"]] == expected
