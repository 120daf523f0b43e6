"""CreateDelegationToken, RenewDelegationToken, ExpireDelegationToken and
DescribeDelegationToken (KIP-48; `kafka-delegation-tokens.sh`, AdminClient) onto
`coordinator.core.delegation`. As on Kafka, only a connection that logged in with SASL of its
own (not with a token) may ask (else DELEGATION_TOKEN_REQUEST_NOT_ALLOWED), and an error answer
carries Kafka's -1 timestamps."""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core import delegation
from coordinator.core.clock import now_ms
from coordinator.core.errors import ClusterAuthorizationFailed
from coordinator.kafka.connection import Client
from coordinator.kafka.errors import FAILURES, error_code
from coordinator.kafka.wire import Request

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
NO_TIME = _EPOCH - datetime.timedelta(milliseconds=1)  # -1 on the wire, as Kafka answers


def _time(ms: int) -> datetime.datetime:
    return _EPOCH + datetime.timedelta(milliseconds=ms)


def _ms(duration: datetime.timedelta) -> int:
    return round(duration.total_seconds() * 1000)


def _policy(client: Client) -> delegation.Policy:
    settings = client.settings
    secret = settings.delegation_token_secret_key
    return delegation.Policy(
        secret.get_secret_value() if secret is not None else None,
        settings.delegation_token_max_lifetime_ms,
        settings.delegation_token_expiry_time_ms,
    )


def _requester(client: Client) -> str:
    """Who asks, once Kafka's allowTokenRequests holds."""
    if client.sasl_principal is None or client.token_authenticated:
        raise delegation.DelegationTokenRequestNotAllowed(
            "delegation tokens are for connections that logged in with SASL, not with a token"
        )
    return client.sasl_principal


def _admin(client: Client) -> bool:
    assert client.access is not None
    try:
        client.access.cluster()
    except ClusterAuthorizationFailed:
        return False
    return True


async def create_delegation_token(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    requester = client.sasl_principal or ""
    owner = getattr(body, "owner_principal_name", None) or requester
    owner_type = getattr(body, "owner_principal_type", None) or delegation.USER
    answer = {
        "principal_type": owner_type,
        "principal_name": owner,
        "token_requester_principal_type": delegation.USER,
        "token_requester_principal_name": requester,
    }
    try:
        _requester(client)
        token = await delegation.create(
            client.db,
            _policy(client),
            requester=requester,
            owner=owner,
            renewers=[(r.principal_type, r.principal_name) for r in body.renewers],
            max_lifetime_ms=_ms(body.max_lifetime),
            admin=_admin(client),
            now_ms=now_ms(),
        )
    except FAILURES as failure:
        return reply.body(
            error_code=error_code(failure),
            **answer,
            issue_timestamp=NO_TIME,
            expiry_timestamp=NO_TIME,
            max_timestamp=NO_TIME,
            token_id="",
            hmac=b"",
        )
    return reply.body(
        error_code=ErrorCode.none,
        **answer,
        issue_timestamp=_time(token.issued_ms),
        expiry_timestamp=_time(token.expiry_ms),
        max_timestamp=_time(token.max_ms),
        token_id=token.token_id,
        hmac=token.hmac,
    )


async def renew_delegation_token(client: Client, request: Request) -> Any:
    body = request.body
    return await _expiry_answer(
        request,
        lambda: delegation.renew(
            client.db,
            _policy(client),
            _requester(client),
            bytes(body.hmac),
            _ms(body.renew_period),
            now_ms(),
        ),
    )


async def expire_delegation_token(client: Client, request: Request) -> Any:
    body = request.body
    return await _expiry_answer(
        request,
        lambda: delegation.expire(
            client.db,
            _policy(client),
            _requester(client),
            bytes(body.hmac),
            _ms(body.expiry_time_period),
            now_ms(),
        ),
    )


async def _expiry_answer(request: Request, change: Callable[[], Awaitable[int]]) -> Any:
    """Renew's and Expire's answer: the token's new expiry, or the refusal with Kafka's -1."""
    try:
        expiry = await change()
    except FAILURES as failure:
        return request.reply.body(error_code=error_code(failure), expiry_timestamp=NO_TIME)
    return request.reply.body(error_code=ErrorCode.none, expiry_timestamp=_time(expiry))


async def describe_delegation_token(client: Client, request: Request) -> Any:
    reply, body = request.reply, request.body
    try:
        requester = _requester(client)
        policy = _policy(client)
        policy.enabled()
        if body.owners is not None and not body.owners:
            tokens = []  # an empty list of owners asks for none (Kafka's ownersListEmpty)
        else:
            owners = None if body.owners is None else [o.principal_name for o in body.owners]
            tokens = await delegation.describe(client.db, policy, requester, owners, _admin(client))
    except FAILURES as failure:
        return reply.body(error_code=error_code(failure), tokens=())
    return reply.body(
        error_code=ErrorCode.none,
        tokens=tuple(
            reply(
                "DescribedDelegationToken",
                principal_type=delegation.USER,
                principal_name=t.owner,
                token_requester_principal_type=delegation.USER,
                token_requester_principal_name=t.requester,
                issue_timestamp=t.issued_ms,  # plain int64 milliseconds in this schema
                expiry_timestamp=t.expiry_ms,
                max_timestamp=t.max_ms,
                token_id=t.token_id,
                hmac=t.hmac,
                renewers=tuple(
                    reply(
                        "DescribedDelegationTokenRenewer",
                        principal_type=delegation.USER,
                        principal_name=name,
                    )
                    for name in t.renewers
                ),
            )
            for t in tokens
        ),
    )
