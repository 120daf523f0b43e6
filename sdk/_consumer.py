"""The Consumer: confluent-kafka's surface (subscribe, assign, seek, poll, consume, commit,
committed, position, close) over the fetch, group-offset and membership endpoints;
read_committed by default.

`poll()` and `consume()` fetch on the caller's thread. Partitions are either assigned explicitly
(`assign()`) or shared with the group's other members (`subscribe()`): then a heartbeat thread
(`sdk._membership`) keeps the membership, and the rebalance callbacks (`on_assign`, `on_revoke`,
`on_lost`) run on the caller's thread inside `poll()`/`consume()`; a partition is given up only
after `on_revoke` returned. Commits of a subscribed consumer carry its member id and epoch, so the
coordinator refuses them once its partitions moved on (KIP-447).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, Unpack

from sdk._callbacks import Callbacks
from sdk._config import ConsumerConfig, ConsumerOptions, build_config
from sdk._errors import (
    ConfigError,
    IllegalStateError,
    KafkaError,
    KafkaException,
)
from sdk._fetcher import Assigned, Fetcher, TopicKey
from sdk._http import HttpClient, api_path
from sdk._lifecycle import Closeable
from sdk._membership import POLL_TIMEOUT, Membership, max_poll_error
from sdk._types import (
    OFFSET_INVALID,
    ConsumerGroupMetadata,
    Message,
    RebalanceCallback,
    TopicPartition,
)

__all__ = ["Consumer"]

log = logging.getLogger("sdk")


class Consumer(Closeable):
    """Reads records from the partitions it is assigned, or that its group gives it after
    `subscribe()`; commits offsets for `group.id`.

        Consumer({"coordinator.url": "http://127.0.0.1:8080", "group.id": "etl",
                  "auto.offset.reset": "earliest"})

    Every method raises `IllegalStateError` once the consumer is closed.
    """

    _what = "the consumer"

    def __init__(
        self,
        config: Mapping[str, object] | ConsumerConfig | None = None,
        /,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        self.config: ConsumerConfig = build_config(ConsumerConfig, config, options)
        self._http = HttpClient(self.config)
        self._read_committed = self.config.isolation_level == "read_committed"
        self._fetcher = Fetcher(self.config, self._http)
        self._auto_committed: dict[TopicKey, int] = {}
        self._next_auto_commit = time.monotonic() + self.config.auto_commit_interval_ms / 1000
        self._closed = False
        self._callbacks = Callbacks(self.config, "consumer", self._statistics)
        self._log = self._callbacks.log
        # Group membership, after subscribe().
        self._member: Membership | None = None
        self._on_assign: RebalanceCallback | None = None
        self._on_revoke: RebalanceCallback | None = None
        self._on_lost: RebalanceCallback | None = None
        # While a rebalance callback runs: which one, and the partitions it was given.
        self._in_callback: tuple[str, set[TopicKey]] | None = None
        self._stored: dict[TopicKey, tuple[int, str | None]] = {}
        self._commit_reports: deque[tuple[KafkaError | None, list[TopicPartition]]] = deque()
        self._returned = 0

    # -- assignment -------------------------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions from now on. A partition's `offset` says where to start:
        an offset, `OFFSET_BEGINNING`, `OFFSET_END`, or (the default) the group's committed
        offset, else `auto.offset.reset`.

        After `subscribe()` the group assigns: then `assign()` is allowed only inside `on_assign`
        (as code written for the eager protocol does), where it takes the partitions given (with
        the offsets it sets) and keeps the others. Raises `IllegalStateError` elsewhere."""
        self._check_open()
        chosen = self._fetcher.chosen(partitions)
        if self._member is not None:
            self._require_callback("assign", "assign()")
            self._fetcher.add(chosen)
            return
        self._fetcher.replace(chosen)

    def unassign(self) -> None:
        self._check_open()
        if self._member is not None:
            given = self._require_callback("revoke", "unassign()")
            self._drop_partitions(given)
            return
        self.assign([])

    def incremental_assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Add these partitions to the assignment (with the offsets they carry, as `assign()`).
        After `subscribe()` only inside `on_assign`; raises `IllegalStateError` elsewhere."""
        self._check_open()
        chosen = self._fetcher.chosen(partitions)
        if self._member is not None:
            self._require_callback("assign", "incremental_assign()")
        self._fetcher.add(chosen)

    def incremental_unassign(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop reading these partitions. After `subscribe()` only inside `on_revoke`/`on_lost`
        (the partitions go anyway when it returns); raises `IllegalStateError` elsewhere."""
        self._check_open()
        keys = {(tp.topic, tp.partition) for tp in partitions}
        if self._member is not None:
            self._require_callback("revoke", "incremental_unassign()")
        self._drop_partitions(keys)

    def assignment(self) -> list[TopicPartition]:
        self._check_open()
        return [TopicPartition(t, p) for t, p in self._fetcher.assigned]

    # -- group membership -------------------------------------------------------------------------

    def subscribe(
        self,
        topics: Iterable[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """Share these topics' partitions with the other consumers of `group.id`: the
        coordinator assigns them and moves them as members come and go. Subscribing again
        replaces the topics (and the callbacks).

        The callbacks run on the caller's thread inside `poll()`/`consume()`, with this consumer
        and a list of `TopicPartition`: `on_assign` with partitions just given (set their
        `offset`, or call `assign()`/`incremental_assign()` with them, to choose where to start;
        by default the committed offset, else `auto.offset.reset`); `on_revoke` with partitions to
        give up: they are given up when it returns, so a commit there (or
        `send_offsets_to_transaction` and `commit_transaction`) lands first; `on_lost` (default:
        `on_revoke`) with partitions already gone to others (the session timed out, or the member
        was fenced): commits of them are refused, so abort the transaction in progress.

        Raises `ConfigError` without `group.id`, `ValueError` for a regular expression (only
        topic names are supported), `IllegalStateError` after `assign()` (call `unassign()`).
        """
        self._check_open()
        if self.config.group_id is None:
            raise ConfigError("group.id: required to subscribe()")
        names = [topics] if isinstance(topics, str) else list(topics)
        for name in names:
            if not isinstance(name, str) or not name:
                raise ValueError(f"topics: expected topic names, not {name!r}")
            if name.startswith("^"):
                raise ValueError(
                    f"topics: {name!r} is a regular expression; subscribe() takes topic names"
                )
        if self._member is None and self._fetcher.assigned:
            raise IllegalStateError("partitions were assign()ed: call unassign() first")
        self._on_assign, self._on_revoke, self._on_lost = on_assign, on_revoke, on_lost
        if self._member is None:
            self._member = Membership(self.config, self.config.group_id, self._callbacks)
        self._member.subscribe(names)

    def unsubscribe(self) -> None:
        """Leave the group: the partitions are given up (`on_revoke` runs, after an auto-commit
        when `enable.auto.commit`) and go to the other members at once."""
        self._check_open()
        self._leave_group()

    def consumer_group_metadata(self) -> ConsumerGroupMetadata:
        """The group, and while subscribed this member's id and epoch: pass it to
        `Producer.send_offsets_to_transaction`, which the coordinator then fences if the member
        no longer owns the partitions (KIP-447)."""
        group = self._group()
        identity = self._member.identity() if self._member is not None else None
        if identity is None:
            return ConsumerGroupMetadata(group)
        return ConsumerGroupMetadata(group, *identity)

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
            if self._member is not None:
                self._serve_group(messages)
            self._fetcher.take(messages, num_messages)
            if len(messages) >= num_messages:
                break
            if self._fetcher.fetch_round(deadline):
                continue
            if messages:
                break
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            pause = self.config.fetch_wait_max_ms / 1000
            time.sleep(pause if remaining is None else min(pause, remaining))
        self._returned += len(messages)
        self._maybe_auto_commit()
        self._serve_callbacks()
        return messages

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        """(log start offset, high watermark) of a partition."""
        self._check_open()
        info = self._fetcher.describe(partition.topic, partition.partition, timeout)
        return info["log_start_offset"], info["high_watermark"]

    # -- offsets ----------------------------------------------------------------------------------

    def commit(
        self,
        message: Message | None = None,
        offsets: Iterable[TopicPartition] | None = None,
        asynchronous: bool = False,
    ) -> list[TopicPartition] | None:
        """Commit offsets for `group.id`: `offsets` as given, or past `message`, or (neither)
        the stored offset of every assigned partition (its position, with
        `enable.auto.offset.store`). Returns the committed offsets, or None when `asynchronous`
        (the commit is done before the call returns either way; `on_commit` hears of it).
        A subscribed consumer commits as its member (id and epoch).

        Raises `KafkaTimeoutError` (retriable: call again) when the service did not answer
        within `default.api.timeout.ms`; `IllegalStateError` without `group.id`;
        `UnknownMemberId`/`FencedMemberEpoch` when the partitions are no longer this member's
        (nothing was committed: they were or will be revoked or lost, and the consumer joins
        again by itself).
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
            chosen = self._to_commit()
        chosen = [tp for tp in chosen if tp.offset >= 0]
        if chosen:
            entries = []
            for tp in chosen:
                entry: dict[str, Any] = {"topic": tp.topic, "partition": tp.partition}
                entry["offset"] = tp.offset
                if tp.metadata is not None:
                    entry["metadata"] = tp.metadata
                entries.append(entry)
            body: dict[str, Any] = {"offsets": entries}
            identity = self._member.identity() if self._member is not None else None
            if identity is not None:
                body["member_id"], body["member_epoch"] = identity
            path = api_path("groups", group, "offsets")
            try:
                self._http.call("POST", path, body=body)
            except KafkaException as exc:
                self._report_commit(exc.error, chosen)
                raise
            self._report_commit(None, chosen)
            for tp in chosen:
                self._auto_committed[(tp.topic, tp.partition)] = tp.offset
        return None if asynchronous else chosen

    def store_offsets(
        self, message: Message | None = None, offsets: Iterable[TopicPartition] | None = None
    ) -> None:
        """Store the offset past `message`, or `offsets` as given, for the next commit (auto or
        `commit()` without arguments). Meant for `enable.auto.offset.store` false: store what was
        processed, and auto-commit commits only that. Raises `IllegalStateError` for a partition
        not assigned."""
        self._check_open()
        if message is not None:
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            if topic is None or partition is None or offset is None:
                raise ValueError("the message has no topic, partition or offset")
            chosen = [TopicPartition(topic, partition, offset + 1)]
        elif offsets is not None:
            chosen = list(offsets)
        else:
            raise ValueError("store_offsets() needs a message or offsets")
        for tp in chosen:
            self._state_of(tp)
            self._stored[(tp.topic, tp.partition)] = (tp.offset, tp.metadata)

    def committed(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """The group's committed offsets of `partitions` (`OFFSET_INVALID` where none). With
        read_committed, waits (up to `timeout`) while a transaction holds pending offsets for
        them, so a restarted job never resumes from a stale offset (KIP-447).

        Raises `KafkaTimeoutError` (retriable) when not answered within `timeout`."""
        wanted = list(partitions)
        by_topic = self._fetcher.committed(self._group(), {tp.topic for tp in wanted}, timeout)
        return [
            TopicPartition(
                tp.topic,
                tp.partition,
                *by_topic.get((tp.topic, tp.partition), (OFFSET_INVALID, None)),
            )
            for tp in wanted
        ]

    def close(self) -> None:
        """Commit the positions (with `enable.auto.commit` and a `group.id`); when subscribed,
        give up the partitions (`on_revoke`) and leave the group; then release the connections.
        Closing again does nothing."""
        self._close_once(self._release)

    def _release(self) -> None:
        try:
            if self._member is not None:
                self._leave_group()
            elif self.config.enable_auto_commit and self.config.group_id is not None:
                self._auto_commit()
        finally:
            self._http.close()

    # -- internals --------------------------------------------------------------------------------

    def _group(self) -> str:
        self._check_open()
        if self.config.group_id is None:
            raise IllegalStateError("this consumer has no group.id")
        return self.config.group_id

    def _state_of(self, tp: TopicPartition) -> Assigned:
        self._check_open()
        state = self._fetcher.assigned.get((tp.topic, tp.partition))
        if state is None:
            raise IllegalStateError(f"{tp.topic} [{tp.partition}] is not assigned")
        return state

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

    def _auto_commit(self, only: set[TopicKey] | None = None) -> None:
        changed = [
            tp
            for tp in self._to_commit()
            if self._auto_committed.get((tp.topic, tp.partition)) != tp.offset
            and (only is None or (tp.topic, tp.partition) in only)
        ]
        if changed:
            self.commit(offsets=changed)

    def _to_commit(self) -> list[TopicPartition]:
        """What a commit without arguments commits: the position of every assigned partition,
        or with `enable.auto.offset.store` false what `store_offsets()` stored."""
        if not self.config.enable_auto_offset_store:
            return [
                TopicPartition(t, p, offset, metadata)
                for (t, p), (offset, metadata) in self._stored.items()
                if (t, p) in self._fetcher.assigned
            ]
        return [
            TopicPartition(t, p, state.position)
            for (t, p), state in self._fetcher.assigned.items()
            if state.position >= 0
        ]

    def _report_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if self.config.on_commit is not None:
            self._commit_reports.append((error, list(partitions)))

    def _serve_callbacks(self) -> None:
        """`on_commit`, `error_cb` and `stats_cb`, on the caller's thread."""
        while self._commit_reports and self.config.on_commit is not None:
            error, partitions = self._commit_reports.popleft()
            self.config.on_commit(error, partitions)
        self._callbacks.serve()

    def _statistics(self) -> dict[str, Any]:
        topics: dict[str, Any] = {}
        for (topic, partition), state in self._fetcher.assigned.items():
            entry = topics.setdefault(topic, {"topic": topic, "partitions": {}})
            entry["partitions"][str(partition)] = {
                "partition": partition,
                "app_offset": state.position,
                "committed_offset": self._auto_committed.get((topic, partition), OFFSET_INVALID),
                "msgq_cnt": len(state.buffer),
            }
        figures: dict[str, Any] = {"rxmsgs": self._returned, "topics": topics}
        if self._member is not None:
            figures["cgrp"] = {
                "state": self._member.state(),
                "rebalance_cnt": self._member.rebalances,
                "assignment_size": len(self._fetcher.assigned),
            }
        return figures

    # -- group membership internals ---------------------------------------------------------------

    def _drop_partitions(self, keys: set[TopicKey]) -> None:
        self._fetcher.drop(keys)
        for key in keys:
            self._stored.pop(key, None)

    def _require_callback(self, kind: str, call: str) -> set[TopicKey]:
        """Inside the `kind` rebalance callback ("revoke" covers `on_lost` too): its partitions."""
        running = self._in_callback
        kinds = ("revoke", "lost") if kind == "revoke" else (kind,)
        if running is None or running[0] not in kinds:
            where = "on_assign" if kind == "assign" else "on_revoke or on_lost"
            raise IllegalStateError(
                f"{call}: this consumer is subscribed, so the group assigns its partitions; "
                f"call it only inside {where}, or unsubscribe() first"
            )
        return set(running[1])

    def _serve_group(self, messages: list[Message]) -> None:
        """Act on what the coordinator decided: partitions lost, revoked, assigned; each
        callback on this thread, the partitions given up only once it returned."""
        member = self._member
        assert member is not None
        changes = member.changes()
        if changes.failure is not None:
            raise changes.failure
        if changes.lost is not None:
            lost = set(self._fetcher.assigned)
            try:
                self._callback("lost", self._on_lost or self._on_revoke, lost)
            finally:
                self._drop_partitions(lost)
                member.ack_lost()
            if changes.lost == POLL_TIMEOUT:
                interval = self.config.max_poll_interval_ms
                messages.append(Message(None, error=max_poll_error(interval)))
            return
        if changes.assignment is None:
            return
        revoked = set(self._fetcher.assigned) - changes.assignment
        if revoked:
            try:
                if self.config.enable_auto_commit:
                    self._commit_quietly(revoked)
                self._callback("revoke", self._on_revoke, revoked)
            finally:
                self._drop_partitions(revoked)
                member.set_owned(set(self._fetcher.assigned))
        added = set(changes.assignment - set(self._fetcher.assigned))
        if added:
            given = [TopicPartition(t, p) for t, p in sorted(added)]
            try:
                self._callback("assign", self._on_assign, added, given)
            finally:
                self._fetcher.add(
                    self._fetcher.chosen(
                        tp for tp in given if (tp.topic, tp.partition) not in self._fetcher.assigned
                    )
                )
                member.set_owned(set(self._fetcher.assigned))

    def _callback(
        self,
        kind: str,
        callback: RebalanceCallback | None,
        keys: set[TopicKey],
        given: list[TopicPartition] | None = None,
    ) -> None:
        if callback is None:
            return
        partitions = given if given is not None else [TopicPartition(t, p) for t, p in sorted(keys)]
        self._in_callback = (kind, keys)
        try:
            callback(self, partitions)
        finally:
            self._in_callback = None

    def _commit_quietly(self, only: set[TopicKey]) -> None:
        """Auto-commit before giving partitions up; a refusal is reported, not raised."""
        try:
            self._auto_commit(only)
        except KafkaException as exc:
            self._callbacks.error(exc.error)

    def _leave_group(self) -> None:
        member = self._member
        if member is None:
            return
        try:
            changes = member.changes()
            owned = set(self._fetcher.assigned)
            if owned and changes.lost is None and changes.failure is None:
                try:
                    if self.config.enable_auto_commit:
                        self._commit_quietly(owned)
                    self._callback("revoke", self._on_revoke, owned)
                finally:
                    self._drop_partitions(owned)
            else:
                self._drop_partitions(owned)
        finally:
            self._member = None
            member.leave()
            self._serve_callbacks()
