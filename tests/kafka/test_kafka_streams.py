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

import shutil
from pathlib import Path

import pytest

from tests.support.java import run_tools, tool_ok
from tests.support.kafka_broker import Broker, broker, create_topic, http_produce
from tests.support.streams import (
    GROUPS,
    INPUTS,
    App,
    amount,
    assert_totals,
    committed_output,
    until_output,
)

__all__ = ["broker"]

pytestmark = pytest.mark.slow


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

    assert_totals(broker, output)

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


def _configs(broker: Broker, topic: str) -> dict[str, str]:
    answer = broker.http.get(f"/v1/topics/{topic}/configs")
    assert answer.status_code == 200, answer.text
    return {c["name"]: c["value"] for c in answer.json()["configs"]}
