"""The AdminClient against the real service, on SQLite and on Postgres."""

from __future__ import annotations

import pytest

from sdk import (
    AdminClient,
    KafkaError,
    NewTopic,
    Producer,
    ProducerFenced,
    TopicAlreadyExists,
    TopicPartition,
    TransactionalIdNotFound,
    UnknownTopicOrPartition,
)
from tests.sdk_support import Coordinator

pytest_plugins = ["tests.sdk_fixtures"]


def test_create_list_and_describe_topics(service: Coordinator) -> None:
    with AdminClient({"coordinator.url": service.url}) as admin:
        futures = admin.create_topics([NewTopic("orders", 3), NewTopic("totals")])
        assert {name: f.result() for name, f in futures.items()} == {
            "orders": None,
            "totals": None,
        }
        again = admin.create_topics([NewTopic("orders", 3)])["orders"]
        with pytest.raises(TopicAlreadyExists):
            again.result()

        metadata = admin.list_topics(timeout=10)
        assert sorted(metadata.topics) == ["orders", "totals"]
        assert sorted(metadata.topics["orders"].partitions) == [0, 1, 2]
        assert len(metadata.topics["totals"].partitions) == 1
        missing = admin.list_topics("nope").topics["nope"]
        assert missing.error is not None
        assert missing.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PARTITION

        with Producer(coordinator_url=service.url) as producer:
            producer.produce("orders", "x", partition=1)
        described = admin.describe_topics(["orders", "nope"])
        orders = described["orders"].result()
        watermarks = [(p.partition, p.high_watermark) for p in orders.partitions]
        assert watermarks == [(0, 0), (1, 1), (2, 0)]
        with pytest.raises(UnknownTopicOrPartition):
            described["nope"].result()


def test_list_describe_and_abort_transactions(service: Coordinator) -> None:
    service.create_topic("t")
    producer = Producer({"coordinator.url": service.url, "transactional.id": "job-1-task-0"})
    producer.init_transactions()
    producer.begin_transaction()
    producer.produce("t", "hanging")
    producer.flush(10)
    with AdminClient(coordinator_url=service.url) as admin:
        listed = admin.list_transactions(state="Ongoing", prefix="job-1-")
        assert [t.transactional_id for t in listed] == ["job-1-task-0"]
        assert admin.list_transactions(prefix="job-2-") == []
        description = admin.describe_transactions(["job-1-task-0"])["job-1-task-0"]
        assert description.state == "Ongoing"
        assert description.partitions == [TopicPartition("t", 0)]
        assert description.started_at is not None and description.started_at.tzinfo is not None
        with pytest.raises(TransactionalIdNotFound):
            admin.describe_transactions(["nobody"])

        [producer_state] = admin.describe_producers([TopicPartition("t", 0)])[
            TopicPartition("t", 0)
        ]
        assert producer_state.producer_id == description.producer_id
        assert producer_state.current_txn_start_offset == 0

        hanging = admin.find_hanging_transactions(max_transaction_timeout_ms=0)
        assert [t.transactional_id for t in hanging.transactions] == ["job-1-task-0"]

        admin.abort_transaction("job-1-task-0")
        assert admin.describe_transactions(["job-1-task-0"])["job-1-task-0"].state == (
            "CompleteAbort"
        )
    with pytest.raises(ProducerFenced):
        producer.commit_transaction()
    producer.close()
    assert service.values("t")[0] == []
