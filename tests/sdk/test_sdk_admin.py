"""The AdminClient against the real service, on SQLite and on Postgres."""

from __future__ import annotations

import pytest

from sdk import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    KafkaError,
    KafkaException,
    NewTopic,
    Producer,
    ProducerFenced,
    ResourceType,
    TopicAlreadyExists,
    TopicPartition,
    TransactionalIdNotFound,
    UnknownTopicOrPartition,
)
from tests.support.sdk_support import Coordinator


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


def test_topic_configs_are_created_described_and_altered_incrementally(
    service: Coordinator,
) -> None:
    with AdminClient({"coordinator.url": service.url}) as admin:
        created = admin.create_topics(
            [NewTopic("log", 1, config={"retention.ms": "60000", "cleanup.policy": "compact"})]
        )
        assert created["log"].result() is None
        resource = ConfigResource(ResourceType.TOPIC, "log")
        configs = admin.describe_configs([resource])[resource].result()
        assert configs["retention.ms"].value == "60000"
        assert configs["retention.ms"].source is ConfigSource.DYNAMIC_TOPIC_CONFIG
        assert configs["retention.bytes"].source is ConfigSource.DEFAULT_CONFIG
        assert configs["retention.bytes"].is_default

        change = ConfigResource("topic", "log")
        change.add_incremental_config(
            ConfigEntry("retention.bytes", "1000", incremental_operation=AlterConfigOpType.SET)
        )
        change.add_incremental_config(
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)
        )
        assert admin.incremental_alter_configs([change])[change].result() is None
        configs = admin.describe_configs([resource])[resource].result()
        assert (configs["retention.bytes"].value, configs["retention.ms"].is_default) == (
            "1000",
            True,
        )

        bad = ConfigResource(ResourceType.TOPIC, "log")
        bad.add_incremental_config(
            ConfigEntry("retention.bytes", "lots", incremental_operation=AlterConfigOpType.SET)
        )
        bad.add_incremental_config(
            ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SET)
        )
        with pytest.raises(KafkaException) as refused:
            admin.incremental_alter_configs([bad])[bad].result()
        assert refused.value.code == KafkaError.INVALID_CONFIG
        unchanged = admin.describe_configs([resource])[resource].result()
        assert unchanged["cleanup.policy"].value == "compact"
        with pytest.raises(UnknownTopicOrPartition):
            missing = ConfigResource(ResourceType.TOPIC, "nope")
            admin.describe_configs([missing])[missing].result()


def test_delete_records_and_delete_topics(service: Coordinator) -> None:
    with AdminClient({"coordinator.url": service.url}) as admin:
        admin.create_topics([NewTopic("t", 2)])["t"].result()
        with Producer(coordinator_url=service.url) as producer:
            for i in range(4):
                producer.produce("t", str(i), partition=0)
        deleted = admin.delete_records([TopicPartition("t", 0, 3), TopicPartition("t", 1, -1)])
        assert deleted[TopicPartition("t", 0, 3)].result().low_watermark == 3
        assert deleted[TopicPartition("t", 1, -1)].result().low_watermark == 0
        too_far = admin.delete_records([TopicPartition("t", 0, 99)])
        with pytest.raises(KafkaException) as refused:
            too_far[TopicPartition("t", 0, 99)].result()
        assert refused.value.code == KafkaError.OFFSET_OUT_OF_RANGE
        assert admin.describe_topics(["t"])["t"].result().partitions[0].log_start_offset == 3

        assert admin.delete_topics(["t"])["t"].result() is None
        with pytest.raises(UnknownTopicOrPartition):
            admin.delete_topics(["t"])["t"].result()
        assert "t" not in admin.list_topics().topics
