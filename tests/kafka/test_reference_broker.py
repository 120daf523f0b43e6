"""The reference broker, Apache Kafka itself (bench/reference_broker.py, issue 38, item 1): it
starts from the jars the README's test command resolved, serves a transactional producer and a
read_committed consumer, says what it is, and leaves nothing behind when it stops."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType

import confluent_kafka as ck
import pytest

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "bench"


def reference_broker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference_broker", BENCH / "reference_broker.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["reference_broker"] = module
    spec.loader.exec_module(module)
    return module


def test_the_reference_broker_serves_a_transaction_and_stops_clean() -> None:
    tool = reference_broker()
    broker = tool.ReferenceBroker()
    with broker:
        described = broker.describe()
        assert described["kafka"] == "4.4.0"  # the Java client's version (tests/clients/java)
        assert described["settings"]["process.roles"] == "broker,controller"
        topic = f"ref-{uuid.uuid4().hex[:8]}"
        producer = ck.Producer(
            {"bootstrap.servers": broker.bootstrap, "transactional.id": f"t-{topic}"}
        )
        producer.init_transactions(60)
        for values, commit in ((["a", "b"], True), (["x"], False), (["c"], True)):
            producer.begin_transaction()
            for value in values:
                producer.produce(topic, value=value.encode())
            producer.flush(30)
            (producer.commit_transaction if commit else producer.abort_transaction)(30)
        consumer = ck.Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": topic,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            }
        )
        try:
            consumer.subscribe([topic])
            seen: list[str] = []
            for _ in range(300):
                message = consumer.poll(0.2)
                if message is not None and message.error() is None:
                    seen.append(message.value().decode())
                if len(seen) == 3:
                    break
        finally:
            consumer.close()
        assert seen == ["a", "b", "c"]
    assert broker.process is None and not broker.root.exists()
