"""The SDK's ShareConsumer (confluent-kafka's share consumer, KIP-932) against the live service on
SQLite and on Postgres: implicit and explicit acknowledgement, release and redelivery between two
consumers; and exactly once over a queue: a transactional producer acknowledges the records it
consumed with its output (`send_share_acknowledgements_to_transaction`), an aborted round's
records come again, and in the end every input record is in the output once."""

from __future__ import annotations

import pytest

from sdk import AcknowledgeType, Producer, ShareConsumer
from tests.support.sdk_support import Coordinator


@pytest.fixture
def service(group_service: Coordinator) -> Coordinator:
    return group_service


def _configure(service: Coordinator, group: str) -> None:
    response = service.http.patch(
        f"/v1/groups/{group}/configs", json={"set": {"share.auto.offset.reset": "earliest"}}
    )
    assert response.status_code == 200, response.text


def _produce(service: Coordinator, topic: str, count: int, partitions: int = 1) -> list[str]:
    values = [f"v{i}" for i in range(count)]
    for p in range(partitions):
        mine = [v for i, v in enumerate(values) if i % partitions == p]
        response = service.http.post(
            f"/v1/topics/{topic}/partitions/{p}/records",
            json={"records": [{"value": v} for v in mine]},
        )
        assert response.status_code == 200, response.text
    return values


def _consumer(service: Coordinator, group: str, mode: str = "implicit") -> ShareConsumer:
    return ShareConsumer(
        {
            "coordinator.url": service.url,
            "group.id": group,
            "share.acknowledgement.mode": mode,
            "max.poll.records": 7,
        }
    )


def test_implicit_acknowledgement_accepts_what_each_poll_returned(service: Coordinator) -> None:
    service.create_topic("in", 2)
    _configure(service, "q")
    values = _produce(service, "in", 30, partitions=2)
    got: list[str] = []
    with _consumer(service, "q") as consumer:
        consumer.subscribe(["in"])
        for _ in range(50):
            got += [m.value().decode() for m in consumer.poll(1.0)]  # type: ignore[union-attr]
            if len(got) >= len(values):
                break
    assert sorted(got) == sorted(values)
    # All accepted (at the last poll's commit, on close): a new consumer finds nothing.
    with _consumer(service, "q") as again:
        again.subscribe(["in"])
        assert again.poll(0.5) == []
    offsets = service.http.get("/v1/share-groups/q").json()["offsets"]
    assert {o["lag"] for o in offsets} == {0}


def test_explicit_release_hands_a_record_to_the_other_consumer(service: Coordinator) -> None:
    service.create_topic("in")
    _configure(service, "q")
    _produce(service, "in", 3)
    with _consumer(service, "q", "explicit") as a, _consumer(service, "q", "explicit") as b:
        a.subscribe(["in"])
        b.subscribe(["in"])
        first = a.poll(5.0)
        assert [m.offset() for m in first] == [0, 1, 2]
        a.acknowledge(first[0], AcknowledgeType.ACCEPT)
        a.acknowledge(first[1], AcknowledgeType.RELEASE)
        a.acknowledge(first[2], AcknowledgeType.REJECT)
        a.commit_sync()
        again = b.poll(5.0)
        assert [(m.offset(), m.value()) for m in again] == [(1, b"v1")]
        b.acknowledge(again[0])
        b.commit_sync()
    offsets = service.http.get("/v1/share-groups/q").json()["offsets"]
    assert offsets == [{"topic": "in", "partition": 0, "start_offset": 3, "lag": 0}]


def test_a_transactional_loop_over_a_queue_is_exactly_once(service: Coordinator) -> None:
    service.create_topic("in", 2)
    service.create_topic("out")
    _configure(service, "q")
    values = _produce(service, "in", 40, partitions=2)
    producer = Producer({"coordinator.url": service.url, "transactional.id": "loop"})
    producer.init_transactions()
    rounds = 0
    with _consumer(service, "q", "explicit") as consumer:
        consumer.subscribe(["in"])
        done = 0
        for _ in range(200):
            records = consumer.poll(1.0)
            if not records:
                if done >= len(values):
                    break
                continue
            producer.begin_transaction()
            for m in records:
                producer.produce("out", m.value().upper(), partition=0)  # type: ignore[union-attr]
                consumer.acknowledge(m)
            producer.send_share_acknowledgements_to_transaction(
                consumer.take_acknowledgements(), consumer.share_group_metadata()
            )
            rounds += 1
            if rounds == 2:
                producer.abort_transaction()  # its records come again, its output never shows
                continue
            producer.commit_transaction()
            done += len(records)
    producer.close()
    output = [r["value"] for r in service.read("out")]
    assert sorted(output) == sorted(v.upper() for v in values)
    assert len(set(output)) == len(output)
