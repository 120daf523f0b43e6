"""The ShareConsumer: confluent-kafka's share consumer (KIP-932's KafkaShareConsumer) over the
coordinator's share-group endpoints (docs/pages/http-api.md, Share groups).

A share group hands each record to one member at a time: `poll()` acquires records, locked to
this consumer for the group's lock duration; `acknowledge()` says what became of each (ACCEPT,
RELEASE for delivery again, REJECT; RENEW extends the lock), and `commit_sync()` sends it. In
implicit mode what a `poll()` returned is accepted at the next `poll()` or commit. A heartbeat
thread keeps the membership; the coordinator assigns the partitions (several members may share
one).

Exactly once: hand the acknowledgements to a transactional producer instead of committing them
(`take_acknowledgements()`, then `Producer.send_share_acknowledgements_to_transaction()`): they
commit with the transaction's output, and an abort releases the records for delivery again.
"""

from __future__ import annotations

import base64
import contextlib
import enum
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Unpack

from sdk._config import ShareConsumerConfig, ShareConsumerOptions, build_config
from sdk._errors import FencedMemberEpoch, IllegalStateError, KafkaException, UnknownMemberId
from sdk._http import HttpClient, api_path
from sdk._lifecycle import Closeable
from sdk._types import TIMESTAMP_CREATE_TIME, Message

__all__ = ["AcknowledgeType", "ShareAcknowledgement", "ShareConsumer", "ShareGroupMetadata"]

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
# The longest a poll waits at the coordinator (its bound), and the heartbeat before it answers.
MAX_WAIT_MS = 30_000
FIRST_HEARTBEAT_S = 5.0


class AcknowledgeType(enum.IntEnum):
    """What became of a record (Kafka's AcknowledgeType)."""

    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4


@dataclass(frozen=True)
class ShareGroupMetadata:
    """Who acknowledges: the share group and this consumer's member id."""

    group_id: str
    member_id: str


@dataclass(frozen=True)
class ShareAcknowledgement:
    topic: str
    partition: int
    offset: int
    type: AcknowledgeType

    def body(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "first_offset": self.offset,
            "type": self.type.name.lower(),
        }


class ShareConsumer(Closeable):
    """Acquires records of its share group's partitions; acknowledges them.

        ShareConsumer({"coordinator.url": "http://127.0.0.1:8080", "group.id": "jobs"})

    Every method raises `IllegalStateError` once the consumer is closed.
    """

    _what = "the share consumer"

    def __init__(
        self,
        config: Mapping[str, object] | ShareConsumerConfig | None = None,
        /,
        **options: Unpack[ShareConsumerOptions],
    ) -> None:
        self.config: ShareConsumerConfig = build_config(ShareConsumerConfig, config, options)
        self._http = HttpClient(self.config)
        self._beats = HttpClient(self.config, max_connections=1)
        self._group = self.config.group_id
        self.member_id = str(uuid.uuid4())
        self._explicit = self.config.share_acknowledgement_mode == "explicit"
        self._topics: list[str] = []
        self._lock = threading.Condition()
        self._epoch = JOIN_EPOCH
        self._joined = False
        self._interval = 1.0
        self._failure: KafkaException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._delivered: list[Message] = []  # the last poll's, for implicit acceptance
        self._pending: dict[tuple[str, int, int], AcknowledgeType] = {}
        self._closed = False

    # -- membership ---------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str]) -> None:
        """Join the share group with these topics (replacing any earlier subscription)."""
        self._check_open()
        wanted = sorted(set(topics))
        if not wanted:
            self.unsubscribe()
            return
        with self._lock:
            self._topics = wanted
            self._epoch = JOIN_EPOCH  # a new subscription: join again with it
            self._joined = False
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="share-heartbeat", daemon=True)
            self._thread.start()
        else:
            with self._lock:
                self._lock.notify_all()

    def subscription(self) -> list[str]:
        """The topics subscribed to."""
        return list(self._topics)

    def unsubscribe(self) -> None:
        """Leave the share group: what this consumer holds goes to the others at once."""
        self._check_open()
        self._leave()
        with self._lock:
            self._topics = []

    def share_group_metadata(self) -> ShareGroupMetadata:
        """Who acknowledges, for `Producer.send_share_acknowledgements_to_transaction()`."""
        return ShareGroupMetadata(self._group, self.member_id)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                topics, epoch = list(self._topics), self._epoch
            if topics:
                self._beat(topics, epoch)
            with self._lock:
                self._lock.wait(self._interval if self._joined else 0.5)

    def _beat(self, topics: list[str], epoch: int) -> None:
        body: dict[str, Any] = {"member_id": self.member_id, "member_epoch": epoch}
        if epoch == JOIN_EPOCH:
            body["subscribed_topics"] = topics
        try:
            answer = self._beats.call(
                "POST", api_path("share-groups", self._group, "heartbeat"), body=body
            )
        except (UnknownMemberId, FencedMemberEpoch):
            with self._lock:
                self._epoch, self._joined = JOIN_EPOCH, False  # join again
            return
        except KafkaException as error:
            if not error.retriable:
                with self._lock:
                    self._failure = error
                    self._lock.notify_all()
            return
        with self._lock:
            self._epoch = answer["member_epoch"]
            self._interval = answer["heartbeat_interval_ms"] / 1000
            self._joined = True
            self._lock.notify_all()

    def _leave(self) -> None:
        with self._lock:
            joined, self._joined = self._joined, False
            self._epoch = JOIN_EPOCH
        if joined:
            body = {"member_id": self.member_id, "member_epoch": LEAVE_EPOCH}
            with contextlib.suppress(UnknownMemberId, FencedMemberEpoch):  # gone already
                self._beats.call(
                    "POST", api_path("share-groups", self._group, "heartbeat"), body=body
                )

    # -- records ------------------------------------------------------------------------------

    def poll(self, timeout: float | None = -1) -> list[Message]:
        """Acquire records, waiting up to `timeout` seconds (-1 or None: the longest the
        coordinator waits) while there are none. Implicit mode accepts what the last poll
        returned first; explicit mode sends the acknowledgements made since."""
        self._check_open()
        if not self._topics:
            raise IllegalStateError("poll(): subscribe() first")
        wait_ms = MAX_WAIT_MS if timeout is None or timeout < 0 else int(timeout * 1000)
        with self._lock:
            if self._failure is not None:
                raise self._failure
            if not self._joined:
                self._lock.wait_for(
                    lambda: self._joined or self._failure is not None,
                    min(FIRST_HEARTBEAT_S, max(wait_ms, 1) / 1000),
                )
            if self._failure is not None:
                raise self._failure
            if not self._joined:
                return []
        self.commit_sync()
        answer = self._http.call(
            "POST",
            api_path("share-groups", self._group, "fetch"),
            body={
                "member_id": self.member_id,
                "max_records": self.config.max_poll_records,
                "max_wait_ms": min(wait_ms, MAX_WAIT_MS),
                "encoding": "base64",
            },
        )
        messages = [_message(r) for r in answer["records"]]
        self._delivered = messages
        return messages

    def acknowledge(
        self, message: Message, ack_type: AcknowledgeType = AcknowledgeType.ACCEPT
    ) -> None:
        """Mark what became of a record `poll()` returned (sent at the next poll or commit)."""
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        if topic is None or partition is None or offset is None:
            raise IllegalStateError("acknowledge(): not a record this consumer returned")
        self.acknowledge_offset(topic, partition, offset, ack_type)

    def acknowledge_offset(
        self,
        topic: str,
        partition: int,
        offset: int,
        ack_type: AcknowledgeType = AcknowledgeType.ACCEPT,
    ) -> None:
        """`acknowledge()` by the record's topic, partition and offset."""
        self._check_open()
        self._pending[(topic, partition, offset)] = AcknowledgeType(ack_type)

    def take_acknowledgements(self) -> list[ShareAcknowledgement]:
        """The acknowledgements not sent yet (implicit mode: every record of the last poll as
        ACCEPT), taken out of the consumer: for a transactional producer to send with its
        transaction (`Producer.send_share_acknowledgements_to_transaction`)."""
        self._check_open()
        pending = self._outstanding()
        self._pending.clear()
        self._delivered = []
        return [ShareAcknowledgement(t, p, o, kind) for (t, p, o), kind in sorted(pending.items())]

    def _outstanding(self) -> dict[tuple[str, int, int], AcknowledgeType]:
        pending = dict(self._pending)
        if not self._explicit:
            for m in self._delivered:
                key = (m.topic() or "", m.partition() or 0, m.offset() or 0)
                pending.setdefault(key, AcknowledgeType.ACCEPT)
        return pending

    def commit_sync(self, timeout: float | None = None) -> None:
        """Send the acknowledgements made since the last commit (implicit mode: the last
        poll's records, accepted). All of them apply, or none: `InvalidRecordState`-like
        errors (a lock that ran out) raise, and the records go to others."""
        self._check_open()
        pending = self._outstanding()
        if not pending:
            return
        self._pending.clear()
        self._delivered = []
        acks = [
            ShareAcknowledgement(t, p, o, kind).body()
            for (t, p, o), kind in sorted(pending.items())
        ]
        self._http.call(
            "POST",
            api_path("share-groups", self._group, "acknowledge"),
            body={"member_id": self.member_id, "acknowledgements": acks},
            deadline=self._http.deadline(timeout),
        )

    def commit_async(self) -> None:
        """`commit_sync()` (the coordinator's acknowledgement is one short call)."""
        self.commit_sync()

    def close(self) -> None:
        """Commit what is pending, leave the group (what this consumer holds goes to others at
        once), and close."""
        self._close_once(self._release)

    def _release(self) -> None:
        try:
            if self._topics:
                self.commit_sync()
        finally:
            self._stop.set()
            with self._lock:
                self._lock.notify_all()
            if self._thread is not None:
                self._thread.join(10)
            try:
                self._leave()
            finally:
                self._http.close()
                self._beats.close()


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _message(record: Mapping[str, Any]) -> Message:
    return Message(
        record["topic"],
        record["partition"],
        record["offset"],
        _bytes(record["key"]),
        _bytes(record["value"]),
        [(k, _bytes(v)) for k, v in record["headers"].items()],
        timestamp=record["timestamp"],
        timestamp_type=TIMESTAMP_CREATE_TIME,
    )
