"""SASL/PLAIN against the tokens file: user = principal, password = token; the principal's
roles and prefixes then apply to every request on the connection, as on HTTP."""

from __future__ import annotations

import struct
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core.auth import Access
from coordinator.kafka.server import Client
from coordinator.kafka.wire import BadRequest, Request

PLAIN = "PLAIN"


async def handshake(client: Client, request: Request) -> Any:
    mechanism = request.body.mechanism
    if mechanism != PLAIN:
        return request.reply.body(
            error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=(PLAIN,)
        )
    client.sasl_mechanism = PLAIN
    # Version 0: the token follows as a bare frame, not wrapped in SaslAuthenticate.
    client.raw_sasl = request.version == 0
    return request.reply.body(error_code=ErrorCode.none, mechanisms=(PLAIN,))


def _check(client: Client, auth_bytes: bytes) -> str | None:
    """None when the PLAIN message names a principal whose token it carries, else why not."""
    if client.authenticator is None:
        client.access = Access(None)
        return None
    parts = auth_bytes.split(b"\0")
    if len(parts) != 3:
        return "not a SASL/PLAIN message"
    _, user, password = (p.decode("utf-8", "replace") for p in parts)
    principal = client.authenticator.principal(password) if password else None
    if principal is None or principal.name != user:
        return "unknown principal or token"
    client.access = Access(principal)
    return None


async def authenticate(client: Client, request: Request) -> Any:
    if client.sasl_mechanism != PLAIN or (client.access is not None and client.authenticator):
        return request.reply.body(
            error_code=ErrorCode.illegal_sasl_state,
            error_message="SaslHandshake with PLAIN first, once per connection",
            auth_bytes=b"",
        )
    failure = _check(client, bytes(request.body.auth_bytes))
    # The answer says why; then the listener closes the connection after Kafka's delay.
    client.failed_authentication = failure is not None
    return request.reply.body(
        error_code=ErrorCode.sasl_authentication_failed if failure else ErrorCode.none,
        error_message=failure,
        auth_bytes=b"",
        session_lifetime=0,
    )


def authenticate_raw(client: Client, frame: bytes) -> bytes:
    """The token frame after a version-0 handshake: an empty frame on success; on failure the
    connection closes (version 0 has no way to say why)."""
    client.raw_sasl = False
    failure = _check(client, frame)
    if failure:
        raise BadRequest(f"SASL/PLAIN failed: {failure}", "authentication_failed")
    return struct.pack(">i", 0)
