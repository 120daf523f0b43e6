"""The AdminClient: topics (confluent-kafka's shapes: futures from `create_topics` and
`describe_topics`, `ClusterMetadata` from `list_topics`) and, like `kafka-transactions.sh`,
transactions: list, describe, abort, describe producers, find hanging ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar, Unpack
from urllib.parse import quote

from sdk._config import AdminConfig, AdminOptions, build_config
from sdk._errors import IllegalStateError, KafkaError, KafkaException
from sdk._http import HttpClient
from sdk._types import TopicPartition

__all__ = [
    "AdminClient",
    "ClusterMetadata",
    "HangingPartition",
    "HangingTransactions",
    "NewTopic",
    "PartitionDescription",
    "PartitionMetadata",
    "ProducerState",
    "TopicDescription",
    "TopicMetadata",
    "TransactionDescription",
]

T = TypeVar("T")


@dataclass(frozen=True)
class NewTopic:
    """A topic for `create_topics`. `num_partitions` -1 takes the service's default (1);
    `replication_factor` is accepted for compatibility and ignored (the store is the replica)."""

    topic: str
    num_partitions: int = -1
    replication_factor: int = -1
    config: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.config:
            raise ValueError("NewTopic.config: topics take no configuration here")


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


def _settled(value: T) -> Future[T]:
    future: Future[T] = Future()
    future.set_result(value)
    return future


def _failed(error: BaseException) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_exception(error)
    return future


class AdminClient:
    """Administers topics and transactions. `AdminClient({"coordinator.url": ...})`.

    Calls made without a timeout are bounded by `default.api.timeout.ms`; transport failures and
    retriable answers are retried within it, then `KafkaTimeoutError` (retriable) is raised.
    Where auth is on, the token needs the `admin` role. Raises `IllegalStateError` once closed.
    """

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
            try:
                self._http.call(
                    "POST", "/v1/topics", body=body, deadline=self._deadline(request_timeout)
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
        answer = self._http.call("GET", "/v1/topics", deadline=self._deadline(timeout))
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
                    "GET", f"/v1/topics/{name}", deadline=self._deadline(request_timeout)
                )
                futures[name] = _settled(
                    TopicDescription(
                        doc["name"], [PartitionDescription(**p) for p in doc["partitions"]]
                    )
                )
            except KafkaException as exc:
                futures[name] = _failed(exc)
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
        answer = self._get("/v1/admin/transactions", params, timeout)
        return [_transaction(t) for t in answer["transactions"]]

    def describe_transactions(
        self, transactional_ids: Iterable[str], timeout: float | None = None
    ) -> dict[str, TransactionDescription]:
        """The state of each transactional id. Raises `TransactionalIdNotFound` for an unknown
        one."""
        return {
            tid: _transaction(self._get(f"/v1/transactions/{quote(tid, safe='')}", None, timeout))
            for tid in transactional_ids
        }

    def abort_transaction(self, transactional_id: str, timeout: float | None = None) -> None:
        """Abort the open transaction of `transactional_id` and fence its producer (its epoch is
        raised; it gets `ProducerFenced` on its next call)."""
        self._check_open()
        self._http.call(
            "POST",
            f"/v1/admin/transactions/{quote(transactional_id, safe='')}/abort",
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
                "/v1/admin/producers", {"topic": tp.topic, "partition": tp.partition}, timeout
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
            "/v1/admin/hanging", {"max_transaction_timeout_ms": max_transaction_timeout_ms}, timeout
        )
        return HangingTransactions(
            [_transaction(t) for t in answer["transactions"]],
            [HangingPartition(**p) for p in answer["partitions"]],
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._http.closed:
            raise IllegalStateError("the admin client is closed")

    def _deadline(self, timeout: float | None) -> float:
        return self._http.deadline(timeout)

    def _get(self, path: str, params: Mapping[str, str | int] | None, timeout: float | None) -> Any:
        self._check_open()
        return self._http.call("GET", path, params=params, deadline=self._deadline(timeout))
