"""Delegation tokens (KIP-48) through the listener, byte by byte, on SQLite and on Postgres: a
principal logged in with SASL creates a token, another connection logs in with it (SCRAM with
`tokenauth=true`) as that principal and may not ask for tokens itself; renewal and expiry by the
owner and renewers only; the tokens another process sees; Kafka's refusals. Kafka's own tool
and Java client are tried in tests/kafka/test_security_tools.py; the rules without I/O in
tests/service/test_delegation_rules.py."""

from __future__ import annotations

import base64
import datetime
import struct
from dataclasses import dataclass
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from kio.static.constants import EntityType

from coordinator.core import scram
from coordinator.kafka.server import KafkaListener
from coordinator.kafka.wire import payload_type
from coordinator.log import topics as log_topics
from tests.support.kafka_listener import authenticated, connect, listener
from tests.support.kafka_wire import Connection
from tests.support.scram_client import scram_login
from tests.support.services import free_port

__all__ = ["listener"]

TOKENS_ON = {"auth": True, "delegation_token_secret_key": "a-secret-of-the-store"}
DAY_MS = 24 * 3600 * 1000
CREATE: Any = __import__("kio.schema.create_delegation_token.v3.request", fromlist=["x"])
DESCRIBE: Any = __import__("kio.schema.describe_delegation_token.v3.request", fromlist=["x"])


@dataclass
class Refused:
    """An error answer of Create, Renew or ExpireDelegationToken, which kio cannot read (Kafka's
    -1 timestamps): its code and, for a creation, the owner's and requester's names."""

    error_code: ErrorCode
    names: tuple[str, ...] = ()


def _compact_strings(body: bytes, at: int, count: int) -> tuple[str, ...]:
    found = []
    for _ in range(count):
        size = body[at] - 1  # an unsigned varint, under 128 here
        found.append(body[at + 1 : at + 1 + size].decode())
        at += 1 + size
    return tuple(found)


async def _maybe_refused(connection: Connection, api_key: int, version: int, **fields: Any) -> Any:
    body = await connection.call_frame(api_key, version, **fields)
    code = ErrorCode(struct.unpack(">h", body[:2])[0])
    if code != ErrorCode.none:
        return Refused(code, _compact_strings(body, 2, 4) if api_key == 38 else ())
    response_type = payload_type(api_key, version, EntityType.response)
    return entity_reader(response_type)(body, 0)[0]


async def _create(
    connection: Connection, owner: str | None = None, renewers: tuple[tuple[str, str], ...] = ()
) -> Any:
    return await _maybe_refused(
        connection,
        38,
        3,
        owner_principal_type="User" if owner else None,
        owner_principal_name=owner,
        renewers=tuple(
            CREATE.CreatableRenewers(principal_type=t, principal_name=n) for t, n in renewers
        ),
        max_lifetime=datetime.timedelta(milliseconds=-1),
    )


async def _renew(connection: Connection, token_hmac: bytes, period_ms: int = -1) -> Any:
    return await _maybe_refused(
        connection, 39, 2, hmac=token_hmac, renew_period=datetime.timedelta(milliseconds=period_ms)
    )


async def _expire(connection: Connection, token_hmac: bytes, period_ms: int) -> Any:
    return await _maybe_refused(
        connection,
        40,
        2,
        hmac=token_hmac,
        expiry_time_period=datetime.timedelta(milliseconds=period_ms),
    )


async def _described(connection: Connection, *owners: str) -> Any:
    asked = tuple(
        DESCRIBE.DescribeDelegationTokenOwner(principal_type="User", principal_name=o)
        for o in owners
    )
    return await connection.call(41, 3, owners=asked if owners else None)


async def _token_login(
    listener: KafkaListener, token: Any, mechanism: str = "SCRAM-SHA-512"
) -> tuple[Connection, ErrorCode]:
    connection = await connect(listener)
    password = base64.b64encode(bytes(token.hmac)).decode()
    return connection, await scram_login(
        connection, mechanism, token.token_id, password, tokenauth="true"
    )


@pytest.mark.parametrize("listener", [TOKENS_ON], indirect=True)
async def test_a_token_logs_another_client_in_as_its_owner(listener: KafkaListener) -> None:
    reader, login = await authenticated(listener, "reader", "reader-token-1")
    assert login.error_code == ErrorCode.none
    token = await _create(reader)
    assert token.error_code == ErrorCode.none
    assert (token.principal_type, token.principal_name) == ("User", "reader")
    assert token.token_requester_principal_name == "reader"
    issued = token.issue_timestamp
    assert token.expiry_timestamp - issued == datetime.timedelta(milliseconds=DAY_MS)
    assert token.max_timestamp - issued == datetime.timedelta(milliseconds=7 * DAY_MS)
    for mechanism in scram.MECHANISMS:
        delegated, code = await _token_login(listener, token, mechanism)
        assert code == ErrorCode.none
    # The token's connection is its owner: the reader's rights (topics "pay*" only).
    for name in ("pay-1", "other-1"):
        await log_topics.create_topic(listener.db, log_topics.TopicSpec(name, 1))
    listed = await delegated.call(
        3,
        12,
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    assert [t.name for t in listed.topics] == ["pay-1"]
    # ... and may not ask for tokens itself.
    assert (await _create(delegated)).error_code == ErrorCode.delegation_token_request_not_allowed
    assert (
        await _described(delegated)
    ).error_code == ErrorCode.delegation_token_request_not_allowed
    # A wrong password, an unknown token id: refused, as a wrong SCRAM password is.
    wrong = type("T", (), {"token_id": token.token_id, "hmac": b"not-the-hmac"})()
    assert (await _token_login(listener, wrong))[1] == ErrorCode.sasl_authentication_failed
    # Another process on the store takes the same token.
    address = f"127.0.0.1:{free_port()}"
    settings = listener.settings.model_copy(update={"kafka_listener": address})
    other = KafkaListener(listener.db, settings, listener.authenticator)
    await other.start()
    try:
        assert (await _token_login(other, token))[1] == ErrorCode.none
    finally:
        await other.close()


@pytest.mark.parametrize("listener", [TOKENS_ON], indirect=True)
async def test_owners_and_renewers_renew_and_expire_it(listener: KafkaListener) -> None:
    reader, _ = await authenticated(listener, "reader", "reader-token-1")
    ops, _ = await authenticated(listener, "ops", "admin-token-1")
    token = await _create(reader)
    # Renewed by its owner: at most the expiry time, never past the maximum.
    renewed = await _renew(reader, token.hmac, 3600_000)
    assert renewed.error_code == ErrorCode.none
    assert token.issue_timestamp < renewed.expiry_timestamp < token.expiry_timestamp
    # Not by another principal, even an admin, unless it is a renewer.
    assert (await _renew(ops, token.hmac)).error_code == ErrorCode.delegation_token_owner_mismatch
    assert (
        await _expire(ops, token.hmac, -1)
    ).error_code == ErrorCode.delegation_token_owner_mismatch
    shared = await _create(reader, renewers=(("User", "ops"),))
    assert (await _renew(ops, shared.hmac)).error_code == ErrorCode.none
    # The owner sees its tokens; an admin sees everyone's; owners filter.
    mine = await _described(reader)
    assert {t.token_id for t in mine.tokens} == {token.token_id, shared.token_id}
    [described] = [t for t in mine.tokens if t.token_id == shared.token_id]
    assert [(r.principal_type, r.principal_name) for r in described.renewers] == [("User", "ops")]
    assert bytes(described.hmac) == bytes(shared.hmac)
    assert {t.token_id for t in (await _described(ops, "reader")).tokens} == {
        token.token_id,
        shared.token_id,
    }
    assert (await _described(ops, "nobody")).tokens == ()
    empty = await ops.call(41, 3, owners=())
    assert empty.error_code == ErrorCode.none and empty.tokens == ()
    # Expired at once: gone, and no longer a login.
    gone = await _expire(reader, token.hmac, -1)
    assert gone.error_code == ErrorCode.none
    assert (await _token_login(listener, token))[1] == ErrorCode.sasl_authentication_failed
    assert (await _renew(reader, token.hmac)).error_code == ErrorCode.delegation_token_not_found
    # Expired a moment from now: refused once the moment has passed.
    soon = await _expire(reader, shared.hmac, 0)
    assert soon.error_code == ErrorCode.none
    assert soon.expiry_timestamp <= datetime.datetime.now(datetime.UTC)
    assert (await _token_login(listener, shared))[1] == ErrorCode.sasl_authentication_failed


@pytest.mark.parametrize("listener", [TOKENS_ON], indirect=True)
async def test_tokens_for_others_take_the_cluster_s_rights(listener: KafkaListener) -> None:
    reader, _ = await authenticated(listener, "reader", "reader-token-1")
    ops, _ = await authenticated(listener, "ops", "admin-token-1")
    refused = await _create(reader, owner="ops")
    assert refused.error_code == ErrorCode.delegation_token_authorization_failed
    assert refused.names == ("User", "ops", "User", "reader")  # owner, then requester
    for_reader = await _create(ops, owner="reader")
    assert for_reader.error_code == ErrorCode.none
    assert (
        for_reader.principal_name == "reader" and for_reader.token_requester_principal_name == "ops"
    )
    assert (await _token_login(listener, for_reader))[1] == ErrorCode.none
    bad = await _create(ops, renewers=(("Group", "g"),))
    assert bad.error_code == ErrorCode.invalid_principal_type


@pytest.mark.parametrize("listener", [{**TOKENS_ON, "auth": False}], indirect=True)
async def test_without_a_sasl_login_tokens_are_not_asked_for(listener: KafkaListener) -> None:
    # As Kafka's PLAINTEXT listener: DELEGATION_TOKEN_REQUEST_NOT_ALLOWED (with auth off, the
    # listener still takes SASL, and a login names the owner).
    plain = await connect(listener)
    assert (await _renew(plain, b"x")).error_code == ErrorCode.delegation_token_request_not_allowed
    assert (await _create(plain)).error_code == ErrorCode.delegation_token_request_not_allowed
    anyone, login = await authenticated(listener, "anyone", "any-password")
    assert login.error_code == ErrorCode.none
    token = await _create(anyone)
    assert token.error_code == ErrorCode.none and token.principal_name == "anyone"


@pytest.mark.parametrize("listener", [{"auth": True}], indirect=True)
async def test_without_a_secret_key_tokens_are_disabled(listener: KafkaListener) -> None:
    reader, _ = await authenticated(listener, "reader", "reader-token-1")
    assert (await _create(reader)).error_code == ErrorCode.delegation_token_auth_disabled
    assert (await _described(reader)).error_code == ErrorCode.delegation_token_auth_disabled
    assert (await _renew(reader, b"x")).error_code == ErrorCode.delegation_token_auth_disabled
