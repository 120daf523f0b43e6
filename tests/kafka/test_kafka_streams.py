"""Kafka Streams under `processing.guarantee=exactly_once_v2`, unchanged, against the listener on
SQLite and on Postgres: `tests/clients/java/.../StreamsApp.java`, a running total per group in a
state store with its changelog, after a repartition step.

The app is run as a process and SIGKILLed twice in the middle of its work: the second restart
keeps its state directory, the last one finds it removed, so its state must come back from the
changelog alone. The last instance finishes, and a read_committed reader checks the output: every
input counted once, and each group's totals exactly the running sums of its inputs. One
transaction per thread (transaction version 2, each end raising the epoch).

Both group protocols: `classic`, where Streams makes its internal topics through the AdminClient
and assigns its tasks itself (its assignor's user data in JoinGroup), and `streams` (KIP-1071),
where the coordinator takes the topology, makes the internal topics (a compacted changelog, a
repartition topic with its configs) and assigns the tasks; there kafka-streams-groups.sh
describes the group while it runs, and the killed members leave when the group's
`streams.session.timeout.ms` passes."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.support.java import java_command, run_tools, tool_ok
from tests.support.kafka_broker import Broker, broker, create_topic, http_produce, http_values

__all__ = ["broker"]

pytestmark = pytest.mark.slow

INPUTS = 600
GROUPS = 5
DELAY_MS = "10"  # per record: the app's work takes seconds, so a kill lands in the middle of it
DEADLINE_S = 120.0


def amount(i: int) -> int:
    return i * 7 % 10 + 1


class App:
    """One instance of StreamsApp, a process whose output is kept in a file."""

    def __init__(
        self,
        broker: Broker,
        application: str,
        state: Path,
        topics: tuple[str, str],
        protocol: str,
    ):
        self.log = state.parent / f"{application}-{time.monotonic_ns()}.log"
        with self.log.open("w") as out:
            command = java_command(
                broker.bootstrap,
                application,
                str(state),
                *topics,
                DELAY_MS,
                f"group.protocol={protocol}",
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


@pytest.mark.parametrize("protocol", ["classic", "streams"])
def test_kafka_streams_exactly_once_v2_survives_two_kills_and_a_lost_state_directory(
    broker: Broker, tmp_path: Path, protocol: str
) -> None:
    source, output = create_topic(broker, 2), create_topic(broker, 2)
    inputs = [f"{i}:{amount(i)}:g{i % GROUPS}" for i in range(INPUTS)]
    for p in range(2):
        http_produce(broker, source, p, inputs[p::2])
    application = f"totals-{source}"
    state = tmp_path / "state"
    if protocol == "streams":  # the session a killed member's tasks wait out is the group's
        answer = broker.http.patch(
            f"/v1/groups/{application}/configs",
            json={"set": {"streams.session.timeout.ms": "3000"}},
        )
        assert answer.status_code == 200, answer.text

    def app() -> App:
        return App(broker, application, state, (source, output), protocol)

    first = app()
    try:
        until_output(broker, output, first, INPUTS // 4)
    finally:
        first.kill()
    second = app()  # the same state directory
    try:
        until_output(broker, output, second, INPUTS // 2)
    finally:
        second.kill()
    assert len(committed_output(broker, output)) < INPUTS  # each kill came mid-work
    shutil.rmtree(state)  # the last instance's state comes from the changelog alone
    last = app()
    try:
        until_output(broker, output, last, INPUTS)
        if protocol == "streams":
            _described_by_the_tool(broker, application, source)
    finally:
        last.stop()
    assert not any("error" in line for line in last.lines()), last.lines()
    # The totals the last instance started from came from the changelog: it restored them.
    restored = [line for line in last.lines() if "restored" in line]
    assert {line["from"] for line in restored} == {
        f"{application}-totals-changelog-{p}" for p in range(2)
    }, last.lines()
    assert sum(int(line["restored"]) for line in restored) > 0

    # Every input counted once; each group's totals are the running sums of its inputs, in the
    # order they were counted (the output of a group is on one partition, in order).
    counted: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for p in range(2):
        for record in _records(broker, output, p):
            ident, text = record["value"].split(":")
            counted[record["key"]].append((int(ident), int(text)))
    assert sorted(i for group in counted.values() for i, _ in group) == list(range(INPUTS))
    for group, updates in counted.items():
        assert all(f"g{i % GROUPS}" == group for i, _ in updates), group
        running = 0
        for i, total in updates:
            running += amount(i)
            assert total == running, (group, i, total, running)

    # Streams' internal topics, made by its AdminClient with Streams' configs.
    configs = _configs(broker, f"{application}-totals-changelog")
    assert configs["cleanup.policy"] == "compact"
    repartition = f"{application}-by-group-repartition"
    configs = _configs(broker, repartition)
    assert configs["cleanup.policy"] == "delete" and configs["retention.ms"] == "-1"
    # Streams purged the repartition topic of what it had consumed (DeleteRecords).
    described = broker.http.get(f"/v1/topics/{repartition}").json()["partitions"]
    assert any(d["log_start_offset"] > 0 for d in described), described


def _described_by_the_tool(broker: Broker, application: str, source: str) -> None:
    """kafka-streams-groups.sh while the last instance runs: the group listed, Stable with one
    member (the killed ones gone), which runs every task of both subtopologies."""
    tool = ["kafka-streams-groups", "--bootstrap-server", broker.bootstrap]
    listed, state, members = run_tools(
        [
            [*tool, "--list"],
            [*tool, "--describe", "--group", application, "--state"],
            [*tool, "--describe", "--group", application, "--members", "--verbose"],
        ]
    )
    assert application in tool_ok(listed).split()
    [row] = [line.split() for line in tool_ok(state).splitlines() if line.startswith(application)]
    assert row[-2:] == ["Stable", "1"], tool_ok(state)  # STATE, #MEMBERS
    described = tool_ok(members)
    [member] = [line for line in described.splitlines() if line.startswith(application)]
    assert "ACTIVE: 0:[0,1]; 1:[0,1]; TARGET-ACTIVE: 0:[0,1]; 1:[0,1];" in member, described


def _records(broker: Broker, topic: str, partition: int) -> list[dict[str, str]]:
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


def _configs(broker: Broker, topic: str) -> dict[str, str]:
    answer = broker.http.get(f"/v1/topics/{topic}/configs")
    assert answer.status_code == 200, answer.text
    return {c["name"]: c["value"] for c in answer.json()["configs"]}
