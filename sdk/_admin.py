"""The AdminClient: topics (confluent-kafka's shapes: futures from `create_topics`,
`delete_topics`, `describe_topics`, `describe_configs`, `incremental_alter_configs` and
`delete_records`, `ClusterMetadata` from `list_topics`) and, like `kafka-transactions.sh`,
transactions: list, describe, abort, describe producers, find hanging ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, TypeVar, Unpack

from sdk._config import AdminConfig, AdminOptions, build_config
from sdk._errors import KafkaError, KafkaException
from sdk._http import HttpClient, api_path
from sdk._lifecycle import Closeable
from sdk._types import TopicPartition

__all__ = [
    "AdminClient",
    "AlterConfigOpType",
    "ClusterMetadata",
    "ConfigEntry",
    "ConfigResource",
    "ConfigSource",
    "DeletedRecords",
    "HangingPartition",
    "HangingTransactions",
    "NewTopic",
    "PartitionDescription",
    "PartitionMetadata",
    "ProducerState",
    "ResourceType",
    "TopicDescription",
    "TopicMetadata",
    "TransactionDescription",
]

T = TypeVar("T")


@dataclass(frozen=True)
class NewTopic:
    """A topic for `create_topics`. `num_partitions` -1 takes the service's default (1);
    `replication_factor` is accepted for compatibility and ignored (the store is the replica);
    `config`: topic configs by Kafka's names (`retention.ms`, `cleanup.policy`, ...)."""

    topic: str
    num_partitions: int = -1
    replication_factor: int = -1
    config: Mapping[str, str] = field(default_factory=dict)


class ResourceType(Enum):
    """What a `ConfigResource` names; the coordinator has topic configs only."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    BROKER = 4


class ConfigSource(Enum):
    """Where a config's value comes from: set on the topic, or the default."""

    UNKNOWN_CONFIG = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class AlterConfigOpType(Enum):
    """How `incremental_alter_configs` changes a config: SET a value, or DELETE it (back to its
    default). APPEND and SUBTRACT (list configs) are refused: no topic config here is a list."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


@dataclass
class ConfigEntry:
    """A config: what `describe_configs` returns (by name), and what
    `ConfigResource.add_incremental_config` takes with an `incremental_operation`."""

    name: str
    value: str | None
    source: ConfigSource = ConfigSource.UNKNOWN_CONFIG
    is_read_only: bool = False
    is_default: bool = False
    is_sensitive: bool = False
    is_synonym: bool = False
    synonyms: list[ConfigEntry] = field(default_factory=list)
    incremental_operation: AlterConfigOpType | None = None


class ConfigResource:
    """A resource whose configs are described or altered: `ConfigResource(ResourceType.TOPIC,
    "payments")` (or the type's name, "topic"). Equal and hashed by type and name, as the keys
    of the futures the calls return."""

    Type = ResourceType

    def __init__(
        self,
        restype: ResourceType | str | int,
        name: str,
        set_config: Mapping[str, str] | None = None,
        described_configs: Mapping[str, ConfigEntry] | None = None,
        error: KafkaError | None = None,
        incremental_configs: list[ConfigEntry] | None = None,
    ) -> None:
        if isinstance(restype, str):
            restype = ResourceType[restype.upper()]
        elif isinstance(restype, int):
            restype = ResourceType(restype)
        self.restype = restype
        self.name = name
        self.set_config_dict: dict[str, str] = dict(set_config or {})
        self.configs = dict(described_configs or {})
        self.error = error
        self.incremental_configs: list[ConfigEntry] = list(incremental_configs or [])

    def set_config(self, name: str, value: str, overwrite: bool = True) -> None:
        if overwrite or name not in self.set_config_dict:
            self.set_config_dict[name] = value

    def add_incremental_config(self, config: ConfigEntry) -> None:
        self.incremental_configs.append(config)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConfigResource) and (self.restype, self.name) == (
            other.restype,
            other.name,
        )

    def __hash__(self) -> int:
        return hash((self.restype, self.name))

    def __repr__(self) -> str:
        return f"ConfigResource({self.restype.name}, {self.name!r})"


@dataclass(frozen=True)
class DeletedRecords:
    """`delete_records`'s result per partition: its new log start offset."""

    low_watermark: int


@dataclass(frozen=True)
class PartitionMetadata:
    id: int
    error: KafkaError | None = None


@dataclass(frozen=True)
class TopicMetadata:
    topic: str
    partitions: dict[int, PartitionMetadata]
    error: KafkaError | None = None


@dataclass(frozen=True)
class ClusterMetadata:
    """What `list_topics()` returns: `.topics` maps each topic's name to its metadata."""

    topics: dict[str, TopicMetadata]
    cluster_id: str | None = None
    orig_broker_name: str | None = None


@dataclass(frozen=True)
class PartitionDescription:
    partition: int
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int


@dataclass(frozen=True)
class TopicDescription:
    name: str
    partitions: list[PartitionDescription]


@dataclass(frozen=True)
class TransactionDescription:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    started_at: datetime | None
    partitions: list[TopicPartition]
    groups: list[str]


@dataclass(frozen=True)
class ProducerState:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    current_txn_start_offset: int | None


@dataclass(frozen=True)
class HangingPartition:
    """A partition whose last stable offset is pinned by a producer with no open transaction."""

    topic: str
    partition: int
    producer_id: int
    current_txn_start_offset: int


@dataclass(frozen=True)
class HangingTransactions:
    transactions: list[TransactionDescription]
    partitions: list[HangingPartition]


def _transaction(doc: dict[str, Any]) -> TransactionDescription:
    started = doc.get("started_at")
    return TransactionDescription(
        transactional_id=doc["transactional_id"],
        producer_id=doc["producer_id"],
        producer_epoch=doc["producer_epoch"],
        state=doc["state"],
        timeout_ms=doc["timeout_ms"],
        started_at=datetime.fromisoformat(started) if started else None,
        partitions=[TopicPartition(p["topic"], p["partition"]) for p in doc.get("partitions", [])],
        groups=[g if isinstance(g, str) else g["group_id"] for g in doc.get("groups", [])],
    )


def _topic_of(resource: ConfigResource) -> str:
    if resource.restype is not ResourceType.TOPIC:
        raise ValueError(f"{resource!r}: only topic configs exist here")
    return api_path("topics", resource.name)


_SOURCES = {"TOPIC": ConfigSource.DYNAMIC_TOPIC_CONFIG, "DEFAULT": ConfigSource.DEFAULT_CONFIG}


def _entries(answer: dict[str, Any]) -> dict[str, ConfigEntry]:
    return {
        c["name"]: ConfigEntry(
            c["name"],
            c["value"],
            source=_SOURCES.get(c["source"], ConfigSource.UNKNOWN_CONFIG),
            is_default=c["source"] == "DEFAULT",
        )
        for c in answer["configs"]
    }


def _settled(value: T) -> Future[T]:
    future: Future[T] = Future()
    future.set_result(value)
    return future


def _failed(error: BaseException) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_exception(error)
    return future


class AdminClient(Closeable):
    """Administers topics and transactions. `AdminClient({"coordinator.url": ...})`.

    Calls made without a timeout are bounded by `default.api.timeout.ms`; transport failures and
    retriable answers are retried within it, then `KafkaTimeoutError` (retriable) is raised.
    Where auth is on, the token needs the `admin` role. Raises `IllegalStateError` once closed.
    """

    _what = "the admin client"

    def __init__(
        self,
        config: Mapping[str, object] | AdminConfig | None = None,
        /,
        **options: Unpack[AdminOptions],
    ) -> None:
        self.config: AdminConfig = build_config(AdminConfig, config, options)
        self._http = HttpClient(self.config)

    # -- topics ---------------------------------------------------------------------------------

    def create_topics(
        self,
        new_topics: Iterable[NewTopic],
        operation_timeout: float = 0,
        request_timeout: float | None = None,
        validate_only: bool = False,
    ) -> dict[str, Future[None]]:
        """Create topics. Returns a future per topic name: `.result()` is None, or raises
        (`TopicAlreadyExists`, `InvalidRequest`...). A retry after a lost answer may report
        `TopicAlreadyExists` for a topic this call created."""
        self._check_open()
        if validate_only:
            raise ValueError("validate_only: not supported")
        futures: dict[str, Future[None]] = {}
        for new in new_topics:
            body: dict[str, Any] = {"name": new.topic}
            if new.num_partitions != -1:
                body["partitions"] = new.num_partitions
            if new.config:
                body["configs"] = dict(new.config)
            try:
                self._http.call(
                    "POST", api_path("topics"), body=body, deadline=self._deadline(request_timeout)
                )
                futures[new.topic] = _settled(None)
            except KafkaException as exc:
                futures[new.topic] = _failed(exc)
        return futures

    def list_topics(
        self, topic: str | None = None, timeout: float | None = None
    ) -> ClusterMetadata:
        """Every topic (or only `topic`: unknown, it carries an `UNKNOWN_TOPIC_OR_PARTITION`
        error) with its partitions."""
        self._check_open()
        answer = self._http.call("GET", api_path("topics"), deadline=self._deadline(timeout))
        topics = {
            t["name"]: TopicMetadata(
                t["name"], {p: PartitionMetadata(p) for p in range(t["partitions"])}
            )
            for t in answer["topics"]
            if topic is None or t["name"] == topic
        }
        if topic is not None and topic not in topics:
            missing = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {topic!r}")
            topics[topic] = TopicMetadata(topic, {}, missing)
        return ClusterMetadata(topics)

    def describe_topics(
        self, topics: Iterable[str], request_timeout: float | None = None
    ) -> dict[str, Future[TopicDescription]]:
        """Partitions of each topic with their log start offset, high watermark and last stable
        offset. A future per topic name; `.result()` raises `UnknownTopicOrPartition`."""
        self._check_open()
        names = list(getattr(topics, "topic_names", topics))
        futures: dict[str, Future[TopicDescription]] = {}
        for name in names:
            try:
                doc = self._http.call(
                    "GET", api_path("topics", name), deadline=self._deadline(request_timeout)
                )
                futures[name] = _settled(
                    TopicDescription(
                        doc["name"], [PartitionDescription(**p) for p in doc["partitions"]]
                    )
                )
            except KafkaException as exc:
                futures[name] = _failed(exc)
        return futures

    def delete_topics(
        self,
        topics: Iterable[str],
        operation_timeout: float = 0,
        request_timeout: float | None = None,
    ) -> dict[str, Future[None]]:
        """Delete topics with their records, producer state and group offsets; open
        transactions that include one are aborted and their producers fenced. A future per
        topic name: `.result()` is None, or raises (`UnknownTopicOrPartition`...)."""
        self._check_open()
        futures: dict[str, Future[None]] = {}
        for name in topics:
            try:
                self._http.call(
                    "DELETE", api_path("topics", name), deadline=self._deadline(request_timeout)
                )
                futures[name] = _settled(None)
            except KafkaException as exc:
                futures[name] = _failed(exc)
        return futures

    def describe_configs(
        self, resources: Iterable[ConfigResource], request_timeout: float | None = None
    ) -> dict[ConfigResource, Future[dict[str, ConfigEntry]]]:
        """Every config of each topic, by name, with its value and source
        (`DYNAMIC_TOPIC_CONFIG`: set on the topic; `DEFAULT_CONFIG`)."""
        self._check_open()
        futures: dict[ConfigResource, Future[dict[str, ConfigEntry]]] = {}
        for resource in resources:
            try:
                answer = self._http.call(
                    "GET",
                    f"{_topic_of(resource)}/configs",
                    deadline=self._deadline(request_timeout),
                )
                futures[resource] = _settled(_entries(answer))
            except (KafkaException, ValueError) as exc:
                futures[resource] = _failed(exc)
        return futures

    def incremental_alter_configs(
        self, resources: Iterable[ConfigResource], request_timeout: float | None = None
    ) -> dict[ConfigResource, Future[None]]:
        """Apply each resource's incremental configs (`ConfigEntry` with
        `incremental_operation` SET or DELETE), all or nothing per resource: a bad name or value
        fails its future with `INVALID_CONFIG` and changes nothing."""
        self._check_open()
        futures: dict[ConfigResource, Future[None]] = {}
        for resource in resources:
            try:
                body: dict[str, Any] = {"set": {}, "delete": []}
                for entry in resource.incremental_configs:
                    operation = entry.incremental_operation or AlterConfigOpType.SET
                    if operation is AlterConfigOpType.SET:
                        body["set"][entry.name] = entry.value
                    elif operation is AlterConfigOpType.DELETE:
                        body["delete"].append(entry.name)
                    else:
                        raise KafkaException(
                            KafkaError(
                                KafkaError.INVALID_CONFIG,
                                f"{entry.name}: {operation.name} applies to list configs; "
                                "no topic config here is one",
                            )
                        )
                self._http.call(
                    "PATCH",
                    f"{_topic_of(resource)}/configs",
                    body=body,
                    deadline=self._deadline(request_timeout),
                )
                futures[resource] = _settled(None)
            except (KafkaException, ValueError) as exc:
                futures[resource] = _failed(exc)
        return futures

    def delete_records(
        self,
        topic_partition_offsets: Iterable[TopicPartition],
        request_timeout: float | None = None,
        operation_timeout: float = 0,
    ) -> dict[TopicPartition, Future[DeletedRecords]]:
        """Delete the records below each partition's offset (`OFFSET_END`, -1: all of them, up
        to the high watermark), moving its log start offset up, never down. One request per
        topic, all or nothing: an offset above a high watermark fails the topic's futures with
        `OFFSET_OUT_OF_RANGE`."""
        self._check_open()
        by_topic: dict[str, list[TopicPartition]] = {}
        for tp in topic_partition_offsets:
            by_topic.setdefault(tp.topic, []).append(tp)
        futures: dict[TopicPartition, Future[DeletedRecords]] = {}
        for topic, partitions in by_topic.items():
            body = {
                "partitions": [
                    {"partition": tp.partition, "offset": tp.offset} for tp in partitions
                ]
            }
            try:
                answer = self._http.call(
                    "POST",
                    api_path("topics", topic, "delete-records"),
                    body=body,
                    deadline=self._deadline(request_timeout),
                )
                starts = {p["partition"]: p["log_start_offset"] for p in answer["partitions"]}
                for tp in partitions:
                    futures[tp] = _settled(DeletedRecords(starts[tp.partition]))
            except KafkaException as exc:
                for tp in partitions:
                    futures[tp] = _failed(exc)
        return futures

    # -- transactions -----------------------------------------------------------------------------

    def list_transactions(
        self,
        *,
        state: str | None = None,
        older_than_ms: int | None = None,
        prefix: str | None = None,
        timeout: float | None = None,
    ) -> list[TransactionDescription]:
        """Transactions, optionally only those in `state`, open longer than `older_than_ms`, or
        whose transactional id starts with `prefix`."""
        params: dict[str, str | int] = {}
        if state is not None:
            params["state"] = state
        if older_than_ms is not None:
            params["older_than_ms"] = older_than_ms
        if prefix is not None:
            params["prefix"] = prefix
        answer = self._get(api_path("admin", "transactions"), params, timeout)
        return [_transaction(t) for t in answer["transactions"]]

    def describe_transactions(
        self, transactional_ids: Iterable[str], timeout: float | None = None
    ) -> dict[str, TransactionDescription]:
        """The state of each transactional id. Raises `TransactionalIdNotFound` for an unknown
        one."""
        return {
            tid: _transaction(self._get(api_path("transactions", tid), None, timeout))
            for tid in transactional_ids
        }

    def abort_transaction(self, transactional_id: str, timeout: float | None = None) -> None:
        """Abort the open transaction of `transactional_id` and fence its producer (its epoch is
        raised; it gets `ProducerFenced` on its next call)."""
        self._check_open()
        self._http.call(
            "POST",
            api_path("admin", "transactions", transactional_id, "abort"),
            body={},
            deadline=self._deadline(timeout),
        )

    def describe_producers(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, list[ProducerState]]:
        """The producers with state on each partition: epoch, last sequence and timestamp, and
        the first offset of their open transaction (None without one)."""
        result: dict[TopicPartition, list[ProducerState]] = {}
        for tp in partitions:
            answer = self._get(
                api_path("admin", "producers"),
                {"topic": tp.topic, "partition": tp.partition},
                timeout,
            )
            result[TopicPartition(tp.topic, tp.partition)] = [
                ProducerState(**p) for p in answer["producers"]
            ]
        return result

    def find_hanging_transactions(
        self, max_transaction_timeout_ms: int = 900_000, timeout: float | None = None
    ) -> HangingTransactions:
        """Open transactions older than `max_transaction_timeout_ms`, and partitions whose last
        stable offset is pinned by a producer with no open transaction."""
        answer = self._get(
            api_path("admin", "hanging"),
            {"max_transaction_timeout_ms": max_transaction_timeout_ms},
            timeout,
        )
        return HangingTransactions(
            [_transaction(t) for t in answer["transactions"]],
            [HangingPartition(**p) for p in answer["partitions"]],
        )

    # -- the API itself ---------------------------------------------------------------------------

    def call_api(
        self,
        method: str,
        *path: str | int,
        params: Mapping[str, str | int] | None = None,
        body: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        retry: bool = True,
    ) -> Any:
        """Any call of the service's HTTP API (`docs/pages/http-api.md`), named by its path's
        segments after `/v1/`, each quoted whole (ids may hold any character):
        `call_api("GET", "groups", group_id)`. Returns the JSON answer as the API gives it;
        for tools that print it (`coordinator transactions|topics|groups` sit on this) and
        calls with no method here. Retried as the other calls are, within `timeout`; with
        `retry=False`, one attempt of at most `timeout` seconds. Raises their typed errors."""
        self._check_open()
        if retry:
            return self._http.call(
                method, api_path(*path), body=body, params=params, deadline=self._deadline(timeout)
            )
        return self._http.send(method, api_path(*path), body=body, params=params, timeout=timeout)

    def close(self) -> None:
        self._close_once(self._http.close)

    def _deadline(self, timeout: float | None) -> float:
        return self._http.deadline(timeout)

    def _get(self, path: str, params: Mapping[str, str | int] | None, timeout: float | None) -> Any:
        self._check_open()
        return self._http.call("GET", path, params=params, deadline=self._deadline(timeout))
