"""Kafka Connect and MirrorMaker 2 as the tests run them: JVM processes on the jars `mvn package`
resolved in tests/clients/connect (Connect 4.3.1, pinned there), watched through what they
change, and a read_committed reader of what they wrote."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

CONNECT = Path(__file__).resolve().parents[1] / "clients" / "connect" / "target" / "lib"
# How long one step may take before a test gives up (a worker start, a rebalance, a copy).
STEP_S = 60.0


class JvmProcess:
    """A Connect worker or a MirrorMaker node: `main` on Connect's classpath, its output in
    `log`."""

    def __init__(self, main: str, args: list[str], log: Path, what: str) -> None:
        java = shutil.which("java")
        if java is None or not list(CONNECT.glob("connect-mirror-*.jar")):
            pytest.fail(
                "Kafka Connect is not resolved: run the README's test command "
                "(mvn -f tests/clients/pom.xml package)"
            )
        # MirrorMaker's own decisions (groups found, offsets translated or skipped) are logged
        # at DEBUG: kept in the log, for the failure a test shows.
        debug = "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.connect.mirror=debug"
        self.command = [java, "-Xmx512m", debug, "-cp", f"{CONNECT}/*", main, *args]
        self.log = log
        self.what = what
        self.process: subprocess.Popen[bytes] | None = None

    def spawn(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def wait(
        self,
        done: Callable[[], bool],
        what: str,
        every_s: float = 0.2,
        state: Callable[[], str] = lambda: "",
    ) -> None:
        """Until `done()`: Connect's progress, which it does not announce (its REST API and the
        clusters are all an operator has). A failure prints `state()`, what the clusters held
        then, before the worker's log."""
        deadline = time.monotonic() + STEP_S
        while not done():
            assert self.process is not None
            if self.process.poll() is not None:
                pytest.fail(f"{self.what} exited waiting for {what}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} after {STEP_S:.0f} s: {state()}\n{self.log_tail()}")
            time.sleep(every_s)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def committed(bootstrap: str, topic: str, partition: int = 0, start: int = 0) -> list[str]:
    """The values a read_committed reader finds in the partition from `start`, up to its last
    stable offset (where a read_committed reader meets the partition's end); none when the topic
    does not exist yet."""
    return [value for _, value in read_committed(bootstrap, topic, partition, start)]


def read_committed(
    bootstrap: str, topic: str, partition: int = 0, start: int = 0
) -> list[tuple[int, str]]:
    """`committed`, with each record's offset."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "topic.metadata.refresh.interval.ms": 500,
            "log_level": 3,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        values: list[tuple[int, str]] = []
        deadline = time.monotonic() + STEP_S
        while time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is None:
                continue
            error = message.error()
            if error is None:
                values.append((message.offset(), message.value().decode()))
            elif error.code() == KafkaError._PARTITION_EOF:
                return values
            elif error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION):
                return values  # no record written yet: the first makes the topic
            else:
                raise KafkaException(error)
        pytest.fail(f"{topic}-{partition}: no end reached in {STEP_S:.0f} s")
    finally:
        consumer.close()
