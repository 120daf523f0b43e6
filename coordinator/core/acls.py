"""Kafka's ACLs, kept in the store: who may do what, managed with `kafka-acls.sh` and AdminClient
(CreateAcls, DescribeAcls, DeleteAcls) and enforced by `coordinator.core.auth.Access` on both
doors, as one model with the tokens file's roles and prefixes.

An ACL is Kafka's binding: a resource pattern (type, name, LITERAL or PREFIXED; the literal name
`*` is every resource of the type) and an entry (principal `User:name` or `User:*`, host or `*`,
operation, ALLOW or DENY). The rules are those of Kafka's StandardAuthorizer:

- a DENY that matches the principal, host, resource and operation (or ALL) refuses, whatever
  else allows;
- otherwise an ALLOW of the operation (or ALL) allows; an ALLOW of READ, WRITE, DELETE or ALTER
  also allows DESCRIBE, and one of ALTER_CONFIGS allows DESCRIBE_CONFIGS (a DENY implies
  nothing);
- nothing matching refuses (`allow.everyone.if.no.acl.found` is false).

`Access` reads the tokens file's grants as ALLOW ACLs of the token's principal, and the admin
role as Kafka's super user, whom no DENY stops.

Every process keeps the ACLs in memory (`Acls`), so a check costs no query: loaded before the
process serves, reloaded at once by the process that changes them, and by every other process
within `COORDINATOR_ACL_REFRESH_MS` (as Kafka's brokers apply ACL changes from the metadata log
a moment after the controller accepts them). Deliberately pure above the store functions at the
end, so the rules are tested without I/O (tests/service/test_acl_rules.py).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import Integer, Text, UniqueConstraint, delete, select
from sqlalchemy.orm import Mapped, mapped_column

from coordinator.core.errors import CoordinatorError
from coordinator.core.periodic import run_periodically
from coordinator.core.tables import Base, BigIntKey
from coordinator.store import Store

# Each name, principal and host of an ACL: at most this many characters (Kafka sets no bound;
# the store's unique index does).
MAX_TEXT = 1000
_log = logging.getLogger(__name__)
CLUSTER_NAME = "kafka-cluster"  # the one name of the CLUSTER resource
WILDCARD = "*"  # a literal resource name, a principal's name or a host: any
USER = "User"


class Operation(enum.IntEnum):
    """Kafka's AclOperation codes."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class ResourceType(enum.IntEnum):
    """Kafka's ResourceType codes."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    """Kafka's PatternType codes: ANY and MATCH only in filters."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Permission(enum.IntEnum):
    """Kafka's AclPermissionType codes."""

    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


_IMPLIES_DESCRIBE = frozenset(
    {Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}
)
_IMPLIES_DESCRIBE_CONFIGS = frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS})


class InvalidAcl(CoordinatorError):
    """An ACL or a filter Kafka's broker refuses (INVALID_REQUEST)."""

    code = "INVALID_REQUEST"
    status = 422
    title = "Invalid ACL"


_E = TypeVar("_E", bound=enum.IntEnum)


def _code(enum_type: type[_E], value: int) -> _E:
    try:
        return enum_type(value)
    except ValueError:
        return enum_type(0)  # UNKNOWN, as Kafka reads a code it does not know


def _codes(
    resource_type: int, pattern_type: int, operation: int, permission: int
) -> tuple[ResourceType, PatternType, Operation, Permission]:
    """A binding's or a filter's four codes, as Kafka reads them."""
    return (
        _code(ResourceType, resource_type),
        _code(PatternType, pattern_type),
        _code(Operation, operation),
        _code(Permission, permission),
    )


@dataclass(frozen=True, slots=True)
class Acl:
    """One binding, as stored and as answered."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    @classmethod
    def of(
        cls,
        resource_type: int,
        resource_name: str,
        pattern_type: int,
        principal: str,
        host: str,
        operation: int,
        permission: int,
    ) -> Acl:
        kind, pattern, op, permitted = _codes(resource_type, pattern_type, operation, permission)
        return cls(kind, resource_name, pattern, principal, host, op, permitted)

    def covers(self, resource_type: ResourceType, name: str) -> bool:
        """Whether the pattern takes in the resource of that type and (literal) name."""
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name in (name, WILDCARD)


def check_new(acl: Acl) -> None:
    """Kafka's checks of an ACL to create (AclApis, AclControlManager.validateNewAcl)."""
    if acl.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        raise InvalidAcl(f"Invalid resourceType {acl.resource_type.name}")
    if acl.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidAcl(f"Invalid patternType {acl.pattern_type.name}")
    if acl.operation in (Operation.UNKNOWN, Operation.ANY):
        raise InvalidAcl(f"Invalid operation {acl.operation.name}")
    if acl.permission not in (Permission.DENY, Permission.ALLOW):
        raise InvalidAcl(f"Invalid permissionType {acl.permission.name}")
    if acl.resource_type == ResourceType.CLUSTER and acl.resource_name != CLUSTER_NAME:
        raise InvalidAcl(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if not acl.resource_name:
        raise InvalidAcl("Invalid empty resource name")
    kind, colon, name = acl.principal.partition(":")
    if not colon or not kind or not name:
        raise InvalidAcl(f"Could not parse principal from `{acl.principal}`")
    if not acl.host:
        raise InvalidAcl("Invalid empty host")
    for what, text in (
        ("resource name", acl.resource_name),
        ("principal", acl.principal),
        ("host", acl.host),
    ):
        if len(text) > MAX_TEXT or "\0" in text:
            raise InvalidAcl(f"the {what} holds a NUL or is over {MAX_TEXT} characters")


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Kafka's AclBindingFilter: None, ANY and UNKNOWN-free codes as Kafka reads them."""

    resource_type: ResourceType
    resource_name: str | None
    pattern_type: PatternType
    principal: str | None
    host: str | None
    operation: Operation
    permission: Permission

    @classmethod
    def of(
        cls,
        resource_type: int,
        resource_name: str | None,
        pattern_type: int,
        principal: str | None,
        host: str | None,
        operation: int,
        permission: int,
    ) -> AclFilter:
        kind, pattern, op, permitted = _codes(resource_type, pattern_type, operation, permission)
        return cls(kind, resource_name, pattern, principal, host, op, permitted)

    def check(self) -> None:
        """Kafka's validateFilter: a filter with an unknown code matches nothing it could
        mean, and is refused."""
        if self.resource_type == ResourceType.UNKNOWN or self.pattern_type == PatternType.UNKNOWN:
            raise InvalidAcl("Unknown patternFilter.")
        if self.operation == Operation.UNKNOWN or self.permission == Permission.UNKNOWN:
            raise InvalidAcl("Unknown entryFilter.")

    def matches(self, acl: Acl) -> bool:
        """Kafka's AclBindingFilter.matches: ANY and None match everything; MATCH takes in the
        literal name, the wildcard and every prefix of the name."""
        if self.resource_type not in (ResourceType.ANY, acl.resource_type):
            return False
        if self.pattern_type == PatternType.MATCH:
            if self.resource_name is None:
                return True
            if acl.pattern_type == PatternType.LITERAL:
                if acl.resource_name not in (self.resource_name, WILDCARD):
                    return False
            elif not self.resource_name.startswith(acl.resource_name):
                return False
        else:
            if self.pattern_type not in (PatternType.ANY, acl.pattern_type):
                return False
            if self.resource_name is not None and self.resource_name != acl.resource_name:
                return False
        return (
            self.principal in (None, acl.principal)
            and self.host in (None, acl.host)
            and self.operation in (Operation.ANY, acl.operation)
            and self.permission in (Permission.ANY, acl.permission)
        )


class Verdict(enum.Enum):
    ALLOWED = "allowed"
    DENIED = "denied"
    NONE = "none"  # no ACL speaks to it


def _entry_allows(acl: Acl, operation: Operation) -> Verdict:
    """What one ACL whose principal, host and resource match says of the operation (Kafka's
    StandardAuthorizerData.findResult)."""
    if acl.operation != Operation.ALL:
        if acl.permission == Permission.ALLOW:
            if operation == Operation.DESCRIBE:
                if acl.operation not in _IMPLIES_DESCRIBE:
                    return Verdict.NONE
            elif operation == Operation.DESCRIBE_CONFIGS:
                if acl.operation not in _IMPLIES_DESCRIBE_CONFIGS:
                    return Verdict.NONE
            elif operation != acl.operation:
                return Verdict.NONE
        elif operation != acl.operation:
            return Verdict.NONE
    return Verdict.ALLOWED if acl.permission == Permission.ALLOW else Verdict.DENIED


class Acls:
    """The ACLs one process holds, indexed by principal; replaced whole on each reload, so a
    check never sees half a change."""

    def __init__(self, acls: Iterable[Acl] = ()) -> None:
        self._set(acls)

    def _set(self, acls: Iterable[Acl]) -> None:
        listed = tuple(sorted(set(acls), key=_order))
        by_principal: dict[str, list[Acl]] = {}
        for acl in listed:
            by_principal.setdefault(acl.principal, []).append(acl)
        self._all = listed
        self._by_principal = {p: tuple(a) for p, a in by_principal.items()}

    def replace(self, acls: Iterable[Acl]) -> None:
        self._set(acls)

    @property
    def all(self) -> tuple[Acl, ...]:
        return self._all

    def _candidates(self, principal: str, host: str) -> Iterable[Acl]:
        for name in (principal, f"{USER}:{WILDCARD}"):
            for acl in self._by_principal.get(name, ()):
                if acl.host in (WILDCARD, host):
                    yield acl

    def verdict(
        self,
        principal: str,
        host: str,
        resource_type: ResourceType,
        name: str,
        operation: Operation,
        *,
        covering: bool = False,
    ) -> Verdict:
        """What the ACLs say of `principal` (as `User:name`) from `host` doing `operation` on
        the resource. `covering`: the name is a prefix standing for every name it starts, so
        only the wildcard and PREFIXED patterns that cover all of them allow."""
        found = Verdict.NONE
        for acl in self._candidates(principal, host):
            if not acl.covers(resource_type, name):
                continue
            if (
                covering
                and acl.permission == Permission.ALLOW
                and acl.pattern_type == PatternType.LITERAL
                and acl.resource_name != WILDCARD
            ):
                continue
            said = _entry_allows(acl, operation)
            if said is Verdict.DENIED:
                return said
            if said is Verdict.ALLOWED:
                found = said
        return found

    def allows_any(
        self, principal: str, host: str, resource_type: ResourceType, operation: Operation
    ) -> bool:
        """Whether some resource of the type is allowed the operation (Kafka's
        authorizeByResourceType, which KIP-679 uses to let WRITE on any topic stand for
        IDEMPOTENT_WRITE): an ALLOW pattern that no DENY of the wildcard or a covering prefix
        takes back."""
        mine = [
            acl for acl in self._candidates(principal, host) if acl.resource_type == resource_type
        ]
        denied = [
            acl
            for acl in mine
            if acl.permission == Permission.DENY and acl.operation in (operation, Operation.ALL)
        ]
        for acl in mine:
            if acl.permission != Permission.ALLOW or acl.operation not in (
                operation,
                Operation.ALL,
            ):
                continue
            if not any(
                (
                    d.pattern_type == PatternType.LITERAL
                    and d.resource_name in (WILDCARD, acl.resource_name)
                )
                or (
                    d.pattern_type == PatternType.PREFIXED
                    and acl.resource_name.startswith(d.resource_name)
                )
                for d in denied
            ):
                return True
        return False


def _order(acl: Acl) -> tuple[int, str, int, str, str, int, int]:
    return (
        acl.resource_type,
        acl.resource_name,
        acl.pattern_type,
        acl.principal,
        acl.host,
        acl.operation,
        acl.permission,
    )


# -- the store -------------------------------------------------------------------------------------


class AclRow(Base):
    __tablename__ = "acls"
    __table_args__ = (
        UniqueConstraint(
            "resource_type",
            "resource_name",
            "pattern_type",
            "principal",
            "host",
            "operation",
            "permission",
            name="uq_acls_binding",
        ),
    )

    id: Mapped[int] = mapped_column(BigIntKey, primary_key=True)
    resource_type: Mapped[int] = mapped_column(Integer)
    resource_name: Mapped[str] = mapped_column(Text)
    pattern_type: Mapped[int] = mapped_column(Integer)
    principal: Mapped[str] = mapped_column(Text)
    host: Mapped[str] = mapped_column(Text)
    operation: Mapped[int] = mapped_column(Integer)
    permission: Mapped[int] = mapped_column(Integer)


def _acl(row: AclRow) -> Acl:
    return Acl.of(
        row.resource_type,
        row.resource_name,
        row.pattern_type,
        row.principal,
        row.host,
        row.operation,
        row.permission,
    )


async def load(db: Store) -> list[Acl]:
    async with db.read() as session:
        return [_acl(row) for row in (await session.execute(select(AclRow))).scalars()]


async def refresh(db: Store, held: Acls) -> None:
    """What the process holds, made the store's."""
    held.replace(await load(db))


async def keep_fresh(db: Store, held: Acls, interval_s: float) -> None:
    """Reload the ACLs every `interval_s` until cancelled, so this process applies what other
    processes changed."""
    await run_periodically(interval_s, lambda: refresh(db, held), _log)


_BINDING = [
    "resource_type",
    "resource_name",
    "pattern_type",
    "principal",
    "host",
    "operation",
    "permission",
]


async def create(db: Store, acls: Sequence[Acl]) -> None:
    """Adds the (already checked) ACLs; one that exists already is left as it is, as Kafka
    takes a binding created twice."""
    rows = [
        {
            "resource_type": int(acl.resource_type),
            "resource_name": acl.resource_name,
            "pattern_type": int(acl.pattern_type),
            "principal": acl.principal,
            "host": acl.host,
            "operation": int(acl.operation),
            "permission": int(acl.permission),
        }
        for acl in dict.fromkeys(acls)
    ]
    async with db.write() as session:
        await db.insert_ignore(session, AclRow.__table__, rows, _BINDING)


async def delete_matching(db: Store, filters: Sequence[AclFilter]) -> list[list[Acl]]:
    """Removes every ACL some filter matches, in one transaction; for each filter, the ACLs it
    matched."""
    async with db.write() as session:
        rows = [
            (row.id, _acl(row))
            for row in (await session.execute(select(AclRow).with_for_update())).scalars()
        ]
        matched = [[acl for _, acl in rows if f.matches(acl)] for f in filters]
        gone = [key for key, acl in rows if any(f.matches(acl) for f in filters)]
        if gone:
            await session.execute(delete(AclRow).where(AclRow.id.in_(gone)))
    return [sorted(m, key=_order) for m in matched]
