"""Group configs (Kafka's GROUP config resource, KIP-848 and KIP-932): Kafka 4.4's names, types,
defaults and bounds. `kafka-configs.sh --entity-type groups` and the Admin client set them with
IncrementalAlterConfigs and read them with DescribeConfigs.

A group id keeps only the configs set on it (`GroupConfig`); the others take their defaults,
which are the service's settings where Kafka's are its broker's (`group.share.*`). A value
outside the bounds those settings give is INVALID_CONFIG, as Kafka's GroupConfig.validate
answers. Share groups act on the `share.*` configs (`coordinator.shares`); the others are kept
and described.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.clock import now_ms
from coordinator.core.errors import CoordinatorError
from coordinator.core.schemas import INT32_MAX
from coordinator.core.settings import Settings
from coordinator.groups.models import ConsumerGroup, GroupConfig
from coordinator.store import Store, store_of


class InvalidGroupConfig(CoordinatorError):
    code = "INVALID_CONFIG"
    status = 400
    title = "Invalid group config"


BOOLEAN, STRING, INT, LIST = "BOOLEAN", "STRING", "INT", "LIST"

EARLIEST, LATEST, BY_DURATION = "earliest", "latest", "by_duration:"
READ_COMMITTED, READ_UNCOMMITTED = "read_committed", "read_uncommitted"

# ISO-8601 durations as Java's Duration.parse reads them (share.auto.offset.reset's
# by_duration: PnDTnHnMn.nS, positive).
_DURATION = re.compile(
    r"P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d{1,9})?)S)?)?",
    re.IGNORECASE,
)


def duration_ms(text: str) -> int:
    """An ISO-8601 duration (PnDTnHnMn.nS) in milliseconds; ValueError if it is not one."""
    match = _DURATION.fullmatch(text)
    if match is None or text.upper() in ("P", "PT") or text.upper().endswith("T"):
        raise ValueError(f"{text!r} is not an ISO-8601 duration such as PT1H or P1DT12H")
    days, hours, minutes = (int(match.group(g) or 0) for g in "dhm")
    seconds = float(match.group("s") or 0)
    return round((((days * 24 + hours) * 60 + minutes) * 60 + seconds) * 1000)


Bounds = Callable[[Settings], tuple[int, int]]


@dataclass(frozen=True)
class GroupConfigDef:
    type: str
    default: Callable[[Settings], str]
    parse: Callable[[str, Settings], str]


def _int(bounds: Bounds | None = None) -> Callable[[str, Settings], str]:
    def parse(value: str, settings: Settings) -> str:
        text = value.strip()
        if not re.fullmatch(r"-?\d+", text) or not -(2**31) <= int(text) <= INT32_MAX:
            raise ValueError("expected an int")
        number = int(text)
        low, high = bounds(settings) if bounds else (0, INT32_MAX)
        if not low <= number <= high:
            raise ValueError(f"must be between {low} and {high}")
        return str(number)

    return parse


def _choice(*choices: str) -> Callable[[str, Settings], str]:
    def parse(value: str, _: Settings) -> str:
        if value.strip().lower() not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value.strip().lower()

    return parse


def _bool(value: str, _: Settings) -> str:
    if value.strip().lower() not in ("true", "false"):
        raise ValueError("must be true or false")
    return value.strip().lower()


def _text(value: str, _: Settings) -> str:
    return value


def _reset(value: str, _: Settings) -> str:
    text = value.strip().lower()
    if text in (EARLIEST, LATEST):
        return text
    if text.startswith(BY_DURATION):
        duration_ms(value.strip()[len(BY_DURATION) :])
        return BY_DURATION + value.strip()[len(BY_DURATION) :]
    raise ValueError("must be earliest, latest or by_duration:<ISO-8601 duration>")


def _fixed(value: str) -> Callable[[Settings], str]:
    return lambda _: value


def _setting(name: str) -> Callable[[Settings], str]:
    return lambda settings: str(getattr(settings, name))


def _between(low: str, high: str) -> Bounds:
    return lambda settings: (getattr(settings, low), getattr(settings, high))


CONFIGS: dict[str, GroupConfigDef] = {
    "consumer.assignment.interval.ms": GroupConfigDef(INT, _fixed("1000"), _int()),
    "consumer.heartbeat.interval.ms": GroupConfigDef(
        INT, _setting("group_heartbeat_interval_ms"), _int()
    ),
    "consumer.session.timeout.ms": GroupConfigDef(
        INT,
        _setting("group_session_timeout_ms"),
        _int(_between("group_min_session_timeout_ms", "group_max_session_timeout_ms")),
    ),
    "errors.deadletterqueue.copy.record.enable": GroupConfigDef(BOOLEAN, _fixed("false"), _bool),
    "errors.deadletterqueue.topic.name": GroupConfigDef(STRING, _fixed(""), _text),
    "share.assignment.interval.ms": GroupConfigDef(INT, _fixed("1000"), _int()),
    "share.auto.offset.reset": GroupConfigDef(STRING, _fixed(LATEST), _reset),
    "share.delivery.count.limit": GroupConfigDef(
        INT,
        _setting("share_delivery_count_limit"),
        _int(_between("share_min_delivery_count_limit", "share_max_delivery_count_limit")),
    ),
    "share.heartbeat.interval.ms": GroupConfigDef(
        INT,
        _setting("share_heartbeat_interval_ms"),
        _int(_between("share_min_heartbeat_interval_ms", "share_max_heartbeat_interval_ms")),
    ),
    "share.isolation.level": GroupConfigDef(
        STRING, _fixed(READ_UNCOMMITTED), _choice(READ_COMMITTED, READ_UNCOMMITTED)
    ),
    "share.partition.max.record.locks": GroupConfigDef(
        INT,
        _setting("share_partition_max_record_locks"),
        _int(lambda s: (100, s.share_max_partition_max_record_locks)),
    ),
    "share.record.lock.duration.ms": GroupConfigDef(
        INT,
        _setting("share_record_lock_duration_ms"),
        _int(_between("share_min_record_lock_duration_ms", "share_max_record_lock_duration_ms")),
    ),
    "share.renew.acknowledge.enable": GroupConfigDef(BOOLEAN, _fixed("true"), _bool),
    "share.session.timeout.ms": GroupConfigDef(
        INT,
        _setting("share_session_timeout_ms"),
        _int(_between("share_min_session_timeout_ms", "share_max_session_timeout_ms")),
    ),
    "streams.assignment.interval.ms": GroupConfigDef(INT, _fixed("1000"), _int()),
    "streams.assignor.name": GroupConfigDef(STRING, _fixed("sticky"), _choice("sticky")),
    # A member is told this or a third of streams.session.timeout.ms, the smaller.
    "streams.heartbeat.interval.ms": GroupConfigDef(
        INT, _setting("group_heartbeat_interval_ms"), _int(lambda _: (1, INT32_MAX))
    ),
    "streams.initial.rebalance.delay.ms": GroupConfigDef(INT, _fixed("3000"), _int()),
    "streams.num.standby.replicas": GroupConfigDef(INT, _fixed("0"), _int()),
    "streams.rack.aware.assignment.tags": GroupConfigDef(LIST, _fixed(""), _text),
    "streams.session.timeout.ms": GroupConfigDef(
        INT,
        _setting("group_session_timeout_ms"),
        _int(_between("group_min_session_timeout_ms", "group_max_session_timeout_ms")),
    ),
}


@dataclass(frozen=True)
class GroupConfigValue:
    name: str
    value: str
    is_set: bool
    type: str


def effective(settings: Settings, stored: Mapping[str, str]) -> dict[str, str]:
    """Every config's value for a group that set `stored`."""
    return {name: stored.get(name, d.default(settings)) for name, d in CONFIGS.items()}


async def stored_configs(session: AsyncSession, group_id: str) -> dict[str, str]:
    row = await session.get(GroupConfig, group_id)
    return dict(row.configs) if row is not None else {}


async def group_configs(session: AsyncSession, settings: Settings, group_id: str) -> dict[str, str]:
    """The group's configs, set or default, in a unit of work (the share rules read them)."""
    return effective(settings, await stored_configs(session, group_id))


async def list_names(db: Store) -> list[str]:
    """The group ids that exist or have configs set, in order."""
    async with db.read() as session:
        configured = await session.scalars(select(GroupConfig.group_id))
        existing = await session.scalars(select(ConsumerGroup.group_id))
        return sorted({*configured, *existing})


async def describe(db: Store, settings: Settings, group_id: str) -> list[GroupConfigValue]:
    async with db.read() as session:
        stored = await stored_configs(session, group_id)
    return [
        GroupConfigValue(name, stored.get(name, d.default(settings)), name in stored, d.type)
        for name, d in CONFIGS.items()
    ]


def _checked(
    settings: Settings, to_set: Mapping[str, str | None], to_delete: Sequence[str]
) -> dict[str, str | None]:
    changes: dict[str, str | None] = {}
    for name in [*to_set, *to_delete]:
        if name not in CONFIGS:
            raise InvalidGroupConfig(f"Unknown group config name: {name}")
    for name, value in to_set.items():
        if value is None:
            raise InvalidGroupConfig(f"Null value not supported for : {name}")
        try:
            changes[name] = CONFIGS[name].parse(value, settings)
        except ValueError as exc:
            raise InvalidGroupConfig(
                f"Invalid value {value} for configuration {name}: {exc}"
            ) from None
    for name in to_delete:
        changes[name] = None
    return changes


async def alter(
    db: Store,
    settings: Settings,
    group_id: str,
    to_set: Mapping[str, str | None],
    to_delete: Sequence[str],
    *,
    validate_only: bool = False,
) -> None:
    """Set and delete group configs, all or none: an unknown name or a bad value is
    INVALID_CONFIG and nothing changes."""
    if not 0 < len(group_id) <= 255:
        raise InvalidGroupConfig(f"a group id is 1 to 255 characters, not {len(group_id)}")
    changes = _checked(settings, to_set, to_delete)
    if validate_only:
        return
    async with db.write() as session:
        query = select(GroupConfig).where(GroupConfig.group_id == group_id).with_for_update()
        row = (await session.scalars(query)).one_or_none()
        stored = dict(row.configs) if row is not None else {}
        for name, value in changes.items():
            if value is None:
                stored.pop(name, None)
            else:
                stored[name] = value
        await store_of(session).upsert(
            session,
            GroupConfig,
            [{"group_id": group_id, "configs": stored, "updated_ms": now_ms()}],
            ["group_id"],
        )
