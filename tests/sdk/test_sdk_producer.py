"""The idempotent Producer against the real service, on SQLite and on Postgres."""

from __future__ import annotations

import base64
import itertools
import threading

import pytest

from sdk import (
    IllegalStateError,
    KafkaError,
    MessageSizeTooLarge,
    MessageTimedOut,
    Producer,
    UnknownTopicOrPartition,
)
from sdk._partitioner import partition_for_key
from sdk.recordbatch import read_header
from tests.support.sdk_support import Coordinator, Faults, FaultyTransport, Reports, is_produce


def test_records_are_written_in_produce_order_and_reported_with_their_offsets(
    service: Coordinator,
) -> None:
    service.create_topic("t")
    reports = Reports()
    with Producer({"coordinator.url": service.url, "on_delivery": reports}) as producer:
        for i in range(300):
            producer.produce("t", f"v{i}", partition=0)
        assert producer.flush(30) == 0
        assert len(producer) == 0
    assert reports.errors() == []
    assert [(m.offset(), m.value()) for _, m in reports.items] == [
        (i, f"v{i}".encode()) for i in range(300)
    ]
    assert service.values("t")[0] == [f"v{i}" for i in range(300)]


def test_keyed_records_land_on_the_murmur2_partition(service: Coordinator) -> None:
    service.create_topic("t", 5)
    reports = Reports()
    with Producer(coordinator_url=service.url) as producer:
        for i in range(100):
            producer.produce("t", "x", key=f"customer-{i % 13}", on_delivery=reports)
        producer.flush(30)
    assert len(reports.items) == 100
    for err, msg in reports.items:
        assert err is None
        key = msg.key()
        assert key is not None
        assert msg.partition() == partition_for_key(key, 5)


def test_null_key_records_stick_to_one_partition_until_its_batch_is_sent(
    service: Coordinator,
) -> None:
    service.create_topic("t", 4)
    reports = Reports()
    with Producer(coordinator_url=service.url, linger_ms=60_000, batch_size=100) as producer:
        # Each record counts 16 bytes of overhead + 4 of value: a batch takes 5 of them.
        for i in range(20):
            producer.produce("t", f"{i:04d}", on_delivery=reports)
        producer.flush(30)
    in_order = sorted(reports.items, key=lambda report: report[1].value() or b"")
    partitions = [msg.partition() for _, msg in in_order]
    runs = [partitions[i : i + 5] for i in range(0, 20, 5)]
    assert all(len(set(run)) == 1 for run in runs), runs
    assert all(a[0] != b[0] for a, b in itertools.pairwise(runs)), runs


def test_bytes_keys_values_and_headers_round_trip_exactly(service: Coordinator) -> None:
    service.create_topic("t")
    raw = bytes(range(256))
    with Producer(coordinator_url=service.url) as producer:
        producer.produce("t", raw, key=b"\xff\x00", headers=[("trace", b"\x01\x02"), ("h", "é")])
        producer.produce("t", None, key="k", headers={"only": "one"})
        producer.produce("t", "", key=None)
    response = service.http.get(
        "/v1/topics/t/partitions/0/records", params={"encoding": "base64", "offset": 0}
    )
    records = response.json()["records"]
    decoded = [
        (
            None if r["key"] is None else base64.b64decode(r["key"]),
            None if r["value"] is None else base64.b64decode(r["value"]),
            {k: base64.b64decode(v) for k, v in r["headers"].items()},
        )
        for r in records
    ]
    assert decoded == [
        (b"\xff\x00", raw, {"trace": b"\x01\x02", "h": "é".encode()}),
        (b"k", None, {"only": b"one"}),
        (None, b"", {}),
    ]


def test_records_are_batched_per_partition(service: Coordinator) -> None:
    service.create_topic("t", 2)
    transport = FaultyTransport(Faults(), seed=0)
    with Producer(coordinator_url=service.url, linger_ms=50, transport=transport) as producer:
        for i in range(200):
            producer.produce("t", f"v{i}", partition=i % 2)
        producer.flush(30)
    produce_calls = [r for r in transport.sent if is_produce(r)]
    assert 2 <= len(produce_calls) <= 10
    assert service.high_watermark("t", 0) == service.high_watermark("t", 1) == 100


@pytest.mark.parametrize("in_flight", [1, 5])
def test_up_to_max_in_flight_batches_of_a_partition_are_in_flight_at_once(
    service: Coordinator, in_flight: int
) -> None:
    service.create_topic("t")
    transport = FaultyTransport(Faults(hold=0.03, only=is_produce), seed=0)
    with Producer(
        coordinator_url=service.url,
        linger_ms=0,
        batch_size=50,
        max_in_flight_requests_per_connection=in_flight,
        transport=transport,
    ) as producer:
        for i in range(15):
            producer.produce("t", f"value-{i:04d}", partition=0)
        producer.flush(30)
    assert transport.most_concurrent["/v1/topics/t/partitions/0/records"] == in_flight
    assert service.values("t")[0] == [f"value-{i:04d}" for i in range(15)]


def test_unknown_topic_or_partition_is_refused_by_produce(service: Coordinator) -> None:
    service.create_topic("t", 2)
    with Producer(coordinator_url=service.url) as producer:
        with pytest.raises(UnknownTopicOrPartition):
            producer.produce("missing", "v")
        with pytest.raises(UnknownTopicOrPartition):
            producer.produce("t", "v", partition=2)
        assert len(producer) == 0


def test_a_record_over_message_max_bytes_is_refused(service: Coordinator) -> None:
    service.create_topic("t")
    with Producer(coordinator_url=service.url, message_max_bytes=10) as producer:
        with pytest.raises(MessageSizeTooLarge):
            producer.produce("t", "x" * 11)
        producer.produce("t", "x" * 10)
    assert service.values("t")[0] == ["x" * 10]


def test_a_full_queue_raises_buffer_error_until_reports_are_served(service: Coordinator) -> None:
    service.create_topic("t")
    with Producer(
        coordinator_url=service.url, queue_buffering_max_messages=3, linger_ms=60_000
    ) as producer:
        for i in range(3):
            producer.produce("t", str(i))
        with pytest.raises(BufferError):
            producer.produce("t", "3")
        producer.flush(30)
        producer.produce("t", "3")
    assert service.values("t")[0] == ["0", "1", "2", "3"]


def test_bad_arguments_are_refused_before_anything_is_queued(service: Coordinator) -> None:
    service.create_topic("t")
    with Producer(coordinator_url=service.url) as producer:
        with pytest.raises(TypeError):
            producer.produce("t", 42)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="twice"):
            producer.produce("t", "v", headers=[("a", "1"), ("a", "2")])
        with pytest.raises(ValueError, match="timestamp"):
            producer.produce("t", "v", timestamp=-1)
        assert len(producer) == 0


def test_records_never_acknowledged_are_reported_after_delivery_timeout(
    service: Coordinator,
) -> None:
    service.create_topic("t")
    reports = Reports()
    transport = FaultyTransport(Faults(refuse=1.0, only=is_produce), seed=0)
    producer = Producer(
        coordinator_url=service.url,
        transport=transport,
        request_timeout_ms=100,
        linger_ms=0,
        delivery_timeout_ms=400,
        retry_backoff_ms=20,
    )
    producer.produce("t", "never", on_delivery=reports)
    assert producer.flush(10) == 0
    producer.close()
    [(err, msg)] = reports.items
    assert err is not None and err.code() == KafkaError._MSG_TIMED_OUT
    assert isinstance(err.exception(), MessageTimedOut)
    assert msg.value() == b"never" and msg.offset() is None
    assert service.high_watermark("t") == 0


def test_without_idempotence_records_are_plain_appends(service: Coordinator) -> None:
    service.create_topic("t")
    transport = FaultyTransport(Faults(only=is_produce), seed=0)
    with Producer(
        coordinator_url=service.url, enable_idempotence=False, transport=transport
    ) as producer:
        producer.produce("t", "v")
    header = read_header(transport.sent[-1].read())
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (-1, -1, -1)
    assert service.values("t")[0] == ["v"]


def test_a_closed_producer_refuses_every_call(service: Coordinator) -> None:
    service.create_topic("t")
    producer = Producer(coordinator_url=service.url)
    producer.close()
    producer.close()  # closing again does nothing
    with pytest.raises(IllegalStateError):
        producer.produce("t", "v")
    with pytest.raises(IllegalStateError):
        producer.init_transactions()


def test_poll_serves_delivery_callbacks_on_the_callers_thread(service: Coordinator) -> None:
    service.create_topic("t")
    threads: list[str] = []
    with Producer(coordinator_url=service.url, linger_ms=0) as producer:
        producer.produce(
            "t", "v", on_delivery=lambda err, msg: threads.append(threading.current_thread().name)
        )
        served = 0
        while not served:
            served = producer.poll(5)
        assert served == 1
    assert threads == [threading.current_thread().name]
