"""The client-wide callbacks of confluent-kafka's configuration: `error_cb`, `stats_cb`,
`throttle_cb` and `logger`. Background threads only queue; `serve()`, called from `poll()` (and
the Producer's `flush()`), runs them on the caller's thread, as librdkafka does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson

from sdk._config import ClientConfig
from sdk._errors import KafkaError

__all__ = ["Callbacks"]


class Callbacks:
    """One client's `error_cb`, `stats_cb` and logger. `stats` gives the figures `stats_cb` gets
    (librdkafka's statistics' top-level fields, where they apply here)."""

    def __init__(self, config: ClientConfig, kind: str, stats: Callable[[], dict[str, Any]]):
        self.log: logging.Logger | logging.LoggerAdapter[Any] = config.logger or logging.getLogger(
            "sdk"
        )
        self._error_cb = config.error_cb
        self._stats_cb = config.stats_cb
        self._interval = config.statistics_interval_ms / 1000
        self._name = f"{config.client_id}#{kind}-{id(self):x}"
        self._kind = kind
        self._client_id = config.client_id
        self._stats = stats
        self._started = time.monotonic()
        self._next_stats = self._started + self._interval
        self._errors: deque[KafkaError] = deque()
        self._lock = threading.Lock()

    def error(self, error: KafkaError) -> None:
        """An error no call returns: queued for `error_cb` (thread-safe), or logged without one."""
        if self._error_cb is None:
            self.log.warning("%s: %s", self._name, error)
            return
        with self._lock:
            self._errors.append(error)

    def serve(self) -> int:
        """Run the queued `error_cb` calls and, when due, `stats_cb`; returns how many ran."""
        served = 0
        while self._error_cb is not None:
            with self._lock:
                if not self._errors:
                    break
                error = self._errors.popleft()
            self._error_cb(error)
            served += 1
        if self._stats_cb is not None and self._interval > 0:
            now = time.monotonic()
            if now >= self._next_stats:
                self._next_stats = now + self._interval
                self._stats_cb(self._statistics(now))
                served += 1
        return served

    def _statistics(self, now: float) -> str:
        figures = {
            "name": self._name,
            "client_id": self._client_id,
            "type": self._kind,
            "ts": time.time_ns() // 1000,
            "time": int(time.time()),
            "age": int((now - self._started) * 1_000_000),
            **self._stats(),
        }
        return orjson.dumps(figures).decode()
