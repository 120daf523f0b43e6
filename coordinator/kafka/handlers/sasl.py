"""SASL over Kafka's protocol: PLAIN against the tokens file (user = principal, password =
token) and SCRAM-SHA-256/512 against the stored credentials (`coordinator.core.scram`), or, with
Kafka's `tokenauth` extension, against a delegation token (`coordinator.core.delegation`: the
principal is the token's owner); the principal takes its roles and prefixes from the tokens
file. The principal's rights then apply to
every request on the connection, as on HTTP. A failed exchange is answered, and the listener
closes the connection after Kafka's delay."""

from __future__ import annotations

import struct
from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core import delegation, scram
from coordinator.core.acls import Operation
from coordinator.core.auth import Access
from coordinator.core.clock import now_ms
from coordinator.kafka.connection import Client
from coordinator.kafka.errors import FAILURES, error_code
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
        self._token = False

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
                if first.token_auth:
                    found = await delegation.login(client.db, first.user, self.mechanism, now_ms())
                    credential, self._user = found if found else (None, "")
                    self._token = True
                else:
                    credential = await scram.lookup(client.db, first.user, self.mechanism)
                    self._user = first.user
                if credential is None:
                    raise scram.ScramFailed("invalid credentials")
                self._server = scram.ScramServer(self.mechanism, first, credential)
                return self._server.server_first.encode(), False
            final = self._server.final(message)
        except (scram.ScramFailed, UnicodeDecodeError):
            raise _Failed(f"invalid credentials for {self.mechanism}") from None
        _grant(client, self._user)
        client.token_authenticated = self._token
        return final.encode(), True


def _grant(client: Client, name: str) -> None:
    client.sasl_principal = name
    if client.authenticator is None:
        client.access = Access(None)
        return
    client.access = client.authenticator.access(
        client.authenticator.named(name), client.client_host
    )


def _plain(client: Client, auth_bytes: bytes) -> None:
    parts = auth_bytes.split(b"\0")
    if client.authenticator is None:
        client.access = Access(None)
        client.sasl_principal = parts[1].decode("utf-8", "replace") if len(parts) == 3 else ""
        return
    if len(parts) != 3:
        raise _Failed("not a SASL/PLAIN message")
    _, user, password = (p.decode("utf-8", "replace") for p in parts)
    principal = client.authenticator.principal(password) if password else None
    if principal is None or principal.name != user:
        raise _Failed("unknown principal or token")
    client.access = client.authenticator.access(principal, client.client_host)
    client.sasl_principal = user


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


# AlterUserScramCredentials and DescribeUserScramCredentials name mechanisms by number.
_MECHANISM_NUMBERS = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
_NUMBERS = {name: number for number, name in _MECHANISM_NUMBERS.items()}


async def describe_user_scram_credentials(client: Client, request: Request) -> Any:
    """`kafka-configs --describe --entity-type users`: each user's mechanisms and iterations
    (never a key), every user with one when none is named; the cluster's rights."""
    reply, body = request.reply, request.body
    assert client.access is not None
    try:
        client.access.cluster(Operation.DESCRIBE)
        listed = await scram.list_credentials(client.db)
    except FAILURES as failure:
        code = error_code(failure)
        return reply.body(error_code=code, error_message=str(failure), results=())
    by_user: dict[str, list[scram.Listed]] = {}
    for credential in listed:
        by_user.setdefault(credential.principal, []).append(credential)
    names = [u.name for u in body.users] if body.users is not None else sorted(by_user)
    results = []
    for name in dict.fromkeys(names):
        if names.count(name) > 1:
            code, message, infos = ErrorCode.duplicate_resource, "named more than once", ()
        elif name not in by_user:
            code, message, infos = ErrorCode.resource_not_found, "no credentials", ()
        else:
            code, message = ErrorCode.none, None
            infos = tuple(
                reply("CredentialInfo", mechanism=_NUMBERS[c.mechanism], iterations=c.iterations)
                for c in by_user[name]
            )
        results.append(
            reply(
                "DescribeUserScramCredentialsResult",
                user=name,
                error_code=code,
                error_message=message,
                credential_infos=infos,
            )
        )
    return reply.body(error_code=ErrorCode.none, error_message=None, results=tuple(results))


async def alter_user_scram_credentials(client: Client, request: Request) -> Any:
    """`kafka-configs --alter --entity-type users --add-config 'SCRAM-SHA-256=[...]'` (and
    --delete-config): upsertions carry the salt and the salted password the tool derived, so the
    password never travels; one result per user, as Kafka answers them; the cluster's rights."""
    reply, body = request.reply, request.body
    assert client.access is not None
    changes: dict[str, list[Any]] = {}
    for change in (*body.deletions, *body.upsertions):
        changes.setdefault(change.name, []).append(change)
    results = []
    for user, asked in changes.items():
        code, message = ErrorCode.none, None
        try:
            client.access.cluster()
            mechanisms = [_MECHANISM_NUMBERS.get(c.mechanism) for c in asked]
            if not user:
                code, message = ErrorCode.unacceptable_credential, "a user needs a name"
            elif None in mechanisms:
                code, message = ErrorCode.unsupported_sasl_mechanism, "SCRAM-SHA-256 or -512"
            elif len(set(mechanisms)) != len(mechanisms):
                code, message = ErrorCode.duplicate_resource, "a mechanism changed twice"
            else:
                code, message = await _apply(client, user, asked)
        except FAILURES as failure:
            code, message = error_code(failure), str(failure)
        results.append(
            reply(
                "AlterUserScramCredentialsResult",
                user=user,
                error_code=code,
                error_message=message,
            )
        )
    return reply.body(results=tuple(results))


async def _apply(client: Client, user: str, asked: list[Any]) -> tuple[ErrorCode, str | None]:
    """Every change of the user checked first, then all made: none is made when one is refused."""
    for change in asked:
        mechanism = _MECHANISM_NUMBERS[change.mechanism]
        if not hasattr(change, "salted_password"):
            if await scram.lookup(client.db, user, mechanism) is None:
                return ErrorCode.resource_not_found, f"no {mechanism} credential of {user!r}"
        elif not scram.MIN_ITERATIONS <= change.iterations <= scram.MAX_ITERATIONS:
            return ErrorCode.unacceptable_credential, (
                f"iterations {change.iterations}: {scram.MIN_ITERATIONS} to {scram.MAX_ITERATIONS}"
            )
        elif not change.salt or not change.salted_password:
            return ErrorCode.unacceptable_credential, "a salt and a salted password are needed"
    for change in asked:
        mechanism = _MECHANISM_NUMBERS[change.mechanism]
        if hasattr(change, "salted_password"):
            await scram.set_salted(
                client.db,
                user,
                mechanism,
                bytes(change.salt),
                bytes(change.salted_password),
                change.iterations,
            )
        else:
            await scram.delete_credential(client.db, user, mechanism)
    return ErrorCode.none, None
