"""Kafka Streams' exactly-once app of the suite (`tests/clients/java/.../StreamsApp.java`) as a
process, and the checks of its output: every input counted once, each group's totals the
running sums of its inputs."""

from __future__ import annotations

import json
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.support.java import java_command
from tests.support.kafka_broker import Broker, http_values

INPUTS = 600
GROUPS = 5
DELAY_MS = "10"  # per record: the app's work takes seconds, so a kill lands in the middle of it
DEADLINE_S = 120.0


def amount(i: int) -> int:
    return i * 7 % 10 + 1


class App:
    """One instance of StreamsApp, a process whose output is kept in a file; `settings`
    (`name=value`) over its configs."""

    def __init__(
        self,
        broker: Broker,
        application: str,
        state: Path,
        topics: tuple[str, str],
        protocol: str,
        *settings: str,
        delay_ms: str = DELAY_MS,
    ):
        self.log = state.parent / f"{application}-{time.monotonic_ns()}.log"
        with self.log.open("w") as out:
            command = java_command(
                broker.bootstrap,
                application,
                str(state),
                *topics,
                delay_ms,
                f"group.protocol={protocol}",
                *settings,
                main="coordinator.clients.StreamsApp",
            )
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def lines(self) -> list[dict[str, Any]]:
        return [
            json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")
        ]

    def alive(self) -> None:
        assert self.process.poll() is None, self.log.read_text()[-4000:]

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM: Streams closes (its transaction committed or aborted, its member gone), and
        the JVM exits as a SIGTERM ends it, 143."""
        self.process.terminate()
        assert self.process.wait(timeout=60) == 143, self.log.read_text()[-4000:]
        # close() returned true, in time, with Streams NOT_RUNNING (the state listener's line for
        # it may come after the hook's, or never: the JVM halts once the hook returns).
        assert {"closed": True, "state": "NOT_RUNNING"} in self.lines(), self.lines()


def committed_output(broker: Broker, topic: str) -> list[str]:
    return [value for p in range(2) for value in http_values(broker, topic, p)]


def until_output(broker: Broker, topic: str, app: App, count: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while len(committed_output(broker, topic)) < count:
        app.alive()
        assert time.monotonic() < deadline, f"fewer than {count} outputs: {app.lines()}"
        time.sleep(0.2)


def assert_totals(broker: Broker, output: str, inputs: int = INPUTS) -> None:
    """Every one of the `inputs` inputs counted once; each group's totals are the running sums
    of its inputs, in the order they were counted (the output of a group is on one partition, in
    order)."""
    counted: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for p in range(2):
        for record in records(broker, output, p):
            ident, text = record["value"].split(":")
            counted[record["key"]].append((int(ident), int(text)))
    assert sorted(i for group in counted.values() for i, _ in group) == list(range(inputs))
    for group, updates in counted.items():
        assert all(f"g{i % GROUPS}" == group for i, _ in updates), group
        running = 0
        for i, total in updates:
            running += amount(i)
            assert total == running, (group, i, total, running)


def records(broker: Broker, topic: str, partition: int) -> list[dict[str, str]]:
    """The committed records of a partition, key and value as text."""
    records: list[dict[str, str]] = []
    offset = 0
    while True:
        answer = broker.http.get(
            f"/v1/topics/{topic}/partitions/{partition}/records",
            params={"offset": offset, "max_records": 10000, "isolation_level": "read_committed"},
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        records += body["records"]
        if not body["records"]:
            return records
        offset = body["next_offset"]
