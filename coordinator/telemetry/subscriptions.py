"""Client-metrics subscriptions: Kafka's CLIENT_METRICS config resources (KIP-714), each a name
with up to three configs, as Kafka's ClientMetricsConfigs defines them:

- `metrics`: the metric name prefixes a matching client should push (`*`: all of them);
- `interval.ms`: how often it pushes (100 ms to an hour; 5 minutes when not set);
- `match`: which clients, as `key=regex` pairs over the client's instance id, client id,
  software name and version, source address and port (every pair must match; none: all
  clients).

A client matching several subscriptions pushes the union of their metrics at the shortest of
their intervals. The rules are pure (`Subscription`, `requested`); reading and writing them is
`list_names`, `configs_of`, `alter`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import delete, select

from coordinator.core.errors import InvalidRequest
from coordinator.log.errors import InvalidConfig
from coordinator.store import Store
from coordinator.telemetry.models import ClientMetricsConfig

METRICS, INTERVAL_MS, MATCH = "metrics", "interval.ms", "match"
CONFIGS = (METRICS, INTERVAL_MS, MATCH)
LISTS = (METRICS, MATCH)
ALL_METRICS = "*"
DEFAULT_INTERVAL_MS = 5 * 60 * 1000
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 100, 3_600_000
# What a `match` pair may name: the client's metadata (ClientMetricsInstanceMetadata).
MATCH_KEYS = (
    "client_instance_id",
    "client_id",
    "client_software_name",
    "client_software_version",
    "client_source_address",
    "client_source_port",
)


def split_list(value: str) -> list[str]:
    """A LIST config's items, as Kafka's ConfigDef parses them: split on commas, trimmed, empty
    ones dropped."""
    return [item.strip() for item in value.split(",") if item.strip()]


@dataclass(frozen=True, slots=True)
class Subscription:
    name: str
    metrics: frozenset[str]
    interval_ms: int
    match: Mapping[str, re.Pattern[str]]

    @classmethod
    def of(cls, name: str, configs: Mapping[str, str]) -> Subscription:
        interval = configs.get(INTERVAL_MS)
        return cls(
            name,
            frozenset(split_list(configs.get(METRICS, ""))),
            DEFAULT_INTERVAL_MS if interval is None else int(interval),
            parse_match(split_list(configs.get(MATCH, ""))),
        )

    def matches(self, metadata: Mapping[str, str]) -> bool:
        """Kafka's isMatch: every pattern matches its attribute whole."""
        return all(
            pattern.fullmatch(metadata.get(key, "")) is not None
            for key, pattern in self.match.items()
        )


def parse_match(patterns: Iterable[str]) -> dict[str, re.Pattern[str]]:
    parsed: dict[str, re.Pattern[str]] = {}
    for pattern in patterns:
        pair = pattern.split("=")
        if len(pair) != 2 or pair[0].strip() not in MATCH_KEYS:
            raise InvalidConfig(
                f"Illegal client matching pattern: {pattern} (key=regex, the key one of "
                f"{', '.join(MATCH_KEYS)})"
            )
        try:
            parsed[pair[0].strip()] = re.compile(pair[1].strip())
        except re.error as bad:
            raise InvalidConfig(f"Illegal client matching pattern: {pattern} ({bad})") from bad
    return parsed


def check(name: str, configs: Mapping[str, str]) -> None:
    """Kafka's ClientMetricsConfigs.validate of a subscription's configs after a change."""
    if not name:
        raise InvalidRequest("Subscription name can't be empty")
    for key in configs:
        if key not in CONFIGS:
            raise InvalidRequest(f"Unknown client metrics configuration: {key}")
    if INTERVAL_MS in configs:
        try:
            interval = int(configs[INTERVAL_MS].strip())
        except ValueError:
            raise InvalidConfig(
                f"Invalid value {configs[INTERVAL_MS]} for configuration {INTERVAL_MS}: "
                "Not a number of type INT"
            ) from None
        if not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
            raise InvalidRequest(
                f"Invalid value {interval} for {INTERVAL_MS}, interval must be between "
                f"{MIN_INTERVAL_MS} and {MAX_INTERVAL_MS} (1 hour)"
            )
    if MATCH in configs:
        parse_match(split_list(configs[MATCH]))


@dataclass(frozen=True, slots=True)
class Requested:
    """What one client is asked to push: metric prefixes (`*` alone: all) at an interval."""

    metrics: tuple[str, ...]
    interval_ms: int


def requested(subscriptions: Iterable[Subscription], metadata: Mapping[str, str]) -> Requested:
    """Kafka's union over the subscriptions a client matches: their metrics (`*` if any asks
    for all), the shortest interval (5 minutes when none matches)."""
    metrics: set[str] = set()
    interval = DEFAULT_INTERVAL_MS
    for subscription in subscriptions:
        if subscription.matches(metadata):
            metrics |= subscription.metrics
            interval = min(interval, subscription.interval_ms)
    if ALL_METRICS in metrics:
        return Requested((ALL_METRICS,), interval)
    return Requested(tuple(sorted(metrics)), interval)


# -- the store -------------------------------------------------------------------------------------


async def stored(db: Store) -> dict[str, dict[str, str]]:
    """Every subscription's configs, by name."""
    async with db.read() as session:
        rows = await session.execute(
            select(ClientMetricsConfig.name, ClientMetricsConfig.config, ClientMetricsConfig.value)
        )
        found: dict[str, dict[str, str]] = {}
        for name, config, value in rows:
            found.setdefault(name, {})[config] = value
        return found


async def subscriptions(db: Store) -> list[Subscription]:
    return [Subscription.of(name, configs) for name, configs in (await stored(db)).items()]


async def list_names(db: Store) -> list[str]:
    return sorted(await stored(db))


@dataclass(frozen=True, slots=True)
class Described:
    name: str
    value: str
    is_set: bool  # else Kafka's default
    type: str  # Kafka's ConfigDef type: INT or LIST


DEFAULTS = {METRICS: "", INTERVAL_MS: str(DEFAULT_INTERVAL_MS), MATCH: ""}


async def describe(db: Store, name: str) -> list[Described]:
    """Every config of a subscription, as Kafka describes one: those set, and the others at
    their defaults (a name no subscription has shows the defaults alone)."""
    if not name:
        raise InvalidRequest("Client metrics subscription name must not be empty")
    configs = (await stored(db)).get(name, {})
    return [
        Described(
            key,
            configs.get(key, DEFAULTS[key]),
            key in configs,
            "LIST" if key in LISTS else "INT",
        )
        for key in CONFIGS
    ]


async def alter(
    db: Store,
    name: str,
    to_set: Mapping[str, str],
    to_delete: Sequence[str],
    *,
    validate_only: bool,
) -> None:
    """Set and delete a subscription's configs, checked as a whole; a subscription left
    without configs is gone."""
    if not name:
        raise InvalidRequest("Subscription name can't be empty")
    for key in [*to_set, *to_delete]:
        if key not in CONFIGS:
            raise InvalidRequest(f"Unknown client metrics configuration: {key}")
    async with db.write() as session:
        rows = await session.execute(
            select(ClientMetricsConfig.config, ClientMetricsConfig.value).where(
                ClientMetricsConfig.name == name
            )
        )
        after = {config: value for config, value in rows}
        for key in to_delete:
            after.pop(key, None)
        after.update(to_set)
        check(name, after)
        if validate_only:
            return
        await session.execute(delete(ClientMetricsConfig).where(ClientMetricsConfig.name == name))
        session.add_all(
            ClientMetricsConfig(name=name, config=key, value=value) for key, value in after.items()
        )
