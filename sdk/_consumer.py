"""The Consumer: confluent-kafka's surface (assign, seek, poll, consume, commit, committed,
position, close) over the fetch and group-offset endpoints; read_committed by default.

No threads: `poll()` and `consume()` fetch on the caller's thread. Partitions are assigned
explicitly (`assign()`); there is no group membership or rebalancing.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Unpack
from urllib.parse import quote

import httpx

from coordinator.log import recordbatch
from sdk._config import ConsumerConfig, ConsumerOptions, build_config
from sdk._errors import IllegalStateError, KafkaError, KafkaException, UnknownTopicOrPartition
from sdk._http import HttpClient
from sdk._types import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    ConsumerGroupMetadata,
    Message,
    TopicPartition,
)

__all__ = ["Consumer"]

log = logging.getLogger("sdk")

TopicKey = tuple[str, int]
RECORD_BATCH = "application/vnd.kafka.record-batch"


class _Assigned:
    """Where one assigned partition stands: its position and the records fetched past it."""

    __slots__ = ("buffer", "eof_sent", "fetched_next", "position")

    def __init__(self, position: int) -> None:
        self.position = position  # the next offset to hand out, or a logical OFFSET_*
        self.buffer: deque[Message] = deque()
        self.fetched_next = position  # where the next fetch starts, past markers
        self.eof_sent = False


class Consumer:
    """Reads records from assigned partitions; commits offsets for `group.id`.

        Consumer({"coordinator.url": "http://127.0.0.1:8080", "group.id": "etl",
                  "auto.offset.reset": "earliest"})

    Every method raises `IllegalStateError` once the consumer is closed.
    """

    def __init__(
        self,
        config: Mapping[str, object] | ConsumerConfig | None = None,
        /,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        self.config: ConsumerConfig = build_config(ConsumerConfig, config, options)
        self._http = HttpClient(self.config)
        self._read_committed = self.config.isolation_level == "read_committed"
        self._assigned: dict[TopicKey, _Assigned] = {}
        self._rotation: deque[TopicKey] = deque()
        self._auto_committed: dict[TopicKey, int] = {}
        self._next_auto_commit = time.monotonic() + self.config.auto_commit_interval_ms / 1000
        self._closed = False

    # -- assignment -------------------------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions from now on. A partition's `offset` says where to start:
        an offset, `OFFSET_BEGINNING`, `OFFSET_END`, or (the default) the group's committed
        offset, else `auto.offset.reset`."""
        self._check_open()
        assigned: dict[TopicKey, _Assigned] = {}
        for tp in partitions:
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"expected TopicPartition, not {type(tp).__name__}")
            if tp.partition < 0:
                raise ValueError(f"{tp}: assign() needs a partition number")
            offset = OFFSET_STORED if tp.offset == OFFSET_INVALID else tp.offset
            assigned[(tp.topic, tp.partition)] = _Assigned(offset)
        self._assigned = assigned
        self._rotation = deque(assigned)

    def unassign(self) -> None:
        self._check_open()
        self.assign([])

    def assignment(self) -> list[TopicPartition]:
        self._check_open()
        return [TopicPartition(t, p) for t, p in self._assigned]

    def seek(self, partition: TopicPartition) -> None:
        """Make the next record of an assigned partition come from `partition.offset` (an offset,
        `OFFSET_BEGINNING` or `OFFSET_END`). Raises `IllegalStateError` if it is not assigned."""
        state = self._state_of(partition)
        state.position = state.fetched_next = partition.offset
        state.buffer.clear()
        state.eof_sent = False

    def position(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        """The offset of the next record each partition will return (what
        `send_offsets_to_transaction` should commit); `OFFSET_INVALID` when not yet known."""
        result = []
        for tp in partitions:
            state = self._state_of(tp)
            offset = state.position if state.position >= 0 else OFFSET_INVALID
            result.append(TopicPartition(tp.topic, tp.partition, offset))
        return result

    # -- reading ----------------------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> Message | None:
        """The next record, or an event (`msg.error()` not None: `_PARTITION_EOF` with
        `enable.partition.eof`), or None when nothing came within `timeout` seconds (None or
        negative: wait until something comes). Transport failures are retried until the timeout.

        Raises: a `KafkaException` the service gave for a partition (e.g.
        `UnknownTopicOrPartition`, `AuthorizationFailed`), or `_AUTO_OFFSET_RESET` when a
        partition has no committed offset and `auto.offset.reset` is `error`.
        """
        messages = self.consume(1, timeout)
        return messages[0] if messages else None

    def consume(self, num_messages: int = 1, timeout: float | None = -1) -> list[Message]:
        """Up to `num_messages` records (and events), returned as soon as at least one is
        available; an empty list when none came within `timeout` seconds (None or negative: wait
        until one comes). Raises as `poll()` does."""
        self._check_open()
        if num_messages < 1:
            raise ValueError("num_messages must be at least 1")
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        messages: list[Message] = []
        while True:
            self._take(messages, num_messages)
            if len(messages) >= num_messages:
                break
            if self._fetch_round(deadline):
                continue
            if messages:
                break
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            pause = self.config.fetch_wait_max_ms / 1000
            time.sleep(pause if remaining is None else min(pause, remaining))
        self._maybe_auto_commit()
        return messages

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        """(log start offset, high watermark) of a partition."""
        self._check_open()
        info = self._describe(partition.topic, partition.partition, timeout)
        return info["log_start_offset"], info["high_watermark"]

    # -- offsets ----------------------------------------------------------------------------------

    def consumer_group_metadata(self) -> ConsumerGroupMetadata:
        """The group, for `Producer.send_offsets_to_transaction`."""
        return ConsumerGroupMetadata(self._group())

    def commit(
        self,
        message: Message | None = None,
        offsets: Iterable[TopicPartition] | None = None,
        asynchronous: bool = False,
    ) -> list[TopicPartition] | None:
        """Commit offsets for `group.id`: `offsets` as given, or past `message`, or (neither)
        the current position of every assigned partition. Returns the committed offsets, or
        None when `asynchronous` (accepted for compatibility; the commit is done before the call
        returns either way).

        Raises `KafkaTimeoutError` (retriable: call again) when the service did not answer
        within `default.api.timeout.ms`; `IllegalStateError` without `group.id`.
        """
        group = self._group()
        if offsets is not None:
            chosen = [
                TopicPartition(tp.topic, tp.partition, tp.offset, tp.metadata) for tp in offsets
            ]
        elif message is not None:
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            if topic is None or partition is None or offset is None:
                raise ValueError("the message has no topic, partition or offset")
            chosen = [TopicPartition(topic, partition, offset + 1)]
        else:
            chosen = [
                TopicPartition(t, p, state.position)
                for (t, p), state in self._assigned.items()
                if state.position >= 0
            ]
        chosen = [tp for tp in chosen if tp.offset >= 0]
        if chosen:
            entries = []
            for tp in chosen:
                entry: dict[str, Any] = {"topic": tp.topic, "partition": tp.partition}
                entry["offset"] = tp.offset
                if tp.metadata is not None:
                    entry["metadata"] = tp.metadata
                entries.append(entry)
            path = f"/v1/groups/{quote(group, safe='')}/offsets"
            self._http.call("POST", path, body={"offsets": entries})
            for tp in chosen:
                self._auto_committed[(tp.topic, tp.partition)] = tp.offset
        return None if asynchronous else chosen

    def committed(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """The group's committed offsets of `partitions` (`OFFSET_INVALID` where none). With
        read_committed, waits (up to `timeout`) while a transaction holds pending offsets for
        them, so a restarted job never resumes from a stale offset (KIP-447).

        Raises `KafkaTimeoutError` (retriable) when not answered within `timeout`."""
        wanted = list(partitions)
        by_topic = self._committed_offsets({tp.topic for tp in wanted}, timeout)
        return [
            TopicPartition(
                tp.topic,
                tp.partition,
                *by_topic.get((tp.topic, tp.partition), (OFFSET_INVALID, None)),
            )
            for tp in wanted
        ]

    def close(self) -> None:
        """Commit the positions (with `enable.auto.commit` and a `group.id`), then release the
        connections. Closing again does nothing."""
        if self._closed:
            return
        try:
            if self.config.enable_auto_commit and self.config.group_id is not None:
                self._auto_commit()
        finally:
            self._http.close()
            self._closed = True

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("the consumer is closed")

    def _group(self) -> str:
        self._check_open()
        if self.config.group_id is None:
            raise IllegalStateError("this consumer has no group.id")
        return self.config.group_id

    def _state_of(self, tp: TopicPartition) -> _Assigned:
        self._check_open()
        state = self._assigned.get((tp.topic, tp.partition))
        if state is None:
            raise IllegalStateError(f"{tp.topic} [{tp.partition}] is not assigned")
        return state

    def _take(self, messages: list[Message], limit: int) -> None:
        """Move buffered messages into `messages`, one partition after another in turn."""
        for _ in range(len(self._rotation)):
            if len(messages) >= limit:
                return
            tp = self._rotation[0]
            self._rotation.rotate(-1)
            state = self._assigned[tp]
            while state.buffer and len(messages) < limit:
                message = state.buffer.popleft()
                messages.append(message)
                offset = message.offset()
                if message.error() is None and offset is not None:
                    state.position = offset + 1
                if not state.buffer:
                    state.position = state.fetched_next

    def _fetch_round(self, deadline: float | None) -> bool:
        """Fetch once from every assigned partition whose buffer is empty. True when any record
        or event was buffered. Retriable failures wait for the next round."""
        self._resolve_positions(deadline)
        found = False
        for (topic, partition), state in list(self._assigned.items()):
            if state.buffer or state.position < 0:
                continue
            params: dict[str, str | int] = {
                "offset": state.fetched_next,
                "max_bytes": self.config.max_partition_fetch_bytes,
                "isolation_level": self.config.isolation_level,
            }
            try:
                page = self._http.fetch_binary(
                    f"/v1/topics/{topic}/partitions/{partition}/records", params, RECORD_BATCH
                )
            except KafkaException as exc:
                if exc.code == KafkaError.OFFSET_OUT_OF_RANGE:
                    self._out_of_range(topic, partition, state, exc)
                    continue
                if not exc.retriable:
                    raise
                log.debug("fetch %s [%d] failed, retrying: %s", topic, partition, exc)
                continue
            found = self._buffer(topic, partition, state, page) or found
        return found

    def _buffer(
        self, topic: str, partition: int, state: _Assigned, page: tuple[bytes, httpx.Headers]
    ) -> bool:
        """Decode a fetched run of record batches into messages, from `fetched_next` on (a batch
        may begin before it), at most `max.poll.records` of them."""
        data, headers = page
        start = state.fetched_next
        limit = self.config.max_poll_records
        added = 0
        next_offset = int(headers["next-offset"])
        try:
            for pos, header in recordbatch.iter_batches(data, verify=self.config.check_crcs):
                kind = (
                    TIMESTAMP_LOG_APPEND_TIME if header.log_append_time else TIMESTAMP_CREATE_TIME
                )
                for record in recordbatch.records(data, pos, header):
                    if record.offset < start:
                        continue
                    if added >= limit:
                        next_offset = record.offset
                        break
                    state.buffer.append(
                        Message(
                            topic,
                            partition,
                            record.offset,
                            record.key,
                            record.value,
                            record.headers,
                            None,
                            record.timestamp,
                            kind,
                        )
                    )
                    added += 1
                else:
                    continue
                break
        except recordbatch.CorruptBatch as exc:
            raise KafkaException(
                KafkaError(KafkaError._BAD_MSG, f"{topic} [{partition}] at {start}: {exc}")
            ) from None
        state.fetched_next = next_offset
        if added:
            state.eof_sent = False
            return True
        state.position = state.fetched_next
        field = "last-stable-offset" if self._read_committed else "high-watermark"
        end = int(headers[field])
        if state.position >= end and self.config.enable_partition_eof and not state.eof_sent:
            state.eof_sent = True
            eof = KafkaError(KafkaError._PARTITION_EOF, f"reached the end of {topic} [{partition}]")
            state.buffer.append(Message(topic, partition, state.position, error=eof))
            return True
        return False

    def _out_of_range(
        self, topic: str, partition: int, state: _Assigned, error: KafkaException
    ) -> None:
        """The position is outside the log (below its start, past its end): start again where
        `auto.offset.reset` says, as Kafka's consumers do; with `error`, raise."""
        reset = self.config.auto_offset_reset
        if reset == "error":
            raise error
        log.warning("%s [%d]: %s; resetting to the %s", topic, partition, error, reset)
        state.position = OFFSET_BEGINNING if reset == "earliest" else OFFSET_END
        state.fetched_next = -1
        state.buffer.clear()

    def _resolve_positions(self, deadline: float | None) -> None:
        """Turn logical positions into offsets: committed offsets (one request per topic),
        else `auto.offset.reset`, and the log's start or end."""
        stored = [tp for tp, s in self._assigned.items() if s.position == OFFSET_STORED]
        if stored and self.config.group_id is not None:
            try:
                committed = self._committed_offsets({t for t, _ in stored}, None, once=True)
            except KafkaException as exc:
                if not exc.retriable:
                    raise
                log.debug("committed offsets not available yet: %s", exc)
                stored = []  # try again next round
                committed = {}
            for tp in stored:
                offset = committed.get(tp, (OFFSET_INVALID, None))[0]
                self._assigned[tp].position = offset if offset >= 0 else self._reset_target(tp)
        elif stored:
            for tp in stored:
                self._assigned[tp].position = self._reset_target(tp)
        for (topic, partition), state in self._assigned.items():
            if state.position in (OFFSET_BEGINNING, OFFSET_END):
                info = self._describe(topic, partition, None)
                end = "last_stable_offset" if self._read_committed else "high_watermark"
                key = "log_start_offset" if state.position == OFFSET_BEGINNING else end
                state.position = info[key]
            if state.position >= 0 and state.fetched_next < 0:
                state.fetched_next = state.position

    def _reset_target(self, tp: TopicKey) -> int:
        reset = self.config.auto_offset_reset
        if reset == "error":
            raise KafkaException(
                KafkaError(
                    KafkaError._AUTO_OFFSET_RESET,
                    f"{tp[0]} [{tp[1]}] has no committed offset and auto.offset.reset is error",
                )
            )
        return OFFSET_BEGINNING if reset == "earliest" else OFFSET_END

    def _describe(self, topic: str, partition: int, timeout: float | None) -> dict[str, Any]:
        described = self._http.call(
            "GET", f"/v1/topics/{topic}", deadline=self._http.deadline(timeout)
        )
        for info in described["partitions"]:
            if info["partition"] == partition:
                result: dict[str, Any] = info
                return result
        raise UnknownTopicOrPartition(f"{topic} has no partition {partition}")

    def _committed_offsets(
        self, topics: set[str], timeout: float | None, *, once: bool = False
    ) -> dict[TopicKey, tuple[int, str | None]]:
        """Committed (offset, metadata) per partition of `topics`; `once`: a single attempt
        (poll() retries on its next round), else retried until `timeout`."""
        group = self._group()
        params: dict[str, str | int] = {"require_stable": str(self._read_committed).lower()}
        result: dict[TopicKey, tuple[int, str | None]] = {}
        deadline = self._http.deadline(timeout)
        for topic in sorted(topics):
            path = f"/v1/groups/{quote(group, safe='')}/offsets"
            query = {**params, "topic": topic}
            answer = (
                self._http.send("GET", path, params=query)
                if once
                else self._http.call("GET", path, params=query, deadline=deadline)
            )
            for entry in answer["offsets"]:
                result[(entry["topic"], entry["partition"])] = (
                    entry["offset"],
                    entry.get("metadata"),
                )
        return result

    def _maybe_auto_commit(self) -> None:
        if not self.config.enable_auto_commit or self.config.group_id is None:
            return
        now = time.monotonic()
        if now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self.config.auto_commit_interval_ms / 1000
        try:
            self._auto_commit()
        except KafkaException as exc:
            log.warning("auto-commit failed (will try again): %s", exc)

    def _auto_commit(self) -> None:
        changed = [
            TopicPartition(t, p, state.position)
            for (t, p), state in self._assigned.items()
            if state.position >= 0 and self._auto_committed.get((t, p)) != state.position
        ]
        if changed:
            self.commit(offsets=changed)
