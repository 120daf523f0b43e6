"""Exactly once through rebalances, on SQLite and on Postgres: a consume-transform-produce loop in
confluent-kafka's style (subscribe; produce; `send_offsets_to_transaction` with the consumer's
positions and `consumer_group_metadata()`; `commit_transaction`; the same in `on_revoke`, abort
in `on_lost`) runs as three members, while members join and leave mid-stream and more input
arrives. The output holds every input record exactly once, and the group's committed offsets
reach the end of the input."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from sdk import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Producer,
    TopicPartition,
)
from tests.support.sdk_support import Coordinator


@pytest.fixture
def service(group_service: Coordinator) -> Coordinator:
    """The service with short group timeouts (`tests/sdk/conftest.py`), emptied for this test."""
    return group_service


INPUT_PARTITIONS = 6
OUTPUT_PARTITIONS = 3


class Worker(threading.Thread):
    """One member of the pipeline, with its own transactional id, as a user would write it."""

    def __init__(self, service: Coordinator, name: str) -> None:
        super().__init__(name=f"eos-{name}", daemon=True)
        self.url = service.url
        self.member = name
        self.processed = 0
        self.aborts = 0
        self.error: BaseException | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            self.loop()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def loop(self) -> None:
        consumer = Consumer(
            {
                "coordinator.url": self.url,
                "group.id": "eos",
                "client.id": self.member,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "session.timeout.ms": 5000,
                "heartbeat.interval.ms": 50,
                "fetch.wait.max.ms": 10,
            }
        )
        producer = Producer(
            {"coordinator.url": self.url, "transactional.id": f"eos-{self.member}", "linger.ms": 1}
        )
        producer.init_transactions()
        producer.begin_transaction()

        def commit_processed(c: Consumer) -> None:
            try:
                producer.send_offsets_to_transaction(
                    c.position(c.assignment()), c.consumer_group_metadata()
                )
                producer.commit_transaction()
            except KafkaException as e:
                if not e.args[0].txn_requires_abort():
                    raise
                # This member lost partitions meanwhile: throw the transaction away and read
                # again from the committed offsets what it still owns.
                producer.abort_transaction()
                self.aborts += 1
                for tp in c.committed(c.assignment()):
                    c.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, OFFSET_BEGINNING)))
            producer.begin_transaction()

        def on_revoke(c: Consumer, partitions: list[TopicPartition]) -> None:
            commit_processed(c)  # what was read from them commits before they go

        def on_lost(c: Consumer, partitions: list[TopicPartition]) -> None:
            producer.abort_transaction()  # they belong to another member now
            self.aborts += 1
            producer.begin_transaction()

        consumer.subscribe(["in"], on_revoke=on_revoke, on_lost=on_lost)
        since_commit = 0
        while not self.stopping.is_set():
            msg = consumer.poll(0.05)
            if msg is None or msg.error():
                if since_commit:
                    commit_processed(consumer)
                    since_commit = 0
                continue
            producer.produce("out", msg.value(), msg.key())
            self.processed += 1
            since_commit += 1
            if since_commit == 5:
                commit_processed(consumer)
                since_commit = 0
        commit_processed(consumer)
        consumer.close()  # on_revoke commits once more, then it leaves the group
        producer.abort_transaction()
        producer.close()

    def finish(self) -> None:
        self.stopping.set()
        self.join(timeout=60)
        assert not self.is_alive(), f"{self.member} did not stop"
        assert self.error is None, f"{self.member} failed: {self.error!r}"


def produce(service: Coordinator, first: int, last: int) -> None:
    with Producer(coordinator_url=service.url) as producer:
        for i in range(first, last):
            producer.produce("in", f"record-{i}", key=f"k{i}")


def test_the_output_holds_every_input_record_exactly_once_through_joins_and_leaves(
    service: Coordinator,
) -> None:
    service.create_topic("in", INPUT_PARTITIONS)
    service.create_topic("out", OUTPUT_PARTITIONS)
    workers: dict[str, Worker] = {}

    def start(name: str) -> None:
        workers[name] = Worker(service, name)
        workers[name].start()

    def processed() -> int:
        return sum(w.processed for w in workers.values())

    def wait_until(done: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            for worker in workers.values():
                assert worker.error is None, f"{worker.member} failed: {worker.error!r}"
            assert time.monotonic() < deadline, f"timed out waiting until {what}"
            time.sleep(0.01)

    def all_committed() -> bool:
        offsets = service.http.get("/v1/groups/eos/offsets").json()["offsets"]
        committed = {o["partition"]: o["offset"] for o in offsets}
        ends = {p: service.high_watermark("in", p) for p in range(INPUT_PARTITIONS)}
        return sum(ends.values()) == 300 and committed == ends

    try:
        produce(service, 0, 100)
        start("w1")
        wait_until(lambda: processed() >= 30, "w1 is under way")
        start("w2")
        start("w3")  # three members now
        produce(service, 100, 200)
        wait_until(lambda: processed() >= 120, "the three are under way")
        workers["w1"].finish()  # leaves mid-stream
        start("w4")  # joins mid-stream
        produce(service, 200, 300)
        wait_until(lambda: processed() >= 220, "w4 is in")
        workers["w2"].finish()
        wait_until(all_committed, "every input record is committed")
    finally:
        for worker in workers.values():
            worker.stopping.set()
    for worker in workers.values():
        worker.finish()

    output = service.all_values("out", OUTPUT_PARTITIONS)
    assert len(output) == len(set(output)) == 300  # no record twice
    assert sorted(output) == sorted(f"record-{i}" for i in range(300))  # none lost
    group = service.http.get("/v1/groups/eos").json()
    assert group["state"] == "Empty" and group["group_epoch"] >= 6  # it did rebalance
