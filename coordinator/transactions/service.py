"""The transaction coordinator: InitPid with a transactional id, AddPartitions, AddOffsets,
Prepare, EndTxn, commit-group, describe, and the coordinator's own aborts (timeouts, admin).

Every call locks its transactional id's row (with the producer id row) first, then partitions in
(topic, partition) order; that fixed order is what keeps concurrent calls free of deadlocks. All of
a transaction's end (markers on every partition, group offsets, new state, raised epoch) is one
database transaction: it happens whole or not at all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import orjson
from sqlalchemy import Table, and_, bindparam, delete, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import flag_modified, set_committed_value

from coordinator.core.clock import now_ms, rfc3339
from coordinator.core.errors import CoordinatorError, InvalidRequest
from coordinator.core.metrics import record_end
from coordinator.core.schemas import EPOCH_MAX
from coordinator.core.settings import Settings
from coordinator.groups.fencing import check_offset_commit
from coordinator.groups.offsets import commit_offsets
from coordinator.log.errors import InvalidProducerEpoch
from coordinator.log.markers import lock_partitions, write_markers
from coordinator.log.models import Partition, ProducerState
from coordinator.log.topics import require_partitions
from coordinator.producers.models import ProducerId
from coordinator.producers.repository import (
    EPOCH_RETIRED,
    SET_EPOCH,
    issue_producer_id,
    set_epoch,
)
from coordinator.store import Store, store_of
from coordinator.store.sql import pairs_in
from coordinator.transactions.caller import check_caller, timed_out_at
from coordinator.transactions.ending import ENDED, end_in_one_statement, end_writes
from coordinator.transactions.errors import (
    ProducerFenced,
    TransactionalIdNotFound,
)
from coordinator.transactions.models import (
    TimedOutEpoch,
    Transaction,
    TransactionOffset,
    TransactionPartition,
)
from coordinator.transactions.offsets import TxnOffsets, add_in_two_statements, hold_offsets
from coordinator.transactions.schemas import (
    AddOffsetsRequest,
    AddPartitionsRequest,
    Caller,
    CommitGroupRequest,
    CommitGroupResponse,
    CommittedMember,
    EndTxnRequest,
    EndTxnResponse,
    StateResponse,
    TopicPartitionOut,
    TransactionDescription,
)
from coordinator.transactions.states import OPEN, Op, State, allowed, transition

# Why a transaction ended (`Transaction.last_reason`).
BY_CLIENT = "client"  # the producer's own EndTxn
BY_GROUP = "group"  # committed by commit-group
FENCED = "fenced"  # a newer epoch took over: InitPid, or commit-group aborting the losers
TIMED_OUT = "timeout"  # outlived its timeout
BY_ADMIN = "admin"  # an operator aborted it


_transactions = cast(Table, Transaction.__table__)
_txn_partitions = cast(Table, TransactionPartition.__table__)
_txn_offsets = cast(Table, TransactionOffset.__table__)


# Ending a transaction, with its markers: its partitions dropped, its end recorded; its pending
# offsets taken (built once: `write_markers` composes them by identity).
_ENDS, _TAKE_OFFSETS = end_writes()


# A transaction's partitions, locked in the fixed order, with what its markers need (built once:
# it runs on every EndTxn and every abort).
_LOCK_TRANSACTION_PARTITIONS = (
    select(
        Partition.topic,
        Partition.partition,
        Partition.high_watermark,
        TransactionPartition.producer_id,
        ProducerState.current_txn_first_offset,
    )
    .join(
        TransactionPartition,
        (TransactionPartition.topic == Partition.topic)
        & (TransactionPartition.partition == Partition.partition),
    )
    .outerjoin(
        ProducerState,
        (ProducerState.topic == Partition.topic)
        & (ProducerState.partition == Partition.partition)
        & (ProducerState.producer_id == TransactionPartition.producer_id),
    )
    .where(TransactionPartition.transactional_id == bindparam("tid"))
    .order_by(Partition.topic, Partition.partition)
    .with_for_update(of=Partition)
)


async def lock_transaction_partitions(
    session: AsyncSession, transactional_id: str
) -> dict[tuple[str, int], tuple[int, int, int | None]]:
    """Lock the partitions of a transaction, in the fixed order, in one query; returns each one's
    high watermark, the producer id whose records the transaction holds there, and the first
    offset of those records (None if it wrote none there). The caller holds the transactional
    id's lock, so its partition list cannot change meanwhile, nor can that producer's state."""
    rows = await session.execute(_LOCK_TRANSACTION_PARTITIONS, {"tid": transactional_id})
    return {(t, p): (hw, pid, first) for t, p, hw, pid, first in rows}


@dataclass(slots=True)
class Locked:
    """A transaction row locked for this unit of work, with its producer's current epoch."""

    txn: Transaction
    epoch: int


async def lock_ids(session: AsyncSession, transactional_ids: Collection[str]) -> list[Locked]:
    """Lock the transactional ids in the fixed order (sorted), each with its producer's current
    epoch; unknown ones are left out."""
    rows = await session.execute(
        select(Transaction, ProducerId.producer_epoch)
        .join(ProducerId, ProducerId.producer_id == Transaction.producer_id)
        .where(Transaction.transactional_id.in_(sorted(transactional_ids)))
        .order_by(Transaction.transactional_id)
        .with_for_update()
    )
    return [Locked(txn, epoch) for txn, epoch in rows]


async def _lock(session: AsyncSession, transactional_id: str) -> Locked | None:
    locked = await lock_ids(session, [transactional_id])
    return locked[0] if locked else None


async def _lock_existing(session: AsyncSession, transactional_id: str) -> Locked:
    locked = await _lock(session, transactional_id)
    if locked is None:
        raise TransactionalIdNotFound(f"transactional id {transactional_id!r} is not known")
    return locked


def _ended_by(txn: Transaction, producer_id: int, epoch: int, state: State) -> bool:
    """True when exactly this producer id and epoch ended the last transaction, in `state`, by
    its own request (EndTxn or commit-group): a retry, answered again rather than refused."""
    return (
        txn.last_producer_id == producer_id
        and txn.last_producer_epoch == epoch
        and txn.last_state == state
        and txn.last_reason in (BY_CLIENT, BY_GROUP)
    )


def _identity_after(txn: Transaction) -> tuple[int, int]:
    """The producer id and epoch the last end handed out (for answering its retries)."""
    assert txn.last_producer_id is not None and txn.last_producer_epoch is not None
    if txn.last_producer_epoch < EPOCH_MAX:
        return txn.last_producer_id, txn.last_producer_epoch + 1
    return txn.producer_id, 0


async def _raise_epoch(session: AsyncSession, locked: Locked) -> tuple[int, int]:
    """Raise the producer's epoch by one; past 32766, a new producer id at epoch 0."""
    txn = locked.txn
    txn.recovered_producer_id = txn.recovered_producer_epoch = None
    if locked.epoch < EPOCH_MAX:
        locked.epoch += 1
        await set_epoch(session, txn.producer_id, locked.epoch)
        return txn.producer_id, locked.epoch
    await set_epoch(session, txn.producer_id, EPOCH_RETIRED)
    txn.producer_id = await issue_producer_id(session, txn.transactional_id)
    locked.epoch = 0
    return txn.producer_id, 0


async def partitions_by_id(
    session: AsyncSession, transactional_ids: list[str]
) -> list[tuple[str, str, int, int]]:
    """(transactional id, topic, partition, producer id) of every partition the ids' open
    transactions include."""
    rows = await session.execute(
        select(
            TransactionPartition.transactional_id,
            TransactionPartition.topic,
            TransactionPartition.partition,
            TransactionPartition.producer_id,
        ).where(TransactionPartition.transactional_id.in_(transactional_ids))
    )
    return [(tid, t, p, pid) for tid, t, p, pid in rows]


async def _finish(
    session: AsyncSession,
    locked: Locked,
    op: Op,
    reason: str,
    now: int,
    group_key: str | None = None,
    *,
    raise_epoch: bool = False,
) -> State:
    """End the open transaction: markers on each of its partitions, its group offsets applied
    (commit) or dropped (abort), who ended it recorded and, with `raise_epoch`, its producer's
    epoch raised (`txn.producer_id` and `locked.epoch` are then the producer's next), all with
    the markers' statement (past epoch 32766, a new producer id is issued after it)."""
    txn = locked.txn
    tid = txn.transactional_id
    target = transition(txn.state, op, tid)
    commit = target is State.COMPLETE_COMMIT
    high_watermarks = await lock_transaction_partitions(session, tid)
    ended: dict[str, Any] = {
        "state": target,
        "last_producer_id": txn.producer_id,
        "last_producer_epoch": locked.epoch,
        "last_state": target,
        "last_reason": reason,
        "last_group_key": group_key,
        "updated_ms": now,
        "recovered_producer_id": txn.recovered_producer_id,
        "recovered_producer_epoch": txn.recovered_producer_epoch,
    }
    also: list[Any] = [*_ENDS]
    params: dict[str, Any] = {"tid": tid}
    raised = raise_epoch and locked.epoch < EPOCH_MAX
    if raise_epoch:
        ended["recovered_producer_id"] = ended["recovered_producer_epoch"] = None
    if raised:
        also.append(SET_EPOCH)
        params |= {"pid": txn.producer_id, "epoch": locked.epoch + 1}
    params |= {f"end_{column}": ended[column] for column in ENDED}
    # The markers, the transaction's partitions and its pending offsets (answered, to apply on
    # commit), its end and its new epoch go in one statement on Postgres.
    pending = await write_markers(
        session,
        txn.producer_id,
        locked.epoch,
        high_watermarks,
        commit,
        now,
        also=also,
        returning=_TAKE_OFFSETS,
        params=params,
    )
    # The row object as the statement left the row (written, so not flushed again).
    for name, value in {**ended, "started_ms": None, "deadline_ms": None}.items():
        set_committed_value(txn, name, value)
    if raised:
        locked.epoch += 1
    elif raise_epoch:
        await _raise_epoch(session, locked)
    if commit:
        await commit_offsets(session, pending, now)
    if reason == TIMED_OUT:
        timed_out = TimedOutEpoch(
            transactional_id=tid,
            producer_id=ended["last_producer_id"],
            producer_epoch=ended["last_producer_epoch"],
        )
        session.add(timed_out)
    session.info.setdefault("after_commit", []).append(partial(record_end, commit, reason))
    return target


def _begin(txn: Transaction, now: int) -> None:
    txn.started_ms = now
    txn.deadline_ms = now + txn.timeout_ms


# -- InitPid ------------------------------------------------------------------------------------


async def init_transactional(
    db: Store,
    settings: Settings,
    transactional_id: str,
    timeout_ms: int,
    keep_prepared: bool,
    recovering: tuple[int, int] | None = None,
) -> tuple[int, int]:
    """Create the transactional id at epoch 0, or raise its epoch by one, fencing the older one.

    The older epoch's open transaction is aborted in the same unit of work, unless it is
    Prepared and `keep_prepared` asks to keep it for the new instance to finish.

    `recovering` is the producer id and epoch a running producer gives to bump its own epoch
    after an error (KIP-360, Kafka's InitProducerId). Only the current ones may: any other is a
    zombie, PRODUCER_FENCED, so it can never fence its successor; the retry of a recovery
    already made is answered with its result.
    """
    # Two first InitPids of one id race on the insert; the loser retries and raises the epoch.
    for attempt in range(3):
        try:
            async with db.write() as session:
                now = now_ms()
                locked = await _lock(session, transactional_id)
                if locked is None:
                    producer_id = await issue_producer_id(session, transactional_id)
                    session.add(
                        Transaction(
                            transactional_id=transactional_id,
                            producer_id=producer_id,
                            state=State.EMPTY,
                            timeout_ms=timeout_ms,
                            updated_ms=now,
                        )
                    )
                    await session.flush()
                    return producer_id, 0
                txn = locked.txn
                if recovering is not None:
                    if recovering == (txn.recovered_producer_id, txn.recovered_producer_epoch):
                        return txn.producer_id, locked.epoch
                    if recovering != (txn.producer_id, locked.epoch):
                        raise ProducerFenced(
                            f"producer id {recovering[0]} at epoch {recovering[1]} is not the "
                            f"current instance of transactional id {transactional_id!r}"
                        )
                keep = txn.state == State.PREPARED and keep_prepared
                if txn.state in OPEN and not keep:
                    await _finish(session, locked, Op.FENCE, FENCED, now)
                producer_id, epoch = await _raise_epoch(session, locked)
                if recovering is not None:
                    txn.recovered_producer_id, txn.recovered_producer_epoch = recovering
                if not keep:
                    txn.state = transition(txn.state, Op.INIT_PID, transactional_id)
                    txn.timeout_ms = timeout_ms
                txn.updated_ms = now
                return producer_id, epoch
        except IntegrityError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


# -- the producer's calls -----------------------------------------------------------------------


async def add_partitions(
    db: Store, transactional_id: str, body: AddPartitionsRequest
) -> StateResponse:
    keys = sorted({(p.topic, p.partition) for p in body.partitions})
    pid, epoch = body.producer_id, body.producer_epoch
    if await db.add_partitions_at_once(transactional_id, pid, epoch, keys, now_ms()):
        return StateResponse(state=State.ONGOING)
    async with db.write() as session:
        now = now_ms()
        locked = await _lock_existing(session, transactional_id)
        txn = locked.txn
        await check_caller(session, txn, locked.epoch, body.producer_id, body.producer_epoch)
        target = transition(txn.state, Op.ADD_PARTITIONS, transactional_id)
        await require_partitions(session, keys)
        if txn.state != State.ONGOING:
            _begin(txn, now)
        # Every change to the row before the insert below, whose autoflush then writes it once;
        # written even when unchanged (a call within the same millisecond): a new version of the
        # row is how `ending` sees that the transaction's membership changed.
        txn.state = target
        txn.updated_ms = now
        flag_modified(txn, "updated_ms")
        await store_of(session).insert_ignore(
            session,
            TransactionPartition,
            [
                {
                    "transactional_id": transactional_id,
                    "topic": t,
                    "partition": p,
                    "producer_id": txn.producer_id,
                }
                for t, p in keys
            ],
            ["transactional_id", "topic", "partition"],
        )
    return StateResponse(state=target)


async def missing_partitions(
    db: Store,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    keys: list[tuple[str, int]],
) -> list[tuple[str, int]]:
    """KIP-890's verification (Kafka's AddPartitionsToTxn with verify_only): those of `keys` the
    caller's transaction does not include (all of them when none is open); the caller is
    checked as for every transaction call, and nothing is written."""
    async with db.write() as session:
        locked = await _lock_existing(session, transactional_id)
        await check_caller(session, locked.txn, locked.epoch, producer_id, producer_epoch)
        if locked.txn.state not in OPEN:
            return list(keys)
        included = {(t, p) for _, t, p, _ in await partitions_by_id(session, [transactional_id])}
    return [key for key in keys if key not in included]


async def add_offsets(db: Store, transactional_id: str, body: AddOffsetsRequest) -> StateResponse:
    keys = sorted({(o.topic, o.partition) for o in body.offsets})
    if len(keys) != len(body.offsets):
        raise InvalidRequest("offsets: a partition appears more than once")
    offsets = {(o.topic, o.partition): o for o in body.offsets}
    ask = TxnOffsets(
        transactional_id,
        body.producer_id,
        body.producer_epoch,
        body.group_id,
        body.member_id,
        body.member_epoch,
        keys,
        [(o.offset, o.metadata, o.leader_epoch) for o in (offsets[key] for key in keys)],
        now_ms(),
    )
    added = await add_in_two_statements(db, ask)
    if added is not None:
        return StateResponse(state=added)
    async with db.write() as session:
        now = now_ms()
        locked = await _lock_existing(session, transactional_id)
        txn = locked.txn
        await check_caller(session, txn, locked.epoch, body.producer_id, body.producer_epoch)
        target = transition(txn.state, Op.ADD_OFFSETS, transactional_id)
        # KIP-447: the group checks the member here, when the offsets join the transaction (the
        # lock order: this transactional id, then the group, then partitions).
        # Without offsets (Kafka's AddOffsetsToTxn: the group joins, its offsets come later)
        # nothing is committed, so there is nobody to check yet.
        if keys or body.member_id is not None:
            await check_offset_commit(
                session, body.group_id, body.member_id, body.member_epoch, keys, transactional=True
            )
        if keys:
            await require_partitions(session, keys)
        if txn.state != State.ONGOING:
            _begin(txn, now)
        await hold_offsets(session, ask)
        txn.state = target
        txn.updated_ms = now
        flag_modified(txn, "updated_ms")  # a new version of the row, as in add_partitions
    return StateResponse(state=target)


async def prepare(
    db: Store, settings: Settings, transactional_id: str, body: Caller
) -> StateResponse:
    async with db.write() as session:
        now = now_ms()
        locked = await _lock_existing(session, transactional_id)
        txn = locked.txn
        await check_caller(session, txn, locked.epoch, body.producer_id, body.producer_epoch)
        target = transition(txn.state, Op.PREPARE, transactional_id)
        if txn.state != State.PREPARED:
            if txn.started_ms is None:
                txn.started_ms = now
            # Prepared waits for its commit far longer than an Ongoing transaction may run.
            txn.deadline_ms = now + settings.prepared_timeout_ms
        txn.state = target
        txn.updated_ms = now
    return StateResponse(state=target)


async def end(
    db: Store,
    transactional_id: str,
    body: EndTxnRequest,
    *,
    version: int = 2,
    kafka_aborts: bool = False,
) -> EndTxnResponse:
    """EndTxn. Transaction version 2 (KIP-890, the HTTP API's) raises the epoch at every end;
    version 1 (Kafka's clients before KIP-890) keeps it, so the producer's next transaction
    runs at the same epoch, and a retry is recognised only while no transaction is open.

    `kafka_aborts` (Kafka's EndTxn 5) answers two aborts as a Kafka 4 coordinator answers a
    client of transaction version 2, where the HTTP door keeps API.md's refusals:
    - an abort from the epoch whose transaction the coordinator aborted after its timeout, with
      nothing since, is the retry of that abort (not TRANSACTION_TIMED_OUT); the client goes on
      at the epoch the answer gives;
    - an abort with no transaction open at the caller's current epoch raises the epoch and
      answers it (`Op.ABORT_NOTHING`; not INVALID_TXN_STATE): the client cannot know whether its
      produce reached the coordinator."""
    wanted = State.COMPLETE_COMMIT if body.commit else State.COMPLETE_ABORT
    op = Op.COMMIT if body.commit else Op.ABORT
    now = now_ms()
    pid, epoch = body.producer_id, body.producer_epoch
    raise_epoch = version >= 2
    ended = await end_in_one_statement(
        db, transactional_id, pid, epoch, op, BY_CLIENT, now, raise_epoch=raise_epoch
    )
    if ended is not None:
        record_end(body.commit, BY_CLIENT)
        after = epoch + 1 if raise_epoch else epoch
        return EndTxnResponse(state=ended, producer_id=pid, producer_epoch=after)
    async with db.write() as session:
        now = now_ms()
        locked = await _lock_existing(session, transactional_id)
        txn = locked.txn
        retry = _ended_by(txn, body.producer_id, body.producer_epoch, wanted)
        if retry and (version >= 2 or txn.state not in OPEN):
            producer_id, epoch = (
                _identity_after(txn) if version >= 2 else (body.producer_id, body.producer_epoch)
            )
            return EndTxnResponse(state=wanted, producer_id=producer_id, producer_epoch=epoch)
        if (
            kafka_aborts
            and not body.commit
            and await _aborted_on_timeout(session, locked, body.producer_id, body.producer_epoch)
        ):
            return EndTxnResponse(
                state=State.COMPLETE_ABORT, producer_id=txn.producer_id, producer_epoch=locked.epoch
            )
        await check_caller(session, txn, locked.epoch, body.producer_id, body.producer_epoch)
        if kafka_aborts and not body.commit and txn.state not in OPEN:
            op = Op.ABORT_NOTHING
        state = await _finish(session, locked, op, BY_CLIENT, now, raise_epoch=version >= 2)
        producer_id, epoch = txn.producer_id, locked.epoch
    return EndTxnResponse(state=state, producer_id=producer_id, producer_epoch=epoch)


async def _aborted_on_timeout(
    session: AsyncSession, locked: Locked, producer_id: int, epoch: int
) -> bool:
    """True when the coordinator's timeout ended this producer's transaction at `epoch`, raised
    the epoch to the one stored now, and nothing has happened since (no transaction is open)."""
    txn = locked.txn
    if txn.producer_id != producer_id or locked.epoch != epoch + 1 or txn.state in OPEN:
        return False
    return await timed_out_at(session, txn.transactional_id, producer_id, epoch)


async def describe(db: Store, transactional_id: str) -> TransactionDescription:
    async with db.read() as session:
        row = (
            await session.execute(
                select(Transaction, ProducerId.producer_epoch)
                .join(ProducerId, ProducerId.producer_id == Transaction.producer_id)
                .where(Transaction.transactional_id == transactional_id)
            )
        ).first()
        if row is None:
            raise TransactionalIdNotFound(f"transactional id {transactional_id!r} is not known")
        descriptions = await describe_rows(session, [(row[0], row[1])])
    return descriptions[0]


async def describe_rows(
    session: AsyncSession, rows: list[tuple[Transaction, int]]
) -> list[TransactionDescription]:
    ids = [txn.transactional_id for txn, _ in rows]
    partitions: dict[str, list[TopicPartitionOut]] = {tid: [] for tid in ids}
    for tid, topic, partition, _ in sorted(await partitions_by_id(session, ids)):
        partitions[tid].append(TopicPartitionOut(topic=topic, partition=partition))
    groups: dict[str, list[str]] = {tid: [] for tid in ids}
    for tid, group_id in (
        await session.execute(
            select(TransactionOffset.transactional_id, TransactionOffset.group_id)
            .where(TransactionOffset.transactional_id.in_(ids))
            .distinct()
            .order_by(TransactionOffset.transactional_id, TransactionOffset.group_id)
        )
    ).all():
        groups[tid].append(group_id)
    return [
        TransactionDescription(
            transactional_id=txn.transactional_id,
            producer_id=txn.producer_id,
            producer_epoch=epoch,
            state=txn.state,
            timeout_ms=txn.timeout_ms,
            started_at=rfc3339(txn.started_ms),
            started_ms=txn.started_ms,
            partitions=partitions[txn.transactional_id],
            groups=groups[txn.transactional_id],
        )
        for txn, epoch in rows
    ]


# -- commit-group -------------------------------------------------------------------------------


def _group_key(body: CommitGroupRequest) -> str:
    canonical = orjson.dumps(
        {
            "transactions": sorted(
                (m.transactional_id, m.producer_id, m.producer_epoch) for m in body.transactions
            ),
            "prefix": body.abort_others_with_prefix,
        }
    )
    return hashlib.sha256(canonical).hexdigest()


def _naming(error: CoordinatorError, transactional_id: str) -> CoordinatorError:
    """The same error, its detail naming the offending transaction."""
    return type(error)(f"transaction {transactional_id!r}: {error.detail}")


async def commit_group(db: Store, body: CommitGroupRequest) -> CommitGroupResponse:
    """Commit every listed transaction, all or none, and abort the other open transactions whose
    ids start with the prefix, in one unit of work."""
    listed = [m.transactional_id for m in body.transactions]
    if len(set(listed)) != len(listed):
        raise InvalidRequest("transactions: a transactional id appears more than once")
    key = _group_key(body)
    prefix = body.abort_others_with_prefix
    async with db.write() as session:
        now = now_ms()
        condition: Any = Transaction.transactional_id.in_(listed)
        if prefix is not None:
            condition = or_(
                condition,
                and_(
                    Transaction.transactional_id.startswith(prefix, autoescape=True),
                    Transaction.state.in_(list(OPEN)),
                ),
            )
        rows = (
            await session.execute(
                select(Transaction, ProducerId.producer_epoch)
                .join(ProducerId, ProducerId.producer_id == Transaction.producer_id)
                .where(condition)
                .order_by(Transaction.transactional_id)
                .with_for_update()
            )
        ).all()
        by_id = {txn.transactional_id: Locked(txn, epoch) for txn, epoch in rows}

        to_commit: list[Locked] = []
        for member in body.transactions:
            tid = member.transactional_id
            locked = by_id.get(tid)
            try:
                if locked is None:
                    raise TransactionalIdNotFound(f"transactional id {tid!r} is not known")
                txn = locked.txn
                if _ended_by(txn, member.producer_id, member.producer_epoch, State.COMPLETE_COMMIT):
                    continue  # committed by exactly this epoch already: a retry
                await check_caller(
                    session, txn, locked.epoch, member.producer_id, member.producer_epoch
                )
                transition(txn.state, Op.COMMIT, tid)
            except CoordinatorError as error:
                raise _naming(error, tid) from None
            to_commit.append(locked)
        # A retry of this very call after it succeeded changes nothing: transactions opened
        # under the prefix since then are not the losers it meant to abort.
        retry = not to_commit and all(by_id[tid].txn.last_group_key == key for tid in listed)
        to_abort = [
            locked
            for tid, locked in sorted(by_id.items())
            if not retry and tid not in set(listed) and locked.txn.state in OPEN
        ]
        ending = sorted(to_commit + to_abort, key=lambda lk: lk.txn.transactional_id)
        partitions = await partitions_by_id(session, [lk.txn.transactional_id for lk in ending])
        # Every partition of every ending transaction, locked once, in the fixed order.
        await lock_partitions(session, [(t, p) for _, t, p, _ in partitions])
        committing = {id(lk) for lk in to_commit}
        for locked in ending:
            op, reason = (Op.COMMIT, BY_GROUP) if id(locked) in committing else (Op.FENCE, FENCED)
            await _finish(session, locked, op, reason, now, key, raise_epoch=True)
        await session.flush()

        committed = []
        for member in body.transactions:
            txn = by_id[member.transactional_id].txn
            producer_id, epoch = _identity_after(txn)
            committed.append(
                CommittedMember(
                    transactional_id=txn.transactional_id,
                    producer_id=producer_id,
                    producer_epoch=epoch,
                )
            )
        aborted = (
            await session.scalars(
                select(Transaction.transactional_id)
                .where(
                    Transaction.last_group_key == key,
                    Transaction.last_state == State.COMPLETE_ABORT,
                )
                .order_by(Transaction.transactional_id)
            )
        ).all()
    return CommitGroupResponse(committed=committed, aborted=list(aborted))


# -- the coordinator's own aborts ---------------------------------------------------------------


async def abort_by_coordinator(
    db: Store, transactional_id: str, reason: str, op: Op
) -> EndTxnResponse:
    """Abort the open transaction and fence its producer (epoch raised): an operator's abort."""
    async with db.write() as session:
        now = now_ms()
        locked = await _lock_existing(session, transactional_id)
        state = await _finish(session, locked, op, reason, now, raise_epoch=True)
        producer_id, epoch = locked.txn.producer_id, locked.epoch
    return EndTxnResponse(state=state, producer_id=producer_id, producer_epoch=epoch)


async def abort_by_marker(
    db: Store, producer_id: int, producer_epoch: int, keys: list[tuple[str, int]]
) -> bool:
    """Kafka's WriteTxnMarkers abort, as `kafka-transactions abort` sends it to a partition's
    leader: the operator's abort (and fence) of the open transaction of `producer_id` that
    includes one of `keys`. Here a transaction's markers are written in one unit of work with
    its state, so the transaction is aborted whole, never one partition of it. An epoch older
    than the producer's is refused as the leader refuses it; True when something was aborted,
    False when the producer has no open transaction there (nothing is pending to abort)."""
    async with db.write() as session:
        tid = await session.scalar(
            select(TransactionPartition.transactional_id)
            .where(
                TransactionPartition.producer_id == producer_id,
                pairs_in(TransactionPartition.topic, TransactionPartition.partition, keys),
            )
            .limit(1)
        )
        if tid is None:
            return False
        locked = await _lock_existing(session, tid)
        if locked.txn.producer_id != producer_id or locked.txn.state not in OPEN:
            return False
        if producer_epoch < locked.epoch:
            raise InvalidProducerEpoch(
                f"epoch {producer_epoch} of producer {producer_id} is older than its epoch "
                f"{locked.epoch}"
            )
        await _finish(session, locked, Op.ADMIN_ABORT, BY_ADMIN, now_ms(), raise_epoch=True)
    return True


async def lock_including(session: AsyncSession, topic: str) -> list[Locked]:
    """Lock, in the fixed order, the transactional ids whose open transaction includes a
    partition of `topic` (a topic's deletion aborts them)."""
    tids = (
        await session.scalars(
            select(TransactionPartition.transactional_id)
            .where(TransactionPartition.topic == topic)
            .distinct()
            .order_by(TransactionPartition.transactional_id)
        )
    ).all()
    return [await _lock_existing(session, tid) for tid in tids]


async def partitions_of(session: AsyncSession, locked: list[Locked]) -> list[tuple[str, int]]:
    """The partitions the locked transactions include."""
    rows = await partitions_by_id(session, [entry.txn.transactional_id for entry in locked])
    return [(topic, partition) for _, topic, partition, _ in rows]


async def abort_and_fence(session: AsyncSession, locked: Locked, reason: str, now: int) -> None:
    """The operator's abort, in the caller's unit of work: abort the open transaction (if it
    still is) and fence its producer. The caller holds the partition locks it needs, in order."""
    if locked.txn.state in OPEN:
        await _finish(session, locked, Op.ADMIN_ABORT, reason, now, raise_epoch=True)


# Timed-out transactions aborted per unit of work (one claim, one lock of all their partitions,
# one commit): 10,000 that time out together go in 100 units, not 10,000.
ABORTS_PER_UNIT = 100


async def abort_timed_out(
    db: Store, now: int | None = None, per_unit: int = ABORTS_PER_UNIT
) -> list[str]:
    """Abort every open transaction past its deadline, raising its epoch; returns their ids.

    Up to `per_unit` transactions per unit of work, claimed with SKIP LOCKED (so several
    coordinator processes share the sweep without waiting on each other), the most overdue
    first; all their partitions are then locked in one statement, in the fixed order (one
    transaction's partitions after another's would not be).
    """
    aborted: list[str] = []
    while True:
        async with db.write() as session:
            moment = now_ms() if now is None else now
            rows = (
                await session.execute(
                    select(Transaction, ProducerId.producer_epoch)
                    .join(ProducerId, ProducerId.producer_id == Transaction.producer_id)
                    .where(
                        Transaction.state.in_(list(OPEN)),
                        Transaction.deadline_ms < moment,
                    )
                    .order_by(Transaction.deadline_ms)
                    .limit(per_unit)
                    .with_for_update(skip_locked=True)
                )
            ).all()
            if not rows:
                return aborted
            claimed = [Locked(txn, epoch) for txn, epoch in rows]
            await lock_partitions(session, await partitions_of(session, claimed))
            # The claimed rows' own changes (state, who ended them, the timed-out epochs) are
            # read by nothing below: they go in one flush at the commit, as executemany.
            with session.no_autoflush:
                for locked in claimed:
                    await _finish(session, locked, Op.TIME_OUT, TIMED_OUT, moment, raise_epoch=True)
                    aborted.append(locked.txn.transactional_id)


async def expire_idle(db: Store, expiration_ms: int, now: int | None = None) -> int:
    """Remove transactional ids idle (Empty or Complete) for longer than `expiration_ms`."""
    moment = now_ms() if now is None else now
    async with db.write() as session:
        result = await session.execute(
            delete(Transaction).where(
                Transaction.state.in_(allowed(Op.EXPIRE)),
                Transaction.updated_ms < moment - expiration_ms,
            )
        )
        count: int = getattr(result, "rowcount", 0) or 0
    return count
