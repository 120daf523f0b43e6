"""Share groups (KIP-932) as Kafka's own clients and tools use them, against `coordinator serve`'s
Kafka listener on SQLite and on Postgres: kafka-clients 4.4's KafkaShareConsumer and Admin
(tests/clients/java/.../ShareScenarios.java: several consumers in one group with explicit
acknowledgement, implicit acknowledgement, REJECT and the delivery-count limit, read_committed,
the Admin's share-group calls), a consumer SIGKILLed while it holds acquired records, whose
records another consumer gets once their lock runs out, each accepted exactly once in the end,
and kafka-share-groups.sh (list, describe, state, reset offsets, delete offsets, delete) with
kafka-configs.sh setting the group configs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from typing import Any

import pytest

from tests.support.java import java_command, run_tools, tool_ok
from tests.support.kafka_broker import Broker, broker, create_topic, http_produce

__all__ = ["broker"]

pytestmark = pytest.mark.slow

SCENARIOS = [
    "share_explicit",
    "share_implicit",
    "share_reject_and_limit",
    "share_read_committed",
    "share_admin",
]
SHARES = "coordinator.clients.ShareScenarios"
# The group the kill test runs in locks a record for 2 s (the module's broker allows 1 s on).
LOCK_MS = 2000


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _tools(commands: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    return dict(zip(commands, run_tools(list(commands.values())), strict=True))


@pytest.fixture(scope="module")
def outcomes(broker: Broker) -> dict[str, dict[str, Any]]:
    done = subprocess.run(
        java_command(broker.bootstrap, *SCENARIOS, main=SHARES),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = {line["scenario"]: line for line in _json_lines(done.stdout)}
    assert sorted(found) == sorted(SCENARIOS), done.stdout + done.stderr[-4000:]
    return found


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_kafka_share_consumer(outcomes: dict[str, dict[str, Any]], scenario: str) -> None:
    outcome = outcomes[scenario]
    assert outcome["ok"], outcome["detail"]


@pytest.fixture(scope="module")
def groups(broker: Broker) -> dict[str, str]:
    """Two groups with their configs set by kafka-configs.sh: `kill` for the kill test (read
    from the start, records locked for LOCK_MS), `tools` for kafka-share-groups.sh."""
    tag = uuid.uuid4().hex[:8]
    names = {"kill": f"kill-{tag}", "tools": f"tools-{tag}"}
    entity = ["--bootstrap-server", broker.bootstrap, "--entity-type", "groups"]
    ran = _tools(
        {
            "kill": [
                "kafka-configs", *entity, "--entity-name", names["kill"], "--alter",
                "--add-config",
                f"share.auto.offset.reset=earliest,share.record.lock.duration.ms={LOCK_MS}",
            ],
            "tools": [
                "kafka-configs", *entity, "--entity-name", names["tools"], "--alter",
                "--add-config", "share.auto.offset.reset=earliest",
            ],
            "described": [
                "kafka-configs", *entity, "--entity-name", names["kill"], "--describe",
            ],
        }
    )  # fmt: skip
    for name in names.values():
        assert f"Completed updating config for group {name}." in tool_ok(ran[name.split("-")[0]])
    described = tool_ok(ran["described"])
    assert "share.auto.offset.reset=earliest" in described
    assert f"share.record.lock.duration.ms={LOCK_MS}" in described
    return names


def test_a_killed_consumers_records_go_to_another_once_their_lock_runs_out(
    broker: Broker, groups: dict[str, str]
) -> None:
    """A consumer acquires records and is SIGKILLed before acknowledging them: their lock runs
    out and another consumer of the group gets them, delivered a second time; every record is
    accepted exactly once in the end. One partition, so that the new consumer shares it with
    the dead one (whose membership lasts until its session times out)."""
    topic = create_topic(broker, partitions=1)
    http_produce(broker, topic, 0, [f"v{i}" for i in range(20)])
    group = groups["kill"]
    with subprocess.Popen(
        java_command(broker.bootstrap, "hold", group, topic, "8", main=SHARES),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            held = json.loads(holder.stdout.readline())["held"]
        finally:
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(timeout=30)
    assert len(held) >= 8
    drained = subprocess.run(
        java_command(broker.bootstrap, "drain", group, topic, "20", main=SHARES),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert drained.returncode == 0, drained.stderr[-4000:]
    [answer] = _json_lines(drained.stdout)
    accepted: dict[str, int] = answer["accepted"]
    assert sorted(accepted) == sorted(f"0@{o}" for o in range(20))
    assert answer["twice"] == 0, "a record was delivered twice to the consumer that accepted it"
    # What the killed consumer was given came again once its lock ran out (it may have held
    # more than it was given: what its last fetch acquired and its poll had not yet returned).
    assert {r: accepted[r] for r in held} == dict.fromkeys(held, 2)
    assert all(count in (1, 2) for count in accepted.values())


@pytest.fixture(scope="module")
def share_tools(broker: Broker, groups: dict[str, str]) -> tuple[str, str, dict[str, Any]]:
    """A topic of 2 partitions of 5 records each, read whole by a share consumer of `tools`,
    then kafka-share-groups.sh's commands, in order."""
    group = groups["tools"]
    topic = create_topic(broker, partitions=2)
    for partition in (0, 1):
        http_produce(broker, topic, partition, [f"t{partition}-{i}" for i in range(5)])
    drained = subprocess.run(
        java_command(broker.bootstrap, "drain", group, topic, "10", main=SHARES),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert drained.returncode == 0, drained.stderr[-4000:]
    tool = ["kafka-share-groups", "--bootstrap-server", broker.bootstrap]
    on = ["--group", group]
    ran = _tools(
        {
            "list": [*tool, "--list"],
            "describe": [*tool, "--describe", *on],
            "state": [*tool, "--describe", *on, "--state"],
            "reset": [
                *tool,
                "--reset-offsets",
                *on,
                "--topic",
                topic,
                "--to-earliest",
                "--execute",
            ],
            "described_again": [*tool, "--describe", *on],
            "delete_offsets": [*tool, "--delete-offsets", *on, "--topic", topic],
            "delete": [*tool, "--delete", *on],
            "listed_again": [*tool, "--list"],
        }
    )
    return group, topic, ran


def _rows(text: str) -> list[list[str]]:
    lines = [line.split() for line in text.splitlines() if line.strip()]
    return lines[1:]


def test_kafka_share_groups_lists_and_describes_offsets_and_state(share_tools: Any) -> None:
    group, topic, ran = share_tools
    assert group in tool_ok(ran["list"]).split()
    assert _rows(tool_ok(ran["describe"])) == [[group, topic, str(p), "5", "0"] for p in (0, 1)]
    [state] = _rows(tool_ok(ran["state"]))
    assert state[0] == group and state[-2:] == ["Empty", "0"]


def test_kafka_share_groups_resets_offsets_to_the_earliest(share_tools: Any) -> None:
    group, topic, ran = share_tools
    assert sorted(_rows(tool_ok(ran["reset"]))) == [[group, topic, str(p), "0"] for p in (0, 1)]
    assert _rows(tool_ok(ran["described_again"])) == [
        [group, topic, str(p), "0", "5"] for p in (0, 1)
    ]


def test_kafka_share_groups_deletes_offsets_and_the_group(share_tools: Any) -> None:
    group, topic, ran = share_tools
    assert _rows(tool_ok(ran["delete_offsets"])) == [[topic, "Successful"]]
    assert f"Deletion of requested share groups ('{group}') was successful." in tool_ok(
        ran["delete"]
    )
    assert group not in tool_ok(ran["listed_again"]).split()


def test_librdkafka_share_consumers_split_a_queue_and_redeliver_a_release(
    broker: Broker, groups: dict[str, str]
) -> None:
    """confluent-kafka's ShareConsumer (librdkafka's, KIP-932): two consumers of one group in
    explicit mode; each releases the first record it gets, which comes again; in the end every
    record is accepted exactly once."""
    from confluent_kafka import AcknowledgeType, ShareConsumer

    topic = create_topic(broker, partitions=2)
    for partition in (0, 1):
        http_produce(broker, topic, partition, [f"r{partition}-{i}" for i in range(10)])
    config = {
        "bootstrap.servers": broker.bootstrap,
        "group.id": groups["tools"] + "-rd",
        "share.acknowledgement.mode": "explicit",
        "log_level": 3,
    }
    configured = broker.http.patch(
        f"/v1/groups/{config['group.id']}/configs",
        json={"set": {"share.auto.offset.reset": "earliest"}},
    )
    assert configured.status_code == 200, configured.text
    accepted: dict[str, int] = {}
    released: set[str] = set()
    consumers = [ShareConsumer(config), ShareConsumer(config)]
    try:
        for consumer in consumers:
            consumer.subscribe([topic])
        for _ in range(200):
            for consumer in consumers:
                messages = consumer.poll(0.2) or []
                for m in messages:
                    assert m.error() is None, m.error()
                    value = m.value().decode()
                    if value not in released:
                        released.add(value)
                        consumer.acknowledge(m, AcknowledgeType.RELEASE)
                    else:
                        accepted[value] = accepted.get(value, 0) + 1
                        consumer.acknowledge(m, AcknowledgeType.ACCEPT)
                if messages:
                    consumer.commit_sync()
            if len(accepted) == 20:
                break
    finally:
        for consumer in consumers:
            consumer.close()
    assert sorted(accepted) == sorted(f"r{p}-{i}" for p in (0, 1) for i in range(10))
    assert set(accepted.values()) == {1}
    assert released == set(accepted)
