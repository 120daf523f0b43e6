"""The coordinator's own aborts: an operator's (the admin API, Kafka's WriteTxnMarkers from
`kafka-transactions abort`), a topic's deletion's, and the timeout sweep's; and the expiry of idle
transactional ids."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.clock import now_ms
from coordinator.log.errors import InvalidProducerEpoch
from coordinator.log.markers import lock_partitions
from coordinator.producers.models import ProducerId
from coordinator.store import Store
from coordinator.store.sql import pairs_in
from coordinator.transactions.finishing import (
    BY_ADMIN,
    TIMED_OUT,
    finish,
)
from coordinator.transactions.locks import (
    Locked,
    lock_existing,
    partitions_of,
)
from coordinator.transactions.models import (
    Transaction,
    TransactionPartition,
)
from coordinator.transactions.schemas import (
    EndTxnResponse,
)
from coordinator.transactions.states import OPEN, Op, allowed


async def abort_by_coordinator(
    db: Store, transactional_id: str, reason: str, op: Op
) -> EndTxnResponse:
    """Abort the open transaction and fence its producer (epoch raised): an operator's abort."""
    async with db.write() as session:
        now = now_ms()
        locked = await lock_existing(session, transactional_id)
        state = await finish(session, locked, op, reason, now, raise_epoch=True)
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
        locked = await lock_existing(session, tid)
        if locked.txn.producer_id != producer_id or locked.txn.state not in OPEN:
            return False
        if producer_epoch < locked.epoch:
            raise InvalidProducerEpoch(
                f"epoch {producer_epoch} of producer {producer_id} is older than its epoch "
                f"{locked.epoch}"
            )
        await finish(session, locked, Op.ADMIN_ABORT, BY_ADMIN, now_ms(), raise_epoch=True)
    return True


async def abort_and_fence(session: AsyncSession, locked: Locked, reason: str, now: int) -> None:
    """The operator's abort, in the caller's unit of work: abort the open transaction (if it
    still is) and fence its producer. The caller holds the partition locks it needs, in order."""
    if locked.txn.state in OPEN:
        await finish(session, locked, Op.ADMIN_ABORT, reason, now, raise_epoch=True)


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
                    await finish(session, locked, Op.TIME_OUT, TIMED_OUT, moment, raise_epoch=True)
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
