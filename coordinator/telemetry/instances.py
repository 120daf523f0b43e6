"""Client instances as Kafka's ClientMetricsManager keeps them, per process: each one's
subscription and the times of its last GetTelemetrySubscriptions and PushTelemetry, by which a
client asking or pushing early is throttled. Pure rules over an in-memory cache, no I/O: the
subscriptions come in as `Requested`, the time as milliseconds.

Another process (or this one after a restart) meets the client as a new instance, as another
broker of a Kafka cluster does: its first push after that is accepted. A subscription id is
derived from what it asks and the instance id alone, so every process gives one client the
same id, and a push with an id its subscriptions no longer give is UNKNOWN_SUBSCRIPTION_ID,
which sends the client back to GetTelemetrySubscriptions.
"""

from __future__ import annotations

import base64
import collections
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import crc32c

from coordinator.core.errors import CoordinatorError, InvalidRequest
from coordinator.core.quotas import ThrottlingQuotaExceeded
from coordinator.telemetry.subscriptions import Requested

# Kafka's compression type ids a push may use (CompressionType.forId): none, gzip, snappy,
# lz4, zstd. Offered to clients in Kafka's order of preference (no compression implied).
COMPRESSION_TYPES = (0, 1, 2, 3, 4)
ACCEPTED_COMPRESSION = (4, 3, 1, 2)
# Kafka's cache: 16k client instances per broker, each kept a minute past its last request
# (or three push intervals, if longer).
CACHE_SIZE = 16384
EXPIRY_MS = 60_000
# Uuid.RESERVED: the zero id and the metadata topic's.
RESERVED = (uuid.UUID(int=0), uuid.UUID(int=1))


class UnknownSubscriptionId(CoordinatorError):
    code: ClassVar[str] = "UNKNOWN_SUBSCRIPTION_ID"
    status: ClassVar[int] = 409
    title: ClassVar[str] = "Unknown subscription id"


class UnsupportedCompressionType(CoordinatorError):
    code: ClassVar[str] = "UNSUPPORTED_COMPRESSION_TYPE"
    status: ClassVar[int] = 422
    title: ClassVar[str] = "Unsupported compression type"


class TelemetryTooLarge(CoordinatorError):
    code: ClassVar[str] = "TELEMETRY_TOO_LARGE"
    status: ClassVar[int] = 413
    title: ClassVar[str] = "Telemetry too large"


def kafka_uuid(value: uuid.UUID) -> str:
    """A Uuid as Kafka writes it (Uuid.toString: URL-safe base64, unpadded), as clients log
    their instance id and as a subscription's `match` sees it."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode()


def subscription_id(requested: Requested, instance_id: uuid.UUID) -> int:
    """A signed 32-bit id of what the client is asked, unique to the instance (Kafka's: a
    CRC32C of the metrics and the interval, XORed with the instance id's hash)."""
    text = f"{','.join(requested.metrics)}|{requested.interval_ms}".encode()
    bits = instance_id.int
    mixed = crc32c.crc32c(text) ^ ((bits >> 96) ^ (bits >> 64) ^ (bits >> 32) ^ bits) & 0xFFFFFFFF
    return mixed - (1 << 32) if mixed >= 1 << 31 else mixed


@dataclass(slots=True)
class Instance:
    instance_id: uuid.UUID
    requested: Requested
    subscription_id: int
    metadata: Mapping[str, str]
    last_get_ms: int = 0
    last_push_ms: int = 0
    terminating: bool = False

    def may_get(self, now_ms: int) -> bool:
        """Kafka's maybeUpdateGetRequestTimestamp: a push interval since the last request."""
        if now_ms - max(self.last_get_ms, self.last_push_ms) >= self.requested.interval_ms:
            self.last_get_ms = now_ms
            return True
        return False

    def may_push(self, now_ms: int) -> bool:
        """Kafka's maybeUpdatePushRequestTimestamp: the first push after a get at once (the
        client's jitter spreads pushes over half to one and a half intervals), later ones a
        push interval apart."""
        accept = self.last_get_ms > self.last_push_ms
        if not accept:
            accept = now_ms - self.last_push_ms >= self.requested.interval_ms
        if accept:
            self.last_push_ms = now_ms
        return accept


@dataclass
class Instances:
    """The process's client instances, least recently used first out past `size`."""

    size: int = CACHE_SIZE
    _cache: collections.OrderedDict[uuid.UUID, Instance] = field(
        default_factory=collections.OrderedDict
    )
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def instance(
        self, instance_id: uuid.UUID, requested: Requested, metadata: Mapping[str, str]
    ) -> Instance:
        """The client's instance, anew when unknown or when its subscriptions changed (as
        Kafka re-evaluates an instance after a subscription update)."""
        with self._lock:
            found = self._cache.get(instance_id)
            if found is None or found.requested != requested:
                found = Instance(
                    instance_id, requested, subscription_id(requested, instance_id), metadata
                )
                self._cache[instance_id] = found
            self._cache.move_to_end(instance_id)
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
            return found

    def forget(self, instance_id: uuid.UUID) -> None:
        with self._lock:
            self._cache.pop(instance_id, None)


def check_get(instance: Instance, now_ms: int) -> None:
    if not instance.may_get(now_ms):
        raise ThrottlingQuotaExceeded(
            f"Request from the client [{instance.instance_id}] arrived before the next push "
            "interval time"
        )


def check_push(
    instance: Instance,
    now_ms: int,
    *,
    subscription: int,
    compression_type: int,
    size: int,
    terminating: bool,
    max_bytes: int,
) -> None:
    """Kafka's validatePushRequest, in its order; the instance is terminating after a push
    that says so, accepted or not."""
    try:
        if instance.terminating:
            raise InvalidRequest(
                f"Client [{instance.instance_id}] sent the previous request with state "
                "terminating to TRUE, can not accept any requests after that"
            )
        if not instance.may_push(now_ms) and not terminating:
            raise ThrottlingQuotaExceeded(
                f"Request from the client [{instance.instance_id}] arrived before the next "
                "push interval time"
            )
        if subscription != instance.subscription_id:
            raise UnknownSubscriptionId(
                f"Unknown client subscription id for the client [{instance.instance_id}]"
            )
        if compression_type not in COMPRESSION_TYPES:
            raise UnsupportedCompressionType(
                f"Unknown compression type [{compression_type}] is received in telemetry "
                f"request from [{instance.instance_id}]"
            )
        if size > max_bytes:
            raise TelemetryTooLarge(
                f"Telemetry request from [{instance.instance_id}] is larger than the maximum "
                f"allowed size [{max_bytes}]"
            )
    finally:
        instance.terminating = terminating


def expiry_ms(instance: Instance) -> int:
    """How long an instance's pushed metrics are shown after its last push."""
    return max(EXPIRY_MS, 3 * instance.requested.interval_ms)
