"""The Kafka listener itself, spoken to byte by byte (kio builds the requests): ApiVersions
advertises exactly what is served; garbage of every kind closes the connection and changes
nothing; a corrupt batch is CORRUPT_MESSAGE; SASL/PLAIN against the tokens file gates every
request, with the same roles and prefixes as HTTP. On SQLite and on Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import logging
import random
import struct
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer
from kio.static.constants import EntityType

from coordinator.cli import main
from coordinator.core.memory import request_memory
from coordinator.core.metrics import PROCESS
from coordinator.kafka.handlers import HANDLERS
from coordinator.kafka.server import KafkaListener
from coordinator.kafka.wire import SUPPORTED, payload_type
from coordinator.log import group_commit
from coordinator.log import topics as log_topics
from coordinator.log.topics import TopicSpec
from sdk import recordbatch
from tests.support.kafka_listener import authenticated, connect, listener
from tests.support.kafka_wire import Connection, fetch_request, produce_request

__all__ = ["listener"]


def test_every_served_api_has_a_handler_and_nothing_more() -> None:
    assert set(HANDLERS) == set(SUPPORTED)
    for key, (low, high) in SUPPORTED.items():
        for version in range(low, high + 1):
            payload_type(key, version, EntityType.request)  # kio knows every version advertised


async def test_api_versions_advertises_exactly_what_is_served(listener: KafkaListener) -> None:
    connection = await connect(listener)
    answer = await connection.call(18, 3, client_software_name="t", client_software_version="1")
    assert answer.error_code == ErrorCode.none
    advertised = {a.api_key: (a.min_version, a.max_version) for a in answer.api_keys}
    assert advertised == dict(SUPPORTED)


async def test_unsupported_api_versions_version_is_answered_in_version_0(
    listener: KafkaListener,
) -> None:
    connection = await connect(listener)
    buffer = io.BytesIO()
    request_type = payload_type(18, 4, EntityType.request)
    entity_writer(request_type.__header_schema__)(
        buffer,
        request_type.__header_schema__(
            request_api_key=18, request_api_version=4, correlation_id=1, client_id="t"
        ),
    )
    entity_writer(request_type)(
        buffer, request_type(client_software_name="t", client_software_version="1")
    )
    # Version 4 is not served: pretend to speak 9, which nobody knows.
    frame = bytearray(buffer.getvalue())
    frame[2:4] = struct.pack(">h", 9)
    connection.correlation = 1
    await connection.send(bytes(frame))
    answer = await connection.receive(18, 0)
    assert answer.error_code == ErrorCode.unsupported_version
    # As Kafka's broker answers it: ApiVersions's own versions, all a client needs to ask again.
    assert [(a.api_key, a.min_version, a.max_version) for a in answer.api_keys] == [
        (18, *SUPPORTED[18])
    ]


@pytest.mark.parametrize(
    "garbage",
    [
        b"\xff\xff\xff\xff",  # a negative size
        struct.pack(">i", 2_000_000_000),  # far over the limit
        struct.pack(">i", 3) + b"abc",  # shorter than a header
        struct.pack(">i", 10) + struct.pack(">hhi", 999, 0, 1) + b"\0\0",  # unknown API key
        struct.pack(">i", 10) + struct.pack(">hhi", 3, 99, 1) + b"\0\0",  # unknown version
        struct.pack(">i", 10) + struct.pack(">hhi", 3, 9, 1) + b"\x05\x00",  # truncated body
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # another protocol
    ],
)
async def test_garbage_closes_the_connection_and_changes_nothing(
    listener: KafkaListener, garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    connection = await connect(listener)
    connection.writer.write(garbage)
    await connection.writer.drain()
    assert await connection.closed()
    # The listener still serves everyone else, and nothing was logged as a failure.
    other = await connect(listener)
    answer = await other.call(18, 3, client_software_name="t", client_software_version="1")
    assert answer.error_code == ErrorCode.none
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    # The operator sees why, at WARNING, with the peer.
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "closed the Kafka connection of 127.0.0.1" in warning.getMessage()


async def test_closed_connections_are_reported_at_most_once_a_second(
    listener: KafkaListener, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(5):
        connection = await connect(listener)
        await connection.send(struct.pack(">hhi", 999, 0, 1) + b"\0\0")
        assert await connection.closed()
    warnings = [r for r in caplog.records if r.name == "coordinator.kafka"]
    # Five closings in well under a second: the first is told, the rest counted for the next.
    assert len(warnings) == 1
    assert "API key 999 version 0" in warnings[0].getMessage()


async def test_bytes_after_a_request_body_are_ignored_as_kafka_ignores_them(
    listener: KafkaListener,
) -> None:
    # librdkafka 2.12+'s all-topics Metadata v12: four bytes where Kafka reads a one-byte count
    # (null), two booleans and the tagged fields; three are left over.
    connection = await connect(listener)
    connection.correlation = 1
    await connection.send(struct.pack(">hhih", 3, 12, 1, 4) + b"test" + b"\0" + b"\0" * 7)
    answer = await connection.receive(3, 12)
    assert answer.brokers


@pytest.mark.parametrize(
    "listener", [{"auth": True, "kafka_sasl_max_receive_size": 4096}], indirect=True
)
async def test_a_frame_before_authentication_is_held_to_the_sasl_limit(
    listener: KafkaListener,
) -> None:
    await log_topics.create_topic(listener.db, TopicSpec("big", 1))
    # Over the limit before SASL: closed on the size alone, without the frame being sent.
    before = await connect(listener)
    before.writer.write(struct.pack(">i", 4097))
    await before.writer.drain()
    assert await before.closed()
    # After SASL the request limit applies: a batch larger than the SASL limit is taken.
    admin, answer = await authenticated(listener, "ops", "admin-token-1")
    assert answer.error_code == ErrorCode.none
    batch = recordbatch.build([(1, b"k", b"v" * 8192, [])], producer_id=-1, producer_epoch=-1)
    produced = await admin.produce("big", batch)
    assert produced.responses[0].partition_responses[0].error_code == ErrorCode.none


@pytest.mark.parametrize("listener", [{"kafka_socket_request_max_bytes": 4096}], indirect=True)
async def test_a_frame_over_socket_request_max_bytes_closes_the_connection(
    listener: KafkaListener,
) -> None:
    await log_topics.create_topic(listener.db, TopicSpec("capped", 1))
    connection = await connect(listener)
    batch = recordbatch.build([(1, b"k", b"v" * 8192, [])], producer_id=-1, producer_epoch=-1)
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        await connection.produce("capped", batch)
    assert await connection.closed()
    described = await log_topics.describe_topic(listener.db, "capped")
    assert described.partitions[0].high_watermark == 0


async def test_corrupt_batch_is_refused_and_nothing_is_written(listener: KafkaListener) -> None:
    await log_topics.create_topic(listener.db, TopicSpec("corrupt", 1))
    good = recordbatch.build([(1, b"k", b"v", [])], producer_id=-1, producer_epoch=-1)
    bad = bytearray(good)
    bad[-1] ^= 0xFF  # the CRC no longer matches
    connection = await connect(listener)
    answer = await connection.produce("corrupt", bytes(bad))
    result = answer.responses[0].partition_responses[0]
    assert result.error_code == ErrorCode.corrupt_message
    assert result.error_message
    described = await log_topics.describe_topic(listener.db, "corrupt")
    assert described.partitions[0].high_watermark == 0


async def test_init_producer_id_lets_only_the_current_instance_bump_its_epoch(
    listener: KafkaListener,
) -> None:
    connection = await connect(listener)

    async def init(producer_id: int, epoch: int) -> tuple[Any, int, int]:
        answer = await connection.call(
            22,
            4,
            transactional_id="kip-360",
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=producer_id,
            producer_epoch=epoch,
        )
        return answer.error_code, answer.producer_id, answer.producer_epoch

    _, pid, zombie = await init(-1, -1)  # a new instance, as after a restart
    _, _, current = await init(-1, -1)
    assert current == zombie + 1
    assert await init(pid, zombie) == (ErrorCode.producer_fenced, -1, -1)
    assert await init(pid, current) == (ErrorCode.none, pid, current + 1)


@pytest.mark.parametrize("listener", [True], indirect=True)
async def test_sasl_plain_refuses_unknown_tokens_and_applies_roles(listener: KafkaListener) -> None:
    before = await connect(listener)
    await before.send(
        # Metadata v12 before SASL: the connection closes.
        struct.pack(">hhi", 3, 12, 1) + b"\x00\x05test\x00\x00\x00\x00"
    )
    assert await before.closed()

    for user, token in [("reader", "wrong-token-1"), ("ops", "reader-token-1")]:
        _, answer = await authenticated(listener, user, token)
        assert answer.error_code == ErrorCode.sasl_authentication_failed

    await log_topics.create_topic(listener.db, TopicSpec("payments", 1))
    await log_topics.create_topic(listener.db, TopicSpec("secret", 1))
    reader, answer = await authenticated(listener, "reader", "reader-token-1")
    assert answer.error_code == ErrorCode.none
    metadata = await reader.call(3, 12, topics=None, include_topic_authorized_operations=False)
    assert "payments" in [t.name for t in metadata.topics]
    assert all(t.name.startswith("pay") for t in metadata.topics)
    # The consumer role may not produce, even under its prefix.
    batch = recordbatch.build([(1, b"k", b"v", [])], producer_id=-1, producer_epoch=-1)
    produced = await reader.produce("payments", batch)
    assert produced.responses[0].partition_responses[0].error_code == (
        ErrorCode.topic_authorization_failed
    )
    admin, answer = await authenticated(listener, "ops", "admin-token-1")
    assert answer.error_code == ErrorCode.none
    metadata = await admin.call(3, 12, topics=None, include_topic_authorized_operations=False)
    assert {"payments", "secret"} <= {t.name for t in metadata.topics}


def test_serve_refuses_an_open_kafka_listener_without_tokens(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["serve", "--kafka-listener", "0.0.0.0:9092"])
    assert code == 2
    assert "refusing to listen on 0.0.0.0" in capsys.readouterr().err


@pytest.mark.parametrize("listener", [{"transaction_max_timeout_ms": 30_000}], indirect=True)
async def test_an_idempotent_producer_is_not_held_to_the_transaction_timeout_maximum(
    listener: KafkaListener,
) -> None:
    connection = await connect(listener)
    answer = await connection.call(
        22,
        4,
        transactional_id=None,
        transaction_timeout=datetime.timedelta(milliseconds=-1),
        producer_id=-1,
        producer_epoch=-1,
    )
    assert answer.error_code == ErrorCode.none
    assert answer.producer_id >= 0


@pytest.mark.parametrize(
    ("api_key", "version", "fields", "code_of"),
    [
        pytest.param(
            22,
            4,
            {
                "transactional_id": "tx\0nul",
                "transaction_timeout": datetime.timedelta(seconds=10),
                "producer_id": -1,
                "producer_epoch": -1,
            },
            lambda a: a.error_code,
            id="init-producer-id",
        ),
        pytest.param(
            15,
            5,
            {"groups": ("g\0nul",), "include_authorized_operations": False},
            lambda a: a.groups[0].error_code,
            id="describe-groups",
        ),
        pytest.param(
            26,
            3,
            {"transactional_id": "tx\0", "producer_id": 1, "producer_epoch": 0, "committed": True},
            lambda a: a.error_code,
            id="end-txn",
        ),
        pytest.param(
            25,
            3,
            {"transactional_id": "tx", "producer_id": 1, "producer_epoch": 0, "group_id": "g\0"},
            lambda a: a.error_code,
            id="add-offsets-to-txn",
        ),
        pytest.param(
            12,
            4,
            {"group_id": "g\0", "generation_id": 1, "member_id": "m", "group_instance_id": None},
            lambda a: a.error_code,
            id="heartbeat",
        ),
        pytest.param(
            9,
            7,
            {"group_id": "g\0", "topics": None, "require_stable": False},
            lambda a: a.error_code,
            id="offset-fetch",
        ),
    ],
)
async def test_a_nul_in_a_kafka_id_is_answered_invalid_request_not_a_closed_connection(
    listener: KafkaListener,
    api_key: int,
    version: int,
    fields: dict[str, Any],
    code_of: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    connection = await connect(listener)
    answer = await connection.call(api_key, version, **fields)
    assert code_of(answer) == ErrorCode.invalid_request
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize(
    "listener", [{"max_uncompressed_batch_bytes": 2 * 1024 * 1024}], indirect=True
)
async def test_a_decompression_bomb_is_record_list_too_large_and_writes_nothing(
    listener: KafkaListener,
) -> None:
    await log_topics.create_topic(listener.db, TopicSpec("bombed", 1))
    bomb = recordbatch.build(
        [(1, b"k", bytes(4 * 1024 * 1024), [])],
        producer_id=-1,
        producer_epoch=-1,
        compression=recordbatch.COMPRESSION_GZIP,
    )
    connection = await connect(listener)
    answer = await connection.produce("bombed", bomb)
    result = answer.responses[0].partition_responses[0]
    assert result.error_code == ErrorCode.record_list_too_large
    described = await log_topics.describe_topic(listener.db, "bombed")
    assert described.partitions[0].high_watermark == 0


async def test_a_kafka_id_that_is_not_utf8_closes_the_connection_and_creates_nothing(
    listener: KafkaListener, caplog: pytest.LogCaptureFixture
) -> None:
    # FindCoordinator v1 and DescribeGroups v0 are plain strings: one invalid byte in the id.
    connection = await connect(listener)
    frame = struct.pack(">hhih", 15, 0, 1, 4) + b"test" + struct.pack(">ih", 1, 3) + b"g\xff1"
    await connection.send(frame)
    assert await connection.closed()
    groups = await connect(listener)
    listed = await groups.call(16, 4, states_filter=())
    assert [g.group_id for g in listed.groups] == []
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def _hold_appends(monkeypatch: pytest.MonkeyPatch) -> tuple[asyncio.Event, asyncio.Event]:
    """Appends wait at a gate: the first event is set once a group is being written, the
    second opens the gate."""
    writing, gate = asyncio.Event(), asyncio.Event()
    write = group_commit._GroupCommit._write

    async def held(commits: Any, group: Any) -> None:
        writing.set()
        await gate.wait()
        await write(commits, group)

    monkeypatch.setattr(group_commit._GroupCommit, "_write", held)
    return writing, gate


async def _idempotent_producer(connection: Connection) -> tuple[int, int]:
    init = await connection.call(
        22,
        4,
        transactional_id=None,
        transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=-1,
        producer_epoch=-1,
    )
    assert init.error_code == ErrorCode.none
    return init.producer_id, init.producer_epoch


async def test_a_connections_produce_requests_sent_together_are_appended_in_the_order_sent(
    listener: KafkaListener,
) -> None:
    """A producer's requests in flight on one connection (Kafka clients keep up to 5) reach the
    sequence rules in the order sent, though the first one's check takes longer: an
    incompressible compressed batch, checked on a worker thread, ahead of small ones that are
    not."""
    await log_topics.create_topic(listener.db, TopicSpec("piped", 1))
    connection = await connect(listener)
    pid, epoch = await _idempotent_producer(connection)
    noise = random.Random(7).randbytes(24_000)
    batches = [
        recordbatch.build(
            [(0, b"k", noise, [])],
            compression=recordbatch.COMPRESSION_GZIP,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
        )
    ]
    assert len(batches[0]) > 16 * 1024  # checked off the event loop
    batches += [
        recordbatch.build(
            [(0, b"k", b"v%d" % i, [])], producer_id=pid, producer_epoch=epoch, base_sequence=i
        )
        for i in range(1, 12)
    ]
    sent = [await connection.send_request(produce_request("piped", batch)) for batch in batches]
    answers = [await connection.receive(0, 9, correlation) for correlation in sent]
    results = [answer.responses[0].partition_responses[0] for answer in answers]
    assert [(r.error_code, r.base_offset) for r in results] == [
        (ErrorCode.none, i) for i in range(12)
    ]


@pytest.mark.parametrize(
    ("listener", "pipelined"),
    [({}, True), ({"kafka_produce_pipeline": 1}, False)],
    indirect=["listener"],
    ids=["pipelined", "one-at-a-time"],
)
async def test_produce_requests_under_way_together_hold_their_memory_and_a_fetch_waits_for_them(
    listener: KafkaListener, pipelined: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the appends held: pipelined, both Produce requests of the connection are read and
    held in the request memory (one at a time, the first alone), and the Fetch sent after them
    is answered after them, seeing both; every byte is given back once answered."""
    await log_topics.create_topic(listener.db, TopicSpec("held", 2))
    writing, gate = _hold_appends(monkeypatch)
    memory = request_memory()
    before = memory.used
    connection = await connect(listener)
    batches = [
        recordbatch.build([(0, b"k", bytes(5000), [])], producer_id=-1, producer_epoch=-1)
        for _ in range(2)
    ]
    sent = [
        await connection.send_request(produce_request("held", batch, partition))
        for partition, batch in enumerate(batches)
    ]
    fetched = await connection.send_request(fetch_request("held", (0, 1)))
    await asyncio.wait_for(writing.wait(), 10)
    if pipelined:
        deadline = asyncio.get_running_loop().time() + 10
        while memory.used - before < 2 * len(batches[0]):
            assert asyncio.get_running_loop().time() < deadline, memory.used - before
            await asyncio.sleep(0.01)
    else:
        # The second request is not read while the first is under way.
        assert len(batches[0]) < memory.used - before < 2 * len(batches[0])
    gate.set()
    for correlation in sent:
        answer = await connection.receive(0, 9, correlation)
        assert answer.responses[0].partition_responses[0].error_code == ErrorCode.none
    answer = await connection.receive(1, 12, fetched)
    assert [p.high_watermark for p in answer.responses[0].partitions] == [1, 1]
    assert memory.used == before


async def test_a_malformed_request_behind_a_produce_under_way_closes_after_its_answer(
    listener: KafkaListener, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The produce before it is answered and stands; the malformed one closes the connection,
    as it would alone, and nothing is logged as a failure."""
    await log_topics.create_topic(listener.db, TopicSpec("then-garbage", 1))
    writing, gate = _hold_appends(monkeypatch)
    connection = await connect(listener)
    batch = recordbatch.build([(0, b"k", b"v", [])], producer_id=-1, producer_epoch=-1)
    sent = await connection.send_request(produce_request("then-garbage", batch))
    await asyncio.wait_for(writing.wait(), 10)
    # A Produce v9 header and then nothing of its body.
    await connection.send(struct.pack(">hhih", 0, 9, sent + 1, 4) + b"test" + b"\0")
    gate.set()
    answer = await connection.receive(0, 9, sent)
    assert answer.responses[0].partition_responses[0].error_code == ErrorCode.none
    assert await connection.closed()
    described = await log_topics.describe_topic(listener.db, "then-garbage")
    assert described.partitions[0].high_watermark == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "malformed" in warning.getMessage()


async def test_each_answer_is_timed_by_its_api(listener: KafkaListener) -> None:
    """`coordinator_kafka_request_duration_seconds`, by Kafka's name of the API, as Kafka's
    RequestMetrics time them."""

    def answered(api: str) -> float:
        name = "coordinator_kafka_request_duration_seconds_count"
        return PROCESS.get_sample_value(name, {"api": api}) or 0.0

    before = answered("ApiVersions"), answered("Metadata")
    connection = await connect(listener)
    for _ in range(2):
        await connection.call(18, 3, client_software_name="t", client_software_version="1")
    await connection.call(
        3,
        12,
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )

    assert (answered("ApiVersions"), answered("Metadata")) == (before[0] + 2, before[1] + 1)
