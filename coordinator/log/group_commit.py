"""Group commit: a process's appends to one store, written together. Appends that arrive while a
unit of work is writing wait and go together in the next one: with no timer, a lone append on
an idle service goes at once, and under load the group grows by itself, bounded by
`GROUP_MAX_BATCHES` and `GROUP_MAX_BYTES`. Appends to a partition another unit is writing wait
for it, in arrival order. If a group's unit of work fails, each batch is appended alone, so one
that cannot be written cannot fail the others."""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, replace

from coordinator.core.errors import StoreUnavailable
from coordinator.core.settings import Settings
from coordinator.log import configs, purgatory
from coordinator.log.edge import Append, Appended
from coordinator.log.planning import Seen, write_group, write_optimistic
from coordinator.log.sequences import in_sequence_order
from coordinator.store import Store

# A group takes waiting appends until it holds this many batches or bytes (it always takes the
# first waiting request whole, and never splits one).
GROUP_MAX_BATCHES = 512
GROUP_MAX_BYTES = 16 * 1024 * 1024


@dataclass(slots=True)
class _Request:
    """One caller's appends, answered together."""

    appends: Sequence[Append]
    answers: list[asyncio.Future[Appended]]
    size: int
    partitions: frozenset[tuple[str, int]]


class _GroupCommit:
    """A process's appends to one store: up to `in_flight` units of work write at once, and
    appends that arrive while they all write wait for the next one free, which takes them all
    (up to the bounds), but for those to a partition another unit is writing: they go after it,
    in the order they came. So a producer's pipelined batches reach the rules in the order it
    sent them (as a Kafka broker reads a connection's requests in order), and two units never
    wait on each other's partition locks."""

    def __init__(self, db: Store, settings: Settings) -> None:
        self._db, self._settings = db, settings
        self._in_flight = db.writers
        # A store in process costs no round trips for a unit of work, so none are saved.
        self._seen = Seen() if db.remote else None
        self._loop = asyncio.get_running_loop()
        self._waiting: deque[_Request] = deque()
        self._writing: set[tuple[str, int]] = set()  # the partitions units are writing
        self._writers: set[asyncio.Task[None]] = set()

    def submit(self, batch: Sequence[Append]) -> Awaitable[list[Appended | BaseException]]:
        """Queue `batch` behind every append queued before it, now; the answers when written."""
        answers = [self._loop.create_future() for _ in batch]
        size = sum(len(a.data) for a in batch)
        partitions = frozenset((a.topic, a.partition) for a in batch)
        self._waiting.append(_Request(batch, answers, size, partitions))
        if len(self._writers) < self._in_flight:
            self._writers.add(self._loop.create_task(self._write_waiting()))
        return asyncio.gather(*answers, return_exceptions=True)

    async def _write_waiting(self) -> None:
        try:
            # Requests left waiting wait for a partition another writer is writing: that
            # writer takes them when it is done.
            while group := self._next_group():
                partitions = frozenset().union(*(request.partitions for request in group))
                self._writing |= partitions
                try:
                    await self._write(group)
                finally:
                    self._writing -= partitions
        except asyncio.CancelledError:
            while self._waiting:  # the loop is closing: nothing more is written
                for answer in self._waiting.popleft().answers:
                    answer.cancel()
            raise
        finally:
            # Here, not in a done callback: an append arriving before that callback ran would
            # count this writer as busy and wait for nobody.
            task = asyncio.current_task()
            assert task is not None
            self._writers.discard(task)

    def _next_group(self) -> list[_Request]:
        """The waiting requests the next unit takes, in arrival order, up to the bounds; one
        to a partition being written stays, and so does every later one to its partitions."""
        group: list[_Request] = []
        count = size = 0
        held = set(self._writing)
        behind: list[_Request] = []
        while self._waiting:
            request = self._waiting[0]
            if request.partitions.isdisjoint(held):
                count += len(request.appends)
                size += request.size
                if group and (count > GROUP_MAX_BATCHES or size > GROUP_MAX_BYTES):
                    break
                group.append(request)
            else:
                held |= request.partitions
                behind.append(request)
            self._waiting.popleft()
        self._waiting.extendleft(reversed(behind))
        return group

    async def _write(self, group: list[_Request]) -> None:
        batch = [a for request in group for a in request.appends]
        answers = [f for request in group for f in request.answers]
        order = in_sequence_order(batch)
        batch, answers = [batch[i] for i in order], [answers[i] for i in order]
        try:
            written: Sequence[Appended | BaseException] | None = None
            if self._seen is not None:
                written = await write_optimistic(self._db, self._settings, batch, self._seen)
            if written is None:
                written = await write_group(self._db, self._settings, batch, self._seen)
            results = list(written)
        except asyncio.CancelledError:
            for answer in answers:
                answer.cancel()
            raise
        except StoreUnavailable as exc:
            # Whether the group was written is unknown: only the clients may retry (a retry of
            # an idempotent batch is found a duplicate; here it would append a plain one twice).
            results = [exc] * len(batch)
        except Exception as exc:
            # One batch the store refused must not fail the others: each goes alone.
            results = [exc] if len(batch) == 1 else [await self._write_alone(a) for a in batch]
        appended = {
            (append.topic, append.partition)
            for append, result in zip(batch, results, strict=True)
            if isinstance(result, Appended)
        }
        purgatory.moved(self._db, appended)
        for answer, result in zip(answers, results, strict=True):
            if answer.done():  # its caller went away; the append stands, as in Kafka
                continue
            if isinstance(result, BaseException):
                answer.set_exception(result)
            else:
                answer.set_result(result)

    async def _write_alone(self, append: Append) -> Appended | BaseException:
        try:
            return (await write_group(self._db, self._settings, [append], self._seen))[0]
        except Exception as exc:
            return exc


_group_commits: weakref.WeakKeyDictionary[Store, _GroupCommit] = weakref.WeakKeyDictionary()


def transaction_ended(db: Store, producer_id: int, partitions: Iterable[tuple[str, int]]) -> None:
    """A transaction of `producer_id` ended on `partitions` in this process, its markers
    committed: what the process saw of the producer there no longer shows it open. So the first
    batch of its next transaction at the same epoch (transaction version 1, where the end does
    not raise it) is planned to join in one statement, as version 2's is. The statement checks
    every view on the locked rows: one that is wrong (another process wrote since) only sends
    the group to the locking path."""
    ended = list(partitions)
    purgatory.moved(db, ended)
    commits = _group_commits.get(db)
    seen = None if commits is None else commits._seen
    if seen is None:
        return
    for topic, partition in ended:
        key = (topic, partition, producer_id)
        view = seen.views.get(key)
        if view is not None:
            # A new view, not the old one changed: a group planned on the old one meanwhile
            # keeps its expectation, which the rows now refute, so it takes the locking path.
            seen.views[key] = replace(view, open_txn_offset=None)


def submit_all(
    db: Store, settings: Settings, batch: Sequence[Append]
) -> Awaitable[list[Appended | BaseException]]:
    """Queue the checked batches for appending, now, behind every append queued before them
    (in one unit of work with whatever else is waiting): awaited, each one's answer, or the
    error it alone failed with, in order. A caller that must not let a later append overtake
    this one (the Kafka door, reading a connection's next Produce) goes on once this returns."""
    commits = _group_commits.get(db)
    if commits is None or commits._loop is not asyncio.get_running_loop():
        commits = _group_commits[db] = _GroupCommit(db, settings)
    return commits.submit(batch)


def topic_codec(db: Store, settings: Settings, topic: str) -> int | None:
    """The codec `topic`'s compression.type asks for, as this process's appends last saw it
    (None: the producer's, or not seen; the append recompresses if it must)."""
    commits = _group_commits.get(db)
    stored = None if commits is None or commits._seen is None else commits._seen.configs.get(topic)
    if stored is None:
        return None
    return configs.produce_settings(stored, settings.max_request_bytes).codec


async def append_all(
    db: Store, settings: Settings, batch: Sequence[Append]
) -> list[Appended | BaseException]:
    """`submit_all`, awaited."""
    return await submit_all(db, settings, batch)
