"""Configuration from `COORDINATOR_*` environment variables (docs/pages/http-api.md, Configuration).

Read through the cached `get_settings()`; tests build `Settings(...)` directly and pass it to
`create_app`.
"""

from __future__ import annotations

import re
import ssl
from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

DEFAULT_SQLITE_FILE = "coordinator.db"


class ConfigurationError(ValueError):
    """A setting the service cannot start with; its text names the variable and what is wrong."""


def normalise_database_url(url: str) -> str:
    """Pick the async driver for a plain URL (postgresql:// -> asyncpg, sqlite:// -> aiosqlite)
    and check that the URL can be used. A Postgres URL may name several servers, in libpq's form
    (`postgresql://user@a:5432,b:5432/db?target_session_attrs=read-write`) or SQLAlchemy's
    (`postgresql://user@/db?host=a:5432&host=b:5432&...`); the first is rewritten to the second,
    which the driver tries in order (docs/pages/high-availability.md)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a database URL: {_redacted(url)!r}")
    base = scheme.split("+", 1)[0]
    if base == "sqlite":
        return f"sqlite+aiosqlite://{rest}"
    if base not in ("postgresql", "postgres"):
        raise ValueError(f"unsupported database {scheme!r}: use postgresql:// or sqlite://")
    parsed = _parse_postgres(f"postgresql+asyncpg://{_libpq_hosts_to_query(rest)}", url)
    return parsed.render_as_string(hide_password=False)


def _libpq_hosts_to_query(rest: str) -> str:
    """`user@a:1,b:2/db?x=y` -> `user@/db?host=a:1&host=b:2&x=y`; one host is left as it is."""
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    userinfo, at, hosts = authority.rpartition("@")
    if "," not in hosts:
        return rest
    path, _, query = tail.partition("?")
    listed = hosts.split(",")
    if not all(listed):
        raise ValueError("a host of the URL's list is empty")
    pairs = [f"host={host}" for host in listed]
    return f"{userinfo}{at}{path or '/'}?{'&'.join(pairs + ([query] if query else []))}"


def _parse_postgres(url: str, given: str) -> URL:
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise ValueError(f"not a usable Postgres URL ({_why(exc)}): {_redacted(given)!r}") from None
    hosts = parsed.query.get("host", ())
    for host in (hosts,) if isinstance(hosts, str) else hosts:
        name, colon, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
        if colon and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"host {host!r} of the URL: the port must be a number from 1 to 65535")
        if colon and not name:
            raise ValueError(f"host {host!r} of the URL has no name")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise ValueError(f"port {parsed.port} of the URL: a number from 1 to 65535")
    if parsed.host and hosts:
        raise ValueError("the URL names a host both before its path and as host=: give one")
    return parsed


def _why(exc: Exception) -> str:
    text = str(exc)
    if "invalid literal for int()" in text:
        return "its port is not a number"
    return text.splitlines()[0] if text else type(exc).__name__


def _redacted(url: str) -> str:
    """The URL with any password masked, for messages."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="COORDINATOR_", extra="ignore")

    database_url: str = Field(
        default_factory=lambda: f"sqlite:///{Path.cwd() / DEFAULT_SQLITE_FILE}",
        description="The store; a plain postgresql:// or sqlite:/// URL.",
    )
    transaction_max_timeout_ms: int = Field(default=900_000, ge=1)
    timeout_check_interval_ms: int = Field(default=10_000, ge=1)
    prepared_timeout_ms: int = Field(default=86_400_000, ge=1)
    transactional_id_expiration_ms: int = Field(default=604_800_000, ge=1)
    # `retention.ms` of topics that do not set it (-1 keeps forever).
    log_retention_ms: int = Field(default=604_800_000, ge=-1)
    # How often each process runs retention, compaction and producer-state expiry.
    log_retention_check_interval_ms: int = Field(default=300_000, ge=1)
    # After a round that removed batches, the cleaner vacuums the log tables itself (Postgres),
    # so their space is reused even where autovacuum is off or runs too seldom.
    log_cleaner_vacuum: bool = True
    # Idle producer state (no append on a partition, no open transaction there) is removed after
    # this, and idempotent producer ids with no state left with it.
    producer_id_expiration_ms: int = Field(default=86_400_000, ge=1)
    # Completed side-effect keys are kept this long; the sweep looks for older ones this often.
    effect_retention_ms: int = Field(default=604_800_000, ge=1)
    effect_retention_check_interval_ms: int = Field(default=300_000, ge=1)
    auth_tokens_file: Path | None = None
    # TLS for both doors (HTTPS, and Kafka's SSL / SASL_SSL): a PEM certificate chain and its
    # key; with a client CA, every client must present a certificate it signed (mTLS).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    # host:port of the Kafka protocol listener (docs/pages/http-api.md, "Kafka protocol"); None:
    # off.
    kafka_listener: str | None = None
    # Several processes as one Kafka cluster (docs/pages/cluster.md): the host:port clients are
    # told to reach this listener at (Kafka's advertised.listeners; None: the address each client
    # reached, and the listener's own to the other brokers), its broker id (Kafka's node.id;
    # None: the id this address had, else the lowest free one) and rack (broker.rack).
    kafka_advertised_listener: str | None = None
    kafka_node_id: int | None = Field(default=None, ge=0, le=2**31 - 1)
    kafka_broker_rack: str | None = Field(default=None, max_length=255)
    # A broker whose lease has not been renewed this long is dead, and its partitions and
    # coordinators move (Kafka's broker.session.timeout.ms); it renews every heartbeat
    # (broker.heartbeat.interval.ms), and places leadership and reads the cluster then.
    kafka_broker_session_timeout_ms: int = Field(default=9_000, ge=100)
    kafka_broker_heartbeat_interval_ms: int = Field(default=2_000, ge=10)
    # Kafka's auto.create.topics.enable: a Metadata request naming an unknown topic creates it
    # (with num.partitions partitions) when the request allows it and the principal may create
    # topics. The HTTP API never creates a topic by itself.
    auto_create_topics_enable: bool = True
    # Kafka's CreateTopics may ask any replication factor (tools ask 3); it is kept as the topic's
    # stated factor, the copies being the database's. True refuses any but 1, as one broker would.
    strict_replication_factor: bool = False
    num_partitions: int = Field(default=1, ge=1, le=10_000)
    # Largest Kafka request frame, in bytes (Kafka's socket.request.max.bytes); a larger one
    # closes the connection before a byte of it is read.
    kafka_socket_request_max_bytes: int = Field(default=100 * 1024 * 1024, ge=1024)
    # Largest Kafka request frame before SASL authentication completes (Kafka's
    # sasl.server.max.receive.size), so an unauthenticated peer cannot make the service hold
    # large frames.
    kafka_sasl_max_receive_size: int = Field(default=512 * 1024, ge=1024)
    # Connections one client address may hold open, per door and per process (Kafka's
    # max.connections.per.ip); a connection past it is closed at once (HTTP: answered 429 first).
    max_connections_per_ip: int = Field(default=1000, ge=1)
    # Produce requests of one Kafka connection under way at once, answered in order: the next is
    # read once the one before is queued for appending, in the order the client sent them
    # (Kafka's broker takes one request at a time; 1 does the same). Any other request waits for
    # those under way to be answered.
    kafka_produce_pipeline: int = Field(default=5, ge=1, le=100)
    # A connection with no traffic this long is closed, through both doors, mid-request too
    # (Kafka's connections.max.idle.ms): stalled connections do not pile up.
    connections_max_idle_ms: int = Field(default=600_000, ge=1)
    # A Kafka connection whose SASL authentication failed is closed this long after the answer
    # (Kafka's connection.failed.authentication.delay.ms), so guessing tokens is slow.
    connection_failed_authentication_delay_ms: int = Field(default=100, ge=0)
    # Partitions one principal may create or delete per second, per process (Kafka's
    # controller_mutation_rate quota, KIP-599); past it THROTTLING_QUOTA_EXCEEDED (HTTP 429).
    controller_mutation_rate: float = Field(default=1000.0, gt=0)
    # How soon a process applies ACLs that another process changed (kafka-acls.sh, CreateAcls):
    # each process reloads the store's ACLs this often; the process that changes them, at once.
    acl_refresh_ms: int = Field(default=1000, ge=10)
    # Delegation tokens (Kafka's delegation.token.* settings, KIP-48): off without a secret key;
    # every process of one store needs the same key.
    delegation_token_secret_key: SecretStr | None = None
    delegation_token_max_lifetime_ms: int = Field(default=7 * 24 * 3600 * 1000, ge=1)
    delegation_token_expiry_time_ms: int = Field(default=24 * 3600 * 1000, ge=1)
    # Largest compressed push of a client's own metrics (Kafka's telemetry.max.bytes, KIP-714);
    # past it the push is TELEMETRY_TOO_LARGE.
    telemetry_max_bytes: int = Field(default=1024 * 1024, ge=1)
    # Largest HTTP request line and header block, in bytes; over it the answer is 431.
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    # Largest request body accepted, in bytes; a produce over it is 413 RECORD_LIST_TOO_LARGE.
    max_request_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # One budget for what requests hold in a process (Kafka's queued.max.request.bytes): bodies
    # being buffered, Kafka frames until answered, batches inflated to be checked. Past it a
    # request waits its turn, and after the wait below is refused as retriable.
    queued_max_request_bytes: int = Field(default=256 * 1024 * 1024, ge=1024 * 1024)
    queued_max_request_wait_ms: int = Field(default=30_000, ge=1)
    # A compressed batch may inflate to at most this many bytes, and to at most
    # max_compression_ratio times its own size (1 MiB is always allowed); past either it is
    # refused as RECORD_LIST_TOO_LARGE with nothing written (a decompression bomb).
    max_uncompressed_batch_bytes: int = Field(default=32 * 1024 * 1024, ge=1024 * 1024)
    max_compression_ratio: int = Field(default=250, ge=1)
    # A fetch stops adding records once their payload passes this (it always returns at least one).
    fetch_max_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    # Connections per service process (Postgres).
    pool_size: int = Field(default=10, ge=1)
    # Hot standbys of the Postgres primary that may serve fetches (KIP-392's follower fetching),
    # as a JSON list of URLs; one is used only while it replays within the lag bound.
    read_replica_urls: list[str] = Field(default_factory=list)
    replica_max_lag_ms: int = Field(default=1_000, ge=0)
    replica_check_interval_ms: int = Field(default=200, ge=10)
    # Append groups one process writes at once (Postgres; SQLite writes one at a time): appends
    # arriving while this many units of work are writing wait and go together in the next.
    append_groups_in_flight: int = Field(default=2, ge=1)
    # Consumer groups: a member without a heartbeat this long is removed (unless its heartbeats
    # ask for another session timeout within the bounds below, as Kafka's group.min/max do).
    group_session_timeout_ms: int = Field(default=45_000, ge=1)
    group_min_session_timeout_ms: int = Field(default=6_000, ge=1)
    group_max_session_timeout_ms: int = Field(default=1_800_000, ge=1)
    # The heartbeat interval answered to members (at most a third of their session timeout).
    group_heartbeat_interval_ms: int = Field(default=5_000, ge=1)
    # Members one group may have (Kafka's group.consumer.max.size); one more is refused with
    # GROUP_MAX_SIZE_REACHED.
    group_consumer_max_size: int = Field(default=1000, ge=1)
    # A classic group's first rebalance waits this long for more members to join, once more for
    # each one that does, up to the rebalance timeout (Kafka's group.initial.rebalance.delay.ms).
    group_initial_rebalance_delay_ms: int = Field(default=3_000, ge=0)
    # How often each process looks for members whose session or rebalance timeout passed.
    group_check_interval_ms: int = Field(default=1_000, ge=1)
    # Share groups (KIP-932), with Kafka's broker settings' defaults and bounds (group.share.*):
    # each is a group config's default (share.record.lock.duration.ms, ...), and a group config
    # outside the bounds is INVALID_CONFIG.
    share_record_lock_duration_ms: int = Field(default=30_000, ge=1)
    share_min_record_lock_duration_ms: int = Field(default=15_000, ge=1)
    share_max_record_lock_duration_ms: int = Field(default=60_000, ge=1)
    share_delivery_count_limit: int = Field(default=5, ge=1)
    share_min_delivery_count_limit: int = Field(default=2, ge=1)
    share_max_delivery_count_limit: int = Field(default=10, ge=1)
    share_session_timeout_ms: int = Field(default=45_000, ge=1)
    share_min_session_timeout_ms: int = Field(default=45_000, ge=1)
    share_max_session_timeout_ms: int = Field(default=60_000, ge=1)
    share_heartbeat_interval_ms: int = Field(default=5_000, ge=1)
    share_min_heartbeat_interval_ms: int = Field(default=5_000, ge=1)
    share_max_heartbeat_interval_ms: int = Field(default=15_000, ge=1)
    share_partition_max_record_locks: int = Field(default=2_000, ge=1)
    share_max_partition_max_record_locks: int = Field(default=10_000, ge=1)
    # Members one share group may have (group.share.max.size), and the share sessions (Kafka's
    # ShareFetch sessions) one process keeps (group.share.max.share.sessions).
    share_max_size: int = Field(default=200, ge=1)
    share_max_sessions: int = Field(default=2_000, ge=1)

    @field_validator("database_url")
    @classmethod
    def _async_driver(cls, value: str) -> str:
        return normalise_database_url(value)

    @field_validator("read_replica_urls")
    @classmethod
    def _replica_drivers(cls, value: list[str]) -> list[str]:
        urls = [normalise_database_url(url) for url in value]
        if any(not url.startswith("postgresql") for url in urls):
            raise ValueError("read replicas are Postgres hot standbys: postgresql:// URLs")
        return urls

    @model_validator(mode="after")
    def _heartbeat_within_lease(self) -> Settings:
        if self.kafka_broker_heartbeat_interval_ms >= self.kafka_broker_session_timeout_ms:
            raise ValueError(
                "kafka_broker_heartbeat_interval_ms must be below "
                "kafka_broker_session_timeout_ms, or a live broker's lease lapses between beats"
            )
        return self

    @field_validator("kafka_listener", "kafka_advertised_listener")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"a Kafka listener is host:port, not {value!r}")
        return value

    def server_tls(self) -> ssl.SSLContext | None:
        """The TLS context the doors serve with, or None without a certificate."""
        if self.tls_cert_file is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        if self.tls_client_ca_file is not None:
            context.load_verify_locations(self.tls_client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def load_settings(**values: object) -> Settings:
    """`Settings(**values)` over the environment, a bad value raised as `ConfigurationError`
    naming its variable (the commands print it, with no traceback)."""
    try:
        return Settings(**values)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise ConfigurationError(
            "; ".join(
                f"COORDINATOR_{'_'.join(str(part) for part in error['loc']).upper()}: "
                f"{error['msg'].removeprefix('Value error, ')}"
                for error in exc.errors()
            )
        ) from None


@lru_cache
def get_settings() -> Settings:
    return load_settings()
