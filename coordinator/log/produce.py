"""Produce, for every front door (HTTP JSON, HTTP record batches, Kafka's protocol): a record batch
checked at the edge, then appended with whatever else is waiting, in one unit of work.

**The edge.** `check_batch` proves a batch well formed, not inflating past its bounds and
acceptable from a producer, before any database work; JSON produce builds its batch at the edge
(`batch_from_json`). Large compressed batches are inflated on a worker thread.

**Group commit.** Appends that arrive while a unit of work is writing wait and go together in the
next one (`_GroupCommit`): with no timer, a lone append on an idle service goes at once, and under
load the group grows by itself, bounded by `GROUP_MAX_BATCHES` and `GROUP_MAX_BYTES`. Appends to a
partition another unit is writing wait for it, in arrival order, and a group sees a producer's
batches to a partition in sequence order (`in_sequence_order`): a producer's pipelined requests
race on their connections, and the rules must not refuse the later for arriving first when both
wait together. A group's unit of work takes its locks in the fixed order (the transactional ids its
batches join, sorted, then its partitions, sorted, in one statement each), reads the producers'
epochs and states in two more, applies API.md's rules to each batch in that order (`sequence_rule`,
a pure function, with the group's own earlier batches seen as written), and writes every accepted
batch, producer state and high watermark in one statement each (`appends`). A batch that fails its
checks fails alone and writes nothing; if the unit of work itself fails, each batch is appended
alone, so one that cannot be written cannot fail the others. A Kafka Produce request's partitions
go in one group. Several processes on one store stay correct: the row locks decide.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from coordinator.core.clock import now_ms
from coordinator.core.errors import CoordinatorError, InvalidRequest, StoreUnavailable
from coordinator.core.memory import request_memory
from coordinator.core.schemas import INT32_MAX
from coordinator.core.settings import Settings
from coordinator.log import appends, configs
from coordinator.log.errors import (
    BatchTooLarge,
    CorruptMessage,
    InvalidProducerEpoch,
    InvalidRecord,
    InvalidTxnState,
    OutOfOrderSequenceNumber,
    RecordListTooLarge,
    UnknownProducerId,
    UnknownTopicOrPartition,
)
from coordinator.log.schemas import ProduceRequest
from coordinator.store import Store
from sdk import recordbatch

# A group takes waiting appends until it holds this many batches or bytes (it always takes the
# first waiting request whole, and never splits one).
GROUP_MAX_BATCHES = 512
GROUP_MAX_BYTES = 16 * 1024 * 1024


class GroupTransactions(Protocol):
    """What an append group needs of the transactions its batches join. The log declares it;
    the app gives it the transactions domain's (`use_transactions`, from
    `coordinator.app.wire_domains`), so the log never imports that domain."""

    async def lock(self, transactional_ids: Collection[str]) -> None:
        """Lock them in the fixed order: sorted, before any partition."""

    async def check(self, transactional_id: str, producer_id: int, epoch: int) -> None:
        """API.md's checks of a transactional batch (the id, the caller, the state): raises."""

    def join(self, transactional_id: str, topic: str, partition: int, now: int) -> None:
        """Add the partition to the transaction (written by `write`)."""

    async def write(self) -> None:
        """The joins' writes, in the group's unit of work."""


_transactions: Callable[[AsyncSession], GroupTransactions] | None = None
# The state of a transaction that takes batches into the partitions it already includes, and the
# states in which a batch may join (and start) one, which it then is in (what an optimistic
# group's statement checks), named by the transactions domain.
_open_state: str | None = None
_joinable_states: tuple[str, ...] = ()


def use_transactions(
    provider: Callable[[AsyncSession], GroupTransactions],
    open_state: str,
    joinable_states: Collection[str],
) -> None:
    """How append groups reach the transactions their batches join; the state in which a
    transaction takes batches without a change, and those in which a batch may join it, which
    leave it in `open_state` (set by `coordinator.app.wire_domains`)."""
    global _transactions, _open_state, _joinable_states
    _transactions, _open_state = provider, open_state
    _joinable_states = tuple(joinable_states)


def next_sequence(sequence: int) -> int:
    """Sequences wrap from 2**31-1 to 0, as in Kafka."""
    return 0 if sequence == INT32_MAX else sequence + 1


def last_sequence_of(base_sequence: int, count: int) -> int:
    return (base_sequence + count - 1) % (INT32_MAX + 1)


@dataclass(frozen=True, slots=True)
class Appended:
    """A produce's answer: what both front doors need (Kafka's ProduceResponse included)."""

    base_offset: int
    last_offset: int
    duplicate: bool
    log_append_time: int  # the append time for a LogAppendTime topic, else -1
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class Append:
    """One checked batch to append to a partition."""

    topic: str
    partition: int
    data: bytes
    checked: recordbatch.Checked
    transactional_id: str | None


# -- the edge -----------------------------------------------------------------------------------


def _decoder(encoding: str) -> Callable[[str], bytes]:
    if encoding == "utf8":
        return str.encode

    def from_base64(text: str) -> bytes:
        return base64.b64decode(text, validate=True)

    return from_base64


def batch_from_json(body: ProduceRequest, now: int) -> tuple[bytes, recordbatch.Checked]:
    """The request's records as one record batch (uncompressed), built at the edge, with what
    `recordbatch.check` would find in it; a value that is not valid in its encoding is 422
    naming it. Records without a timestamp get `now`."""
    to_bytes = _decoder(body.encoding)
    built: list[recordbatch.BuildRecord] = []
    has_null_key = False
    for i, record in enumerate(body.records):
        field_name = "key"
        try:
            key = None if record.key is None else to_bytes(record.key)
            field_name = "value"
            value = None if record.value is None else to_bytes(record.value)
            field_name = "headers"
            headers = [(name, to_bytes(v)) for name, v in record.headers.items()]
            for name, _ in headers:
                name.encode()
        except (UnicodeEncodeError, binascii.Error, ValueError) as exc:
            raise InvalidRequest(
                f"records.{i}.{field_name}: not valid {body.encoding} ({exc.__class__.__name__})"
            ) from None
        timestamp = now if record.timestamp is None else record.timestamp
        built.append((timestamp, key, value, headers))
        has_null_key = has_null_key or key is None
    data = recordbatch.build(
        built,
        producer_id=body.producer_id,
        producer_epoch=body.producer_epoch,
        base_sequence=body.base_sequence,
        transactional=body.transactional_id is not None,
    )
    header = recordbatch.read_header(data)
    return data, recordbatch.Checked(header, header.max_timestamp, has_null_key)


# Compressed batches at least this large are checked on a worker thread: inflating and walking
# them takes long enough that the event loop (every other client of the process) must not wait.
_CHECK_OFF_LOOP_BYTES = 16 * 1024
# Inflating up to this much is always allowed, whatever the ratio (small batches compress well).
_INFLATION_FLOOR_BYTES = 1024 * 1024


def inflation_limit(settings: Settings, size: int) -> int:
    """How far a compressed batch of `size` bytes may inflate: the absolute cap, and the ratio
    cap above a floor."""
    by_ratio = max(_INFLATION_FLOOR_BYTES, size * settings.max_compression_ratio)
    return min(settings.max_uncompressed_batch_bytes, by_ratio)


async def check_batch(
    settings: Settings, data: bytes, transactional_id: str | None
) -> recordbatch.Checked:
    """A batch's own checks, before any database work: well formed (CORRUPT_MESSAGE), not
    inflating past its bounds (RECORD_LIST_TOO_LARGE), then acceptable from a producer
    (INVALID_RECORD)."""
    limit = inflation_limit(settings, len(data))
    try:
        if len(data) >= _CHECK_OFF_LOOP_BYTES and recordbatch.read_header(data).compression:
            # Inflated on a worker thread, holding up to `limit` bytes: reserved first from the
            # process's request memory, so concurrent bombs inflate in turn, within the budget.
            async with request_memory().reserve(limit):
                checked = await asyncio.to_thread(recordbatch.check, data, limit)
        else:
            checked = recordbatch.check(data, limit)
    except recordbatch.InflatesTooFar as exc:
        raise RecordListTooLarge(
            f"{exc} (a {len(data)}-byte batch may inflate to {limit} bytes: "
            "COORDINATOR_MAX_UNCOMPRESSED_BATCH_BYTES, COORDINATOR_MAX_COMPRESSION_RATIO)"
        ) from None
    except recordbatch.CorruptBatch as exc:
        raise CorruptMessage(f"not a well-formed record batch: {exc}") from None
    _acceptable(checked, transactional_id)
    return checked


def _acceptable(checked: recordbatch.Checked, transactional_id: str | None) -> None:
    header = checked.header
    if header.is_control:
        raise InvalidRecord("a producer may not send a control batch")
    if header.is_transactional and transactional_id is None:
        raise InvalidRecord("a transactional batch needs the transactional_id parameter")
    if transactional_id is not None and not header.is_transactional:
        raise InvalidRecord("transactional_id is given but the batch is not transactional")
    if header.producer_id < -1:
        raise InvalidRecord(f"producer id {header.producer_id}: -1 or a producer id")
    if header.producer_id >= 0 and (header.producer_epoch < 0 or header.base_sequence < 0):
        raise InvalidRecord("a batch with a producer id needs its epoch and base sequence")
    if header.producer_id < 0 and header.is_transactional:
        raise InvalidRecord("a transactional batch needs a producer id")


async def produce_batch(
    db: Store,
    settings: Settings,
    topic: str,
    partition: int,
    data: bytes,
    transactional_id: str | None,
) -> Appended:
    """Append one record batch, as API.md's Records section says."""
    checked = await check_batch(settings, data, transactional_id)
    append = Append(topic, partition, data, checked, transactional_id)
    return _answer((await append_all(db, settings, [append]))[0])


async def produce_json(
    db: Store, settings: Settings, topic: str, partition: int, body: ProduceRequest
) -> Appended:
    """JSON produce: a batch built at the edge, appended as a binary one is (it skips only the
    walk over its records, which it has just written)."""
    data, checked = batch_from_json(body, now_ms())
    _acceptable(checked, body.transactional_id)
    append = Append(topic, partition, data, checked, body.transactional_id)
    return _answer((await append_all(db, settings, [append]))[0])


def _answer(result: Appended | BaseException) -> Appended:
    if isinstance(result, BaseException):
        raise result
    return result


# -- group commit -------------------------------------------------------------------------------


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
        self._seen = _Seen() if db.remote else None
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


def in_sequence_order(batch: Sequence[Append]) -> list[int]:
    """The indices of `batch` in the order the rules see them: arrival order, but a producer's
    batches to one partition (at one epoch) in sequence order, in the places they came in.
    Requests sent one after another on different connections may arrive in either order; in
    one group, the later no longer fails as out of order for coming first. Sequences wrap at
    INT32_MAX: past the wrap, the small ones come after the large."""
    chains: dict[tuple[str, int, int, int], list[int]] = {}
    for i, append in enumerate(batch):
        header = append.checked.header
        if header.producer_id >= 0:
            key = (append.topic, append.partition, header.producer_id, header.producer_epoch)
            chains.setdefault(key, []).append(i)
    order = list(range(len(batch)))
    for places in chains.values():
        if len(places) < 2:
            continue
        sequences = {i: batch[i].checked.header.base_sequence for i in places}
        wrapped = max(sequences.values()) - min(sequences.values()) > _HALF_SEQUENCE
        for place, i in zip(
            places,
            sorted(places, key=lambda i: _unwrapped(sequences[i], wrapped)),
            strict=True,
        ):
            order[place] = i
    return order


_HALF_SEQUENCE = (INT32_MAX + 1) // 2


def _unwrapped(sequence: int, wrapped: bool) -> int:
    return sequence + INT32_MAX + 1 if wrapped and sequence < _HALF_SEQUENCE else sequence


_group_commits: weakref.WeakKeyDictionary[Store, _GroupCommit] = weakref.WeakKeyDictionary()


def transaction_ended(db: Store, producer_id: int, partitions: Iterable[tuple[str, int]]) -> None:
    """A transaction of `producer_id` ended on `partitions` in this process, its markers
    committed: what the process saw of the producer there no longer shows it open. So the first
    batch of its next transaction at the same epoch (transaction version 1, where the end does
    not raise it) is planned to join in one statement, as version 2's is. The statement checks
    every view on the locked rows: one that is wrong (another process wrote since) only sends
    the group to the locking path."""
    commits = _group_commits.get(db)
    seen = None if commits is None else commits._seen
    if seen is None:
        return
    for topic, partition in partitions:
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


async def append_all(
    db: Store, settings: Settings, batch: Sequence[Append]
) -> list[Appended | BaseException]:
    """`submit_all`, awaited."""
    return await submit_all(db, settings, batch)


# -- one unit of work ---------------------------------------------------------------------------


class Verdict(Enum):
    """What `sequence_rule` decides of a batch with a producer id."""

    APPEND = "append"
    # The state expired (or never was) and the log may hold this epoch's batch 0: it decides.
    FIRST_BATCH = "first batch"
    # Not the next sequence: a retry of a written batch, or out of order.
    RETRY_OR_GAP = "retry or gap"


def sequence_rule(
    view: appends.ProducerView | None,
    where: str,
    pid: int,
    epoch: int,
    base_sequence: int,
    transactional: bool,
) -> Verdict:
    """API.md's idempotence rules for a batch of producer `pid` at `epoch` on partition
    `where`, given what is written (a pure function: both stores' paths apply it)."""
    if view is None:
        raise UnknownProducerId(f"producer id {pid} was never issued; call init-pid")
    if epoch < view.current_epoch:
        raise InvalidProducerEpoch(
            f"producer {pid} epoch {epoch} is older than its current epoch {view.current_epoch}"
        )
    if epoch > view.current_epoch and transactional:
        raise InvalidProducerEpoch(
            f"producer {pid} epoch {epoch} is newer than its current epoch {view.current_epoch}"
        )
    # An idempotent producer may raise its own epoch (KIP-360: Kafka's Java client does, after a
    # sequence it cannot resolve, and starts again from sequence 0), as Kafka's broker takes it:
    # the newer epoch starts at sequence 0 on each partition, after which the older one is
    # refused there.
    if view.state_epoch is not None and epoch < view.state_epoch:
        raise InvalidProducerEpoch(
            f"producer {pid} epoch {epoch} is older than its epoch {view.state_epoch} on {where}"
        )
    if not transactional and view.open_txn_offset is not None:
        raise InvalidTxnState(
            f"producer {pid} has a transaction open on {where} since offset "
            f"{view.open_txn_offset}; a non-transactional batch may not join it"
        )
    if view.state_epoch is None:
        if base_sequence != 0:
            raise UnknownProducerId(
                f"producer {pid} has no state on {where}, so its first batch must start at "
                f"sequence 0, not {base_sequence}; re-initialise the producer"
            )
        return Verdict.FIRST_BATCH
    if view.state_epoch < epoch:
        if base_sequence != 0:
            raise OutOfOrderSequenceNumber(
                f"the first batch of epoch {epoch} must start at sequence 0, not {base_sequence}"
            )
        return Verdict.APPEND
    assert view.last_sequence is not None
    if base_sequence == next_sequence(view.last_sequence):
        return Verdict.APPEND
    return Verdict.RETRY_OR_GAP


# -- an optimistic group ------------------------------------------------------------------------

# Producers' views a process keeps for its optimistic groups (past this, it starts again empty).
SEEN_MAX_VIEWS = 100_000


@dataclass(slots=True)
class _Seen:
    """What a process's append groups last saw written: each topic's configs and each
    producer's view on a partition. A group planned on it is written by one statement that
    checks it against the locked rows (`write_optimistic`)."""

    configs: dict[str, str] = field(default_factory=dict)
    views: dict[tuple[str, int, int], appends.ProducerView] = field(default_factory=dict)

    def remember(self, plan: _Plan) -> None:
        """What a plan leaves written (as planned: a group that then fails `forget`s it)."""
        if len(self.views) + len(plan.views) > SEEN_MAX_VIEWS:
            self.views.clear()
        if len(self.configs) > SEEN_MAX_VIEWS:
            self.configs.clear()
        for (topic, _), locked in plan.partitions.items():
            self.configs[topic] = locked.configs
        for key, view in plan.views.items():
            self.views[key] = replace(view)

    def forget(self, keys: Collection[tuple[str, int, int]]) -> None:
        for key in keys:
            self.views.pop(key, None)


async def write_optimistic(
    db: Store, settings: Settings, batch: Sequence[Append], seen: _Seen
) -> list[Appended | CoordinatorError] | None:
    """Postgres: the group in one round trip, planned on what `seen` says is written and
    written by one statement only if the locked rows agree; None when the group must take the
    locking path (`write_group`) instead: a producer or topic not seen, a batch the rules
    would not append as it is (a retry, a gap, an error), rows that changed. A transactional
    batch whose partition is not in its transaction yet joins it in the statement. It never
    answers an error itself: the locking path does, from the rows."""
    wanted: dict[tuple[str, int], appends.LockedPartition] = {}
    expected: dict[tuple[str, int, int], appends.ProducerView] = {}
    transactions: dict[str, tuple[int, int]] = {}
    joins: set[tuple[str, str, int]] = set()
    for append in batch:
        configs = seen.configs.get(append.topic)
        if configs is None:
            return None
        # Offsets planned from 0: the statement adds each partition's high watermark.
        wanted[(append.topic, append.partition)] = appends.LockedPartition(0, 0, configs)
        tid, epoch = append.transactional_id, append.checked.header.producer_epoch
        key = (append.topic, append.partition, append.checked.header.producer_id)
        if key[2] >= 0 and key not in expected:
            view = seen.views.get(key)
            if view is None:
                return None
            if tid is not None and epoch > view.current_epoch:
                # A transaction at a newer epoch: what raised it (an end, an InitPid) ended the
                # one the view shows open first. The statement checks both on the locked rows.
                view = replace(view, current_epoch=epoch, open_txn_offset=None)
            expected[key] = view
        if tid is not None:
            owner = transactions.setdefault(tid, (key[2], epoch))
            if owner != (key[2], epoch) or _open_state is None:
                return None
            if expected[key].open_txn_offset is None:
                joins.add((tid, append.topic, append.partition))
    views = {key: replace(view) for key, view in expected.items()}
    plan = _Plan(wanted, views, _JOINED if transactions else None, now_ms())
    planned: list[Appended] = []
    try:
        for append in batch:
            planned.append(await _plan_one(None, settings, plan, append))
    except (_NeedsTheLocks, CoordinatorError):
        return None
    # Seen at once, so the next group of a producer with several requests in flight plans on it.
    seen.remember(plan)
    conditional = appends.ConditionalAppends(
        plan.rows,
        list(plan.states.values()),
        {key: (p.configs, p.high_watermark) for key, p in wanted.items()},
        expected,
        transactions,
        _open_state or "",
        sorted(joins),
        _joinable_states,
        plan.now,
    )
    try:
        before = await db.write_appends_if_unchanged(conditional)
    except BaseException:
        seen.forget(expected)
        raise
    if before is None:
        seen.forget(expected)
        return None
    for tid, topic, partition in joins:
        # The transaction's first offset there was planned from 0 too, as the statement wrote
        # it: what the process saw becomes the offset it got.
        key = (topic, partition, transactions[tid][0])
        opened = plan.views[key].open_txn_offset
        view = seen.views.get(key)
        if view is not None and opened is not None and view.open_txn_offset == opened:
            view.open_txn_offset = opened + before[(topic, partition)][0]
    results: list[Appended | CoordinatorError] = []
    for append, answer in zip(batch, planned, strict=True):
        high_watermark, log_start = before[(append.topic, append.partition)]
        results.append(
            replace(
                answer,
                base_offset=answer.base_offset + high_watermark,
                last_offset=answer.last_offset + high_watermark,
                log_start_offset=log_start,
            )
        )
    return results


class _Joined:
    """An optimistic group's transactions: its statement checks each is open (`_open_state`)
    for its producer with every partition in it already, or may take the partitions it joins
    (`_joinable_states`), and writes the joins, so planning checks and joins nothing."""

    async def lock(self, transactional_ids: Collection[str]) -> None:
        pass

    async def check(self, transactional_id: str, producer_id: int, epoch: int) -> None:
        pass

    def join(self, transactional_id: str, topic: str, partition: int, now: int) -> None:
        pass

    async def write(self) -> None:
        pass


_JOINED = _Joined()


# A batch's key among those written: (topic, partition, producer id, epoch, base sequence).
_Written = tuple[str, int, int, int, int]


@dataclass(slots=True)
class _Plan:
    """An append group's writes, planned batch by batch under the group's locks."""

    partitions: dict[tuple[str, int], appends.LockedPartition]
    views: dict[tuple[str, int, int], appends.ProducerView]
    transactions: GroupTransactions | None
    now: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    states: dict[tuple[str, int, int], dict[str, Any]] = field(default_factory=dict)
    # The group's own batches, as a retry racing its original in the group must find them.
    written: dict[_Written, tuple[int, int, int]] = field(default_factory=dict)


async def write_group(
    db: Store, settings: Settings, batch: Sequence[Append], seen: _Seen | None = None
) -> list[Appended | CoordinatorError]:
    """Append the batches in one unit of work under its locks: each one's answer, or the error
    that failed it alone (a failure of the unit of work itself is raised). What it read and
    wrote goes to `seen` once committed."""
    async with db.write() as session:
        connection = await session.connection()
        joined = {a.transactional_id for a in batch if a.transactional_id is not None}
        transactions = None
        if joined:
            if _transactions is None:
                raise RuntimeError("transactional produce needs coordinator.app.wire_domains()")
            transactions = _transactions(session)
            await transactions.lock(joined)
        locked = await appends.lock_partitions(connection, {(a.topic, a.partition) for a in batch})
        keyed = {
            (a.topic, a.partition, a.checked.header.producer_id)
            for a in batch
            if a.checked.header.producer_id >= 0 and (a.topic, a.partition) in locked
        }
        views = await db.producer_views(connection, keyed) if keyed else {}
        plan = _Plan(locked, views, transactions, now_ms())
        results: list[Appended | CoordinatorError] = []
        for append in batch:
            try:
                results.append(await _plan_one(connection, settings, plan, append))
            except CoordinatorError as exc:
                results.append(exc)
        if plan.rows:
            # The last row of each partition is its newest.
            moved = {(r["topic"], r["partition"]): r["last_offset"] + 1 for r in plan.rows}
            await db.write_appends(
                connection,
                plan.rows,
                list(plan.states.values()),
                sorted((t, p, hw) for (t, p), hw in moved.items()),
            )
        if transactions is not None:
            await transactions.write()
    if seen is not None:
        seen.remember(plan)
    return results


class _NeedsTheLocks(Exception):
    """An optimistic plan met what only the locked rows and the log can decide."""


async def _plan_one(
    connection: AsyncConnection | None,
    settings: Settings,
    plan: _Plan,
    append: Append,
) -> Appended:
    topic, partition, data, checked = append.topic, append.partition, append.data, append.checked
    tid = append.transactional_id
    header = checked.header
    pid, epoch, base_seq, count = (
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        header.record_count,
    )
    where = f"{topic}-{partition}"
    locked = plan.partitions.get((topic, partition))
    if locked is None:
        raise UnknownTopicOrPartition(f"{where} does not exist")
    topic_settings = configs.produce_settings(locked.configs, settings.max_request_bytes)
    if len(data) > topic_settings.max_message_bytes:
        raise BatchTooLarge(
            f"the batch is {len(data)} bytes; {topic}'s max.message.bytes is "
            f"{topic_settings.max_message_bytes}"
        )
    if topic_settings.compacted and checked.has_null_key:
        # Which records, as Kafka names them (KIP-467): a client fails just those with
        # INVALID_RECORD and may send the others again.
        keyless = [i for i, r in enumerate(recordbatch.records(data)) if r.key is None]
        raise InvalidRecord(
            f"{topic} is compacted: every record needs a key", {"record_errors": keyless}
        )
    if tid is not None:
        assert plan.transactions is not None
        await plan.transactions.check(tid, pid, epoch)
    if pid >= 0:
        view = plan.views.get((topic, partition, pid))
        verdict = sequence_rule(view, where, pid, epoch, base_seq, tid is not None)
        if verdict is not Verdict.APPEND:
            if connection is None:
                raise _NeedsTheLocks
            original = plan.written.get((topic, partition, pid, epoch, base_seq))
            if original is None:
                original = await appends.written_batch(
                    connection, topic, partition, pid, epoch, base_seq
                )
            if original is not None and original[2] == last_sequence_of(base_seq, count):
                return Appended(original[0], original[1], True, -1, locked.log_start_offset)
            if verdict is Verdict.FIRST_BATCH and original is not None:
                # The state expired while the log still holds this epoch's batch 0: another
                # batch 0 cannot be told from a retry of it (KIP-360: re-initialise).
                raise UnknownProducerId(
                    f"producer {pid}'s state on {where} expired and epoch {epoch} already used "
                    "sequence 0 there; re-initialise the producer"
                )
            if verdict is Verdict.RETRY_OR_GAP:
                assert view is not None and view.last_sequence is not None
                raise OutOfOrderSequenceNumber(
                    f"producer {pid} on {where}: expected sequence "
                    f"{next_sequence(view.last_sequence)}, got {base_seq}"
                )
    now = plan.now
    if tid is not None:
        assert plan.transactions is not None
        plan.transactions.join(tid, topic, partition, now)
    base_offset = locked.high_watermark
    last_offset = base_offset + count - 1
    locked.high_watermark = last_offset + 1
    if topic_settings.codec is not None:
        # The topic's compression.type, as Kafka's broker recompresses (the records' bytes were
        # checked already; only their compression changes).
        data = recordbatch.with_codec(
            data, topic_settings.codec, inflation_limit(settings, len(data))
        )
    payload = recordbatch.with_base_offset(data, base_offset)
    max_timestamp = checked.max_timestamp
    append_time = -1
    if topic_settings.log_append_time:
        payload = recordbatch.with_log_append_time(payload, now)
        max_timestamp = append_time = now
    last_seq = last_sequence_of(base_seq, count) if pid >= 0 else -1
    plan.rows.append(
        {
            "topic": topic,
            "partition": partition,
            "base_offset": base_offset,
            "last_offset": last_offset,
            "producer_id": pid,
            "producer_epoch": epoch,
            "base_sequence": base_seq,
            "last_sequence": last_seq,
            "timestamp": now,
            "max_timestamp": max_timestamp,
            "size": len(payload),
            "is_transactional": tid is not None,
            "control": None,
            "aborted": False,
            "first_offset": None,
            "record_count": count,
            "payload": payload,
        }
    )
    if pid >= 0:
        key = (topic, partition, pid)
        view = plan.views[key]
        # Pins the LSO from the transaction's first batch here until its marker.
        open_offset = view.open_txn_offset
        if open_offset is None and tid is not None:
            open_offset = base_offset
        view.state_epoch, view.last_sequence, view.open_txn_offset = epoch, last_seq, open_offset
        plan.states[key] = {
            "topic": topic,
            "partition": partition,
            "producer_id": pid,
            "producer_epoch": epoch,
            "last_sequence": last_seq,
            "last_offset": last_offset,
            "last_timestamp": now,
            "current_txn_first_offset": open_offset,
        }
        plan.written[(topic, partition, pid, epoch, base_seq)] = (
            base_offset,
            last_offset,
            last_seq,
        )
    return Appended(base_offset, last_offset, False, append_time, locked.log_start_offset)
