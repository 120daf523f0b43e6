"""Kafka's ACLs through the listener, byte by byte, on SQLite and on Postgres: created, listed and
deleted as Kafka's broker answers (refusals one by one, filters as Kafka matches them), only with
the cluster's rights; a SCRAM user the tokens file does not name does exactly what its ACLs
allow; a DENY takes back what a tokens-file role grants, on the Kafka door and on HTTP; another
process (or a restart) applies them from the store. Kafka's own tool is tried in
tests/kafka/test_security_tools.py; the rules without I/O in tests/service/test_acl_rules.py."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from typing import Any

import httpx
import pytest
from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType

from coordinator.app import create_app
from coordinator.core import acls, scram
from coordinator.core.auth import Authenticator
from coordinator.kafka.server import KafkaListener
from coordinator.log import topics as log_topics
from sdk import recordbatch
from tests.support.kafka_listener import TOKENS, authenticated, connect, listener
from tests.support.kafka_wire import Connection
from tests.support.scram_client import scram_login

__all__ = ["listener"]

TOPIC, GROUP, CLUSTER, TXN = 2, 3, 4, 5
ANY, MATCH, LITERAL, PREFIXED = 1, 2, 3, 4
READ, WRITE, CREATE, ALTER, DESCRIBE, IDEMPOTENT_WRITE = 3, 4, 5, 7, 8, 12
DENY, ALLOW = 2, 3


def binding(
    kind: int,
    name: str,
    operation: int,
    permission: int = ALLOW,
    pattern: int = LITERAL,
    principal: str = "User:carol",
    host: str = "*",
) -> dict[str, Any]:
    return {
        "resource_type": kind,
        "resource_name": name,
        "resource_pattern_type": pattern,
        "principal": principal,
        "host": host,
        "operation": operation,
        "permission_type": permission,
    }


CREATE_ACLS: Any = load_payload_module(30, 3, EntityType.request)
DELETE_ACLS: Any = load_payload_module(31, 3, EntityType.request)


async def create(connection: Connection, *bindings: dict[str, Any]) -> list[ErrorCode]:
    creations = tuple(CREATE_ACLS.AclCreation(**b) for b in bindings)
    answer = await connection.call(30, 3, creations=creations)
    return [r.error_code for r in answer.results]


async def describe(connection: Connection, **asked: Any) -> Any:
    fields = {
        "resource_type_filter": ANY,
        "resource_name_filter": None,
        "pattern_type_filter": ANY,
        "principal_filter": None,
        "host_filter": None,
        "operation": ANY,
        "permission_type": ANY,
        **asked,
    }
    return await connection.call(29, 3, **fields)


def listed(answer: Any) -> set[tuple[Any, ...]]:
    return {
        (
            r.resource_type,
            r.resource_name,
            r.pattern_type,
            a.principal,
            a.operation,
            a.permission_type,
        )
        for r in answer.resources
        for a in r.acls
    }


async def delete(connection: Connection, *filters: dict[str, Any]) -> Any:
    full = [
        {
            "resource_type_filter": ANY,
            "resource_name_filter": None,
            "pattern_type_filter": ANY,
            "principal_filter": None,
            "host_filter": None,
            "operation": ANY,
            "permission_type": ANY,
            **f,
        }
        for f in filters
    ]
    return await connection.call(
        31, 3, filters=tuple(DELETE_ACLS.DeleteAclsFilter(**f) for f in full)
    )


async def produce_code(connection: Connection, topic: str) -> ErrorCode:
    answer = await connection.produce(topic, recordbatch.build([(0, b"k", b"v", [])]))
    code: ErrorCode = answer.responses[0].partition_responses[0].error_code
    return code


async def metadata(connection: Connection) -> Any:
    return await connection.call(
        3,
        12,
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


async def carol(listener: KafkaListener) -> Connection:
    """A SCRAM user made as kafka-configs.sh makes one, which the tokens file does not name."""
    await scram.set_credential(listener.db, "carol", "SCRAM-SHA-256", "carol-secret", 4096)
    connection = await connect(listener)
    assert await scram_login(connection, "SCRAM-SHA-256", "carol", "carol-secret") == ErrorCode.none
    return connection


@pytest.mark.parametrize("listener", [True], indirect=True)
async def test_acls_are_created_listed_and_deleted_as_kafka_answers(
    listener: KafkaListener,
) -> None:
    ops, _ = await authenticated(listener, "ops", "admin-token-1")
    made = await create(
        ops,
        binding(TOPIC, "pay", READ),
        binding(TOPIC, "pay.", WRITE, pattern=PREFIXED),
        binding(GROUP, "*", READ),
        binding(TOPIC, "pay", READ),  # the same binding twice: kept once
        binding(CLUSTER, "other", ALTER),  # refused on its own
        binding(TOPIC, "t", ANY),
        binding(TOPIC, "t", READ, principal="carol"),
    )
    assert made == [ErrorCode.none] * 4 + [ErrorCode.invalid_request] * 3
    everything = await describe(ops)
    assert everything.error_code == ErrorCode.none
    assert listed(everything) == {
        (TOPIC, "pay", LITERAL, "User:carol", READ, ALLOW),
        (TOPIC, "pay.", PREFIXED, "User:carol", WRITE, ALLOW),
        (GROUP, "*", LITERAL, "User:carol", READ, ALLOW),
    }
    # MATCH takes in the literal name, the wildcard and the prefixes that cover it.
    matching = await describe(
        ops, resource_type_filter=TOPIC, resource_name_filter="pay.eu", pattern_type_filter=MATCH
    )
    assert listed(matching) == {(TOPIC, "pay.", PREFIXED, "User:carol", WRITE, ALLOW)}
    unknown = await describe(ops, pattern_type_filter=9)
    assert unknown.error_code == ErrorCode.invalid_request
    # Deleted by filter: each filter answers what it matched.
    gone = await delete(
        ops,
        {"resource_type_filter": TOPIC, "pattern_type_filter": PREFIXED},
        {"resource_type_filter": GROUP, "operation": WRITE},
        {"resource_type_filter": 9},
    )
    first, second, bad = gone.filter_results
    assert [(a.resource_name, a.pattern_type) for a in first.matching_acls] == [("pay.", PREFIXED)]
    assert second.error_code == ErrorCode.none and second.matching_acls == ()
    assert bad.error_code == ErrorCode.invalid_request
    assert {a[1] for a in listed(await describe(ops))} == {"pay", "*"}


@pytest.mark.parametrize("listener", [True], indirect=True)
async def test_acls_are_managed_with_the_cluster_s_rights_only(listener: KafkaListener) -> None:
    reader, _ = await authenticated(listener, "reader", "reader-token-1")
    ops, _ = await authenticated(listener, "ops", "admin-token-1")
    assert (await describe(reader)).error_code == ErrorCode.cluster_authorization_failed
    assert await create(reader, binding(TOPIC, "x", READ)) == [
        ErrorCode.cluster_authorization_failed
    ]
    refused = await delete(reader, {})
    assert refused.filter_results[0].error_code == ErrorCode.cluster_authorization_failed
    # An ACL gives the reader what the admin role gives: ALTER and DESCRIBE on the cluster.
    await create(ops, binding(CLUSTER, "kafka-cluster", ALTER, principal="User:reader"))
    assert await create(reader, binding(TOPIC, "x", READ)) == [ErrorCode.none]
    assert (await describe(reader)).error_code == ErrorCode.none  # ALTER implies DESCRIBE


@pytest.mark.parametrize("listener", [True], indirect=True)
async def test_a_scram_user_does_exactly_what_its_acls_allow(listener: KafkaListener) -> None:
    ops, _ = await authenticated(listener, "ops", "admin-token-1")
    for name in ("pay.eu", "pay.secret", "other"):
        await log_topics.create_topic(listener.db, log_topics.TopicSpec(name, 1))
    user = await carol(listener)
    # Logged in, and nothing allowed: no topic shown, no write.
    shown = await metadata(user)
    assert shown.topics == ()
    assert await produce_code(user, "pay.eu") == ErrorCode.topic_authorization_failed
    await create(
        ops,
        binding(TOPIC, "pay.", WRITE, pattern=PREFIXED),
        binding(TOPIC, "pay.secret", WRITE, DENY),
    )
    assert await produce_code(user, "pay.eu") == ErrorCode.none
    assert await produce_code(user, "pay.secret") == ErrorCode.topic_authorization_failed
    assert await produce_code(user, "other") == ErrorCode.topic_authorization_failed
    shown = await metadata(user)
    # WRITE implies DESCRIBE, and a DENY of WRITE does not deny it (Kafka's rule).
    assert [t.name for t in shown.topics] == ["pay.eu", "pay.secret"]
    # WRITE on some topic stands for IDEMPOTENT_WRITE (KIP-679): a producer id.
    pid = await user.call(
        22, 4, transactional_id=None, transaction_timeout=datetime.timedelta(minutes=1)
    )
    assert pid.error_code == ErrorCode.none
    # The ACLs taken away: refused again, at once.
    await delete(ops, {"principal_filter": "User:carol"})
    assert await produce_code(user, "pay.eu") == ErrorCode.topic_authorization_failed
    # Its credential deleted (kafka-configs.sh --delete-config): locked out.
    await scram.delete_credential(listener.db, "carol", "SCRAM-SHA-256")
    again = await connect(listener)
    assert (
        await scram_login(again, "SCRAM-SHA-256", "carol", "carol-secret")
        == ErrorCode.sasl_authentication_failed
    )


@pytest.mark.parametrize("listener", [True], indirect=True)
async def test_a_deny_takes_back_a_role_s_grant_on_both_doors(listener: KafkaListener) -> None:
    ops, _ = await authenticated(listener, "ops", "admin-token-1")
    reader, _ = await authenticated(listener, "reader", "reader-token-1")
    for name in ("pay.public", "pay.secret"):
        await log_topics.create_topic(listener.db, log_topics.TopicSpec(name, 1))
    made = await create(
        ops, binding(TOPIC, "pay.secret", READ, DENY, principal="User:reader", host="127.0.0.1")
    )
    assert made == [ErrorCode.none]
    codes = {}
    for name in ("pay.public", "pay.secret"):
        answer = await reader.fetch(name)
        codes[name] = answer.responses[0].partitions[0].error_code
    assert codes == {
        "pay.public": ErrorCode.none,
        "pay.secret": ErrorCode.topic_authorization_failed,
    }
    # The HTTP door of the same process checks the same ACLs.
    app = create_app(listener.settings)
    app.state.authenticator = listener.authenticator
    try:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5555))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
            headers = {"authorization": "Bearer reader-token-1"}
            public = await http.get("/v1/topics/pay.public/partitions/0/records", headers=headers)
            secret = await http.get("/v1/topics/pay.secret/partitions/0/records", headers=headers)
        assert public.status_code == 200
        assert secret.status_code == 403
        assert secret.json()["code"] == "TOPIC_AUTHORIZATION_FAILED"
    finally:
        await app.state.db.dispose()


@pytest.mark.parametrize("listener", [True], indirect=True)
async def test_another_process_applies_the_acls_from_the_store(listener: KafkaListener) -> None:
    ops, _ = await authenticated(listener, "ops", "admin-token-1")
    # Another process's authenticator: as at its start (or a restart), it loads them...
    await create(ops, binding(TOPIC, "pay", READ))
    assert listener.settings.auth_tokens_file is not None
    other = Authenticator.from_file(listener.settings.auth_tokens_file)
    await acls.refresh(listener.db, other.acls)
    assert other.acls.all == listener.authenticator.acls.all != ()
    # ... and applies a change another process made within its refresh interval.
    fresh = asyncio.ensure_future(acls.keep_fresh(listener.db, other.acls, 0.01))
    try:
        await create(ops, binding(GROUP, "g", READ))
        async with asyncio.timeout(5):
            # The other process's next round, on its own timer: nothing to wait on but that.
            while len(other.acls.all) != 2:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    finally:
        fresh.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await fresh


async def test_without_auth_acls_are_security_disabled(listener: KafkaListener) -> None:
    connection = await connect(listener)
    assert await create(connection, binding(TOPIC, "t", READ)) == [ErrorCode.security_disabled]
    answer = await describe(connection)
    assert answer.error_code == ErrorCode.security_disabled
    assert "COORDINATOR_AUTH_TOKENS_FILE" in answer.error_message
    assert (await delete(connection, {})).filter_results[0].error_code == (
        ErrorCode.security_disabled
    )


assert TOKENS  # the principals above: ops (admin) and reader (consumer of "pay*", "g-*")
