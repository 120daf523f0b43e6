"""A Kafka team's transactional producer (librdkafka, through confluent-kafka) for the tests
that need committed, aborted and open transactions in a topic, written as Kafka clients write
them."""

from __future__ import annotations

import uuid

import confluent_kafka as ck


def transactional(bootstrap: str) -> ck.Producer:
    """A producer with a transactional id of its own, initialised."""
    producer = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"tx-{uuid.uuid4().hex[:8]}",
            "linger.ms": 0,
        }
    )
    producer.init_transactions(30)
    return producer


def transaction(producer: ck.Producer, topic: str, values: list[str], commit: bool) -> None:
    """One transaction of `values` on partition 0, committed or aborted."""
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value=value.encode(), partition=0)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)
