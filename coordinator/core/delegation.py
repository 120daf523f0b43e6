"""Kafka's delegation tokens (KIP-48): a principal that logged in with SASL gets a token that
another client, without the principal's own secret, logs in with (SCRAM with the `tokenauth`
extension: the token id as user name, its HMAC in base64 as password), as the principal.

The rules are Kafka's DelegationTokenControlManager's: tokens exist only where a secret key
is set (`COORDINATOR_DELEGATION_TOKEN_SECRET_KEY`, Kafka's `delegation.token.secret.key`;
without it DELEGATION_TOKEN_AUTH_DISABLED); a token's HMAC is HmacSHA512 of its id under that
key; it lives until its expiry, which renewals move forward by up to
`COORDINATOR_DELEGATION_TOKEN_EXPIRY_TIME_MS`, never past its maximum lifetime
(`COORDINATOR_DELEGATION_TOKEN_MAX_LIFETIME_MS`); its owner and its renewers may renew and
expire it; a token expired is refused at login and removed at the next token written, as
Kafka's sweep removes it. Creating a token for another owner, or seeing others' tokens, takes
the cluster's rights (Kafka's CREATE_TOKENS and DESCRIBE_TOKENS). Tokens are kept in the store,
so they survive a restart and serve every process.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from sqlalchemy import BigInteger, Index, LargeBinary, String, Text, delete, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from coordinator.core import scram
from coordinator.core.errors import CoordinatorError
from coordinator.core.tables import Base
from coordinator.store import Store

USER = "User"  # the one principal type (KafkaPrincipal.USER_TYPE)


class DelegationTokenAuthDisabled(CoordinatorError):
    code: ClassVar[str] = "DELEGATION_TOKEN_AUTH_DISABLED"
    status: ClassVar[int] = 403
    title: ClassVar[str] = "Delegation tokens are disabled"


class DelegationTokenRequestNotAllowed(CoordinatorError):
    code: ClassVar[str] = "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED"
    status: ClassVar[int] = 403
    title: ClassVar[str] = "Delegation token requests need a SASL login of one's own"


class DelegationTokenAuthorizationFailed(CoordinatorError):
    code: ClassVar[str] = "DELEGATION_TOKEN_AUTHORIZATION_FAILED"
    status: ClassVar[int] = 403
    title: ClassVar[str] = "Delegation token authorization failed"


class DelegationTokenNotFound(CoordinatorError):
    code: ClassVar[str] = "DELEGATION_TOKEN_NOT_FOUND"
    status: ClassVar[int] = 404
    title: ClassVar[str] = "Delegation token not found"


class DelegationTokenOwnerMismatch(CoordinatorError):
    code: ClassVar[str] = "DELEGATION_TOKEN_OWNER_MISMATCH"
    status: ClassVar[int] = 403
    title: ClassVar[str] = "Not the delegation token's owner or renewer"


class DelegationTokenExpired(CoordinatorError):
    code: ClassVar[str] = "DELEGATION_TOKEN_EXPIRED"
    status: ClassVar[int] = 410
    title: ClassVar[str] = "Delegation token expired"


class InvalidPrincipalType(CoordinatorError):
    code: ClassVar[str] = "INVALID_PRINCIPAL_TYPE"
    status: ClassVar[int] = 422
    title: ClassVar[str] = "Invalid principal type"


class DelegationTokenRow(Base):
    __tablename__ = "delegation_tokens"
    __table_args__ = (Index("ix_delegation_tokens_hmac", "hmac", unique=True),)

    token_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(255))
    requester: Mapped[str] = mapped_column(String(255))
    renewers: Mapped[str] = mapped_column(Text)  # a JSON list of principal names
    issued_ms: Mapped[int] = mapped_column(BigInteger)
    expiry_ms: Mapped[int] = mapped_column(BigInteger)
    max_ms: Mapped[int] = mapped_column(BigInteger)
    hmac: Mapped[bytes] = mapped_column(LargeBinary)
    # The salt of the token's SCRAM credential (its password: the HMAC in base64).
    salt: Mapped[bytes] = mapped_column(LargeBinary)


@dataclass(frozen=True, slots=True)
class Policy:
    """The settings tokens follow."""

    secret: str | None
    max_lifetime_ms: int
    expiry_time_ms: int

    def enabled(self) -> None:
        if self.secret is None:
            raise DelegationTokenAuthDisabled(
                "delegation tokens are off: set COORDINATOR_DELEGATION_TOKEN_SECRET_KEY "
                "(Kafka's delegation.token.secret.key)"
            )


@dataclass(frozen=True, slots=True)
class Token:
    token_id: str
    owner: str
    requester: str
    renewers: tuple[str, ...]
    issued_ms: int
    expiry_ms: int
    max_ms: int
    hmac: bytes

    def may_renew(self, principal: str) -> bool:
        """Kafka's allowedToRenew: the owner or a renewer."""
        return principal == self.owner or principal in self.renewers

    def expired(self, now_ms: int) -> bool:
        return self.max_ms < now_ms or self.expiry_ms < now_ms

    def visible_to(self, requester: str, owners: Sequence[str] | None, admin: bool) -> bool:
        """Kafka's filterToken: of the owners asked for (as owner or renewer), those the
        requester owns or renews, or any with the cluster's rights."""
        if owners is not None and not any(o == self.owner or o in self.renewers for o in owners):
            return False
        return self.may_renew(requester) or admin


# -- the rules -------------------------------------------------------------------------------------


def _sum(now_ms: int, duration_ms: int) -> int:
    return min(now_ms + duration_ms, 2**63 - 1)


def lifetime(policy: Policy, now_ms: int, asked_max_ms: int) -> tuple[int, int]:
    """A new token's (maximum, expiry) timestamps: the maximum lifetime asked, at most the
    policy's (any when 0 or less), the expiry one expiry time away, at most the maximum."""
    lifetime_ms = policy.max_lifetime_ms
    if asked_max_ms > 0:
        lifetime_ms = min(lifetime_ms, asked_max_ms)
    max_ms = _sum(now_ms, lifetime_ms)
    return max_ms, min(max_ms, _sum(now_ms, policy.expiry_time_ms))


def renewed(policy: Policy, token: Token, requester: str, now_ms: int, period_ms: int) -> int:
    """The expiry a renewal gives (Kafka: up to the policy's expiry time, at most the
    maximum)."""
    if token.expired(now_ms):
        raise DelegationTokenExpired(f"token {token.token_id} has expired")
    _check_renewer(token, requester)
    renew_ms = policy.expiry_time_ms
    if period_ms > 0:
        renew_ms = min(renew_ms, period_ms)
    return min(token.max_ms, now_ms + renew_ms)


def expired_at(token: Token, requester: str, now_ms: int, period_ms: int) -> int | None:
    """The expiry an ExpireDelegationToken gives; None: the token goes now (a negative
    period)."""
    _check_renewer(token, requester)
    if period_ms < 0:
        return None
    if token.expired(now_ms):
        raise DelegationTokenExpired(f"token {token.token_id} has expired")
    return min(token.max_ms, _sum(now_ms, period_ms))


def _check_renewer(token: Token, requester: str) -> None:
    if not token.may_renew(requester):
        raise DelegationTokenOwnerMismatch(
            f"{requester!r} neither owns nor renews token {token.token_id}"
        )


def hmac_of(policy: Policy, token_id: str) -> bytes:
    assert policy.secret is not None
    return hmac.digest(policy.secret.encode(), token_id.encode(), "sha512")


def password_of(token_hmac: bytes) -> str:
    """What a client logs in with: the HMAC in base64 (Kafka's hmacAsBase64String)."""
    return base64.b64encode(token_hmac).decode()


# -- the store -------------------------------------------------------------------------------------


def _token(row: DelegationTokenRow) -> Token:
    return Token(
        row.token_id,
        row.owner,
        row.requester,
        tuple(json.loads(row.renewers)),
        row.issued_ms,
        row.expiry_ms,
        row.max_ms,
        row.hmac,
    )


async def create(
    db: Store,
    policy: Policy,
    *,
    requester: str,
    owner: str,
    renewers: Sequence[tuple[str, str]],
    max_lifetime_ms: int,
    admin: bool,
    now_ms: int,
) -> Token:
    """A new token for `owner` (the requester's own unless the requester has the cluster's
    rights); renewers are (principal type, name)."""
    if owner != requester and not admin:
        raise DelegationTokenAuthorizationFailed(
            f"{requester!r} may not create tokens for {owner!r} (the cluster's rights)"
        )
    if any(kind != USER for kind, _ in renewers):
        raise InvalidPrincipalType(f"renewers are principals of type {USER}")
    policy.enabled()
    max_ms, expiry_ms = lifetime(policy, now_ms, max_lifetime_ms)
    token_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    token = Token(
        token_id,
        owner,
        requester,
        tuple(dict.fromkeys(name for _, name in renewers)),
        now_ms,
        expiry_ms,
        max_ms,
        hmac_of(policy, token_id),
    )
    async with db.write() as session:
        await session.execute(
            delete(DelegationTokenRow).where(
                (DelegationTokenRow.expiry_ms < now_ms) | (DelegationTokenRow.max_ms < now_ms)
            )
        )
        session.add(
            DelegationTokenRow(
                token_id=token.token_id,
                owner=token.owner,
                requester=token.requester,
                renewers=json.dumps(list(token.renewers)),
                issued_ms=token.issued_ms,
                expiry_ms=token.expiry_ms,
                max_ms=token.max_ms,
                hmac=token.hmac,
                salt=os.urandom(16),
            )
        )
    return token


async def renew(
    db: Store, policy: Policy, requester: str, token_hmac: bytes, period_ms: int, now_ms: int
) -> int:
    """RenewDelegationToken: the token's new expiry."""
    policy.enabled()
    async with db.write() as session:
        row = await _by_hmac(session, token_hmac)
        expiry = renewed(policy, _token(row), requester, now_ms, period_ms)
        row.expiry_ms = expiry
        return expiry


async def expire(
    db: Store, policy: Policy, requester: str, token_hmac: bytes, period_ms: int, now_ms: int
) -> int:
    """ExpireDelegationToken: the token's new expiry (now, when it is removed at once)."""
    policy.enabled()
    async with db.write() as session:
        row = await _by_hmac(session, token_hmac)
        expiry = expired_at(_token(row), requester, now_ms, period_ms)
        if expiry is None:
            await session.delete(row)
            return now_ms
        row.expiry_ms = expiry
        return expiry


async def _by_hmac(session: AsyncSession, token_hmac: bytes) -> DelegationTokenRow:
    row = (
        await session.execute(
            select(DelegationTokenRow).where(DelegationTokenRow.hmac == bytes(token_hmac))
        )
    ).scalar_one_or_none()
    if row is None:
        raise DelegationTokenNotFound("no token has this HMAC")
    return row


async def describe(
    db: Store,
    policy: Policy,
    requester: str,
    owners: Sequence[str] | None,
    admin: bool,
) -> list[Token]:
    """DescribeDelegationToken: the tokens the requester may see, of the owners asked for
    (None: every owner)."""
    policy.enabled()
    async with db.read() as session:
        rows = (
            await session.execute(select(DelegationTokenRow).order_by(DelegationTokenRow.issued_ms))
        ).scalars()
        tokens = [_token(row) for row in rows]
    return [t for t in tokens if t.visible_to(requester, owners, admin)]


async def login(
    db: Store, token_id: str, mechanism: str, now_ms: int
) -> tuple[tuple[bytes, bytes, bytes, int], str] | None:
    """The SCRAM credential of a live token (its password the HMAC in base64) and its owner,
    or None."""
    async with db.read() as session:
        row = await session.get(DelegationTokenRow, token_id)
        if row is None or _token(row).expired(now_ms):
            return None
        password, salt, owner = password_of(row.hmac), row.salt, row.owner
    salted = hashlib.pbkdf2_hmac(
        scram.hash_of(mechanism), password.encode(), salt, scram.DEFAULT_ITERATIONS
    )
    stored_key, server_key = scram.keys_of(mechanism, salted)
    return (salt, stored_key, server_key, scram.DEFAULT_ITERATIONS), owner
