"""Kafka Connect 4.3.1, distributed mode, unchanged, against `coordinator serve` over SQLite and
over Postgres: the worker keeps its config, offset and status topics on the listener and joins
its group with the `connect` protocol type (incremental cooperative rebalancing, Connect's
default `sessioned` protocol), and is driven through its REST API as an operator drives it.

- A FileStreamSource -> topic -> FileStreamSink round trip: the sink's file is the source's.
- Exactly-once source support (KIP-618, `exactly.once.source.support=enabled`): the source task
  writes each poll's records and its file position in one transaction of the worker's
  transactional producer, which the worker fences (InitProducerId on the task's transactional
  id) when the task starts again. The worker is SIGKILLed while the task writes, and started
  again: a read_committed reader then finds every line of the file once, in order. (The worker
  started again waits for the killed task's open transaction to time out, as on Kafka: it reads
  the offsets topic to its end, open transactions included; see `producer.transaction.timeout.ms`
  below.)

Connect runs at 4.3.1 (tests/clients/connect/pom.xml says why).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.connect import JvmProcess, committed, read_committed
from tests.support.kafka_wire import Connection
from tests.support.services import ServiceProcess, free_port, serve_on_fresh_store

pytestmark = pytest.mark.slow


@dataclass
class Served:
    service: ServiceProcess
    bootstrap: str
    root: Path


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("connect")
    port = free_port()
    yield from (
        Served(service, f"127.0.0.1:{port}", root)
        for service in serve_on_fresh_store(
            request.param,
            root,
            "connect",
            COORDINATOR_KAFKA_LISTENER=f"127.0.0.1:{port}",
            # A killed worker's member leaves the group after its 3 s session; a new group
            # forms at once.
            COORDINATOR_GROUP_MIN_SESSION_TIMEOUT_MS="1000",
            COORDINATOR_GROUP_INITIAL_REBALANCE_DELAY_MS="0",
            COORDINATOR_TIMEOUT_CHECK_INTERVAL_MS="500",
        )
    )


class Worker(JvmProcess):
    """One `ConnectDistributed` process of a Connect cluster (its group id and topics)."""

    def __init__(self, served: Served, cluster: str) -> None:
        self.rest = f"http://127.0.0.1:{free_port()}"
        properties = served.root / f"{cluster}.properties"
        properties.write_text(
            "\n".join(
                [
                    f"bootstrap.servers={served.bootstrap}",
                    f"group.id={cluster}",
                    "key.converter=org.apache.kafka.connect.storage.StringConverter",
                    "value.converter=org.apache.kafka.connect.storage.StringConverter",
                    f"config.storage.topic={cluster}-configs",
                    f"offset.storage.topic={cluster}-offsets",
                    f"status.storage.topic={cluster}-status",
                    "config.storage.replication.factor=1",
                    "offset.storage.replication.factor=1",
                    "status.storage.replication.factor=1",
                    "offset.storage.partitions=1",
                    "status.storage.partitions=1",
                    f"listeners={self.rest}",
                    "exactly.once.source.support=enabled",
                    "offset.flush.interval.ms=500",
                    # A lost worker's tasks go to the others at once, not after 5 minutes.
                    "scheduled.rebalance.max.delay.ms=0",
                    "session.timeout.ms=3000",
                    "heartbeat.interval.ms=1000",
                    "task.shutdown.graceful.timeout.ms=2000",
                    "plugin.discovery=only_scan",
                    # A worker starting reads the offsets topic to its end, open transactions
                    # included (Connect's KafkaBasedLog, by design): after a kill, until the
                    # killed task's transaction times out and is aborted, as on Kafka. Connect's
                    # own default makes that a minute; here two seconds.
                    "producer.transaction.timeout.ms=2000",
                    "",
                ]
            )
        )
        super().__init__(
            "org.apache.kafka.connect.cli.ConnectDistributed",
            [str(properties)],
            served.root / f"{cluster}.log",
            "the worker",
        )

    def start(self) -> Worker:
        self.spawn()
        self.wait(lambda: self.get("/").status_code == 200, "the worker's REST API")
        return self

    def get(self, path: str) -> httpx.Response:
        try:
            return httpx.get(self.rest + path, timeout=10)
        except httpx.TransportError:
            return httpx.Response(599)

    def put_connector(self, name: str, config: dict[str, str]) -> None:
        answer = httpx.put(f"{self.rest}/connectors/{name}/config", json=config, timeout=30)
        assert answer.status_code in (200, 201), answer.text

    def running(self, name: str) -> bool:
        status = self.get(f"/connectors/{name}/status")
        if status.status_code != 200:
            return False
        body = status.json()
        tasks = body.get("tasks", [])
        return (
            body["connector"]["state"] == "RUNNING"
            and bool(tasks)
            and all(t["state"] == "RUNNING" for t in tasks)
        )


async def _describe_group(bootstrap: str, group: str) -> Any:
    host, port = bootstrap.split(":")
    connection = Connection(*await asyncio.open_connection(host, int(port)))
    try:
        answer = await connection.call(15, 5, groups=(group,), include_authorized_operations=False)
        return answer.groups[0]
    finally:
        connection.writer.close()


@dataclass
class Cluster:
    """A Connect cluster of one worker, which a test may kill and start again."""

    served: Served
    name: str
    worker: Worker


@pytest.fixture(scope="module")
def cluster(served: Served) -> Iterator[Cluster]:
    name = f"connect-{uuid.uuid4().hex[:8]}"
    running = Cluster(served, name, Worker(served, name).start())
    try:
        yield running
    finally:
        running.worker.stop()


def test_a_file_goes_round_through_source_topic_and_sink(cluster: Cluster) -> None:
    served, worker, tag = cluster.served, cluster.worker, uuid.uuid4().hex[:8]
    source, sink = served.root / f"in-{tag}.txt", served.root / f"out-{tag}.txt"
    lines = [f"{tag} line {i:06d}" for i in range(200)]
    source.write_text("".join(f"{line}\n" for line in lines))
    worker.put_connector(
        f"source-{tag}",
        {
            "connector.class": "org.apache.kafka.connect.file.FileStreamSourceConnector",
            "file": str(source),
            "topic": f"rt-{tag}",
            "tasks.max": "1",
        },
    )
    worker.put_connector(
        f"sink-{tag}",
        {
            "connector.class": "org.apache.kafka.connect.file.FileStreamSinkConnector",
            "file": str(sink),
            "topics": f"rt-{tag}",
            "tasks.max": "1",
        },
    )
    worker.wait(
        lambda: sink.exists() and len(sink.read_text().splitlines()) >= len(lines),
        "sink file with every line",
    )
    assert sink.read_text().splitlines() == lines
    assert worker.running(f"source-{tag}") and worker.running(f"sink-{tag}")
    # The worker's group, as Kafka's DescribeGroups shows it: a classic group of the `connect`
    # type, on Connect's incremental cooperative protocol.
    described = asyncio.run(_describe_group(served.bootstrap, cluster.name))
    assert (described.protocol_type, described.protocol_data) == ("connect", "sessioned")
    assert described.group_state == "Stable" and len(described.members) == 1


def test_an_exactly_once_source_writes_each_line_once_across_a_kill(cluster: Cluster) -> None:
    served, tag = cluster.served, uuid.uuid4().hex[:8]
    source, topic = served.root / f"eos-{tag}.txt", f"eos-{tag}"
    lines = [f"{tag} line {i:06d}" for i in range(3000)]
    source.touch()
    # The file grows while the task reads it (FileStreamSource follows it, as `tail -f`), so
    # the task is busy when the worker is killed.
    appending = threading.Thread(target=_append, args=(source, lines), daemon=True)
    cluster.worker.put_connector(
        f"eos-source-{tag}",
        {
            "connector.class": "org.apache.kafka.connect.file.FileStreamSourceConnector",
            "file": str(source),
            "topic": topic,
            "tasks.max": "1",
            # More than the file's lines, so a poll never returns a full batch: Kafka's
            # FileStreamSourceTask then keeps the lines it read past the batch in its buffer,
            # and takes them out only after its next read of new bytes, so on a file that has
            # stopped growing they wait for ever (FileStreamSourceTask.poll, 4.x). Seen here:
            # a restarted task caught up in 34 polls of 50 and left the last 10 lines unread.
            "batch.size": "10000",
            "exactly.once.support": "required",
            # A transaction a second: the kill comes while one is open, almost surely.
            "transaction.boundary": "interval",
            "transaction.boundary.interval.ms": "1000",
        },
    )
    cluster.worker.wait(
        lambda: cluster.worker.running(f"eos-source-{tag}"), "the source task running"
    )
    appending.start()
    cluster.worker.wait(lambda: len(committed(served.bootstrap, topic)) > 0, "a committed poll")
    cluster.worker.kill()
    appending.join()
    # The same cluster started again: the task goes on from the position committed with its
    # last transaction (having fenced the killed task's transactional producer).
    cluster.worker = Worker(served, cluster.name).start()

    def log_state() -> str:
        """How far the read got, and the ends of the log and of the worker's offsets topic: a
        last stable offset behind the high watermark is a transaction left open, one level
        with it a task that stopped writing (or, on the offsets topic, never started: it
        reads that topic to its high watermark first)."""
        read = len(committed(served.bootstrap, topic))

        def ends(name: str) -> dict[str, int]:
            (partition,) = httpx.get(f"{served.service.url}/v1/topics/{name}").json()["partitions"]
            return {k: v for k, v in partition.items() if k != "partition"}

        offsets = f"{cluster.name}-offsets"
        last = read_committed(served.bootstrap, offsets)[-1:]
        return (
            f"{read} of {len(lines)} lines read committed; the log's ends {ends(topic)}; "
            f"the offsets topic's {ends(offsets)}, its last committed record {last}"
        )

    cluster.worker.wait(
        lambda: len(committed(served.bootstrap, topic)) >= len(lines),
        "every line committed",
        state=log_state,
    )
    assert committed(served.bootstrap, topic) == lines


def _append(path: Path, lines: list[str]) -> None:
    with path.open("a") as out:
        for start in range(0, len(lines), 30):
            out.write("".join(f"{line}\n" for line in lines[start : start + 30]))
            out.flush()
            time.sleep(0.02)  # the pace of a log being written, not a wait for anything
