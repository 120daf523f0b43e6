"""Typed configuration: frozen dataclasses built from a dict with Kafka's key names, from typed
keyword arguments, or both (keywords win). Unknown keys and bad values raise `ConfigError` at
construction, naming the key, instead of failing later. A librdkafka setting this SDK has no use
for (socket and fetch tuning, ...) is accepted and ignored with a logged warning, so code written
for confluent-kafka keeps its configuration.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar

import httpx

from sdk import _librdkafka as librdkafka
from sdk._errors import ConfigError, KafkaError
from sdk._types import CommitCallback, DeliveryCallback

__all__ = [
    "AdminConfig",
    "AdminOptions",
    "ClientConfig",
    "ConsumerConfig",
    "ConsumerOptions",
    "EffectsConfig",
    "EffectsOptions",
    "ProducerConfig",
    "ProducerOptions",
    "build_config",
    "config_keys",
]

INT32_MAX = 2**31 - 1


def _setting(
    default: Any = dataclasses.MISSING,
    *,
    doc: str,
    kind: str = "",
    key: str | None = "",
    minimum: int | None = None,
    maximum: int | None = None,
    choices: Mapping[str, str] | None = None,
) -> Any:
    """A config field. `key` "" derives the Kafka key from the field name (`linger_ms` ->
    `linger.ms`); None means keyword-only (no dict key). `choices` maps accepted spellings."""
    if not kind:
        kind = type(default).__name__ if default not in (None, dataclasses.MISSING) else "str"
    return field(default=default, metadata=_meta(doc, kind, key, minimum, maximum, choices))


def _meta(
    doc: str,
    kind: str,
    key: str | None = "",
    minimum: int | None = None,
    maximum: int | None = None,
    choices: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "doc": doc,
        "kind": kind,
        "key": key,
        "min": minimum,
        "max": maximum,
        "choices": choices,
    }


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    """Settings every client shares."""

    coordinator_url: str = _setting(
        doc="Base URL of the coordinator service, e.g. `http://127.0.0.1:8080` (in place of "
        "`bootstrap.servers`).",
    )
    coordinator_token: str | None = _setting(
        None,
        kind="secret",
        doc="Bearer token sent as `Authorization: Bearer <token>` when the service has auth on "
        "(in place of `sasl.username`/`sasl.password`).",
    )
    client_id: str = _setting("sdk", doc="Name of this client, sent in the `User-Agent` header.")
    request_timeout_ms: int = _setting(
        30_000, minimum=1, doc="Longest wait for one HTTP answer; then the attempt has failed."
    )
    default_api_timeout_ms: int = _setting(
        60_000,
        minimum=1,
        doc="Bound on a blocking call given no timeout (retries included), e.g. "
        "`init_transactions()`, `commit()`, admin calls.",
    )
    retry_backoff_ms: int = _setting(
        100, minimum=0, doc="First pause before a retry; doubles per attempt, with ±20% jitter."
    )
    retry_backoff_max_ms: int = _setting(1_000, minimum=0, doc="Longest pause between retries.")
    transport: httpx.BaseTransport | None = field(
        default=None,
        metadata=_meta(
            "An httpx transport to send requests through (keyword only; for tests).",
            "transport",
            key=None,
        ),
    )
    error_cb: Callable[[KafkaError], object] | None = field(
        default=None,
        metadata=_meta(
            "`error_cb(err)`: errors that no call returns (the service unreachable from a "
            "background thread, a failed auto-commit), served by `poll()`.",
            "callable",
            key="error_cb",
        ),
    )
    throttle_cb: Callable[[Any], object] | None = field(
        default=None,
        metadata=_meta(
            "Accepted for compatibility; the service never throttles, so it is never called.",
            "callable",
            key="throttle_cb",
        ),
    )
    stats_cb: Callable[[str], object] | None = field(
        default=None,
        metadata=_meta(
            "`stats_cb(json_text)`: the client's statistics every `statistics.interval.ms`, "
            "served by `poll()`.",
            "callable",
            key="stats_cb",
        ),
    )
    statistics_interval_ms: int = _setting(
        0, minimum=0, doc="How often `stats_cb` gets statistics; 0 (the default) never."
    )
    logger: logging.Logger | logging.LoggerAdapter[Any] | None = field(
        default=None,
        metadata=_meta(
            "A `logging.Logger` for this client's log lines (default: the `sdk` logger).",
            "logger",
            key="logger",
        ),
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            low, high = f.metadata.get("min"), f.metadata.get("max")
            if (low is not None and value < low) or (high is not None and value > high):
                bounds = f"{'-inf' if low is None else low}..{'inf' if high is None else high}"
                raise ConfigError(f"{_key_of(f)}: {value} is out of range {bounds}")
        url = self.coordinator_url
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"coordinator.url: {url!r} is not an http:// or https:// URL")


@dataclass(frozen=True, kw_only=True)
class ProducerConfig(ClientConfig):
    transactional_id: str | None = _setting(
        None, doc="Enables transactions; the same id across restarts fences older instances."
    )
    enable_idempotence: bool = _setting(
        True, doc="Producer id and sequence numbers, so retries never duplicate or reorder."
    )
    acks: str = _setting(
        "all",
        kind="choice",
        choices={"all": "all", "-1": "all"},
        doc="Only `all`: the service acknowledges a batch once it is committed to the store.",
    )
    transaction_timeout_ms: int = _setting(
        60_000, minimum=1, doc="The coordinator aborts a transaction open longer than this."
    )
    linger_ms: int = _setting(
        5, minimum=0, maximum=900_000, doc="How long a batch waits for more records to join."
    )
    batch_size: int = _setting(
        16_384, minimum=1, doc="Most bytes of records in one batch (a larger record goes alone)."
    )
    compression_type: str = _setting(
        "none",
        kind="choice",
        choices={c: c for c in ("none", "gzip", "snappy", "lz4", "zstd")},
        doc="Codec of each record batch: `none`, `gzip`, `snappy`, `lz4` or `zstd`.",
    )
    max_in_flight_requests_per_connection: int = _setting(
        5,
        minimum=1,
        maximum=5,
        doc="Most batches in flight per partition (5 at most, as in Kafka).",
    )
    retries: int = _setting(
        INT32_MAX, minimum=0, doc="How many times a failed batch is sent again."
    )
    delivery_timeout_ms: int = _setting(
        120_000,
        minimum=1,
        doc="Upper bound on the time from `produce()` to the delivery report, retries included.",
    )
    message_max_bytes: int = _setting(
        1_000_000, minimum=1, doc="Largest record (key, value and headers) `produce()` accepts."
    )
    queue_buffering_max_messages: int = _setting(
        100_000,
        minimum=1,
        doc="Most records waiting for delivery; then `produce()` raises `BufferError`.",
    )
    on_delivery: DeliveryCallback | None = field(
        default=None,
        metadata=_meta(
            "Default `on_delivery(err, msg)` for records produced without one.",
            "callable",
            key="on_delivery",
        ),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.transactional_id is not None and not self.enable_idempotence:
            raise ConfigError("enable.idempotence: must be true when transactional.id is set")
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:
            raise ConfigError(
                "delivery.timeout.ms: must be at least linger.ms + request.timeout.ms "
                f"({self.linger_ms + self.request_timeout_ms})"
            )


@dataclass(frozen=True, kw_only=True)
class ConsumerConfig(ClientConfig):
    group_id: str | None = _setting(
        None, doc="Consumer group whose committed offsets `commit()` and `committed()` use."
    )
    isolation_level: str = _setting(
        "read_committed",
        kind="choice",
        choices={"read_committed": "read_committed", "read_uncommitted": "read_uncommitted"},
        doc="`read_committed` returns only committed transactions' records; "
        "`read_uncommitted` everything written.",
    )
    auto_offset_reset: str = _setting(
        "latest",
        kind="choice",
        choices={
            "earliest": "earliest",
            "smallest": "earliest",
            "beginning": "earliest",
            "latest": "latest",
            "largest": "latest",
            "end": "latest",
            "error": "error",
        },
        doc="Where to start without a committed offset: `earliest`, `latest` or `error`.",
    )
    enable_auto_commit: bool = _setting(
        True, doc="Commit consumed positions every `auto.commit.interval.ms` and on `close()`."
    )
    auto_commit_interval_ms: int = _setting(5_000, minimum=1, doc="How often auto-commit runs.")
    enable_partition_eof: bool = _setting(
        False, doc="`poll()` returns an event with error `_PARTITION_EOF` at a partition's end."
    )
    max_poll_records: int = _setting(
        500, minimum=1, maximum=10_000, doc="Most records fetched from a partition per request."
    )
    fetch_wait_max_ms: int = _setting(
        100, minimum=0, doc="Pause between fetch rounds that found nothing new."
    )
    max_partition_fetch_bytes: int = _setting(
        1_048_576,
        minimum=1,
        maximum=INT32_MAX,
        doc="Most bytes of record batches fetched from a partition per request (at least one "
        "batch comes).",
    )
    check_crcs: bool = _setting(
        False, doc="Verify each fetched record batch's CRC-32C; a mismatch raises `_BAD_MSG`."
    )
    session_timeout_ms: int | None = _setting(
        None,
        kind="int",
        minimum=1,
        doc="After `subscribe()`: the coordinator removes the member when no heartbeat came for "
        "this long (none: the service's `COORDINATOR_GROUP_SESSION_TIMEOUT_MS`).",
    )
    heartbeat_interval_ms: int = _setting(
        3_000,
        minimum=1,
        doc="After `subscribe()`: the most time between heartbeats (the service may ask for less).",
    )
    max_poll_interval_ms: int = _setting(
        300_000,
        minimum=1,
        doc="After `subscribe()`: with no `poll()`/`consume()` for this long the consumer leaves "
        "the group (its partitions go to others); also how long a rebalance may wait for it.",
    )
    enable_auto_offset_store: bool = _setting(
        True,
        doc="Store each record's offset as `poll()` returns it; false: only `store_offsets()` "
        "stores, and auto-commit commits what was stored.",
    )
    on_commit: CommitCallback | None = field(
        default=None,
        metadata=_meta(
            "`on_commit(err, partitions)` after each commit (auto, asynchronous or not), served "
            "by `poll()`.",
            "callable",
            key="on_commit",
        ),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        session = self.session_timeout_ms
        if session is not None and self.heartbeat_interval_ms >= session:
            raise ConfigError(
                f"heartbeat.interval.ms: must be below session.timeout.ms ({session})"
            )
        if session is not None and self.max_poll_interval_ms < session:
            raise ConfigError(
                f"max.poll.interval.ms: must be at least session.timeout.ms ({session})"
            )


@dataclass(frozen=True, kw_only=True)
class ShareConsumerConfig(ClientConfig):
    group_id: str = _setting(doc="The share group (KIP-932) whose records `poll()` acquires.")
    share_acknowledgement_mode: str = _setting(
        "implicit",
        kind="choice",
        choices={"implicit": "implicit", "explicit": "explicit"},
        doc="`implicit`: what a `poll()` returned is accepted at the next `poll()` or commit; "
        "`explicit`: only what `acknowledge()` marks.",
    )
    max_poll_records: int = _setting(
        500, minimum=1, maximum=10_000, doc="Most records one `poll()` acquires per partition."
    )


@dataclass(frozen=True, kw_only=True)
class AdminConfig(ClientConfig):
    pass


@dataclass(frozen=True, kw_only=True)
class EffectsConfig(ClientConfig):
    pass


class ClientOptions(TypedDict, total=False):
    coordinator_url: str
    coordinator_token: str | None
    client_id: str
    request_timeout_ms: int
    default_api_timeout_ms: int
    retry_backoff_ms: int
    retry_backoff_max_ms: int
    transport: httpx.BaseTransport | None
    error_cb: Callable[[KafkaError], object] | None
    throttle_cb: Callable[[Any], object] | None
    stats_cb: Callable[[str], object] | None
    statistics_interval_ms: int
    logger: logging.Logger | logging.LoggerAdapter[Any] | None


class ProducerOptions(ClientOptions, total=False):
    """Typed keyword arguments of `Producer(...)`: the fields of `ProducerConfig`."""

    transactional_id: str | None
    enable_idempotence: bool
    acks: str
    transaction_timeout_ms: int
    linger_ms: int
    batch_size: int
    compression_type: str
    max_in_flight_requests_per_connection: int
    retries: int
    delivery_timeout_ms: int
    message_max_bytes: int
    queue_buffering_max_messages: int
    on_delivery: DeliveryCallback | None


class ConsumerOptions(ClientOptions, total=False):
    """Typed keyword arguments of `Consumer(...)`: the fields of `ConsumerConfig`."""

    group_id: str | None
    isolation_level: str
    auto_offset_reset: str
    enable_auto_commit: bool
    auto_commit_interval_ms: int
    enable_partition_eof: bool
    max_poll_records: int
    fetch_wait_max_ms: int
    max_partition_fetch_bytes: int
    check_crcs: bool
    session_timeout_ms: int | None
    heartbeat_interval_ms: int
    max_poll_interval_ms: int
    enable_auto_offset_store: bool
    on_commit: CommitCallback | None


class ShareConsumerOptions(ClientOptions, total=False):
    """Typed keyword arguments of `ShareConsumer(...)`: the fields of `ShareConsumerConfig`."""

    group_id: str
    share_acknowledgement_mode: str
    max_poll_records: int


class AdminOptions(ClientOptions, total=False):
    """Typed keyword arguments of `AdminClient(...)`: the fields of `AdminConfig`."""


class EffectsOptions(ClientOptions, total=False):
    """Typed keyword arguments of `EffectsClient(...)`: the fields of `EffectsConfig`."""


# Kafka keys that have a different spelling here: say which, instead of "unknown key".
_REDIRECTS = {
    "bootstrap.servers": "use coordinator.url (the service's http:// URL) in its place",
    "sasl.username": "use coordinator.token (a bearer token) in its place",
    "sasl.password": "use coordinator.token (a bearer token) in its place",
    "sasl.mechanism": "use coordinator.token (a bearer token) in its place",
    "sasl.mechanisms": "use coordinator.token (a bearer token) in its place",
    "security.protocol": "use an https:// coordinator.url and coordinator.token instead",
}


def _key_of(f: dataclasses.Field[Any]) -> str:
    key: str | None = f.metadata.get("key", "")
    if key == "":
        return f.name.replace("_", ".")
    return key or f.name


def config_keys(cls: type[ClientConfig]) -> list[tuple[str, str, str]]:
    """(Kafka key, default, meaning) of every dict key `cls` accepts, for docs and tests."""
    rows = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("key", "") is None:
            continue
        default = "required" if f.default is dataclasses.MISSING else f.default
        if default is None:
            default = "none"
        elif isinstance(default, bool):
            default = str(default).lower()
        rows.append((_key_of(f), str(default), str(f.metadata["doc"])))
    return rows


def _coerce(f: dataclasses.Field[Any], value: object) -> object:
    kind, key = f.metadata["kind"], _key_of(f)
    if value is None and f.default is None:
        return None
    if kind == "int":
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, not {value!r}")
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigError(f"{key}: expected true or false, not {value!r}")
    if kind in ("str", "secret"):
        if isinstance(value, str) and value:
            return value
        raise ConfigError(f"{key}: expected a non-empty string, not {value!r}")
    if kind == "choice":
        choices: Mapping[str, str] = f.metadata["choices"]
        spelled = str(value).lower() if isinstance(value, str | int) else ""
        if spelled in choices:
            return choices[spelled]
        accepted = ", ".join(sorted(set(choices)))
        raise ConfigError(f"{key}: expected one of {accepted}, not {value!r}")
    if kind == "callable":
        if callable(value):
            return value
        raise ConfigError(f"{key}: expected a callable, not {value!r}")
    if kind == "logger":
        if isinstance(value, logging.Logger | logging.LoggerAdapter):
            return value
        raise ConfigError(f"{key}: expected a logging.Logger, not {value!r}")
    if kind == "transport":
        if isinstance(value, httpx.BaseTransport):
            return value
        raise ConfigError(f"{key}: expected an httpx.BaseTransport, not {value!r}")
    raise AssertionError(f"unknown setting kind {kind}")


C = TypeVar("C", bound=ClientConfig)


def build_config(
    cls: type[C], config: Mapping[str, object] | C | None, options: Mapping[str, object]
) -> C:
    """A `cls` from a dict with Kafka keys (or a ready `cls`), overridden by keyword options."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    by_key = {_key_of(f): f for f in fields.values() if f.metadata.get("key", "") is not None}
    values: dict[str, object] = {}
    if isinstance(config, cls):
        values = {name: getattr(config, name) for name in fields}
    elif isinstance(config, Mapping):
        ignored = []
        for key, value in config.items():
            if key in _REDIRECTS:
                raise ConfigError(f"{key}: not used by this client; {_REDIRECTS[key]}")
            if key not in by_key and librdkafka.ALIASES.get(key) in by_key:
                key = librdkafka.ALIASES[key]
            if key not in by_key:
                if key not in librdkafka.KNOWN:
                    raise ConfigError(_unknown(key, list(by_key), cls))
                ignored.append(key)
                continue
            values[by_key[key].name] = _coerce(by_key[key], value)
        if ignored:
            logger = values.get("logger") or options.get("logger") or logging.getLogger("sdk")
            assert isinstance(logger, logging.Logger | logging.LoggerAdapter)
            logger.warning(
                "%s ignores librdkafka settings it has no use for: %s",
                cls.__name__,
                ", ".join(sorted(ignored)),
            )
    elif config is not None:
        raise ConfigError(f"expected a dict of settings or a {cls.__name__}, not {config!r}")
    for name, value in options.items():
        if name not in fields:
            raise ConfigError(_unknown(name, list(fields), cls))
        values[name] = _coerce(fields[name], value)
    if "coordinator_url" not in values:
        raise ConfigError(
            "coordinator.url: required (the service's URL, e.g. http://127.0.0.1:8080)"
        )
    return cls(**values)  # type: ignore[arg-type]


def _unknown(key: str, known: list[str], cls: type[ClientConfig]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{key}: not a setting of {cls.__name__}{hint}"
