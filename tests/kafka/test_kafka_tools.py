"""Kafka's command-line tools (the `kafka-tools` jar's main classes, pinned in
tests/clients/java/pom.xml), unchanged, against `coordinator serve`'s Kafka listener on SQLite and
on Postgres: kafka-topics (create with a replication factor of 3, describe, alter partitions),
kafka-configs (a topic's configs, a user's SCRAM credential and mutation rate),
kafka-consumer-groups (list, describe, reset offsets with execute, delete), kafka-transactions
(list, describe, describe-producers, find-hanging, abort), kafka-client-metrics (a subscription
altered, listed, described) and kafka-producer-perf-test with a transactional id;
kafka-log-dirs, kafka-get-offsets (latest and earliest), kafka-delete-records,
kafka-leader-election, kafka-features (describe; an upgrade is refused, as the finalized
features are fixed) and kafka-cluster (cluster-id; unregister is refused: one broker, no
controller to unregister from).

One JVM per store runs every command as its script would (`Tools.java`), in order; each command
is a test here, checked on what the tool printed.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.java import run_tools, tool_ok
from tests.support.kafka_broker import Broker, broker, http_produce

__all__ = ["broker"]

pytestmark = pytest.mark.slow


SCRAM = "SCRAM-SHA-256=[iterations=8192,password=alice-secret]"


@dataclass(frozen=True)
class Names:
    topic: str  # made by kafka-topics
    perf: str  # made by kafka-topics, written by kafka-producer-perf-test
    group: str  # offsets committed over HTTP, on `offsets`
    offsets: str
    transactional_id: str
    hanging: str  # a topic where an open transaction (over HTTP) waits to be aborted
    user: str  # a SCRAM user kafka-configs sets
    subscription: str  # a client-metrics subscription, matching the perf test's producer
    records: str  # ten records over HTTP, on partition 0, for the offset and records tools


def _commands(bootstrap: str, n: Names, deletion: Path) -> dict[str, list[str]]:
    b = ["--bootstrap-server", bootstrap]
    topics, configs = ["kafka-topics", *b], ["kafka-configs", *b]
    groups, transactions = ["kafka-consumer-groups", *b], ["kafka-transactions", *b]
    entity = ["--entity-type", "topics", "--entity-name", n.topic]
    user = ["--entity-type", "users", "--entity-name", n.user]
    return {
        "topics_create": [
            *topics,
            "--create",
            "--topic",
            n.topic,
            "--partitions",
            "2",
            "--replication-factor",
            "3",
            "--config",
            "retention.ms=600000",
        ],
        "topics_describe": [*topics, "--describe", "--topic", n.topic],
        "topics_alter_partitions": [*topics, "--alter", "--topic", n.topic, "--partitions", "4"],
        "topics_describe_grown": [*topics, "--describe", "--topic", n.topic],
        "configs_alter": [*configs, *entity, "--alter", "--add-config", "retention.ms=1200000"],
        "configs_describe": [*configs, *entity, "--describe"],
        "configs_scram_alter": [*configs, *user, "--alter", "--add-config", SCRAM],
        "configs_quota_alter": [
            *configs,
            *user,
            "--alter",
            "--add-config",
            "controller_mutation_rate=50",
        ],
        "configs_scram_describe": [*configs, *user, "--describe"],
        "client_metrics_alter": [
            "kafka-client-metrics",
            *b,
            "--alter",
            "--name",
            n.subscription,
            "--metrics",
            "org.apache.kafka.producer.record.,org.apache.kafka.producer.buffer.",
            "--interval",
            "100",
            "--match",
            f"client_id={n.perf}-client,client_software_name=apache-kafka-java",
        ],
        "client_metrics_list": ["kafka-client-metrics", *b, "--list"],
        "client_metrics_describe": [
            "kafka-client-metrics",
            *b,
            "--describe",
            "--name",
            n.subscription,
        ],
        "topics_create_perf": [*topics, "--create", "--topic", n.perf, "--partitions", "1"],
        "producer_perf_test": [
            "kafka-producer-perf-test",
            "--topic",
            n.perf,
            "--num-records",
            "200",
            "--record-size",
            "100",
            "--throughput",
            "-1",
            "--command-property",
            f"bootstrap.servers={bootstrap}",
            f"client.id={n.perf}-client",
            "--transactional-id",
            n.transactional_id,
            "--transaction-duration-ms",
            "100",
        ],
        "transactions_list": [*transactions, "list"],
        "transactions_describe": [
            *transactions,
            "describe",
            "--transactional-id",
            n.transactional_id,
        ],
        "transactions_describe_producers": [
            *transactions,
            "describe-producers",
            "--topic",
            n.perf,
            "--partition",
            "0",
        ],
        "transactions_find_hanging": [*transactions, "find-hanging", "--broker-id", "0"],
        "hanging_producers": [
            *transactions,
            "describe-producers",
            "--topic",
            n.hanging,
            "--partition",
            "0",
        ],
        "transactions_abort": [
            *transactions,
            "abort",
            "--topic",
            n.hanging,
            "--partition",
            "0",
            "--start-offset",
            "0",
        ],
        "hanging_describe": [*transactions, "describe", "--transactional-id", n.hanging],
        "groups_list": [*groups, "--list"],
        "groups_describe": [*groups, "--describe", "--group", n.group],
        "groups_reset_offsets": [
            *groups,
            "--reset-offsets",
            "--group",
            n.group,
            "--topic",
            n.offsets,
            "--to-earliest",
            "--execute",
        ],
        "groups_delete": [*groups, "--delete", "--group", n.group],
        "groups_list_after": [*groups, "--list"],
        "log_dirs": ["kafka-log-dirs", *b, "--describe", "--topic-list", n.records],
        "offsets_latest": ["kafka-get-offsets", *b, "--topic", n.records],
        "offsets_earliest": ["kafka-get-offsets", *b, "--topic", n.records, "--time", "-2"],
        "delete_records": [
            "kafka-delete-records",
            *b,
            "--offset-json-file",
            str(deletion),
        ],
        "offsets_earliest_after": ["kafka-get-offsets", *b, "--topic", n.records, "--time", "-2"],
        "leader_election": [
            "kafka-leader-election",
            *b,
            "--election-type",
            "preferred",
            "--topic",
            n.records,
            "--partition",
            "0",
        ],
        "features_describe": ["kafka-features", *b, "describe"],
        "features_upgrade": ["kafka-features", *b, "upgrade", "--feature", "group.version=1"],
        "cluster_id": ["kafka-cluster", "cluster-id", *b],
        "cluster_unregister": ["kafka-cluster", "unregister", *b, "--id", "0"],
    }


@pytest.fixture(scope="module")
def ran(
    broker: Broker, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Names, dict[str, dict[str, Any]]]:
    tag = uuid.uuid4().hex[:8]
    names = Names(
        f"tools-{tag}",
        f"perf-{tag}",
        f"g-{tag}",
        f"off-{tag}",
        f"tx-{tag}",
        f"hang-{tag}",
        f"user-{tag}",
        f"sub-{tag}",
        f"rec-{tag}",
    )
    for topic, partitions in ((names.offsets, 2), (names.hanging, 1), (names.records, 1)):
        created = broker.http.post("/v1/topics", json={"name": topic, "partitions": partitions})
        assert created.status_code == 201
    # An open transaction on `hanging`, its transactional id the topic's name.
    pid = broker.http.post("/v1/init-pid", json={"transactional_id": names.hanging}).json()
    batch = {
        **pid,
        "base_sequence": 0,
        "transactional_id": names.hanging,
        "records": [{"value": "x"}],
    }
    produced = broker.http.post(f"/v1/topics/{names.hanging}/partitions/0/records", json=batch)
    assert produced.status_code == 200, produced.text
    committed = broker.http.post(
        f"/v1/groups/{names.group}/offsets",
        json={"offsets": [{"topic": names.offsets, "partition": p, "offset": 0} for p in (0, 1)]},
    )
    assert committed.status_code == 200
    http_produce(broker, names.records, 0, [f"r{i}" for i in range(10)])
    deletion = tmp_path_factory.mktemp("tools") / "delete.json"
    deletion.write_text(
        json.dumps({"partitions": [{"topic": names.records, "partition": 0, "offset": 4}]})
    )
    commands = _commands(broker.bootstrap, names, deletion)
    lines = run_tools(list(commands.values()), timeout=600)
    return names, dict(zip(commands, lines, strict=True))


def _ok(ran: tuple[Names, dict[str, dict[str, Any]]], name: str) -> str:
    return tool_ok(ran[1][name])


def test_kafka_topics_creates_describes_and_grows(ran: Any) -> None:
    names = ran[0]
    assert f"Created topic {names.topic}." in _ok(ran, "topics_create")
    described = _ok(ran, "topics_describe")
    assert "PartitionCount: 2" in described and "ReplicationFactor: 3" in described
    assert "retention.ms=600000" in described and "Replicas: 0,0,0" in described
    _ok(ran, "topics_alter_partitions")
    assert "PartitionCount: 4" in _ok(ran, "topics_describe_grown")


def test_kafka_configs_alters_and_describes(ran: Any) -> None:
    assert f"Completed updating config for topic {ran[0].topic}." in _ok(ran, "configs_alter")
    assert "retention.ms=1200000" in _ok(ran, "configs_describe")


def test_kafka_configs_sets_and_describes_a_scram_credential(ran: Any) -> None:
    assert f"Completed updating config for user {ran[0].user}." in _ok(ran, "configs_scram_alter")
    assert "SCRAM-SHA-256=iterations=8192" in _ok(ran, "configs_scram_describe")


def test_kafka_configs_sets_and_describes_a_user_s_mutation_rate(ran: Any) -> None:
    assert f"Completed updating config for user {ran[0].user}." in _ok(ran, "configs_quota_alter")
    assert "controller_mutation_rate=50.0" in _ok(ran, "configs_scram_describe")


def test_kafka_producer_perf_test_writes_transactionally(ran: Any) -> None:
    _ok(ran, "topics_create_perf")
    assert "200 records sent" in _ok(ran, "producer_perf_test")


def test_kafka_client_metrics_alters_lists_and_describes_a_subscription(ran: Any) -> None:
    # Whether the perf test's producer pushed before it closed depends on its timing (its push
    # at close is best effort, as Kafka's client makes it); the Java client's telemetry
    # scenario waits for a push while its producer is open.
    names = ran[0]
    assert f"Altered client metrics config for {names.subscription}." in _ok(
        ran, "client_metrics_alter"
    )
    assert names.subscription in _ok(ran, "client_metrics_list").split()
    described = _ok(ran, "client_metrics_describe")
    assert "interval.ms=100" in described and "client_id=" in described


def _rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.strip()]
    return [[cell.strip() for cell in line.split("\t")] for line in lines[1:]]


def test_kafka_transactions_lists_describes_and_finds_nothing_hanging(ran: Any) -> None:
    tid = ran[0].transactional_id
    listed = {row[0]: row for row in _rows(_ok(ran, "transactions_list"))}
    assert listed[tid][3] == "CompleteCommit"
    [described] = _rows(_ok(ran, "transactions_describe"))
    assert described[1] == tid and described[4] == "CompleteCommit"
    [producer] = _rows(_ok(ran, "transactions_describe_producers"))
    assert producer[0] == listed[tid][2]  # the transactional producer's id
    assert _rows(_ok(ran, "transactions_find_hanging")) == []


def test_kafka_transactions_aborts_an_open_transaction_at_its_start_offset(ran: Any) -> None:
    """The tool finds the producer whose transaction starts there and sends WriteTxnMarkers: the
    operator's abort, which fences the producer (its epoch raised)."""
    [producer] = _rows(_ok(ran, "hanging_producers"))
    assert producer[5] == "0"  # CurrentTransactionStartOffset
    _ok(ran, "transactions_abort")
    [described] = _rows(_ok(ran, "hanging_describe"))
    assert described[4] == "CompleteAbort" and int(described[3]) == int(producer[1]) + 1


def test_kafka_consumer_groups_describes_resets_and_deletes(ran: Any) -> None:
    names = ran[0]
    assert names.group in _ok(ran, "groups_list").split()
    described = _ok(ran, "groups_describe")
    assert names.offsets in described
    reset = _ok(ran, "groups_reset_offsets")
    rows = [line.split() for line in reset.splitlines() if line.startswith(names.group)]
    assert sorted((r[1], r[2], r[3]) for r in rows) == [
        (names.offsets, "0", "0"),
        (names.offsets, "1", "0"),
    ]
    assert "was successful" in _ok(ran, "groups_delete")
    assert names.group not in _ok(ran, "groups_list_after").split()


def test_kafka_log_dirs_shows_the_one_directory_with_each_partition_s_bytes(ran: Any) -> None:
    names = ran[0]
    printed = _ok(ran, "log_dirs")
    [described] = [json.loads(line) for line in printed.splitlines() if line.startswith("{")]
    [broker_dirs] = described["brokers"]
    [log_dir] = broker_dirs["logDirs"]
    assert log_dir["logDir"] == "store" and log_dir["error"] is None
    [partition] = log_dir["partitions"]
    assert partition["partition"] == f"{names.records}-0" and partition["size"] > 0


def test_kafka_get_offsets_and_kafka_delete_records(ran: Any) -> None:
    names = ran[0]
    assert _ok(ran, "offsets_latest").split() == [f"{names.records}:0:10"]
    assert _ok(ran, "offsets_earliest").split() == [f"{names.records}:0:0"]
    deleted = _ok(ran, "delete_records")
    assert f"partition: {names.records}-0\tlow_watermark: 4" in deleted
    assert _ok(ran, "offsets_earliest_after").split() == [f"{names.records}:0:4"]


def test_kafka_leader_election_finds_the_preferred_leader_already_elected(ran: Any) -> None:
    assert f"Valid replica already elected for partitions {ran[0].records}-0" in _ok(
        ran, "leader_election"
    )


def test_kafka_features_describes_and_may_not_change_the_finalized_features(ran: Any) -> None:
    described = _ok(ran, "features_describe")
    assert "Feature: group.version" in described and "Feature: transaction.version" in described
    assert "FinalizedVersionLevel: 2" in described
    refused = ran[1]["features_upgrade"]
    assert refused["code"] != 0
    assert "does not support UPDATE_FEATURES" in refused["out"]


def test_kafka_cluster_gives_the_cluster_id_and_has_no_broker_to_unregister(ran: Any) -> None:
    assert _ok(ran, "cluster_id").strip() == "Cluster ID: txn-coordinator"
    assert "does not support the broker unregistration API" in _ok(ran, "cluster_unregister")
