"""Topic configs (docs/pages/http-api.md, "Topic configs"): Kafka's names, validation and defaults.

A topic stores only the configs set on it, as a JSON object of canonical string values (Kafka's
AdminClient speaks strings); every other config takes its default, some from the service's
settings. The produce path needs three of them on every append: `produce_settings` turns the
stored JSON into them, parsed once per distinct JSON text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

import orjson

from coordinator.core.schemas import INT32_MAX, INT64_MAX
from coordinator.core.settings import Settings
from coordinator.log.errors import InvalidConfig

CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"


def _long(minimum: int, maximum: int = INT64_MAX) -> Callable[[object], str]:
    def parse(value: object) -> str:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError("expected a whole number")
        text = str(value).strip()
        if not text.lstrip("-").isdigit() or text.startswith("+"):
            raise ValueError("expected a whole number")
        number = int(text)
        if not minimum <= number <= maximum:
            raise ValueError(f"must be between {minimum} and {maximum}")
        return str(number)

    return parse


def _choice(*choices: str) -> Callable[[object], str]:
    def parse(value: object) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return str(value)

    return parse


def _bool(value: object) -> str:
    text = str(value).strip().lower() if isinstance(value, str | bool) else ""
    if text not in ("true", "false"):
        raise ValueError("must be true or false")
    return text


def _ratio(value: object) -> str:
    try:
        number = float(str(value))
    except ValueError:
        raise ValueError("expected a number between 0 and 1") from None
    if not 0 <= number <= 1:
        raise ValueError("must be between 0 and 1")
    return repr(number)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    return value


def _cleanup_policy(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("must be delete, compact, or compact,delete")
    parts = [p.strip() for p in value.split(",")]
    if not parts or len(set(parts)) != len(parts) or not set(parts) <= {"compact", "delete"}:
        raise ValueError("must be delete, compact, or compact,delete")
    return ",".join(sorted(parts))


# Configs whose value is a comma-separated list (Kafka's LIST type), which Kafka's
# IncrementalAlterConfigs may APPEND to and SUBTRACT from.
LISTS = frozenset({"cleanup.policy"})


def edit_list(current: str, items: str, append: bool) -> str:
    """A list config's value with `items` (comma-separated) appended or subtracted, in order,
    without duplicates."""
    values = [v for v in current.split(",") if v]
    changes = [v.strip() for v in items.split(",") if v.strip()]
    if append:
        return ",".join(values + [v for v in changes if v not in values])
    return ",".join(v for v in values if v not in changes)


@dataclass(frozen=True)
class ConfigDef:
    parse: Callable[[object], str]
    default: Callable[[Settings], str]
    # Its type as Kafka 4.4's broker reports it (DescribeConfigs v3+, KIP-569): BOOLEAN,
    # STRING, INT, LONG, DOUBLE or LIST.
    type: str


def _fixed(value: str) -> Callable[[Settings], str]:
    return lambda _: value


# `compression.type`: the codec every stored batch gets, or the producer's own.
PRODUCER = "producer"
_COMPRESSION_TYPES = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_LONG_MAX = str(INT64_MAX)
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = "BOOLEAN", "STRING", "INT", "LONG", "DOUBLE", "LIST"

# The configs the coordinator acts on. The produce path obeys cleanup.policy (keys on a
# compacted topic), compression.type, max.message.bytes and message.timestamp.type; the log
# cleaner obeys cleanup.policy, retention.ms, retention.bytes, min.compaction.lag.ms and
# delete.retention.ms.
ACTED_ON: dict[str, ConfigDef] = {
    "cleanup.policy": ConfigDef(_cleanup_policy, _fixed("delete"), LIST),
    "compression.type": ConfigDef(_choice(PRODUCER, *_COMPRESSION_TYPES), _fixed(PRODUCER), STRING),
    "delete.retention.ms": ConfigDef(_long(0), _fixed("86400000"), LONG),
    "max.message.bytes": ConfigDef(_long(0, INT32_MAX), lambda s: str(s.max_request_bytes), INT),
    "message.timestamp.type": ConfigDef(
        _choice(CREATE_TIME, LOG_APPEND_TIME), _fixed(CREATE_TIME), STRING
    ),
    "min.compaction.lag.ms": ConfigDef(_long(0), _fixed("0"), LONG),
    "retention.bytes": ConfigDef(_long(-1), _fixed("-1"), LONG),
    "retention.ms": ConfigDef(_long(-1), lambda s: str(s.log_retention_ms), LONG),
}

# Every other topic config Kafka 4.4 defines (as its DescribeConfigs lists them; the message
# format's, which Kafka 4 dropped, are gone here too), with Kafka's validation and defaults:
# accepted, stored and described, so tools and clients that set them work, but not acted on
# (segments, flushing, replicas and tiered storage are the database's business here).
STORED_ONLY: dict[str, ConfigDef] = {
    "compression.gzip.level": ConfigDef(_long(-1, 9), _fixed("-1"), INT),
    "compression.lz4.level": ConfigDef(_long(1, 17), _fixed("9"), INT),
    "compression.zstd.level": ConfigDef(_long(-131072, 22), _fixed("3"), INT),
    "file.delete.delay.ms": ConfigDef(_long(0), _fixed("60000"), LONG),
    "flush.messages": ConfigDef(_long(1), _fixed(_LONG_MAX), LONG),
    "flush.ms": ConfigDef(_long(0), _fixed(_LONG_MAX), LONG),
    "follower.replication.throttled.replicas": ConfigDef(_text, _fixed(""), LIST),
    "index.interval.bytes": ConfigDef(_long(0, INT32_MAX), _fixed("4096"), INT),
    "errors.deadletterqueue.group.enable": ConfigDef(_bool, _fixed("false"), BOOLEAN),
    "leader.replication.throttled.replicas": ConfigDef(_text, _fixed(""), LIST),
    "local.retention.bytes": ConfigDef(_long(-2), _fixed("-2"), LONG),
    "local.retention.ms": ConfigDef(_long(-2), _fixed("-2"), LONG),
    "max.compaction.lag.ms": ConfigDef(_long(1), _fixed(_LONG_MAX), LONG),
    "max.decompressed.message.bytes": ConfigDef(_long(0, INT32_MAX), _fixed("2147483639"), INT),
    "message.timestamp.after.max.ms": ConfigDef(_long(0), _fixed("3600000"), LONG),
    "message.timestamp.before.max.ms": ConfigDef(_long(0), _fixed(_LONG_MAX), LONG),
    "min.cleanable.dirty.ratio": ConfigDef(_ratio, _fixed("0.5"), DOUBLE),
    "min.insync.replicas": ConfigDef(_long(1, INT32_MAX), _fixed("1"), INT),
    "preallocate": ConfigDef(_bool, _fixed("false"), BOOLEAN),
    "remote.copy.lag.bytes": ConfigDef(_long(-1), _fixed("-1"), LONG),
    "remote.copy.lag.ms": ConfigDef(_long(-1), _fixed("0"), LONG),
    "remote.log.copy.disable": ConfigDef(_bool, _fixed("false"), BOOLEAN),
    "remote.log.delete.on.disable": ConfigDef(_bool, _fixed("false"), BOOLEAN),
    "remote.storage.enable": ConfigDef(_bool, _fixed("false"), BOOLEAN),
    "segment.bytes": ConfigDef(_long(14, INT32_MAX), _fixed("1073741824"), INT),
    "segment.index.bytes": ConfigDef(_long(4, INT32_MAX), _fixed("10485760"), INT),
    "segment.jitter.ms": ConfigDef(_long(0), _fixed("0"), LONG),
    "segment.ms": ConfigDef(_long(1), _fixed("604800000"), LONG),
    "unclean.leader.election.enable": ConfigDef(_bool, _fixed("false"), BOOLEAN),
}

CONFIGS: dict[str, ConfigDef] = {**ACTED_ON, **STORED_ONLY}


def validated(values: Mapping[str, object]) -> dict[str, str]:
    """`values` in canonical form; an unknown name or a bad value is INVALID_CONFIG naming it."""
    result = {}
    for name, value in values.items():
        definition = CONFIGS.get(name)
        if definition is None:
            raise InvalidConfig(f"{name!r} is not a topic config; known: {', '.join(CONFIGS)}")
        try:
            result[name] = definition.parse(value)
        except ValueError as exc:
            raise InvalidConfig(f"{name}: {value!r} is not valid: {exc}") from None
    return result


def known(names: Iterable[str]) -> list[str]:
    names = list(names)
    for name in names:
        if name not in CONFIGS:
            raise InvalidConfig(f"{name!r} is not a topic config; known: {', '.join(CONFIGS)}")
    return names


def decode(stored: str) -> dict[str, str]:
    loaded: dict[str, str] = orjson.loads(stored)
    return loaded


def encode(configs: Mapping[str, str]) -> str:
    return orjson.dumps(dict(sorted(configs.items()))).decode()


def describe(stored: Mapping[str, str], settings: Settings) -> list[dict[str, str]]:
    """Every config, by name: its value and whether the topic sets it (`TOPIC`) or not."""
    return [
        {"name": name, "value": stored[name], "source": "TOPIC"}
        if name in stored
        else {"name": name, "value": definition.default(settings), "source": "DEFAULT"}
        for name, definition in sorted(CONFIGS.items())
    ]


@dataclass(frozen=True, slots=True)
class ProduceSettings:
    """What an append needs from its topic's configs."""

    log_append_time: bool
    max_message_bytes: int
    compacted: bool
    codec: int | None  # the codec `compression.type` asks for; None: the producer's


@lru_cache(maxsize=1024)
def produce_settings(stored: str, default_max_message_bytes: int) -> ProduceSettings:
    configs = decode(stored)
    compression = configs.get("compression.type", PRODUCER)
    return ProduceSettings(
        log_append_time=configs.get("message.timestamp.type") == LOG_APPEND_TIME,
        max_message_bytes=int(configs.get("max.message.bytes", default_max_message_bytes)),
        compacted="compact" in configs.get("cleanup.policy", "delete"),
        codec=None if compression == PRODUCER else _COMPRESSION_TYPES[compression],
    )


@dataclass(frozen=True, slots=True)
class CleanupSettings:
    """What the log cleaner needs from a topic's configs (-1: no limit)."""

    retention_ms: int
    retention_bytes: int
    delete: bool
    compact: bool
    min_compaction_lag_ms: int
    delete_retention_ms: int

    @property
    def has_work(self) -> bool:
        return self.compact or (
            self.delete and (self.retention_ms >= 0 or self.retention_bytes >= 0)
        )


def cleanup_settings(stored: str, settings: Settings) -> CleanupSettings:
    configs = decode(stored)

    def value(name: str) -> str:
        return configs.get(name) or CONFIGS[name].default(settings)

    policy = value("cleanup.policy").split(",")
    return CleanupSettings(
        retention_ms=int(value("retention.ms")),
        retention_bytes=int(value("retention.bytes")),
        delete="delete" in policy,
        compact="compact" in policy,
        min_compaction_lag_ms=int(value("min.compaction.lag.ms")),
        delete_retention_ms=int(value("delete.retention.ms")),
    )
