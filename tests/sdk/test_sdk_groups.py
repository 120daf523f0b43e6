"""The Consumer's `subscribe()` against the real service, on SQLite and on Postgres: partitions
shared and handed over, rebalance callbacks on the caller's thread inside `poll()`, a commit in
`on_revoke` landing before the partition moves, `consumer_group_metadata()` fencing a transaction
of a consumer that lost its partitions (KIP-447), `max.poll.interval.ms`, auto-commit and
`store_offsets` as a member; and the configuration keys confluent-kafka users pass."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from sdk import (
    OFFSET_BEGINNING,
    ConfigError,
    Consumer,
    ConsumerConfig,
    FencedMemberEpoch,
    IllegalStateError,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
    UnknownMemberId,
)
from sdk._config import build_config
from tests.support.sdk_support import Coordinator


@pytest.fixture
def service(group_service: Coordinator) -> Coordinator:
    """The service with short group timeouts (`tests/sdk/conftest.py`), emptied for this test."""
    return group_service


def consumer(
    service: Coordinator,
    name: str = "c",
    transport: httpx.BaseTransport | None = None,
    **options: Any,
) -> Consumer:
    settings: dict[str, Any] = {
        "coordinator.url": service.url,
        "group.id": "g",
        "client.id": name,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 10,
        "heartbeat.interval.ms": 50,
    }
    settings.update(options)
    return Consumer(settings) if transport is None else Consumer(settings, transport=transport)


def fill(service: Coordinator, topic: str, count: int, partitions: int) -> None:
    with Producer(coordinator_url=service.url) as producer:
        for i in range(count):
            producer.produce(topic, f"v{i}", partition=i % partitions)


def poll_until(
    consumers: list[Consumer],
    done: Callable[[], bool],
    timeout: float = 15.0,
    seen: dict[str, list[Message]] | None = None,
) -> None:
    """Poll every consumer in turn (the callbacks run here) until `done()`; fail at `timeout`.
    Records read go to `seen[client.id]`."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out polling"
        for c in consumers:
            msg = c.poll(0.02)
            if msg is not None and msg.error() is None and seen is not None:
                seen.setdefault(c.config.client_id, []).append(msg)


def owned(c: Consumer) -> set[int]:
    return {tp.partition for tp in c.assignment()}


def describe(service: Coordinator) -> dict[str, Any]:
    response = service.http.get("/v1/groups/g")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def committed(service: Coordinator) -> dict[int, int]:
    offsets = service.http.get("/v1/groups/g/offsets").json()["offsets"]
    return {o["partition"]: o["offset"] for o in offsets}


def test_subscribed_consumers_share_partitions_with_callbacks_on_the_polling_thread(
    service: Coordinator,
) -> None:
    service.create_topic("t", 4)
    events: list[tuple[str, str, list[int], bool]] = []
    here = threading.get_ident()

    def recorder(kind: str) -> Callable[[Consumer, list[TopicPartition]], None]:
        def record(c: Consumer, partitions: list[TopicPartition]) -> None:
            parts = sorted(tp.partition for tp in partitions)
            events.append((kind, c.config.client_id, parts, threading.get_ident() == here))

        return record

    with consumer(service, "a") as a, consumer(service, "b") as b:
        a.subscribe(["t"], on_assign=recorder("assign"), on_revoke=recorder("revoke"))
        poll_until([a], lambda: owned(a) == {0, 1, 2, 3})
        b.subscribe(["t"], on_assign=recorder("assign"), on_revoke=recorder("revoke"))
        poll_until([a, b], lambda: len(owned(a)) == len(owned(b)) == 2)
        assert owned(a) | owned(b) == {0, 1, 2, 3}
        (revoked,) = [parts for kind, name, parts, _ in events if kind == "revoke"]
        assert set(revoked) == owned(b)
        assert events.index(("revoke", "a", revoked, True)) < events.index(
            ("assign", "b", revoked, True)
        )
        assert all(on_our_thread for *_, on_our_thread in events)
        assert describe(service)["state"] == "Stable"
        metadata = a.consumer_group_metadata()
        assert metadata.group_id == "g" and metadata.member_id
        assert metadata.member_epoch == describe_epoch(service, metadata.member_id)


def describe_epoch(service: Coordinator, member_id: str | None) -> int:
    (member,) = [m for m in describe(service)["members"] if m["member_id"] == member_id]
    epoch: int = member["member_epoch"]
    return epoch


def test_a_commit_in_on_revoke_lands_before_the_partition_moves(service: Coordinator) -> None:
    service.create_topic("t", 2)
    fill(service, "t", 20, 2)
    read: dict[str, list[Message]] = {"a": [], "b": []}

    def commit_on_revoke(c: Consumer, partitions: list[TopicPartition]) -> None:
        c.commit(offsets=c.position(partitions))

    with consumer(service, "a") as a:
        a.subscribe(["t"], on_revoke=commit_on_revoke)
        poll_until([a], lambda: len(read["a"]) == 20, seen=read)
        with consumer(service, "b") as b:
            b.subscribe(["t"])
            poll_until([a, b], lambda: len(owned(b)) == 1)
            assert committed(service) == {next(iter(owned(b))): 10}
            fill(service, "t", 4, 2)  # two more for each partition
            poll_until([a, b], lambda: len(read["b"]) == 2 and len(read["a"]) == 22, seen=read)
    # b resumed where a committed in on_revoke: nothing read twice.
    assert sorted(m.offset() for m in read["b"]) == [10, 11]


def test_close_hands_the_partitions_over_at_once(service: Coordinator) -> None:
    service.create_topic("t", 2)
    with consumer(service, "a") as a:
        a.subscribe(["t"])
        b = consumer(service, "b", **{"session.timeout.ms": 60_000})
        b.subscribe(["t"])
        poll_until([a, b], lambda: len(owned(a)) == len(owned(b)) == 1)
        b.close()
        # Well inside b's minute of session timeout: the leave freed its partition.
        poll_until([a], lambda: owned(a) == {0, 1}, timeout=10)
        assert [m["member_id"] for m in describe(service)["members"]] == [
            a.consumer_group_metadata().member_id
        ]


def test_a_consumer_whose_partitions_moved_cannot_commit_them_in_a_transaction(
    service: Coordinator,
) -> None:
    """KIP-447 through the SDK: the metadata taken before a rebalance names an epoch at which the
    member owned both partitions; the offsets of the one now given to b are refused, and the
    transaction can only abort."""
    service.create_topic("t", 2)
    service.create_topic("out", 1)
    with (
        consumer(service, "a") as a,
        consumer(service, "b") as b,
        Producer(coordinator_url=service.url, transactional_id="a-tx") as producer,
    ):
        a.subscribe(["t"])
        poll_until([a], lambda: owned(a) == {0, 1})
        stale = a.consumer_group_metadata()
        b.subscribe(["t"])
        poll_until([a, b], lambda: len(owned(b)) == 1)
        (moved,) = owned(b)
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce("out", "output")
        with pytest.raises(FencedMemberEpoch) as refused:
            producer.send_offsets_to_transaction([TopicPartition("t", moved, 5)], stale)
        assert refused.value.txn_requires_abort
        with pytest.raises(FencedMemberEpoch):
            producer.commit_transaction()
        producer.abort_transaction()
        # Its own partition, with its current metadata, commits.
        producer.begin_transaction()
        (kept,) = owned(a)
        producer.send_offsets_to_transaction(
            [TopicPartition("t", kept, 3)], a.consumer_group_metadata()
        )
        producer.commit_transaction()
    assert committed(service) == {kept: 3}


def test_max_poll_interval_exceeded_leaves_the_group_and_the_next_poll_says_so(
    service: Coordinator,
) -> None:
    service.create_topic("t", 2)
    lost: list[list[int]] = []
    options = {"max.poll.interval.ms": 400, "session.timeout.ms": 300, "heartbeat.interval.ms": 50}
    with consumer(service, "slow", **options) as slow, consumer(service, "b") as b:
        slow.subscribe(["t"], on_lost=lambda c, ps: lost.append([tp.partition for tp in ps]))
        poll_until([slow], lambda: owned(slow) == {0, 1})
        b.subscribe(["t"])
        # The slow consumer stops polling: it leaves, and b gets everything.
        poll_until([b], lambda: owned(b) == {0, 1}, timeout=10)
        msg = slow.poll(1.0)
        assert msg is not None and msg.error() is not None
        assert msg.error().code() == KafkaError._MAX_POLL_EXCEEDED
        assert lost == [[0, 1]] and owned(slow) == set()
        # It joins again and gets its share back.
        poll_until([slow, b], lambda: len(owned(slow)) == len(owned(b)) == 1)


def test_a_paused_consumers_commit_and_transaction_are_refused_and_on_lost_runs(
    service: Coordinator,
) -> None:
    """A zombie: the whole consumer (its heartbeat thread too) stops past its session timeout.
    Meanwhile its partitions go to b. When it wakes, its transactional offsets and its plain
    commit are refused, and its next poll runs on_lost and joins again."""
    service.create_topic("t", 2)
    service.create_topic("out", 1)
    gate = threading.Event()
    gate.set()

    class Pausable(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/heartbeat"):
                gate.wait(30)
            return super().handle_request(request)

    lost: list[list[int]] = []
    zombie = consumer(service, "zombie", Pausable(), **{"session.timeout.ms": 300})
    zombie.subscribe(["t"], on_lost=lambda c, ps: lost.append(sorted(tp.partition for tp in ps)))
    poll_until([zombie], lambda: owned(zombie) == {0, 1})
    metadata = zombie.consumer_group_metadata()
    positions = [TopicPartition("t", p, 1) for p in (0, 1)]
    gate.clear()  # paused
    try:
        with consumer(service, "b") as b:
            b.subscribe(["t"])
            poll_until([b], lambda: owned(b) == {0, 1}, timeout=10)
            with Producer(coordinator_url=service.url, transactional_id="zombie-tx") as producer:
                producer.init_transactions()
                producer.begin_transaction()
                producer.produce("out", "zombie output")
                with pytest.raises(UnknownMemberId) as refused:
                    producer.send_offsets_to_transaction(positions, metadata)
                assert refused.value.txn_requires_abort
                producer.abort_transaction()
            with pytest.raises(UnknownMemberId):
                zombie.commit(offsets=positions)
            gate.set()  # wakes up
            poll_until([zombie, b], lambda: lost == [[0, 1]])
            poll_until([zombie, b], lambda: len(owned(zombie)) == len(owned(b)) == 1)
    finally:
        gate.set()
        zombie.close()
    assert committed(service) == {}
    assert service.all_values("out") == []


def test_auto_commit_commits_as_the_member_and_store_offsets_commits_only_what_was_stored(
    service: Coordinator,
) -> None:
    service.create_topic("t", 1)
    fill(service, "t", 6, 1)
    options = {"enable.auto.commit": True, "auto.commit.interval.ms": 10}
    with consumer(service, "a", **options) as a:
        a.subscribe(["t"])
        read: dict[str, list[Message]] = {}
        poll_until([a], lambda: len(read.get("a", [])) == 6, seen=read)
        poll_until([a], lambda: committed(service) == {0: 6})
    with consumer(service, "s", **options, **{"enable.auto.offset.store": False}) as s:
        s.subscribe(["t"], on_assign=from_the_beginning)
        read = {}
        poll_until([s], lambda: len(read.get("s", [])) == 6, seen=read)
        s.store_offsets(read["s"][2])
        poll_until([s], lambda: committed(service) == {0: 3})
    assert committed(service) == {0: 3}  # close committed what was stored, not the position


def from_the_beginning(c: Consumer, partitions: list[TopicPartition]) -> None:
    for tp in partitions:
        tp.offset = OFFSET_BEGINNING


def test_assign_is_refused_while_subscribed_except_inside_on_assign(service: Coordinator) -> None:
    service.create_topic("t", 1)
    fill(service, "t", 3, 1)

    def start_at_one(c: Consumer, partitions: list[TopicPartition]) -> None:
        c.assign([TopicPartition(tp.topic, tp.partition, 1) for tp in partitions])

    with consumer(service) as c:
        c.subscribe(["t"], on_assign=start_at_one)
        with pytest.raises(IllegalStateError):
            c.assign([TopicPartition("t", 0)])
        read: dict[str, list[Message]] = {}
        poll_until([c], lambda: len(read.get("c", [])) == 2, seen=read)
        assert [m.offset() for m in read["c"]] == [1, 2]
        with pytest.raises(IllegalStateError):
            c.unassign()
    with consumer(service) as plain:
        plain.assign([TopicPartition("t", 0)])
        with pytest.raises(IllegalStateError):
            plain.subscribe(["t"])
    with pytest.raises(ConfigError):
        Consumer({"coordinator.url": service.url}).subscribe(["t"])


def test_error_cb_stats_cb_on_commit_and_logger_are_called(
    service: Coordinator, caplog: pytest.LogCaptureFixture
) -> None:
    service.create_topic("t", 1)
    errors: list[KafkaError] = []
    stats: list[dict[str, Any]] = []
    commits: list[tuple[Any, list[TopicPartition]]] = []
    logger = logging.getLogger("my-app")
    settings = {
        "coordinator.url": service.url,
        "group.id": "g",
        "error_cb": errors.append,
        "stats_cb": lambda text: stats.append(json.loads(text)),
        "statistics.interval.ms": 10,
        "on_commit": lambda err, parts: commits.append((err, parts)),
        "logger": logger,
        "throttle_cb": lambda event: None,
        "socket.keepalive.enable": True,  # librdkafka tuning: accepted, ignored
        "fetch.min.bytes": 1,
        "heartbeat.interval.ms": 50,
    }
    with caplog.at_level(logging.WARNING, logger="my-app"):
        c = Consumer(settings)
    assert any("fetch.min.bytes" in r.message and r.name == "my-app" for r in caplog.records)
    with c:
        c.subscribe(["t"])
        poll_until([c], lambda: owned(c) == {0} and bool(stats))
        c.commit(offsets=[TopicPartition("t", 0, 0)])
        c.poll(0)
        assert commits and commits[0][0] is None and commits[0][1][0].offset == 0
        assert stats[-1]["type"] == "consumer" and stats[-1]["cgrp"]["assignment_size"] == 1
    # A consumer whose service is unreachable hears of it through error_cb, from poll().
    down = Consumer({**settings, "coordinator.url": "http://127.0.0.1:9", "retry.backoff.ms": 1})
    with down:
        down.subscribe(["t"])
        deadline = time.monotonic() + 10
        while not errors and time.monotonic() < deadline:
            down.poll(0.05)
    assert errors and errors[0].code() == KafkaError._TRANSPORT


def test_librdkafka_keys_are_accepted_aliases_applied_and_unknown_keys_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="sdk"):
        config = build_config(
            ConsumerConfig,
            {
                "coordinator.url": "http://h:1",
                "partition.assignment.strategy": "cooperative-sticky",
                "group.protocol": "consumer",
                "auto.commit.enable": "false",
                "linger.ms": 5,  # a producer key on a consumer: ignored too, as librdkafka does
            },
            {},
        )
    assert config.enable_auto_commit is False
    (warning,) = [r.message for r in caplog.records]
    assert "group.protocol" in warning and "partition.assignment.strategy" in warning
    with pytest.raises(ConfigError, match="did you mean"):
        build_config(ConsumerConfig, {"coordinator.url": "http://h:1", "sesion.timeout.ms": 1}, {})
    with pytest.raises(ConfigError, match=r"heartbeat\.interval\.ms"):
        build_config(
            ConsumerConfig,
            {
                "coordinator.url": "http://h:1",
                "session.timeout.ms": 100,
                "heartbeat.interval.ms": 100,
            },
            {},
        )
