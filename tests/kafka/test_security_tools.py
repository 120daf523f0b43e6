"""Kafka's own security tools on `coordinator serve` over SQLite and over Postgres, in one JVM
per run of commands (`Tools.java`).

Delegation tokens: a SCRAM user creates a token with kafka-delegation-tokens.sh (naming a
renewer), kafka-topics.sh logs in with the token (SCRAM, `tokenauth=true`) as that user, a
token's login may not ask for tokens, the user describes and renews the token, and once expired
it logs nobody in. The listener's answers byte by byte are in
tests/kafka/test_kafka_delegation_tokens.py.

ACLs: an operator creates a SCRAM user with kafka-configs.sh and gives it ACLs with
kafka-acls.sh (prefixed and literal, ALLOW and DENY); the user's own tools can do exactly that;
the ACLs survive a restart; removed, they allow nothing; the credential deleted, the user is
locked out. The listener's answers byte by byte are in tests/kafka/test_kafka_acls.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.java import run_tools, tool_ok
from tests.support.services import (
    ServiceProcess,
    create_postgres_database,
    drop_postgres_database,
    free_port,
)

pytestmark = pytest.mark.slow

ADMIN = {"token": "admin-token-1", "principal": "ops", "roles": ["admin"]}
ALICE = {
    "token": "alice-token-1",
    "principal": "alice",
    "roles": ["producer", "consumer"],
    "topic_prefixes": ["alice-"],
    "group_prefixes": [""],
}
PASSWORD = "alice-scram-secret"


@dataclass
class Served:
    service: ServiceProcess
    bootstrap: str
    root: Path


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("tokens")
    postgres = request.param == "postgres"
    url = create_postgres_database() if postgres else f"sqlite:///{root / 'tokens.db'}"
    tokens = root / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [ADMIN, ALICE]}))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "coordinator",
            "scram",
            "set",
            "alice",
            "--mechanism",
            "SCRAM-SHA-256",
            "--password-stdin",
            "--database-url",
            url,
        ],
        input=PASSWORD + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    port = free_port()
    service = ServiceProcess(
        url,
        root,
        COORDINATOR_KAFKA_LISTENER=f"127.0.0.1:{port}",
        COORDINATOR_AUTH_TOKENS_FILE=str(tokens),
        COORDINATOR_DELEGATION_TOKEN_SECRET_KEY="the-store-s-token-secret",
    )
    try:
        yield Served(service.start(), f"127.0.0.1:{port}", root)
    finally:
        service.stop()
        if postgres:
            drop_postgres_database(url)
    assert "Traceback" not in service.log.read_text(errors="replace")


def _properties(path: Path, user: str, password: str, token: bool = False) -> str:
    extension = ' tokenauth="true"' if token else ""
    path.write_text(
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=SCRAM-SHA-256\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}"{extension};\n'
    )
    return str(path)


def _tools(*commands: list[str]) -> list[dict[str, Any]]:
    return run_tools(commands)


def test_a_token_made_with_kafka_s_tool_logs_kafka_s_clients_in(served: Served) -> None:
    b = ["--bootstrap-server", served.bootstrap]
    alice = _properties(served.root / f"alice-{uuid.uuid4().hex[:6]}.properties", "alice", PASSWORD)
    topic = f"alice-{uuid.uuid4().hex[:8]}"
    with served.service.client(headers={"Authorization": f"Bearer {ADMIN['token']}"}) as http:
        assert http.post("/v1/topics", json={"name": topic}).status_code == 201
    [created] = _tools(
        [
            "kafka-delegation-tokens",
            *b,
            "--create",
            "--max-life-time-period",
            "-1",
            "--renewer-principal",
            "User:ops",
            "--command-config",
            alice,
        ]
    )
    printed = tool_ok(created)
    # TOKENID  HMAC  OWNER  REQUESTER  RENEWERS  ISSUEDATE  EXPIRYDATE  MAXDATE
    row = [line.split() for line in printed.splitlines() if "User:alice" in line][-1]
    token_id, token_hmac = row[0], row[1]
    assert "[User:ops]" in printed
    with_token = _properties(
        served.root / f"token-{token_id[:6]}.properties", token_id, token_hmac, token=True
    )
    listed, asked, described, renewed, expired, refused = _tools(
        ["kafka-topics", *b, "--list", "--command-config", with_token],
        [
            "kafka-delegation-tokens",
            *b,
            "--create",
            "--max-life-time-period",
            "-1",
            "--command-config",
            with_token,
        ],
        # With no owner named the tool sends an empty list of owners, which Kafka's broker
        # answers with no token at all; so the owner is named.
        [
            "kafka-delegation-tokens",
            *b,
            "--describe",
            "--owner-principal",
            "User:alice",
            "--command-config",
            alice,
        ],
        [
            "kafka-delegation-tokens",
            *b,
            "--renew",
            "--hmac",
            token_hmac,
            "--renew-time-period",
            "-1",
            "--command-config",
            alice,
        ],
        [
            "kafka-delegation-tokens",
            *b,
            "--expire",
            "--hmac",
            token_hmac,
            "--expiry-time-period",
            "-1",
            "--command-config",
            alice,
        ],
        ["kafka-topics", *b, "--list", "--command-config", with_token],
    )
    # Logged in as alice: her topics, not another's.
    assert topic in tool_ok(listed).split()
    # A token's login may not ask for a token.
    assert asked["code"] != 0
    assert (
        "DelegationTokenDisabledException" in asked["err"]
        or "not allowed" in (asked["out"] + asked["err"]).lower()
        or "DelegationTokenRequestNotAllowed" in asked["err"]
    )
    assert token_id in tool_ok(described)
    assert "Completed renew operation" in tool_ok(renewed)
    assert "Completed expire operation" in tool_ok(expired)
    # Expired: the token logs nobody in.
    assert refused["code"] != 0
    assert "authentication failed" in (refused["out"] + refused["err"]).lower()


def _plain(path: Path, user: str, token: str) -> str:
    path.write_text(
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{user}" password="{token}";\n'
    )
    return str(path)


def _perf(bootstrap: str, topic: str, config: str, transactional_id: str = "") -> list[str]:
    transactional = ["--transactional-id", transactional_id] if transactional_id else []
    return [
        "kafka-producer-perf-test",
        "--topic",
        topic,
        "--num-records",
        "5",
        "--record-size",
        "10",
        "--throughput",
        "-1",
        "--command-property",
        f"bootstrap.servers={bootstrap}",
        "delivery.timeout.ms=5000",
        "request.timeout.ms=4000",
        "--command-config",
        config,
        *transactional,
    ]


def test_a_user_made_with_kafka_s_tools_does_what_kafka_acls_allows(served: Served) -> None:
    b = ["--bootstrap-server", served.bootstrap]
    tag = uuid.uuid4().hex[:6]
    user, password = f"bob{tag}", "bob-scram-secret"
    ops = _plain(served.root / f"ops-{tag}.properties", "ops", str(ADMIN["token"]))
    bob = _properties(served.root / f"{user}.properties", user, password)
    mine, secret, theirs = f"{user}-data", f"{user}-secret", f"other-{tag}"
    with served.service.client(headers={"Authorization": f"Bearer {ADMIN['token']}"}) as http:
        for name in (mine, secret, theirs):
            assert http.post("/v1/topics", json={"name": name}).status_code == 201
    acls = ["kafka-acls", *b, "--command-config", ops]
    grant = [*acls, "--add", "--allow-principal", f"User:{user}", "--operation"]
    made, allowed, denied, txn, group, cluster, listed, topics, wrote, refused = _tools(
        [
            "kafka-configs",
            *b,
            "--command-config",
            ops,
            "--alter",
            "--add-config",
            f"SCRAM-SHA-256=[password={password}]",
            "--entity-type",
            "users",
            "--entity-name",
            user,
        ],
        [
            *acls,
            "--add",
            "--allow-principal",
            f"User:{user}",
            "--operation",
            "Write",
            "--topic",
            f"{user}-",
            "--resource-pattern-type",
            "prefixed",
        ],
        [
            *acls,
            "--add",
            "--deny-principal",
            f"User:{user}",
            "--operation",
            "All",
            "--topic",
            secret,
        ],
        [
            *grant,
            "Write",
            "--transactional-id",
            f"{user}-tx",
            "--resource-pattern-type",
            "prefixed",
        ],
        [*grant, "Read", "--group", f"{user}-group"],
        [*grant, "Describe", "--cluster"],
        [*acls, "--list", "--principal", f"User:{user}"],
        ["kafka-topics", *b, "--list", "--command-config", bob],
        _perf(served.bootstrap, mine, bob, f"{user}-tx-1"),
        _perf(served.bootstrap, theirs, bob),
    )
    for outcome in (made, allowed, denied, txn, group, cluster):
        tool_ok(outcome)
    shown = tool_ok(listed)
    assert f"name={user}-, patternType=PREFIXED" in shown
    assert f"principal=User:{user}, host=*, operation=WRITE, permissionType=ALLOW" in shown
    assert f"name={secret}, patternType=LITERAL" in shown
    assert "operation=ALL, permissionType=DENY" in shown
    assert f"name={user}-tx, patternType=PREFIXED" in shown
    assert f"ResourcePattern(resourceType=GROUP, name={user}-group" in shown
    assert "ResourcePattern(resourceType=CLUSTER, name=kafka-cluster" in shown
    # WRITE implies DESCRIBE, and the DENY of ALL takes the secret topic back.
    assert set(tool_ok(topics).split()) == {mine}
    assert "5 records sent" in tool_ok(wrote)  # in transactions, under its transactional id
    assert "TopicAuthorizationException" in refused["out"] + refused["err"]

    # The ACLs are in the store: a restart keeps them.
    served.service.stop()
    served.service.start()
    after, removed, nothing, deleted, locked = _tools(
        [*acls, "--list", "--principal", f"User:{user}"],
        # MATCH: every ACL that applies to the secret topic, the prefixed one too.
        [*acls, "--remove", "--force", "--topic", secret, "--resource-pattern-type", "match"],
        ["kafka-topics", *b, "--list", "--command-config", bob],
        [
            "kafka-configs",
            *b,
            "--command-config",
            ops,
            "--alter",
            "--delete-config",
            "SCRAM-SHA-256",
            "--entity-type",
            "users",
            "--entity-name",
            user,
        ],
        ["kafka-topics", *b, "--list", "--command-config", bob],
    )
    # The same ACLs (the tool prints them in its own hash order).
    assert sorted(tool_ok(after).splitlines()) == sorted(shown.splitlines())
    tool_ok(removed)
    assert tool_ok(nothing).split() == []
    tool_ok(deleted)
    assert locked["code"] != 0
    assert "authentication failed" in (locked["out"] + locked["err"]).lower()
