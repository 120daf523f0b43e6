"""Transactional consume-transform-produce loops written for confluent-kafka (in the shape of its
`eos-transactions.py` example: end-of-partition events, `send_offsets_to_transaction` with the
consumer's positions and `consumer_group_metadata()`, retry-or-abort on commit errors via
`e.args[0]`), one assigning its partitions and one subscribing with rebalance callbacks,
`error_cb` and the librdkafka tuning such code carries, run against the SDK with two changes:
the import, and `coordinator.url` in place of `bootstrap.servers`."""

from __future__ import annotations

from typing import Any

from sdk import Producer
from tests.support.sdk_support import Coordinator

CONFLUENT_KAFKA_LOOP = """
from confluent_kafka import Producer, Consumer, KafkaError, KafkaException, TopicPartition

consumer = Consumer({
    'bootstrap.servers': BROKERS,
    'group.id': 'eos-uppercase',
    'auto.offset.reset': 'earliest',
    'enable.auto.commit': False,
    'enable.partition.eof': True,
})
consumer.assign([TopicPartition(INPUT_TOPIC, p) for p in range(INPUT_PARTITIONS)])

producer = Producer({
    'bootstrap.servers': BROKERS,
    'transactional.id': 'eos-uppercase-0',
})
producer.init_transactions()
producer.begin_transaction()


def delivery_report(err, msg):
    if err is not None:
        failed.append(err)


def commit_processed():
    producer.send_offsets_to_transaction(
        consumer.position(consumer.assignment()),
        consumer.consumer_group_metadata())
    while True:
        try:
            producer.commit_transaction()
            return
        except KafkaException as e:
            if e.args[0].retriable():
                continue
            if e.args[0].txn_requires_abort():
                producer.abort_transaction()
            raise


eof = {}
processed = 0
while True:
    producer.poll(0)
    msg = consumer.poll(timeout=1.0)
    if msg is None:
        continue
    topic, partition = msg.topic(), msg.partition()
    if msg.error():
        if msg.error().code() == KafkaError._PARTITION_EOF:
            eof[(topic, partition)] = True
            if len(eof) == len(consumer.assignment()):
                break
        continue
    eof.pop((topic, partition), None)
    processed += 1
    producer.produce(OUTPUT_TOPIC, msg.value().upper(), msg.key(), on_delivery=delivery_report)
    if processed % 7 == 0:
        commit_processed()
        producer.begin_transaction()

commit_processed()
consumer.close()
producer.flush()
"""


def ported(source: str) -> str:
    """The only two changes porting needs."""
    changed = source.replace("from confluent_kafka import", "from sdk import").replace(
        "'bootstrap.servers'", "'coordinator.url'"
    )
    assert changed.count("from sdk import") == 1
    assert changed.count("'coordinator.url'") == source.count("'bootstrap.servers'") == 2
    return changed


def run_ported(
    service: Coordinator, program: str, partitions: int, words: list[str], **names: Any
) -> dict[str, Any]:
    """Topics `words` (with `words` in it, keyed) and `shouted`; the ported program run against
    them; its globals after the run."""
    service.create_topic("words", partitions)
    service.create_topic("shouted", partitions)
    with Producer(coordinator_url=service.url) as seed:
        for i, word in enumerate(words):
            seed.produce("words", word, key=f"k{i % 5}")
    scope: dict[str, Any] = {
        "BROKERS": service.url,
        "INPUT_TOPIC": "words",
        "INPUT_PARTITIONS": partitions,
        "OUTPUT_TOPIC": "shouted",
        **names,
    }
    exec(compile(ported(program), "ported.py", "exec"), scope)
    assert sorted(service.all_values("shouted", partitions)) == sorted(w.upper() for w in words)
    return scope


def committed_in_total(service: Coordinator, group: str) -> int:
    offsets = service.http.get(f"/v1/groups/{group}/offsets").json()["offsets"]
    return sum(o["offset"] for o in offsets)


def test_a_confluent_kafka_eos_loop_runs_unchanged_but_for_import_and_url(
    service: Coordinator,
) -> None:
    words = [f"word-{i}" for i in range(40)]
    scope = run_ported(service, CONFLUENT_KAFKA_LOOP, 2, words, failed=[])
    assert scope["failed"] == []
    assert scope["processed"] == 40
    assert committed_in_total(service, "eos-uppercase") == 40


CONFLUENT_KAFKA_SUBSCRIBER = """
import logging
import sys

from confluent_kafka import Producer, Consumer, KafkaError, KafkaException


def error_cb(err):
    errors.append(err)
    print('Client error: {}'.format(err), file=sys.stderr)


def print_assignment(consumer, partitions):
    assigned.append(sorted(p.partition for p in partitions))


def print_revoke(consumer, partitions):
    revoked.append(sorted(p.partition for p in partitions))


consumer = Consumer({
    'bootstrap.servers': BROKERS,
    'group.id': 'eos-subscriber',
    'auto.offset.reset': 'earliest',
    'enable.auto.commit': False,
    'enable.partition.eof': True,
    'isolation.level': 'read_committed',
    'session.timeout.ms': 6000,
    'max.poll.interval.ms': 60000,
    'partition.assignment.strategy': 'cooperative-sticky',
    'fetch.min.bytes': 1,
    'socket.keepalive.enable': True,
    'error_cb': error_cb,
    'logger': logging.getLogger('eos'),
})
consumer.subscribe([INPUT_TOPIC], on_assign=print_assignment, on_revoke=print_revoke)

producer = Producer({
    'bootstrap.servers': BROKERS,
    'transactional.id': 'eos-subscriber-0',
    'error_cb': error_cb,
    'compression.type': 'lz4',
})
producer.init_transactions()
producer.begin_transaction()

msg_cnt = 0
eof = {}
while True:
    producer.poll(0)
    msg = consumer.poll(timeout=1.0)
    if msg is None:
        continue
    topic, partition = msg.topic(), msg.partition()
    if msg.error():
        if msg.error().code() == KafkaError._PARTITION_EOF:
            eof[(topic, partition)] = True
            if len(eof) == len(consumer.assignment()):
                break
        else:
            raise KafkaException(msg.error())
        continue
    eof.pop((topic, partition), None)
    msg_cnt += 1
    producer.produce(OUTPUT_TOPIC, msg.value().upper(), msg.key())
    if msg_cnt % 10 == 0:
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()),
            consumer.consumer_group_metadata())
        producer.commit_transaction()
        producer.begin_transaction()

producer.send_offsets_to_transaction(
    consumer.position(consumer.assignment()),
    consumer.consumer_group_metadata())
producer.commit_transaction()
consumer.close()
"""


def test_a_subscribing_confluent_kafka_eos_loop_runs_unchanged_but_for_import_and_url(
    service: Coordinator,
) -> None:
    words = [f"word-{i}" for i in range(45)]
    scope = run_ported(
        service, CONFLUENT_KAFKA_SUBSCRIBER, 3, words, errors=[], assigned=[], revoked=[]
    )
    assert scope["errors"] == []
    assert scope["assigned"] == [[0, 1, 2]]
    assert scope["revoked"] == [[0, 1, 2]]  # close() gives them up
    assert committed_in_total(service, "eos-subscriber") == 45
    group = service.http.get("/v1/groups/eos-subscriber").json()
    assert group["state"] == "Empty" and group["members"] == []
