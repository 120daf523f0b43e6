"""The Consumer against the real service, on SQLite and on Postgres."""

from __future__ import annotations

from typing import Any

import pytest

from sdk import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    TIMESTAMP_CREATE_TIME,
    Consumer,
    IllegalStateError,
    KafkaError,
    KafkaException,
    KafkaTimeoutError,
    Message,
    Producer,
    TopicPartition,
)
from tests.support.sdk_support import Coordinator


def consumer(service: Coordinator, **options: Any) -> Consumer:
    settings: dict[str, Any] = {
        "group_id": "g",
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "fetch_wait_max_ms": 10,
    }
    settings.update(options)
    return Consumer(coordinator_url=service.url, **settings)


def fill(service: Coordinator, topic: str, values: list[str], partition: int = 0) -> None:
    with Producer(coordinator_url=service.url) as producer:
        for value in values:
            producer.produce(topic, value, partition=partition)


def drain(reader: Consumer, timeout: float = 0.15) -> list[Message]:
    messages: list[Message] = []
    while (msg := reader.poll(timeout)) is not None:
        messages.append(msg)
    return messages


def test_poll_returns_records_in_order_as_bytes_with_headers_and_timestamps(
    service: Coordinator,
) -> None:
    service.create_topic("t")
    with Producer(coordinator_url=service.url) as producer:
        producer.produce("t", b"\x00\xff", key=b"k", headers={"h": b"\x01"})
        producer.produce("t", "two")
    with consumer(service) as reader:
        reader.assign([TopicPartition("t", 0)])
        first, second = drain(reader)
    assert (first.topic(), first.partition(), first.offset()) == ("t", 0, 0)
    assert (first.key(), first.value(), first.headers()) == (b"k", b"\x00\xff", [("h", b"\x01")])
    assert first.error() is None and first.timestamp()[0] == TIMESTAMP_CREATE_TIME
    assert (second.offset(), second.key(), second.value()) == (1, None, b"two")
    assert second.headers() is None


def test_consume_returns_up_to_num_messages_as_soon_as_some_are_there(
    service: Coordinator,
) -> None:
    service.create_topic("t", 2)
    fill(service, "t", [f"a{i}" for i in range(5)], partition=0)
    fill(service, "t", [f"b{i}" for i in range(5)], partition=1)
    with consumer(service) as reader:
        reader.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
        got = reader.consume(4, timeout=5)
        assert len(got) == 4
        rest = reader.consume(100, timeout=5)
        assert reader.consume(10, timeout=0.1) == []
    values = [m.value() for m in got + rest]
    assert sorted(values) == sorted(f"{p}{i}".encode() for p in "ab" for i in range(5))
    for prefix in (b"a", b"b"):
        mine = [v for v in values if v and v.startswith(prefix)]
        assert mine == sorted(mine)


def test_auto_offset_reset_chooses_where_a_partition_without_commits_starts(
    service: Coordinator,
) -> None:
    service.create_topic("t")
    fill(service, "t", ["old"])
    with consumer(service, auto_offset_reset="latest") as latest:
        latest.assign([TopicPartition("t", 0)])
        assert latest.poll(0.15) is None
        assert latest.position([TopicPartition("t", 0)])[0].offset == 1
        fill(service, "t", ["new"])
        assert [m.value() for m in drain(latest)] == [b"new"]
    with consumer(service, auto_offset_reset="earliest") as earliest:
        earliest.assign([TopicPartition("t", 0)])
        assert [m.value() for m in drain(earliest)] == [b"old", b"new"]
    with consumer(service, auto_offset_reset="error") as strict:
        strict.assign([TopicPartition("t", 0)])
        with pytest.raises(KafkaException) as raised:
            strict.poll(1)
        assert raised.value.code == KafkaError._AUTO_OFFSET_RESET


def test_a_position_below_the_log_start_is_reset_as_auto_offset_reset_says(
    service: Coordinator,
) -> None:
    """Records deleted under a consumer (delete-records, retention) leave its position below
    the log start: OFFSET_OUT_OF_RANGE, handled by `auto.offset.reset`."""
    service.create_topic("t")
    fill(service, "t", ["a", "b", "c", "d"])
    partition = TopicPartition("t", 0, 1)

    def delete_below(offset: int) -> None:
        response = service.http.post(
            "/v1/topics/t/delete-records",
            json={"partitions": [{"partition": 0, "offset": offset}]},
        )
        assert response.status_code == 200, response.text

    with consumer(service, auto_offset_reset="earliest") as earliest:
        earliest.assign([partition])
        delete_below(2)
        assert [m.offset() for m in drain(earliest)] == [2, 3]
    with consumer(service, auto_offset_reset="latest") as latest:
        latest.assign([TopicPartition("t", 0, 2)])
        delete_below(3)
        assert drain(latest) == []
        assert latest.position([TopicPartition("t", 0)])[0].offset == 4
        fill(service, "t", ["e"])
        assert [m.value() for m in drain(latest)] == [b"e"]
    with consumer(service, auto_offset_reset="error") as strict:
        strict.assign([TopicPartition("t", 0, 3)])
        delete_below(5)
        with pytest.raises(KafkaException) as raised:
            drain(strict)
        assert raised.value.code == KafkaError.OFFSET_OUT_OF_RANGE


def test_seek_and_position_move_and_report_the_next_offset(service: Coordinator) -> None:
    service.create_topic("t")
    fill(service, "t", [str(i) for i in range(5)])
    tp = TopicPartition("t", 0)
    with consumer(service) as reader:
        reader.assign([tp])
        assert reader.position([tp])[0].offset == OFFSET_INVALID
        assert [m.value() for m in reader.consume(2, timeout=5)] == [b"0", b"1"]
        assert reader.position([tp])[0].offset == 2
        reader.seek(TopicPartition("t", 0, 4))
        assert [m.value() for m in drain(reader)] == [b"4"]
        assert reader.position([tp])[0].offset == 5
        reader.seek(TopicPartition("t", 0, OFFSET_BEGINNING))
        assert len(drain(reader)) == 5
        reader.seek(TopicPartition("t", 0, OFFSET_END))
        assert drain(reader, 0.1) == []
        with pytest.raises(IllegalStateError):
            reader.seek(TopicPartition("t", 1, 0))
    with consumer(service) as reader:
        reader.assign([TopicPartition("t", 0, 3)])
        assert [m.value() for m in drain(reader)] == [b"3", b"4"]


def test_the_end_of_a_partition_is_reported_once_each_time_it_is_reached(
    service: Coordinator,
) -> None:
    service.create_topic("t")
    fill(service, "t", ["a"])
    with consumer(service, enable_partition_eof=True) as reader:
        reader.assign([TopicPartition("t", 0)])
        first, eof = drain(reader)
        assert first.value() == b"a"
        error = eof.error()
        assert error is not None and error.code() == KafkaError._PARTITION_EOF
        assert (eof.topic(), eof.partition(), eof.offset()) == ("t", 0, 1)
        fill(service, "t", ["b"])
        assert [m.error() is None for m in drain(reader)] == [True, False]


def test_commit_and_committed_round_trip_and_assign_resumes_from_the_commit(
    service: Coordinator,
) -> None:
    service.create_topic("t")
    fill(service, "t", [str(i) for i in range(6)])
    tp = TopicPartition("t", 0)
    with consumer(service) as reader:
        assert reader.committed([tp])[0].offset == OFFSET_INVALID
        reader.assign([tp])
        messages = reader.consume(2, timeout=5)
        assert reader.commit() == [TopicPartition("t", 0, 2)]
        assert reader.committed([tp])[0].offset == 2
        reader.commit(message=messages[0])
        assert reader.committed([tp])[0].offset == 1
        reader.commit(offsets=[TopicPartition("t", 0, 4, metadata="note")], asynchronous=True)
        [committed] = reader.committed([tp], timeout=5)
        assert (committed.offset, committed.metadata) == (4, "note")
    with consumer(service, auto_offset_reset="latest") as resumed:
        resumed.assign([tp])
        assert [m.value() for m in drain(resumed)] == [b"4", b"5"]


def test_close_commits_the_positions_with_auto_commit(service: Coordinator) -> None:
    service.create_topic("t")
    fill(service, "t", ["a", "b", "c"])
    reader = consumer(service, enable_auto_commit=True)
    reader.assign([TopicPartition("t", 0)])
    reader.consume(2, timeout=5)
    reader.close()
    reader.close()
    with consumer(service) as check:
        assert check.committed([TopicPartition("t", 0)])[0].offset == 2


def test_read_committed_shows_only_committed_transactions(service: Coordinator) -> None:
    service.create_topic("t")
    fill(service, "t", ["plain"])
    producer = Producer({"coordinator.url": service.url, "transactional.id": "tx"})
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce("t", "aborted")
    producer.flush(10)  # written, then aborted
    producer.abort_transaction()
    producer.begin_transaction()
    producer.produce("t", "committed")
    producer.commit_transaction()
    producer.begin_transaction()
    producer.produce("t", "open")
    producer.flush(10)
    with consumer(service) as committed:
        committed.assign([TopicPartition("t", 0)])
        assert [m.value() for m in drain(committed)] == [b"plain", b"committed"]
        producer.commit_transaction()
        assert [m.value() for m in drain(committed)] == [b"open"]
    with consumer(service, isolation_level="read_uncommitted") as everything:
        everything.assign([TopicPartition("t", 0)])
        values = [m.value() for m in drain(everything)]
        assert values == [b"plain", b"aborted", b"committed", b"open"]
    producer.close()


def test_committed_waits_while_a_transaction_holds_pending_offsets(
    service: Coordinator,
) -> None:
    service.create_topic("t")
    producer = Producer({"coordinator.url": service.url, "transactional.id": "tx"})
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition("t", 0, 9)], "g")
    tp = TopicPartition("t", 0)
    with consumer(service) as reader:
        with pytest.raises(KafkaTimeoutError) as raised:
            reader.committed([tp], timeout=0.3)
        assert raised.value.retriable
        producer.commit_transaction()
        assert reader.committed([tp], timeout=5)[0].offset == 9
    with consumer(service, isolation_level="read_uncommitted") as loose:
        assert loose.committed([tp])[0].offset == 9
    producer.close()


def test_watermarks_and_group_metadata(service: Coordinator) -> None:
    service.create_topic("t")
    fill(service, "t", ["a", "b"])
    with consumer(service) as reader:
        assert reader.get_watermark_offsets(TopicPartition("t", 0)) == (0, 2)
        assert reader.consumer_group_metadata().group_id == "g"
    without_group = Consumer(coordinator_url=service.url)
    with pytest.raises(IllegalStateError):
        without_group.consumer_group_metadata()
    without_group.close()
    with pytest.raises(IllegalStateError):
        without_group.poll(0)
