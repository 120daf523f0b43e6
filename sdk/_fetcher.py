"""The Consumer's fetcher (Kafka's `Fetcher`): where each assigned partition stands, fetching from
the partitions whose records are all handed out, decoding the record batches into messages, and
resolving logical positions (committed, earliest, latest) into offsets; on the caller's thread."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from typing import Any

import httpx

from sdk import recordbatch
from sdk._config import ConsumerConfig
from sdk._errors import KafkaError, KafkaException, UnknownTopicOrPartition
from sdk._http import RECORD_BATCH, HttpClient, api_path
from sdk._types import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Message,
    TopicPartition,
)

__all__ = ["Assigned", "Fetcher", "TopicKey"]

log = logging.getLogger("sdk")

TopicKey = tuple[str, int]


class Assigned:
    """Where one assigned partition stands: its position and the records fetched past it."""

    __slots__ = ("buffer", "eof_sent", "fetched_next", "position")

    def __init__(self, position: int) -> None:
        self.position = position  # the next offset to hand out, or a logical OFFSET_*
        self.buffer: deque[Message] = deque()
        self.fetched_next = position  # where the next fetch starts, past markers
        self.eof_sent = False


class Fetcher:
    """The assigned partitions (`assigned`, in turn by `rotation`) and their fetching; the
    consumer assigns and drops them."""

    def __init__(self, config: ConsumerConfig, http: HttpClient) -> None:
        self._config = config
        self._http = http
        self._read_committed = config.isolation_level == "read_committed"
        self.assigned: dict[TopicKey, Assigned] = {}
        self.rotation: deque[TopicKey] = deque()

    def take(self, messages: list[Message], limit: int) -> None:
        """Move buffered messages into `messages`, one partition after another in turn."""
        for _ in range(len(self.rotation)):
            if len(messages) >= limit:
                return
            tp = self.rotation[0]
            self.rotation.rotate(-1)
            state = self.assigned[tp]
            while state.buffer and len(messages) < limit:
                message = state.buffer.popleft()
                messages.append(message)
                offset = message.offset()
                if message.error() is None and offset is not None:
                    state.position = offset + 1
                if not state.buffer:
                    state.position = state.fetched_next

    def fetch_round(self, deadline: float | None) -> bool:
        """Fetch once from every assigned partition whose buffer is empty. True when any record
        or event was buffered. Retriable failures wait for the next round."""
        self._resolve_positions(deadline)
        found = False
        for (topic, partition), state in list(self.assigned.items()):
            if state.buffer or state.position < 0:
                continue
            params: dict[str, str | int] = {
                "offset": state.fetched_next,
                "max_bytes": self._config.max_partition_fetch_bytes,
                "isolation_level": self._config.isolation_level,
            }
            try:
                page = self._http.fetch_binary(
                    api_path("topics", topic, "partitions", partition, "records"),
                    params,
                    RECORD_BATCH,
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
        self, topic: str, partition: int, state: Assigned, page: tuple[bytes, httpx.Headers]
    ) -> bool:
        """Decode a fetched run of record batches into messages, from `fetched_next` on (a batch
        may begin before it), at most `max.poll.records` of them."""
        data, headers = page
        start = state.fetched_next
        limit = self._config.max_poll_records
        added = 0
        next_offset = int(headers["next-offset"])
        try:
            for pos, header in recordbatch.iter_batches(data, verify=self._config.check_crcs):
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
        if state.position >= end and self._config.enable_partition_eof and not state.eof_sent:
            state.eof_sent = True
            eof = KafkaError(KafkaError._PARTITION_EOF, f"reached the end of {topic} [{partition}]")
            state.buffer.append(Message(topic, partition, state.position, error=eof))
            return True
        return False

    def _out_of_range(
        self, topic: str, partition: int, state: Assigned, error: KafkaException
    ) -> None:
        """The position is outside the log (below its start, past its end): start again where
        `auto.offset.reset` says, as Kafka's consumers do; with `error`, raise."""
        reset = self._config.auto_offset_reset
        if reset == "error":
            raise error
        log.warning("%s [%d]: %s; resetting to the %s", topic, partition, error, reset)
        state.position = OFFSET_BEGINNING if reset == "earliest" else OFFSET_END
        state.fetched_next = -1
        state.buffer.clear()

    def _resolve_positions(self, deadline: float | None) -> None:
        """Turn logical positions into offsets: committed offsets (one request per topic),
        else `auto.offset.reset`, and the log's start or end."""
        stored = [tp for tp, s in self.assigned.items() if s.position == OFFSET_STORED]
        group = self._config.group_id
        if stored and group is not None:
            try:
                committed = self.committed(group, {t for t, _ in stored}, None, once=True)
            except KafkaException as exc:
                if not exc.retriable:
                    raise
                log.debug("committed offsets not available yet: %s", exc)
                stored = []  # try again next round
                committed = {}
            for tp in stored:
                offset = committed.get(tp, (OFFSET_INVALID, None))[0]
                self.assigned[tp].position = offset if offset >= 0 else self._reset_target(tp)
        elif stored:
            for tp in stored:
                self.assigned[tp].position = self._reset_target(tp)
        for (topic, partition), state in self.assigned.items():
            if state.position in (OFFSET_BEGINNING, OFFSET_END):
                info = self.describe(topic, partition, None)
                end = "last_stable_offset" if self._read_committed else "high_watermark"
                key = "log_start_offset" if state.position == OFFSET_BEGINNING else end
                state.position = info[key]
            if state.position >= 0 and state.fetched_next < 0:
                state.fetched_next = state.position

    def _reset_target(self, tp: TopicKey) -> int:
        reset = self._config.auto_offset_reset
        if reset == "error":
            raise KafkaException(
                KafkaError(
                    KafkaError._AUTO_OFFSET_RESET,
                    f"{tp[0]} [{tp[1]}] has no committed offset and auto.offset.reset is error",
                )
            )
        return OFFSET_BEGINNING if reset == "earliest" else OFFSET_END

    def describe(self, topic: str, partition: int, timeout: float | None) -> dict[str, Any]:
        described = self._http.call(
            "GET", api_path("topics", topic), deadline=self._http.deadline(timeout)
        )
        for info in described["partitions"]:
            if info["partition"] == partition:
                result: dict[str, Any] = info
                return result
        raise UnknownTopicOrPartition(f"{topic} has no partition {partition}")

    def chosen(self, partitions: Iterable[TopicPartition]) -> dict[TopicKey, Assigned]:
        chosen: dict[TopicKey, Assigned] = {}
        for tp in partitions:
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"expected TopicPartition, not {type(tp).__name__}")
            if tp.partition < 0:
                raise ValueError(f"{tp}: assign() needs a partition number")
            offset = OFFSET_STORED if tp.offset == OFFSET_INVALID else tp.offset
            chosen[(tp.topic, tp.partition)] = Assigned(offset)
        return chosen

    def replace(self, chosen: dict[TopicKey, Assigned]) -> None:
        """Read exactly these partitions from now on."""
        self.assigned.clear()
        self.rotation.clear()
        self.add(chosen)

    def add(self, chosen: dict[TopicKey, Assigned]) -> None:
        for key, state in chosen.items():
            if key not in self.assigned:
                self.rotation.append(key)
            self.assigned[key] = state

    def drop(self, keys: set[TopicKey]) -> None:
        for key in keys:
            self.assigned.pop(key, None)
        kept = [k for k in self.rotation if k in self.assigned]
        self.rotation.clear()
        self.rotation.extend(kept)

    def committed(
        self, group: str, topics: set[str], timeout: float | None, *, once: bool = False
    ) -> dict[TopicKey, tuple[int, str | None]]:
        """Committed (offset, metadata) per partition of `topics`; `once`: a single attempt
        (poll() retries on its next round), else retried until `timeout`."""
        params: dict[str, str | int] = {"require_stable": str(self._read_committed).lower()}
        result: dict[TopicKey, tuple[int, str | None]] = {}
        deadline = self._http.deadline(timeout)
        for topic in sorted(topics):
            path = api_path("groups", group, "offsets")
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
