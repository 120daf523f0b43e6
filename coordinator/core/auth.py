"""Authentication by bearer token and authorisation by role and name prefix (docs/pages/http-api.md,
Configuration).

The tokens file names each token's principal, roles (`producer`, `consumer`, `admin`) and the
transactional-id, topic and group prefixes it may use; `[""]` allows every name, `[]` none.
Without a tokens file auth is off (and `coordinator serve` only listens on loopback).

Every operation's rule is one method of `Access` (`access.produce(...)`,
`access.transaction_offsets(...)`, ...) that the HTTP routes and the Kafka handlers both call, so
the two doors cannot disagree. Tokens are compared in constant time and never logged.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from fastapi import Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from coordinator.core.errors import (
    ClusterAuthorizationFailed,
    GroupAuthorizationFailed,
    TopicAuthorizationFailed,
    TransactionalIdAuthorizationFailed,
    Unauthenticated,
)

Role = Literal["producer", "consumer", "admin"]
# The dashboard signs in with this cookie (HttpOnly, SameSite=Strict) instead of a header.
SESSION_COOKIE = "coordinator_token"


class TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token: str = Field(min_length=8)
    principal: str = Field(min_length=1)
    roles: list[Role]
    transactional_id_prefixes: list[str] = Field(default_factory=list)
    topic_prefixes: list[str] = Field(default_factory=list)
    group_prefixes: list[str] = Field(default_factory=list)


class TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens: list[TokenEntry]


@dataclass(frozen=True)
class Principal:
    name: str
    roles: frozenset[str]
    transactional_id_prefixes: tuple[str, ...]
    topic_prefixes: tuple[str, ...]
    group_prefixes: tuple[str, ...]

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Authenticator:
    def __init__(self, entries: Iterable[TokenEntry]) -> None:
        self._entries = [
            (
                _digest(e.token),
                Principal(
                    e.principal,
                    frozenset(e.roles),
                    tuple(e.transactional_id_prefixes),
                    tuple(e.topic_prefixes),
                    tuple(e.group_prefixes),
                ),
            )
            for e in entries
        ]

    @classmethod
    def from_file(cls, path: Path) -> Authenticator:
        return cls(TokensFile.model_validate_json(path.read_bytes()).tokens)

    def named(self, name: str) -> Principal | None:
        """The principal of that name (its roles and prefixes), for a SCRAM login, which
        proves the name with a password instead of a token."""
        for _, principal in self._entries:
            if principal.name == name:
                return principal
        return None

    def principal(self, token: str) -> Principal | None:
        """The token's principal. Compares digests of every entry, in constant time each, so
        neither the answer's timing nor its length tells which token came close."""
        presented = _digest(token)
        found = None
        for digest, principal in self._entries:
            if hmac.compare_digest(digest, presented):
                found = principal
        return found


def _bits(*operations: int) -> int:
    return sum(1 << op for op in set(operations))


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name.startswith(p) for p in prefixes)


class Access:
    """What the caller may do; with auth off, everything."""

    def __init__(self, principal: Principal | None) -> None:
        self.principal = principal

    def _has(self, roles: tuple[str, ...]) -> bool:
        assert self.principal is not None
        return bool(self.principal.roles & set(roles))

    def cluster(self) -> None:
        """Topics' creation, `/v1/admin`, `/metrics`, `/dashboard`: admin only."""
        if self.principal is not None and not self.principal.is_admin:
            raise ClusterAuthorizationFailed(
                f"principal {self.principal.name!r} needs the admin role for this"
            )

    def topic(self, topic: str, *roles: Role) -> None:
        p = self.principal
        if p is None or p.is_admin:
            return
        if not (self._has(roles) and _under(topic, p.topic_prefixes)):
            raise TopicAuthorizationFailed(
                f"principal {p.name!r} may not {'/'.join(roles)} on topic {topic!r}"
            )

    def transactional_id(self, transactional_id: str) -> None:
        p = self.principal
        if p is None or p.is_admin:
            return
        if not (self._has(("producer",)) and _under(transactional_id, p.transactional_id_prefixes)):
            raise TransactionalIdAuthorizationFailed(
                f"principal {p.name!r} may not use transactional id {transactional_id!r}"
            )

    def effect(self, key: str) -> None:
        """A side-effect key: the producer role, the key under a transactional-id prefix."""
        self.transactional_id(key)

    def transactional_prefix(self, prefix: str) -> None:
        """Acting on every id that starts with `prefix` needs a granted prefix covering it."""
        self.transactional_id(prefix)

    def idempotent_producer(self) -> None:
        p = self.principal
        if p is None or p.is_admin:
            return
        if not self._has(("producer",)):
            raise ClusterAuthorizationFailed(
                f"principal {p.name!r} needs the producer role for a producer id"
            )

    def group(self, group_id: str, *roles: Role) -> None:
        p = self.principal
        if p is None or p.is_admin:
            return
        if not (self._has(roles) and _under(group_id, p.group_prefixes)):
            raise GroupAuthorizationFailed(f"principal {p.name!r} may not use group {group_id!r}")

    def visible_group(self, group_id: str) -> bool:
        """Listed to this caller: an admin sees every group, a consumer those under its prefixes."""
        p = self.principal
        return (
            p is None
            or p.is_admin
            or (self._has(("consumer",)) and _under(group_id, p.group_prefixes))
        )

    # -- KIP-430: what a principal may do, as Kafka's AclOperation bits (READ 3, WRITE 4, CREATE
    # 5, DELETE 6, ALTER 7, DESCRIBE 8, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11), derived from the
    # same rules as the checks above.

    def topic_operations(self, topic: str) -> int:
        p = self.principal
        if p is None or p.is_admin:
            return _bits(3, 4, 5, 6, 7, 8, 10, 11)
        if not _under(topic, p.topic_prefixes):
            return 0
        ops = set()
        if self._has(("producer",)):
            ops |= {4, 8, 10}
        if self._has(("consumer",)):
            ops |= {3, 8, 10}
        return _bits(*ops)

    def group_operations(self, group_id: str) -> int:
        p = self.principal
        if p is None or p.is_admin:
            return _bits(3, 6, 8)
        if not _under(group_id, p.group_prefixes):
            return 0
        ops = set()
        if self._has(("consumer",)):
            ops |= {3, 8}
        if self._has(("producer",)):
            ops |= {3}  # its transactions' offsets
        return _bits(*ops)

    @property
    def name(self) -> str:
        """Who is asking, for quotas: the principal, or "" with auth off."""
        return "" if self.principal is None else self.principal.name

    def visible_topic(self, topic: str) -> bool:
        p = self.principal
        return p is None or p.is_admin or _under(topic, p.topic_prefixes)

    # -- One rule per operation, which both doors call (Kafka checks access in one place,
    # KafkaApis). Kafka's WRITE on a topic is the producer role, READ the consumer role; a
    # transactional producer commits its input's offsets, so either role may name a group or a
    # topic in a transaction's offsets, but only under the principal's own prefixes.

    def produce(self, topic: str, transactional_id: str | None) -> None:
        self.topic(topic, "producer")
        if transactional_id is not None:
            self.transactional_id(transactional_id)

    def fetch(self, topic: str) -> None:
        """Fetch and ListOffsets."""
        self.topic(topic, "consumer")

    def describe_topic(self, topic: str) -> None:
        """A topic's description and configs."""
        self.topic(topic, "producer", "consumer")

    def init_pid(self, transactional_id: str | None) -> None:
        if transactional_id is None:
            self.idempotent_producer()
        else:
            self.transactional_id(transactional_id)

    def add_partitions(self, transactional_id: str, topics: Iterable[str]) -> None:
        self.transactional_id(transactional_id)
        for topic in topics:
            self.topic(topic, "producer")

    def transaction_offsets(
        self, transactional_id: str, group_id: str, topics: Iterable[str] = ()
    ) -> None:
        """AddOffsetsToTxn (no topics yet) and TxnOffsetCommit: the transactional id, the group
        and every topic whose offsets it commits (Kafka: WRITE on the id, READ on the group and
        the topics)."""
        self.transactional_id(transactional_id)
        self.group(group_id, "producer", "consumer")
        for topic in topics:
            self.topic(topic, "producer", "consumer")

    def offsets(self, group_id: str, topics: Iterable[str]) -> None:
        """OffsetCommit and OffsetFetch: READ on the group and on each topic named."""
        self.group(group_id, "consumer")
        for topic in topics:
            self.topic(topic, "consumer")

    def delete_group(self, group_id: str) -> None:
        """Deleting a group and its offsets: an operator's act (Kafka: DELETE on the group)."""
        self.cluster()

    def delete_offsets(self, group_id: str, topics: Iterable[str]) -> None:
        """Kafka's OffsetDelete: DELETE on the group, READ on the topics; here an operator's."""
        self.cluster()

    def join(self, group_id: str, topics: Iterable[str]) -> None:
        """A member's heartbeat or join: the group, and every topic it subscribes to."""
        self.offsets(group_id, topics)


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    cookie = request.cookies.get(SESSION_COOKIE)
    # A cookie alone may only read; anything that changes state also needs this header, which a
    # cross-site form cannot send (the cookie is SameSite=Strict besides).
    if cookie and (request.method == "GET" or request.headers.get("x-coordinator-dashboard")):
        return cookie
    return None


def authenticate(request: Request) -> Access:
    authenticator: Authenticator | None = request.app.state.authenticator
    if authenticator is None:
        return Access(None)
    token = _bearer(request)
    principal = authenticator.principal(token) if token else None
    if principal is None:
        raise Unauthenticated(
            "send 'Authorization: Bearer <token>' with a token from the tokens file"
            if token is None
            else "the token is not known"
        )
    return Access(principal)


async def access(request: Request) -> Access:
    """The dependency form of `authenticate` (async: no threadpool hop per request)."""
    return authenticate(request)


AccessDep = Annotated[Access, Depends(access)]
