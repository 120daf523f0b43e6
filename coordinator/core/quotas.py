"""Kafka's controller mutation quota (KIP-599): how many partitions a principal may create per
second, per service process.

A token bucket that may go into debt, as Kafka's quota does: a request is admitted while the
principal's bucket is positive, whatever its size (one large topic is never refused outright),
and its partitions are then taken, possibly below zero; the next request waits until the bucket
has refilled. Per process by design, like Kafka's per-broker quotas: it bounds load, it does not
decide correctness.

The rate is a user's own where one is stored (Kafka's AlterClientQuotas, `kafka-configs
--entity-type users`), else the default user's stored one, else the setting
(`COORDINATOR_CONTROLLER_MUTATION_RATE`): Kafka's precedence for user quotas. It is the one
quota kept, because it is the one enforced: a byte-rate or request quota stored here would be
a promise nobody keeps, so it is refused.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from sqlalchemy import Float, String, delete, or_, select
from sqlalchemy.orm import Mapped, mapped_column

from coordinator.core.errors import CoordinatorError, InvalidRequest
from coordinator.core.tables import Base
from coordinator.store import Store

# The bucket holds this many seconds of the rate (Kafka's quota window: 11 samples of 1 s).
_BURST_S = 10


class ThrottlingQuotaExceeded(CoordinatorError):
    code: ClassVar[str] = "THROTTLING_QUOTA_EXCEEDED"
    status: ClassVar[int] = 429
    retriable: ClassVar[bool] = True
    title: ClassVar[str] = "Throttling quota exceeded"


class MutationQuota:
    def __init__(self, partitions_per_second: float, clock: object = time.monotonic) -> None:
        self.rate = partitions_per_second
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # principal: (tokens, at)
        self._lock = threading.Lock()

    async def admit(self, db: Store, principal: str, partitions: int) -> None:
        """Take `partitions` from the principal's bucket, at the principal's rate (`rate_of`),
        or raise `ThrottlingQuotaExceeded` (with `throttle_time_ms`) while it is empty."""
        stored = await rate_of(db, principal)
        self.take(principal, partitions, self.rate if stored is None else stored)

    def take(self, principal: str, partitions: int, rate: float) -> None:
        from coordinator.core.metrics import record_limit_refusal

        capacity = rate * _BURST_S
        with self._lock:
            now: float = self._clock()  # type: ignore[operator]
            tokens, at = self._buckets.get(principal, (capacity, now))
            tokens = min(capacity, tokens + (now - at) * rate)
            if tokens <= 0:
                self._buckets[principal] = (tokens, now)
                wait_ms = int(-tokens / rate * 1000) + 1
                record_limit_refusal("partition_mutation_rate")
                raise ThrottlingQuotaExceeded(
                    f"principal {principal!r} is over its {rate:g} partition mutations per "
                    f"second ({CONTROLLER_MUTATION_RATE}); retry in {wait_ms} ms",
                    {"throttle_time_ms": wait_ms},
                )
            self._buckets[principal] = (tokens - partitions, now)


# -- stored quotas (Kafka's client quotas, per user) -----------------------------------------------

CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
# Kafka's quota keys for user and client-id entities: each is known, only the first is kept.
KAFKA_USER_QUOTAS = (
    CONTROLLER_MUTATION_RATE,
    "producer_byte_rate",
    "consumer_byte_rate",
    "request_percentage",
)
# The default user's row: Kafka refuses an empty user name, so it names no user.
_DEFAULT = ""


class ClientQuota(Base):
    __tablename__ = "client_quotas"

    user_name: Mapped[str] = mapped_column(String(255), primary_key=True)  # "": the default
    quota_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[float] = mapped_column(Float)


@dataclass(frozen=True, slots=True)
class StoredQuota:
    user: str | None  # None: the default user
    key: str
    value: float


async def rate_of(db: Store, principal: str) -> float | None:
    """The principal's stored mutation rate, else the default user's, else None (the
    setting's). With auth off every caller is "" (`Access.name`), so the default user."""
    async with db.read() as session:
        rows = dict(
            (
                await session.execute(
                    select(ClientQuota.user_name, ClientQuota.value).where(
                        ClientQuota.quota_key == CONTROLLER_MUTATION_RATE,
                        or_(ClientQuota.user_name == principal, ClientQuota.user_name == _DEFAULT),
                    )
                )
            ).all()
        )
    return rows.get(principal, rows.get(_DEFAULT))


async def stored_quotas(db: Store) -> list[StoredQuota]:
    async with db.read() as session:
        rows = await session.execute(
            select(ClientQuota.user_name, ClientQuota.quota_key, ClientQuota.value).order_by(
                ClientQuota.user_name, ClientQuota.quota_key
            )
        )
        return [StoredQuota(u if u != _DEFAULT else None, k, v) for u, k, v in rows]


def _check_changes(changes: Mapping[str, float | None]) -> None:
    """Kafka's checks of a user's quota changes (None: remove), then this service's: only the
    quota it enforces may be set."""
    for key, value in changes.items():
        if key not in KAFKA_USER_QUOTAS:
            raise InvalidRequest(f"Invalid configuration key {key}")
        if value is None:
            continue
        if value <= 0:
            raise InvalidRequest(f"Quota {key} must be greater than 0")
        if not math.isfinite(value):
            raise InvalidRequest(f"Quota {key} must be a finite number, not {value}")
        if key != CONTROLLER_MUTATION_RATE:
            raise InvalidRequest(
                f"quota {key} is not enforced by this coordinator, so it is not kept; the "
                f"quota it enforces is {CONTROLLER_MUTATION_RATE}"
            )


# A quota entity's types (Kafka's ClientQuotaEntity), and how a filter matches one.
USER, ENTITY_TYPES = "user", ("user", "client-id", "ip")
EXACT, DEFAULT, ANY = 0, 1, 2


def user_of(entity: Sequence[tuple[str, str | None]]) -> str | None:
    """The user a quota entity ((type, name) pairs) names (None: the default user), after
    Kafka's checks of an entity; this service keeps quotas per user only."""
    if not entity:
        raise InvalidRequest("Invalid empty client quota entity")
    seen: set[str] = set()
    for entity_type, name in entity:
        if entity_type in seen:
            raise InvalidRequest(
                f"Invalid client quota entity, duplicate entity entry {entity_type}"
            )
        seen.add(entity_type)
        if entity_type not in ENTITY_TYPES:
            raise InvalidRequest(f"Unhandled client quota entity type: {entity_type}")
        if name is not None and not name:
            raise InvalidRequest(f"Empty {entity_type} not supported")
    if "ip" in seen and len(seen) > 1:
        raise InvalidRequest("Invalid quota entity combination, IP entity should not be combined")
    if seen != {USER}:
        raise InvalidRequest(
            "this coordinator keeps quotas per user only (its one quota, "
            f"{CONTROLLER_MUTATION_RATE}, is per principal); "
            f"a {' and '.join(sorted(seen))} quota would not be enforced"
        )
    ((_, user),) = entity
    return user


async def describe_quotas(
    db: Store, default_rate: float, filters: Sequence[tuple[str, int, str | None]], strict: bool
) -> dict[str | None, dict[str, float]]:
    """Kafka's DescribeClientQuotas: each user's (None: the default user's) quotas that the
    filters ((entity type, match type, name)) match; the default user's mutation rate is the
    setting (`default_rate`) until one is stored. Every entry is one user's: it matches user
    filters only, and a `strict` filter also wants every type it names."""
    for entity_type, match_type, _ in filters:
        if entity_type not in ENTITY_TYPES or match_type not in (EXACT, DEFAULT, ANY):
            raise InvalidRequest(f"no such filter: {entity_type} {match_type}")
    by_user: dict[str | None, dict[str, float]] = {None: {CONTROLLER_MUTATION_RATE: default_rate}}
    for stored in await stored_quotas(db):
        by_user.setdefault(stored.user, {})[stored.key] = stored.value
    types = {entity_type for entity_type, _, _ in filters}

    def matches(user: str | None) -> bool:
        return all(
            entity_type == USER
            and (
                match_type == ANY
                or (match_type == DEFAULT and user is None)
                or (match_type == EXACT and user is not None and name == user)
            )
            for entity_type, match_type, name in filters
        ) and (not strict or types == {USER})

    return {user: values for user, values in by_user.items() if matches(user)}


async def alter_quotas(
    db: Store,
    user: str | None,
    ops: Sequence[tuple[str, float | None]],
    *,
    validate_only: bool,
) -> None:
    """Set or remove (None) a user's quotas (`user` None: the default user's), all or none;
    `ops` are (key, value) pairs, a key at most once."""
    if user == _DEFAULT:
        raise InvalidRequest("Empty user not supported")
    changes: dict[str, float | None] = {}
    for key, value in ops:
        if key in changes:
            raise InvalidRequest(f"Duplicate quota key {key}")
        changes[key] = value
    _check_changes(changes)
    if validate_only:
        return
    name = _DEFAULT if user is None else user
    async with db.write() as session:
        for key, value in changes.items():
            await session.execute(
                delete(ClientQuota).where(
                    ClientQuota.user_name == name, ClientQuota.quota_key == key
                )
            )
            if value is not None:
                session.add(ClientQuota(user_name=name, quota_key=key, value=value))
