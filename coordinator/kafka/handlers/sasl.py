"""SASL over Kafka's protocol: PLAIN against the tokens file (user = principal, password =
token) and SCRAM-SHA-256/512 against the stored credentials (`coordinator.core.scram`), whose
principal takes its roles and prefixes from the tokens file. The principal's rights then apply to
every request on the connection, as on HTTP. A failed exchange is answered, and the listener
closes the connection after Kafka's delay."""

from __future__ import annotations

import struct
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core import scram
from coordinator.core.auth import Access
from coordinator.kafka.connection import Client
from coordinator.kafka.wire import BadRequest, Request

PLAIN = "PLAIN"
MECHANISMS = (PLAIN, *scram.MECHANISMS)


class _Failed(Exception):
    """The exchange failed; the message says why, without telling which part was wrong."""


class Exchange:
    """One SASL exchange on a connection: tokens in, challenges out, then the principal."""

    def __init__(self, mechanism: str) -> None:
        self.mechanism = mechanism
        self._server: scram.ScramServer | None = None
        self._user = ""

    async def step(self, client: Client, token: bytes) -> tuple[bytes, bool]:
        """The answer to the client's token, and whether the exchange is complete (the
        connection then has its principal). Raises `_Failed`."""
        if self.mechanism == PLAIN:
            _plain(client, token)
            return b"", True
        try:
            message = token.decode("utf-8")
            if self._server is None:
                first = scram.client_first(message)
                credential = await scram.lookup(client.db, first.user, self.mechanism)
                if credential is None:
                    raise scram.ScramFailed("invalid credentials")
                self._user = first.user
                self._server = scram.ScramServer(self.mechanism, first, credential)
                return self._server.server_first.encode(), False
            final = self._server.final(message)
        except (scram.ScramFailed, UnicodeDecodeError):
            raise _Failed(f"invalid credentials for {self.mechanism}") from None
        _grant(client, self._user)
        return final.encode(), True


def _grant(client: Client, name: str) -> None:
    if client.authenticator is None:
        client.access = Access(None)
        return
    principal = client.authenticator.named(name)
    if principal is None:
        raise _Failed("unknown principal or credentials")
    client.access = Access(principal)


def _plain(client: Client, auth_bytes: bytes) -> None:
    if client.authenticator is None:
        client.access = Access(None)
        return
    parts = auth_bytes.split(b"\0")
    if len(parts) != 3:
        raise _Failed("not a SASL/PLAIN message")
    _, user, password = (p.decode("utf-8", "replace") for p in parts)
    principal = client.authenticator.principal(password) if password else None
    if principal is None or principal.name != user:
        raise _Failed("unknown principal or token")
    client.access = Access(principal)


async def handshake(client: Client, request: Request) -> Any:
    mechanism = request.body.mechanism
    if mechanism not in MECHANISMS:
        return request.reply.body(
            error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=MECHANISMS
        )
    client.sasl = Exchange(mechanism)
    # Version 0: the tokens follow as bare frames, not wrapped in SaslAuthenticate.
    client.raw_sasl = request.version == 0
    return request.reply.body(error_code=ErrorCode.none, mechanisms=MECHANISMS)


async def authenticate(client: Client, request: Request) -> Any:
    exchange = client.sasl
    if exchange is None or (client.access is not None and client.authenticator):
        return request.reply.body(
            error_code=ErrorCode.illegal_sasl_state,
            error_message="SaslHandshake first, then one exchange per connection",
            auth_bytes=b"",
        )
    try:
        challenge, done = await exchange.step(client, bytes(request.body.auth_bytes))
    except _Failed as failure:
        # The answer says why; then the listener closes the connection after Kafka's delay.
        client.sasl = None
        client.failed_authentication = True
        return request.reply.body(
            error_code=ErrorCode.sasl_authentication_failed,
            error_message=f"authentication failed: {failure}",
            auth_bytes=b"",
        )
    if done:
        client.sasl = None
    return request.reply.body(
        error_code=ErrorCode.none, error_message=None, auth_bytes=challenge, session_lifetime=0
    )


async def authenticate_raw(client: Client, frame: bytes) -> bytes:
    """A bare token frame after a version-0 handshake: the challenge as a bare frame (empty
    when PLAIN succeeds); a failure closes the connection (version 0 cannot say why)."""
    exchange: Exchange | None = client.sasl
    assert exchange is not None
    try:
        challenge, done = await exchange.step(client, frame)
    except _Failed as failure:
        client.raw_sasl = False
        client.sasl = None
        raise BadRequest(
            f"SASL {exchange.mechanism} failed: {failure}", "authentication_failed"
        ) from None
    if done:
        client.raw_sasl = False
        client.sasl = None
    return struct.pack(">i", len(challenge)) + challenge
