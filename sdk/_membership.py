"""A subscribed consumer's group membership: a background thread that joins the group, heartbeats
and leaves (docs/pages/http-api.md, Membership). It never touches the consumer's partitions: the
consumer's own thread takes what changed (`changes()`), runs the rebalance callbacks inside
`poll()`, and only then reports what it owns (`set_owned()`), which the next heartbeat tells the
coordinator. So a partition is given up only after `on_revoke` returned (a commit there lands
first), and the coordinator hands it to another member only after that heartbeat.

When the coordinator no longer knows the member (its session timed out, it was fenced) or it left
because `poll()` was not called within `max.poll.interval.ms`, its partitions are lost: the thread
waits until the consumer ran `on_lost` (`ack_lost()`), then joins again with epoch 0.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sdk._callbacks import Callbacks
from sdk._config import ConsumerConfig
from sdk._errors import (
    FencedMemberEpoch,
    KafkaError,
    KafkaException,
    UnknownMemberId,
)
from sdk._http import HttpClient, api_path

__all__ = ["Changes", "Membership"]

TP = tuple[str, int]
LEAVE_EPOCH = -1
# Why partitions were lost.
FENCED = "fenced"
POLL_TIMEOUT = "max.poll.interval.ms"
DEFAULT_SESSION_TIMEOUT_MS = 45_000


@dataclass(frozen=True)
class Changes:
    """What the consumer's thread must act on, as of now."""

    assignment: frozenset[TP] | None  # what the coordinator assigns; None: not joined yet
    lost: str | None  # the partitions are lost (FENCED or POLL_TIMEOUT): call on_lost, ack
    failure: KafkaException | None  # the coordinator refuses this member for good (auth, ...)


class Membership:
    """One member of `group_id`, under a member id it makes up (a UUID)."""

    def __init__(self, config: ConsumerConfig, group_id: str, callbacks: Callbacks) -> None:
        self._http = HttpClient(config, max_connections=1)
        self._callbacks = callbacks
        self._path = api_path("groups", group_id, "heartbeat")
        self._client_id = config.client_id
        self._session_timeout_ms = config.session_timeout_ms
        self._rebalance_timeout_ms = config.max_poll_interval_ms
        self._max_poll_interval = config.max_poll_interval_ms / 1000
        self._configured_interval = config.heartbeat_interval_ms / 1000
        session = (config.session_timeout_ms or DEFAULT_SESSION_TIMEOUT_MS) / 1000
        # A heartbeat that hangs must not outlast the session it keeps alive.
        self._request_timeout = min(config.request_timeout_ms / 1000, max(0.5, session / 3))
        self.member_id = str(uuid.uuid4())
        self.rebalances = 0

        self._cond = threading.Condition()
        self._epoch = 0
        self._topics: list[str] = []
        self._send_topics = True
        self._owned: frozenset[TP] = frozenset()
        self._assignment: frozenset[TP] | None = None
        self._lost: str | None = None
        self._failure: KafkaException | None = None
        self._interval = self._configured_interval
        self._due = 0.0
        self._attempts = 0
        self._last_poll = time.monotonic()
        self._stopping = False
        self._thread = threading.Thread(
            target=self._run, name="sdk-consumer-heartbeat", daemon=True
        )

    # -- the consumer's thread ----------------------------------------------------------------

    def subscribe(self, topics: list[str]) -> None:
        with self._cond:
            self._topics = sorted(set(topics))
            self._send_topics = True
            self._due = 0.0
            self._cond.notify_all()
        if not self._thread.is_alive():
            self._thread.start()

    def changes(self) -> Changes:
        with self._cond:
            self._last_poll = time.monotonic()
            return Changes(self._assignment, self._lost, self._failure)

    def set_owned(self, owned: set[TP]) -> None:
        """What the consumer owns now, its callbacks done: told at once (a revocation's end)."""
        with self._cond:
            if frozenset(owned) != self._owned:
                self._owned = frozenset(owned)
                self._due = 0.0
                self._cond.notify_all()

    def ack_lost(self) -> None:
        """The consumer dropped its lost partitions (`on_lost` ran): join again."""
        with self._cond:
            self._owned = frozenset()
            self._lost = None
            self._assignment = None
            self._epoch = 0
            self._send_topics = True
            self._due = 0.0
            self._cond.notify_all()

    def identity(self) -> tuple[str, int] | None:
        """(member id, epoch) while a member, for commits and `consumer_group_metadata()`."""
        with self._cond:
            if self._epoch <= 0 or self._lost is not None:
                return None
            return self.member_id, self._epoch

    def state(self) -> str:
        with self._cond:
            if self._failure is not None:
                return "failed"
            if self._lost is not None or self._assignment is None:
                return "joining"
            return "up"

    def leave(self) -> None:
        """Stop heartbeating and leave the group (its partitions go to others at once); bounded
        by `request.timeout.ms`. The consumer gave up its partitions before."""
        with self._cond:
            self._stopping = True
            joined = self._epoch > 0 and self._lost is None
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=self._request_timeout + 1)
        try:
            if joined:
                self._send_leave()
        finally:
            self._http.close()

    # -- the heartbeat thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    body = self._wait_for_turn()
                    if body is None:
                        return
                self._beat(body)
        except Exception as exc:  # a bug: surface it from poll() rather than die silently
            self._callbacks.log.exception("the consumer's heartbeat thread failed")
            with self._cond:
                self._failure = KafkaException(f"the heartbeat thread failed: {exc!r}")

    def _wait_for_turn(self) -> dict[str, Any] | None:
        """Under the lock: wait until a heartbeat is due; its body, or None to stop."""
        while not self._stopping:
            now = time.monotonic()
            joined = self._lost is None and self._failure is None and self._epoch > 0
            if joined and now - self._last_poll > self._max_poll_interval:
                return {"member_id": self.member_id, "member_epoch": LEAVE_EPOCH}
            if self._lost is not None or self._failure is not None:
                self._cond.wait()
                continue
            if now >= self._due:
                body: dict[str, Any] = {
                    "member_id": self.member_id,
                    "member_epoch": self._epoch,
                    "owned_partitions": [
                        {"topic": t, "partition": p} for t, p in sorted(self._owned)
                    ],
                    "rebalance_timeout_ms": self._rebalance_timeout_ms,
                    "client_id": self._client_id,
                }
                if self._send_topics or self._epoch == 0:
                    body["subscribed_topics"] = list(self._topics)
                if self._session_timeout_ms is not None:
                    body["session_timeout_ms"] = self._session_timeout_ms
                return body
            self._cond.wait(self._due - now)
        return None

    def _beat(self, body: dict[str, Any]) -> None:
        leaving = body["member_epoch"] == LEAVE_EPOCH
        try:
            answer = self._http.send("POST", self._path, body=body, timeout=self._request_timeout)
        except (UnknownMemberId, FencedMemberEpoch) as exc:
            with self._cond:
                self._lose(POLL_TIMEOUT if leaving else FENCED)
            if not leaving:
                self._callbacks.log.info("member %s lost its partitions: %s", self.member_id, exc)
            return
        except KafkaException as exc:
            with self._cond:
                if leaving:
                    # Not heard: the session timeout removes it; its partitions are lost anyway.
                    self._lose(POLL_TIMEOUT)
                elif exc.retriable:
                    self._due = time.monotonic() + min(
                        self._interval, self._http.backoff(self._attempts)
                    )
                    self._attempts += 1
                else:
                    self._failure = exc
                    self._cond.notify_all()
            if exc.retriable or leaving:
                self._callbacks.error(exc.error)
            return
        with self._cond:
            self._attempts = 0
            if leaving:
                self._lose(POLL_TIMEOUT)
                self._callbacks.log.warning(
                    "member %s left group after max.poll.interval.ms (%d ms) without a poll()",
                    self.member_id,
                    self._rebalance_timeout_ms,
                )
                return
            if self._stopping or self._lost is not None:
                return
            if answer["member_epoch"] != self._epoch:
                self.rebalances += 1
            self._epoch = answer["member_epoch"]
            if "subscribed_topics" in body and body["subscribed_topics"] == self._topics:
                self._send_topics = False
            self._assignment = frozenset((a["topic"], a["partition"]) for a in answer["assignment"])
            self._interval = min(self._configured_interval, answer["heartbeat_interval_ms"] / 1000)
            self._due = time.monotonic() + self._interval
            self._cond.notify_all()

    def _lose(self, why: str) -> None:
        """Under the lock: the member is out of the group; the consumer must drop everything."""
        self._lost = why
        self._epoch = 0
        self._assignment = None
        self._cond.notify_all()

    def _send_leave(self) -> None:
        body = {"member_id": self.member_id, "member_epoch": LEAVE_EPOCH}
        try:
            self._http.send("POST", self._path, body=body, timeout=self._request_timeout)
        except (UnknownMemberId, FencedMemberEpoch):
            pass  # already out of the group
        except KafkaException as exc:
            # Its session timeout will remove it instead.
            self._callbacks.log.warning("leaving group failed: %s", exc)


def max_poll_error(interval_ms: int) -> KafkaError:
    return KafkaError(
        KafkaError._MAX_POLL_EXCEEDED,
        f"Application maximum poll interval ({interval_ms}ms) exceeded: the consumer left its "
        "group and lost its partitions; it joins again now",
    )
