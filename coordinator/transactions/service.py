"""The transaction coordinator's calls of a producer: InitPid with a transactional id,
AddPartitions, AddOffsets, Prepare, EndTxn, and describe. commit-group is `commit_group`'s, the
coordinator's own aborts `aborts`'; locks are `locks`', a transaction's end `finishing`'s, the
caller's checks `caller`'s, and what state may go where `states`'.

Every call locks its transactional id's row (with the producer id row) first, then partitions in
(topic, partition) order; that fixed order is what keeps concurrent calls free of deadlocks. All of
a transaction's end (markers on every partition, group offsets, new state, raised epoch) is one
database transaction: it happens whole or not at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import flag_modified

from coordinator.core.clock import now_ms, rfc3339
from coordinator.core.errors import InvalidRequest
from coordinator.core.metrics import record_end
from coordinator.core.settings import Settings
from coordinator.groups.fencing import check_offset_commit
from coordinator.log.topics import require_partitions
from coordinator.producers.models import ProducerId
from coordinator.producers.repository import (
    issue_producer_id,
)
from coordinator.store import Store, store_of
from coordinator.transactions.caller import check_caller, timed_out_at
from coordinator.transactions.ending import end_in_one_statement
from coordinator.transactions.errors import (
    ProducerFenced,
    TransactionalIdNotFound,
)
from coordinator.transactions.finishing import (
    BY_CLIENT,
    FENCED,
    begin,
    ended_by,
    finish,
    identity_after,
    raise_producer_epoch,
)
from coordinator.transactions.inputs import AddOffsets, Caller, check_partitions
from coordinator.transactions.locks import (
    Locked,
    lock,
    lock_existing,
    partitions_by_id,
)
from coordinator.transactions.models import (
    Transaction,
    TransactionOffset,
    TransactionPartition,
)
from coordinator.transactions.offsets import TxnOffsets, add_in_two_statements, hold_offsets
from coordinator.transactions.schemas import (
    EndTxnResponse,
    StateResponse,
    TopicPartitionOut,
    TransactionDescription,
)
from coordinator.transactions.states import OPEN, TRANSITIONS, Op, State, transition

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
                locked = await lock(session, transactional_id)
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
                    await finish(session, locked, Op.FENCE, FENCED, now)
                producer_id, epoch = await raise_producer_epoch(session, locked)
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
    db: Store, transactional_id: str, body: Caller, partitions: Sequence[tuple[str, int]]
) -> StateResponse:
    body.check()
    check_partitions(partitions)
    keys = sorted(set(partitions))
    pid, epoch = body.producer_id, body.producer_epoch
    if await db.add_partitions_at_once(transactional_id, pid, epoch, keys, now_ms()):
        return StateResponse(state=State.ONGOING)
    async with db.write() as session:
        now = now_ms()
        locked = await lock_existing(session, transactional_id)
        txn = locked.txn
        await check_caller(session, txn, locked.epoch, body.producer_id, body.producer_epoch)
        target = transition(txn.state, Op.ADD_PARTITIONS, transactional_id)
        await require_partitions(session, keys)
        if txn.state != State.ONGOING:
            begin(txn, now)
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
        locked = await lock_existing(session, transactional_id)
        await check_caller(session, locked.txn, locked.epoch, producer_id, producer_epoch)
        if locked.txn.state not in OPEN:
            return list(keys)
        included = {(t, p) for _, t, p, _ in await partitions_by_id(session, [transactional_id])}
    return [key for key in keys if key not in included]


# An AddOffsets of no offsets takes an AddPartitions' one statement (`add_offsets`).
assert TRANSITIONS[Op.ADD_OFFSETS] == TRANSITIONS[Op.ADD_PARTITIONS]


async def add_offsets(db: Store, transactional_id: str, adding: AddOffsets) -> StateResponse:
    adding.check()
    body = adding.caller
    keys = sorted({(o.topic, o.partition) for o in adding.offsets})
    if len(keys) != len(adding.offsets):
        raise InvalidRequest("offsets: a partition appears more than once")
    if not keys and adding.member_id is None:
        # Kafka's AddOffsetsToTxn: the group joins and nothing is written but the transaction's
        # start, by the rule of an AddPartitions of no partitions (the same transitions):
        # its one statement, where the store has one.
        joined = await db.add_partitions_at_once(
            transactional_id, body.producer_id, body.producer_epoch, [], now_ms()
        )
        if joined:
            return StateResponse(state=State.ONGOING)
    offsets = {(o.topic, o.partition): o for o in adding.offsets}
    ask = TxnOffsets(
        transactional_id,
        body.producer_id,
        body.producer_epoch,
        adding.group_id,
        adding.member_id,
        adding.member_epoch,
        keys,
        [(o.offset, o.metadata, o.leader_epoch) for o in (offsets[key] for key in keys)],
        now_ms(),
    )
    added = await add_in_two_statements(db, ask)
    if added is not None:
        return StateResponse(state=added)
    async with db.write() as session:
        now = now_ms()
        locked = await lock_existing(session, transactional_id)
        txn = locked.txn
        await check_caller(session, txn, locked.epoch, body.producer_id, body.producer_epoch)
        target = transition(txn.state, Op.ADD_OFFSETS, transactional_id)
        # KIP-447: the group checks the member here, when the offsets join the transaction (the
        # lock order: this transactional id, then the group, then partitions).
        # Without offsets (Kafka's AddOffsetsToTxn: the group joins, its offsets come later)
        # nothing is committed, so there is nobody to check yet.
        if keys or adding.member_id is not None:
            await check_offset_commit(
                session,
                adding.group_id,
                adding.member_id,
                adding.member_epoch,
                keys,
                transactional=True,
            )
        if keys:
            await require_partitions(session, keys)
        if txn.state != State.ONGOING:
            begin(txn, now)
        await hold_offsets(session, ask)
        txn.state = target
        txn.updated_ms = now
        flag_modified(txn, "updated_ms")  # a new version of the row, as in add_partitions
    return StateResponse(state=target)


async def prepare(
    db: Store, settings: Settings, transactional_id: str, body: Caller
) -> StateResponse:
    body.check()
    async with db.write() as session:
        now = now_ms()
        locked = await lock_existing(session, transactional_id)
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
    body: Caller,
    commit: bool,
    *,
    version: int = 2,
    kafka_aborts: bool = False,
) -> EndTxnResponse:
    """EndTxn. Transaction version 2 (KIP-890, the HTTP API's) raises the epoch at every end;
    version 1 (Kafka's clients before KIP-890) keeps it, so the producer's next transaction
    runs at the same epoch, and a retry is recognised only while no transaction is open.

    `kafka_aborts` (Kafka's EndTxn 5) answers two aborts as a Kafka 4 coordinator answers a
    client of transaction version 2, where the HTTP door keeps the HTTP API's refusals:
    - an abort from the epoch whose transaction the coordinator aborted after its timeout, with
      nothing since, is the retry of that abort (not TRANSACTION_TIMED_OUT); the client goes on
      at the epoch the answer gives;
    - an abort with no transaction open at the caller's current epoch raises the epoch and
      answers it (`Op.ABORT_NOTHING`; not INVALID_TXN_STATE): the client cannot know whether its
      produce reached the coordinator."""
    body.check()
    wanted = State.COMPLETE_COMMIT if commit else State.COMPLETE_ABORT
    op = Op.COMMIT if commit else Op.ABORT
    now = now_ms()
    pid, epoch = body.producer_id, body.producer_epoch
    raise_epoch = version >= 2
    ended = await end_in_one_statement(
        db, transactional_id, pid, epoch, op, BY_CLIENT, now, raise_epoch=raise_epoch
    )
    if ended is not None:
        record_end(commit, BY_CLIENT)
        after = epoch + 1 if raise_epoch else epoch
        return EndTxnResponse(state=ended, producer_id=pid, producer_epoch=after)
    async with db.write() as session:
        now = now_ms()
        locked = await lock_existing(session, transactional_id)
        txn = locked.txn
        retry = ended_by(txn, body.producer_id, body.producer_epoch, wanted)
        if retry and (version >= 2 or txn.state not in OPEN):
            producer_id, epoch = (
                identity_after(txn) if version >= 2 else (body.producer_id, body.producer_epoch)
            )
            return EndTxnResponse(state=wanted, producer_id=producer_id, producer_epoch=epoch)
        if (
            kafka_aborts
            and not commit
            and await _aborted_on_timeout(session, locked, body.producer_id, body.producer_epoch)
        ):
            return EndTxnResponse(
                state=State.COMPLETE_ABORT, producer_id=txn.producer_id, producer_epoch=locked.epoch
            )
        await check_caller(session, txn, locked.epoch, body.producer_id, body.producer_epoch)
        if kafka_aborts and not commit and txn.state not in OPEN:
            op = Op.ABORT_NOTHING
        state = await finish(session, locked, op, BY_CLIENT, now, raise_epoch=version >= 2)
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


# -- the coordinator's own aborts ---------------------------------------------------------------
