"""An append group's unit of work: its locks in the fixed order (the transactional ids its batches
join, sorted, then its partitions, sorted, in one statement each), the producers' epochs and
states read, the rules applied to each batch in order (`sequences.sequence_rule`, with the
group's own earlier batches seen as written), and every accepted batch, producer state and high
watermark written in one statement each (`write_group`). On a store whose statements are round
trips, a group planned on what the process saw written goes in one statement that checks it
(`write_optimistic`), falling back to the locks when the rows disagree."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from coordinator.core.clock import now_ms
from coordinator.core.errors import CoordinatorError
from coordinator.core.settings import Settings
from coordinator.log import appends, configs, epochs
from coordinator.log.edge import Append, Appended, inflation_limit
from coordinator.log.errors import (
    BatchTooLarge,
    InvalidRecord,
    NotLeaderOrFollower,
    OutOfOrderSequenceNumber,
    UnknownProducerId,
    UnknownTopicOrPartition,
)
from coordinator.log.sequences import Verdict, last_sequence_of, next_sequence, sequence_rule
from coordinator.store import Store
from sdk import recordbatch


class GroupTransactions(Protocol):
    """What an append group needs of the transactions its batches join. The log declares it;
    the app gives it the transactions domain's (`use_transactions`, from
    `coordinator.app.wire_domains`), so the log never imports that domain."""

    async def lock(self, transactional_ids: Collection[str]) -> None:
        """Lock them in the fixed order: sorted, before any partition."""

    async def check(self, transactional_id: str, producer_id: int, epoch: int) -> None:
        """The checks of a transactional batch (the id, the caller, the state): raises."""

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


# Producers' views a process keeps for its optimistic groups (past this, it starts again empty).
SEEN_MAX_VIEWS = 100_000


@dataclass(slots=True)
class Seen:
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
    db: Store, settings: Settings, batch: Sequence[Append], seen: Seen
) -> list[Appended | CoordinatorError] | None:
    """Postgres: the group in one round trip, planned on what `seen` says is written and
    written by one statement only if the locked rows agree; None when the group must take the
    locking path (`write_group`) instead: a producer or topic not seen, a batch the rules
    would not append as it is (a retry, a gap, an error), rows that changed. A transactional
    batch whose partition is not in its transaction yet joins it in the statement; one that the
    process saw in a transaction still open there, which another process ended since (and an
    AddPartitions there began the next), starts that next one there in the statement. It never
    answers an error itself: the locking path does, from the rows."""
    wanted: dict[tuple[str, int], appends.LockedPartition] = {}
    led: dict[tuple[str, int], tuple[int, int] | None] = {}
    expected: dict[tuple[str, int, int], appends.ProducerView] = {}
    transactions: dict[str, tuple[int, int]] = {}
    joins: set[tuple[str, str, int]] = set()
    for append in batch:
        configs = seen.configs.get(append.topic)
        if configs is None:
            return None
        # Offsets planned from 0: the statement adds each partition's high watermark.
        wanted[(append.topic, append.partition)] = appends.LockedPartition(0, 0, configs)
        if led.setdefault((append.topic, append.partition), append.leader) != append.leader:
            return None  # taken under two leaderships: the locks tell which stands
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
    # A transactional batch planned as its transaction's next one on a partition, where the
    # statement may find that transaction ended by another process: it then starts the next one
    # there, at the offset of the producer's first batch in this group.
    reopens: dict[tuple[str, int, int], tuple[str, int]] = {}
    for append, answer in zip(batch, planned, strict=True):
        key = (append.topic, append.partition, append.checked.header.producer_id)
        if append.transactional_id is not None and expected[key].open_txn_offset is not None:
            reopens.setdefault(key, (append.transactional_id, answer.base_offset))
    # Seen at once, so the next group of a producer with several requests in flight plans on it.
    seen.remember(plan)
    conditional = appends.ConditionalAppends(
        plan.rows,
        list(plan.states.values()),
        {key: (p.configs, p.high_watermark, led[key]) for key, p in wanted.items()},
        expected,
        transactions,
        _open_state or "",
        sorted(joins),
        _joinable_states,
        plan.now,
        reopens,
    )
    try:
        written = await db.write_appends_if_unchanged(conditional)
    except BaseException:
        seen.forget(expected)
        raise
    if written is None:
        seen.forget(expected)
        return None
    before = written.before
    for tid, topic, partition in joins:
        # The transaction's first offset there was planned from 0 too, as the statement wrote
        # it: what the process saw becomes the offset it got.
        key = (topic, partition, transactions[tid][0])
        opened = plan.views[key].open_txn_offset
        view = seen.views.get(key)
        if view is not None and opened is not None and view.open_txn_offset == opened:
            view.open_txn_offset = opened + before[(topic, partition)][0]
    for key in written.reopened:
        # The statement started the transaction there again: its first offset is the one the
        # process sees now (unless a later group's plan changed the view meanwhile).
        view = seen.views.get(key)
        if view is not None and view.open_txn_offset == plan.views[key].open_txn_offset:
            view.open_txn_offset = reopens[key][1] + before[key[:2]][0]
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
    db: Store, settings: Settings, batch: Sequence[Append], seen: Seen | None = None
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
    claimed = append.leader if connection is not None else None  # the statement checks it
    if claimed is not None and not epochs.leads(locked.leader_id, locked.leader_epoch, claimed):
        raise NotLeaderOrFollower(
            f"broker {claimed[0]} at leader epoch {claimed[1]} no longer leads "
            f"{where} (broker {locked.leader_id}, epoch {locked.leader_epoch} does)"
        )
    topic_settings = configs.produce_settings(locked.configs, settings.max_request_bytes)
    if topic_settings.codec is not None:
        # Recompressed for its topic's compression.type as Kafka's broker does (the edge did
        # it already where it knew the topic's configs: then this changes nothing).
        data = recordbatch.with_codec(
            data, topic_settings.codec, inflation_limit(settings, len(data))
        )
    # As Kafka checks both the producer's batch and the batch as its topic stores it.
    size = max(len(data), len(append.data), append.sent_size)
    if size > topic_settings.max_message_bytes:
        raise BatchTooLarge(
            f"the batch is {size} bytes; {topic}'s max.message.bytes is "
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
    # On the optimistic path the statement writes each batch's base offset into its payload
    # (it knows the high watermark, this plan does not): the batch is not copied to set it.
    payload, max_timestamp, append_time = _as_stored(
        data, checked, topic_settings, base_offset if connection is not None else None, now
    )
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


def _as_stored(
    data: bytes,
    checked: recordbatch.Checked,
    topic: configs.ProduceSettings,
    base_offset: int | None,
    now: int,
) -> tuple[bytes, int, int]:
    """The batch's bytes as its topic stores them, with its newest timestamp and its append
    time (-1 but for a LogAppendTime topic): at its base offset (None: the store sets it as it
    writes), stamped with the append time for a LogAppendTime topic."""
    payload = data if base_offset is None else recordbatch.with_base_offset(data, base_offset)
    if not topic.log_append_time:
        return payload, checked.max_timestamp, -1
    return recordbatch.with_log_append_time(payload, now), now, now
