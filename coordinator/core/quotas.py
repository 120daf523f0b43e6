"""Kafka's controller mutation quota (KIP-599): how many partitions a principal may create per
second, per service process.

A token bucket that may go into debt, as Kafka's quota does: a request is admitted while the
principal's bucket is positive, whatever its size (one large topic is never refused outright),
and its partitions are then taken, possibly below zero; the next request waits until the bucket
has refilled. Per process by design, like Kafka's per-broker quotas: it bounds load, it does not
decide correctness.
"""

from __future__ import annotations

import threading
import time
from typing import ClassVar

from coordinator.core.errors import CoordinatorError

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

    def admit(self, principal: str, partitions: int) -> None:
        """Take `partitions` from the principal's bucket, or raise `ThrottlingQuotaExceeded`
        (with `throttle_time_ms`) while it is empty."""
        from coordinator.core.metrics import record_limit_refusal

        capacity = self.rate * _BURST_S
        with self._lock:
            now: float = self._clock()  # type: ignore[operator]
            tokens, at = self._buckets.get(principal, (capacity, now))
            tokens = min(capacity, tokens + (now - at) * self.rate)
            if tokens <= 0:
                self._buckets[principal] = (tokens, now)
                wait_ms = int(-tokens / self.rate * 1000) + 1
                record_limit_refusal("partition_mutation_rate")
                raise ThrottlingQuotaExceeded(
                    f"principal {principal!r} is over its {self.rate:g} partition mutations per "
                    f"second (COORDINATOR_CONTROLLER_MUTATION_RATE); retry in {wait_ms} ms",
                    {"throttle_time_ms": wait_ms},
                )
            self._buckets[principal] = (tokens - partitions, now)
