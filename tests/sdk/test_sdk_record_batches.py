"""The SDK on the binary path: the Producer sends Kafka record batches (every
`compression.type`, CreateTime timestamps, no AddPartitions for transactions), the Consumer
fetches and decodes them, checking CRCs when `check.crcs` is set."""

from __future__ import annotations

import time

import httpx
import pytest

from sdk import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from sdk import recordbatch as rb
from tests.support.sdk_support import Coordinator, Faults, FaultyTransport, is_produce


def read(service: Coordinator, topic: str, **config: object) -> list[tuple[int, object, object]]:
    reader = Consumer({"coordinator.url": service.url, "auto.offset.reset": "earliest", **config})
    with reader:
        reader.assign([TopicPartition(topic, 0)])
        messages = []
        while (msg := reader.poll(0.3)) is not None:
            messages.append(msg)
    return [(m.offset(), m.value(), m.timestamp()) for m in messages]


@pytest.mark.parametrize("codec", list(rb.CODECS))
def test_every_compression_type_goes_binary_and_reads_back(
    service: Coordinator, codec: str
) -> None:
    service.create_topic("t")
    transport = FaultyTransport(Faults(), seed=1)
    config = {"coordinator.url": service.url, "compression.type": codec, "linger.ms": 50}
    with Producer(config, transport=transport) as producer:
        for i in range(20):
            producer.produce("t", f"value-{i}" * 10, key=f"k{i % 3}", timestamp=1_000_000 + i)
        assert producer.flush(30) == 0
    sent = [r for r in transport.sent if is_produce(r)]
    assert sent and all(r.headers["content-type"] == rb_content_type() for r in sent)
    assert {rb.read_header(r.content).compression for r in sent} == {rb.CODECS[codec]}
    assert read(service, "t") == [
        (i, (f"value-{i}" * 10).encode(), (TIMESTAMP_CREATE_TIME, 1_000_000 + i)) for i in range(20)
    ]


def rb_content_type() -> str:
    return "application/vnd.kafka.record-batch"


def test_records_without_a_timestamp_get_the_time_of_produce(service: Coordinator) -> None:
    service.create_topic("t")
    before = int(time.time() * 1000)
    with Producer(coordinator_url=service.url) as producer:
        producer.produce("t", "v")
        assert producer.flush(30) == 0
    after = int(time.time() * 1000)
    ((_, _, (kind, stamp)),) = read(service, "t")
    assert kind == TIMESTAMP_CREATE_TIME and before <= stamp <= after


def test_a_log_append_time_topic_reports_the_services_time(service: Coordinator) -> None:
    answer = service.http.post(
        "/v1/topics",
        json={"name": "t", "configs": {"message.timestamp.type": "LogAppendTime"}},
    )
    assert answer.status_code == 201
    with Producer(coordinator_url=service.url) as producer:
        producer.produce("t", "v", timestamp=5)
        assert producer.flush(30) == 0
    ((_, _, (kind, stamp)),) = read(service, "t")
    assert kind == TIMESTAMP_LOG_APPEND_TIME and stamp > 5


def test_a_transactional_producer_never_calls_add_partitions(service: Coordinator) -> None:
    service.create_topic("t", 3)
    transport = FaultyTransport(Faults(), seed=1)
    config = {"coordinator.url": service.url, "transactional.id": "tx"}
    with Producer(config, transport=transport) as producer:
        producer.init_transactions()
        for round_ in range(2):
            producer.begin_transaction()
            for partition in range(3):
                producer.produce("t", f"{round_}-{partition}", partition=partition)
            producer.commit_transaction()
    paths = [r.url.path for r in transport.sent]
    assert not [p for p in paths if p.endswith("/partitions")], paths
    produced = [r for r in transport.sent if is_produce(r)]
    assert {r.url.params["transactional_id"] for r in produced} == {"tx"}
    assert all(rb.read_header(r.content).is_transactional for r in produced)
    assert sorted(v for p in service.values("t", 3).values() for v in p) == [
        f"{r}-{p}" for r in range(2) for p in range(3)
    ]


def _corrupt_fetches(transport: httpx.BaseTransport) -> httpx.BaseTransport:
    """A transport that flips a byte inside the records of every binary fetch answer."""

    class Flipping(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = transport.handle_request(request)
            if request.method == "GET" and request.url.path.endswith("/records"):
                body = bytearray(response.read())
                response.close()
                if len(body) > rb.HEADER_SIZE + 8:
                    body[rb.HEADER_SIZE + 8] ^= 0x01  # inside the value: still parses
                return httpx.Response(
                    response.status_code, headers=response.headers, content=bytes(body)
                )
            return response

        def close(self) -> None:
            transport.close()

    return Flipping()


@pytest.mark.parametrize("check_crcs", [True, False])
def test_check_crcs_catches_a_batch_damaged_on_the_way(
    service: Coordinator, check_crcs: bool
) -> None:
    service.create_topic("t")
    with Producer(coordinator_url=service.url) as producer:
        producer.produce("t", "abcdefgh", key=None)
        assert producer.flush(30) == 0
    reader = Consumer(
        {
            "coordinator.url": service.url,
            "auto.offset.reset": "earliest",
            "check.crcs": check_crcs,
        },
        transport=_corrupt_fetches(httpx.HTTPTransport()),
    )
    with reader:
        reader.assign([TopicPartition("t", 0)])
        if check_crcs:
            with pytest.raises(KafkaException) as caught:
                reader.poll(5)
            assert caught.value.args[0].code() == KafkaError._BAD_MSG
            assert "CRC" in str(caught.value)
        else:
            message = reader.poll(5)
            assert message is not None and message.value() != b"abcdefgh"


def test_a_position_past_the_end_resets_as_auto_offset_reset_says(service: Coordinator) -> None:
    service.create_topic("t")
    with Producer(coordinator_url=service.url) as producer:
        for i in range(3):
            producer.produce("t", f"v{i}")
        assert producer.flush(30) == 0
    reader = Consumer({"coordinator.url": service.url, "auto.offset.reset": "earliest"})
    with reader:
        reader.assign([TopicPartition("t", 0, 10)])  # past the high watermark: 416
        messages = []
        while (msg := reader.poll(0.5)) is not None:
            messages.append(msg.value())
    assert messages == [b"v0", b"v1", b"v2"]
