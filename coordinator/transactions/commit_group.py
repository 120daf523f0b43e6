"""commit-group: many transactions committed all or none, and the open transactions under a prefix
aborted (the losing attempts of a Spark job), in one unit of work."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import orjson
from sqlalchemy import and_, or_, select

from coordinator.core.clock import now_ms
from coordinator.core.errors import CoordinatorError, InvalidRequest
from coordinator.log.markers import lock_partitions
from coordinator.producers.models import ProducerId
from coordinator.store import Store
from coordinator.transactions.caller import check_caller
from coordinator.transactions.errors import (
    TransactionalIdNotFound,
)
from coordinator.transactions.finishing import (
    BY_GROUP,
    FENCED,
    ended_by,
    finish,
    identity_after,
)
from coordinator.transactions.inputs import Committing
from coordinator.transactions.locks import (
    Locked,
    partitions_by_id,
)
from coordinator.transactions.models import (
    Transaction,
)
from coordinator.transactions.schemas import (
    CommitGroupResponse,
    CommittedMember,
)
from coordinator.transactions.states import OPEN, Op, State, transition


def _group_key(transactions: Sequence[Committing], prefix: str | None) -> str:
    canonical = orjson.dumps(
        {
            "transactions": sorted(
                (m.transactional_id, m.producer_id, m.producer_epoch) for m in transactions
            ),
            "prefix": prefix,
        }
    )
    return hashlib.sha256(canonical).hexdigest()


def _naming(error: CoordinatorError, transactional_id: str) -> CoordinatorError:
    """The same error, its detail naming the offending transaction."""
    return type(error)(f"transaction {transactional_id!r}: {error.detail}")


async def commit_group(
    db: Store, transactions: Sequence[Committing], prefix: str | None = None
) -> CommitGroupResponse:
    """Commit every listed transaction, all or none, and abort the other open transactions whose
    ids start with the prefix, in one unit of work."""
    listed = [m.transactional_id for m in transactions]
    if len(set(listed)) != len(listed):
        raise InvalidRequest("transactions: a transactional id appears more than once")
    key = _group_key(transactions, prefix)
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
        for member in transactions:
            tid = member.transactional_id
            locked = by_id.get(tid)
            try:
                if locked is None:
                    raise TransactionalIdNotFound(f"transactional id {tid!r} is not known")
                txn = locked.txn
                if ended_by(txn, member.producer_id, member.producer_epoch, State.COMPLETE_COMMIT):
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
            await finish(session, locked, op, reason, now, key, raise_epoch=True)
        await session.flush()

        committed = []
        for member in transactions:
            txn = by_id[member.transactional_id].txn
            producer_id, epoch = identity_after(txn)
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
