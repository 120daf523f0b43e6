"""Kafka's default partitioner: murmur2 of the key (the Java client's `Utils.murmur2`, so keyed
records land where a Java producer puts them), and sticky partitioning for null keys (KIP-480).
"""

from __future__ import annotations

import random
import threading

from sdk._http import HttpClient, api_path

__all__ = ["PartitionCounts", "StickyPartitioner", "murmur2", "partition_for_key"]

_MASK = 0xFFFFFFFF
_M = 0x5BD1E995
_SEED = 0x9747B28C


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 as a signed 32-bit int, equal to `Utils.murmur2(data)` in Java."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partitions: int) -> int:
    """`Utils.toPositive(Utils.murmur2(key)) % partitions`, as the Java client's partitioner."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class StickyPartitioner:
    """For records without a key: keep one partition per topic until its batch is closed, then
    move to another at random, so null-key records fill batches rather than scatter (KIP-480)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._current: dict[str, int] = {}

    def partition(self, topic: str, partitions: int) -> int:
        current = self._current.get(topic)
        if current is None or current >= partitions:
            current = self._rng.randrange(partitions)
            self._current[topic] = current
        return current

    def on_new_batch(self, topic: str, partitions: int, previous: int) -> int:
        """The sticky partition's batch was closed: pick a different partition, if there is one."""
        if partitions <= 1:
            chosen = 0
        else:
            chosen = self._rng.randrange(partitions - 1)
            if chosen >= previous:
                chosen += 1
        self._current[topic] = chosen
        return chosen


class PartitionCounts:
    """Each topic's partition count, asked of the coordinator once and kept (a producer picks
    partitions by it)."""

    def __init__(self, http: HttpClient) -> None:
        self._http = http
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def known(self, topic: object) -> int | None:
        """The count, if the topic was asked already (no call, no lock)."""
        return self._counts.get(topic) if isinstance(topic, str) else None

    def of(self, topic: str) -> int:
        with self._lock:
            count = self._counts.get(topic)
        if count is None:
            if not isinstance(topic, str):
                raise TypeError(f"topic must be str, not {type(topic).__name__}")
            described = self._http.call("GET", api_path("topics", topic))
            count = len(described["partitions"])
            with self._lock:
                self._counts[topic] = count
        return count
