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

from coordinator.core.acls import (
    CLUSTER_NAME,
    USER,
    Acls,
    Operation,
    ResourceType,
    Verdict,
)
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

    @classmethod
    def bare(cls, name: str) -> Principal:
        """A principal the tokens file does not name (a SCRAM user made with kafka-configs.sh):
        no role and no prefix, so what it may do is what the ACLs allow."""
        return cls(name, frozenset(), (), (), ())


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Authenticator:
    """Who a token is, and (auth being on) the ACLs this process holds, which every `Access`
    it makes checks."""

    def __init__(self, entries: Iterable[TokenEntry]) -> None:
        self.acls = Acls()
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

    def named(self, name: str) -> Principal:
        """The principal of that name, for a SASL login, which proves the name with a password
        (SCRAM) or a delegation token instead of a token of the file: the file's roles and
        prefixes when it names the principal, none otherwise."""
        for _, principal in self._entries:
            if principal.name == name:
                return principal
        return Principal.bare(name)

    def access(self, principal: Principal, host: str) -> Access:
        return Access(principal, self.acls, host)

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


# What the tokens file's roles grant on the resources under the principal's prefixes, read as
# Kafka's ALLOW ACLs: a producer WRITEs topics and transactional ids, a consumer READs topics
# and groups, either DESCRIBEs the topics (and their configs) it may use. Creating, deleting,
# altering and the cluster's operations are the admin's (Kafka's super user) or an ACL's.
_TOPIC_GRANTS: dict[Operation, tuple[Role, ...]] = {
    Operation.WRITE: ("producer",),
    Operation.READ: ("consumer",),
    Operation.DESCRIBE: ("producer", "consumer"),
    Operation.DESCRIBE_CONFIGS: ("producer", "consumer"),
}
_GROUP_GRANTS: dict[Operation, tuple[Role, ...]] = {
    Operation.READ: ("consumer",),
    Operation.DESCRIBE: ("consumer",),
}
_TXN_GRANTS: dict[Operation, tuple[Role, ...]] = {
    Operation.WRITE: ("producer",),
    Operation.DESCRIBE: ("producer",),
}
_GRANTS: dict[ResourceType, dict[Operation, tuple[Role, ...]]] = {
    ResourceType.TOPIC: _TOPIC_GRANTS,
    ResourceType.GROUP: _GROUP_GRANTS,
    ResourceType.TRANSACTIONAL_ID: _TXN_GRANTS,
}
# KIP-430's operations shown for a topic and a group.
_TOPIC_OPERATIONS = (
    Operation.READ,
    Operation.WRITE,
    Operation.CREATE,
    Operation.DELETE,
    Operation.ALTER,
    Operation.DESCRIBE,
    Operation.DESCRIBE_CONFIGS,
    Operation.ALTER_CONFIGS,
)
_GROUP_OPERATIONS = (Operation.READ, Operation.DELETE, Operation.DESCRIBE)


class Access:
    """What the caller may do; with auth off, everything. One model for both doors: the tokens
    file's roles and prefixes (read as ALLOW ACLs, the admin role as Kafka's super user) and
    the ACLs kept in the store (`coordinator.core.acls`), checked as Kafka's StandardAuthorizer
    checks them: a matching DENY refuses, then any grant allows, then nothing does."""

    def __init__(
        self, principal: Principal | None, acls: Acls | None = None, host: str = ""
    ) -> None:
        self.principal = principal
        self.acls = acls if acls is not None else Acls()
        self.host = host  # the caller's address, which an ACL's host may name

    def _has(self, roles: tuple[str, ...]) -> bool:
        assert self.principal is not None
        return bool(self.principal.roles & set(roles))

    def may(
        self,
        resource_type: ResourceType,
        name: str,
        operation: Operation,
        roles: tuple[str, ...] | None = None,
        *,
        covering: bool = False,
    ) -> bool:
        """Whether the caller may do `operation` on the resource. `roles`: the tokens-file
        roles that grant it under the principal's prefixes for that resource type (by default
        those of `_GRANTS`)."""
        p = self.principal
        if p is None or p.is_admin:
            return True
        verdict = self.acls.verdict(
            f"{USER}:{p.name}", self.host, resource_type, name, operation, covering=covering
        )
        if verdict is Verdict.DENIED:
            return False
        if verdict is Verdict.ALLOWED:
            return True
        prefixes = {
            ResourceType.TOPIC: p.topic_prefixes,
            ResourceType.GROUP: p.group_prefixes,
            ResourceType.TRANSACTIONAL_ID: p.transactional_id_prefixes,
        }.get(resource_type, ("",))
        if roles is None:
            roles = _GRANTS.get(resource_type, {}).get(operation, ())
        return self._has(roles) and _under(name, prefixes)

    def cluster(self, operation: Operation = Operation.ALTER) -> None:
        """An operation on the cluster (creating topics, `/v1/admin`, `/metrics`, quotas,
        users, the ACLs themselves): the admin role, or an ACL on the CLUSTER resource."""
        if not self.may(ResourceType.CLUSTER, CLUSTER_NAME, operation, ()):
            assert self.principal is not None
            raise ClusterAuthorizationFailed(
                f"principal {self.principal.name!r} may not {operation.name} the cluster "
                "(the admin role or an ACL)"
            )

    def topic(
        self, topic: str, operation: Operation, roles: tuple[Role, ...] | None = None
    ) -> None:
        if not self.may(ResourceType.TOPIC, topic, operation, roles):
            assert self.principal is not None
            raise TopicAuthorizationFailed(
                f"principal {self.principal.name!r} may not {operation.name} topic {topic!r}"
            )

    def topic_or_cluster(self, topic: str, operation: Operation) -> None:
        """Creating a topic (Kafka: CREATE on the cluster or on the topic), deleting one and
        altering its configs (on the topic; the admin role here too)."""
        if operation == Operation.CREATE and self.may(
            ResourceType.CLUSTER, CLUSTER_NAME, operation, ()
        ):
            return
        self.topic(topic, operation)

    def transactional_id(
        self,
        transactional_id: str,
        operation: Operation = Operation.WRITE,
        *,
        covering: bool = False,
    ) -> None:
        if not self.may(
            ResourceType.TRANSACTIONAL_ID,
            transactional_id,
            operation,
            covering=covering,
        ):
            assert self.principal is not None
            raise TransactionalIdAuthorizationFailed(
                f"principal {self.principal.name!r} may not use transactional id "
                f"{transactional_id!r}"
            )

    def effect(self, key: str) -> None:
        """A side-effect key: the producer role, the key under a transactional-id prefix."""
        self.transactional_id(key)

    def transactional_prefix(self, prefix: str) -> None:
        """Acting on every id that starts with `prefix` needs a granted prefix covering it (or a
        PREFIXED or wildcard ACL that does)."""
        self.transactional_id(prefix, covering=True)

    def idempotent_producer(self) -> None:
        """A producer id without a transactional id (Kafka: IDEMPOTENT_WRITE on the cluster,
        or, since KIP-679, WRITE on any topic)."""
        p = self.principal
        if self.may(ResourceType.CLUSTER, CLUSTER_NAME, Operation.IDEMPOTENT_WRITE, ("producer",)):
            return
        assert p is not None
        if self.acls.allows_any(f"{USER}:{p.name}", self.host, ResourceType.TOPIC, Operation.WRITE):
            return
        raise ClusterAuthorizationFailed(
            f"principal {p.name!r} needs the producer role or an ACL to WRITE some topic for "
            "a producer id"
        )

    def group(
        self, group_id: str, operation: Operation, roles: tuple[Role, ...] | None = None
    ) -> None:
        if not self.may(ResourceType.GROUP, group_id, operation, roles):
            assert self.principal is not None
            raise GroupAuthorizationFailed(
                f"principal {self.principal.name!r} may not {operation.name} group {group_id!r}"
            )

    def visible_group(self, group_id: str) -> bool:
        """Listed to this caller: DESCRIBE on the group."""
        return self.may(ResourceType.GROUP, group_id, Operation.DESCRIBE)

    # -- KIP-430: what a principal may do, as Kafka's AclOperation bits, from the same checks.

    def topic_operations(self, topic: str) -> int:
        return _bits(*(op for op in _TOPIC_OPERATIONS if self.may(ResourceType.TOPIC, topic, op)))

    def group_operations(self, group_id: str) -> int:
        # A producer READs a group too: it commits its transactions' offsets there.
        grants = {**_GROUP_GRANTS, Operation.READ: ("consumer", "producer")}
        return _bits(
            *(
                op
                for op in _GROUP_OPERATIONS
                if self.may(ResourceType.GROUP, group_id, op, grants.get(op, ()))
            )
        )

    @property
    def name(self) -> str:
        """Who is asking, for quotas: the principal, or "" with auth off."""
        return "" if self.principal is None else self.principal.name

    def visible_topic(self, topic: str) -> bool:
        """Listed to this caller: DESCRIBE on the topic."""
        return self.may(ResourceType.TOPIC, topic, Operation.DESCRIBE)

    # -- One rule per operation, which both doors call (Kafka checks access in one place,
    # KafkaApis). A transactional producer commits its input's offsets, so either role may name
    # a group or a topic in a transaction's offsets, but only under the principal's prefixes.

    def produce(self, topic: str, transactional_id: str | None) -> None:
        self.topic(topic, Operation.WRITE)
        if transactional_id is not None:
            self.transactional_id(transactional_id)

    def fetch(self, topic: str) -> None:
        """Fetch and ListOffsets: READ on the topic."""
        self.topic(topic, Operation.READ)

    def describe_topic(self, topic: str) -> None:
        """A topic's description and configs: DESCRIBE on the topic."""
        self.topic(topic, Operation.DESCRIBE)

    def init_pid(self, transactional_id: str | None) -> None:
        if transactional_id is None:
            self.idempotent_producer()
        else:
            self.transactional_id(transactional_id)

    def add_partitions(self, transactional_id: str, topics: Iterable[str]) -> None:
        self.transactional_id(transactional_id)
        for topic in topics:
            self.topic(topic, Operation.WRITE)

    def transaction_offsets(
        self, transactional_id: str, group_id: str, topics: Iterable[str] = ()
    ) -> None:
        """AddOffsetsToTxn (no topics yet) and TxnOffsetCommit: WRITE on the transactional id,
        READ on the group and on every topic whose offsets it commits."""
        self.transactional_id(transactional_id)
        self.group(group_id, Operation.READ, ("producer", "consumer"))
        for topic in topics:
            self.topic(topic, Operation.READ, ("producer", "consumer"))

    def offsets(self, group_id: str, topics: Iterable[str]) -> None:
        """OffsetCommit and OffsetFetch: READ on the group and on each topic named."""
        self.group(group_id, Operation.READ)
        for topic in topics:
            self.topic(topic, Operation.READ)

    def delete_group(self, group_id: str) -> None:
        """Deleting a group and its offsets: DELETE on the group."""
        self.group(group_id, Operation.DELETE)

    def delete_offsets(self, group_id: str, topics: Iterable[str]) -> None:
        """Kafka's OffsetDelete: DELETE on the group, READ on the topics."""
        self.group(group_id, Operation.DELETE)
        for topic in topics:
            self.topic(topic, Operation.READ)

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
    return authenticator.access(principal, request.client.host if request.client else "")


async def access(request: Request) -> Access:
    """The dependency form of `authenticate` (async: no threadpool hop per request)."""
    return authenticate(request)


AccessDep = Annotated[Access, Depends(access)]
