"""Ending a transaction: its markers on every partition, its group offsets applied (commit) or
dropped (abort), its share-group acknowledgements applied (commit) or their records released
(abort), who ended it recorded and, from transaction version 2 on, its producer's epoch raised,
all in the caller's unit of work (`transactions.ending` holds the statements it shares
with EndTxn's one-statement path). And what a retry of an end is answered with."""

from __future__ import annotations

from functools import partial
from typing import Any

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from coordinator.core.metrics import record_end
from coordinator.core.schemas import EPOCH_MAX
from coordinator.groups.offsets import commit_offsets
from coordinator.log.markers import write_markers
from coordinator.producers.repository import (
    EPOCH_RETIRED,
    SET_EPOCH,
    issue_producer_id,
    set_epoch,
)
from coordinator.shares.held import settle_in
from coordinator.transactions.ending import ENDED, end_writes
from coordinator.transactions.locks import (
    Locked,
    lock_transaction_partitions,
)
from coordinator.transactions.models import (
    TimedOutEpoch,
    Transaction,
    TransactionShareAck,
)
from coordinator.transactions.states import Op, State, transition

# Why a transaction ended (`Transaction.last_reason`).
BY_CLIENT = "client"  # the producer's own EndTxn
BY_GROUP = "group"  # committed by commit-group
FENCED = "fenced"  # a newer epoch took over: InitPid, or commit-group aborting the losers
TIMED_OUT = "timeout"  # outlived its timeout
BY_ADMIN = "admin"  # an operator aborted it


# Ending a transaction, with its markers: its partitions dropped, its end recorded; its pending
# offsets taken (built once: `write_markers` composes them by identity).
_ENDS, _TAKE_OFFSETS = end_writes()


def ended_by(txn: Transaction, producer_id: int, epoch: int, state: State) -> bool:
    """True when exactly this producer id and epoch ended the last transaction, in `state`, by
    its own request (EndTxn or commit-group): a retry, answered again rather than refused."""
    return (
        txn.last_producer_id == producer_id
        and txn.last_producer_epoch == epoch
        and txn.last_state == state
        and txn.last_reason in (BY_CLIENT, BY_GROUP)
    )


def identity_after(txn: Transaction) -> tuple[int, int]:
    """The producer id and epoch the last end handed out (for answering its retries)."""
    assert txn.last_producer_id is not None and txn.last_producer_epoch is not None
    if txn.last_producer_epoch < EPOCH_MAX:
        return txn.last_producer_id, txn.last_producer_epoch + 1
    return txn.producer_id, 0


async def raise_producer_epoch(session: AsyncSession, locked: Locked) -> tuple[int, int]:
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


async def finish(
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
        await raise_producer_epoch(session, locked)
    if commit:
        await commit_offsets(session, pending, now)
    if txn.share_acks:
        acks = TransactionShareAck
        held: list[tuple[str, str, int]] = [
            (row.group_id, row.topic, row.partition)
            for row in await session.execute(
                delete(acks)
                .where(acks.transactional_id == tid)
                .returning(acks.group_id, acks.topic, acks.partition)
            )
        ]
        await settle_in(session, tid, held, commit)
        txn.share_acks = False
    if reason == TIMED_OUT:
        timed_out = TimedOutEpoch(
            transactional_id=tid,
            producer_id=ended["last_producer_id"],
            producer_epoch=ended["last_producer_epoch"],
        )
        session.add(timed_out)
    session.info.setdefault("after_commit", []).append(partial(record_end, commit, reason))
    return target


def begin(txn: Transaction, now: int) -> None:
    txn.started_ms = now
    txn.deadline_ms = now + txn.timeout_ms
