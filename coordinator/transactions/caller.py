"""Who may act on a transaction: its producer at its current epoch (docs/pages/http-api.md's
checks, in its order), written once. `is_current` is the rule itself, on values (the locking
path, the facts a fast path read) or on columns (the one-statement paths, which render it into
their SQL with `in_sql`); `check_caller` says why a caller who is not current is refused."""

from __future__ import annotations

from typing import Any

from sqlalchemy import literal_column, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.log.errors import InvalidProducerEpoch
from coordinator.producers.models import ProducerId
from coordinator.transactions.errors import (
    InvalidProducerIdMapping,
    ProducerFenced,
    TransactionTimedOut,
)
from coordinator.transactions.models import TimedOutEpoch, Transaction


def is_current(txn_producer_id: Any, current_epoch: Any, producer_id: Any, epoch: Any) -> Any:
    """The caller (`producer_id` at `epoch`) is the transaction's producer (`txn_producer_id`)
    at its current epoch: a bool of values, or a SQL condition of columns."""
    return (txn_producer_id == producer_id) & (current_epoch == epoch)


def in_sql(txn_producer_id: str, current_epoch: str, producer_id: str, epoch: str) -> str:
    """`is_current` as Postgres SQL text, over the given column or parameter expressions."""
    columns: list[Any] = [
        literal_column(c) for c in (txn_producer_id, current_epoch, producer_id, epoch)
    ]
    condition = is_current(*columns)
    return f"({condition.compile(dialect=postgresql.dialect())})"  # type: ignore[no-untyped-call]


async def check_caller(
    session: AsyncSession, txn: Transaction, current_epoch: int, producer_id: int, epoch: int
) -> None:
    """Refuse a caller who is not current, in the contract's order: producer id mapping, then
    older epoch (fenced, or timed out), then newer epoch. Shared by every transaction call and
    by transactional produce."""
    if is_current(txn.producer_id, current_epoch, producer_id, epoch):
        return
    if producer_id != txn.producer_id:
        owner = await session.scalar(
            select(ProducerId.transactional_id).where(ProducerId.producer_id == producer_id)
        )
        if owner == txn.transactional_id:
            await _refuse_timed_out(session, txn, producer_id, epoch)
            raise ProducerFenced(
                f"producer id {producer_id} of {txn.transactional_id!r} was replaced by "
                f"{txn.producer_id} after its epochs ran out"
            )
        raise InvalidProducerIdMapping(
            f"producer id {producer_id} does not belong to transactional id "
            f"{txn.transactional_id!r}"
        )
    if epoch < current_epoch:
        await _refuse_timed_out(session, txn, producer_id, epoch)
        raise ProducerFenced(
            f"epoch {epoch} of {txn.transactional_id!r} is fenced by epoch {current_epoch}"
        )
    raise InvalidProducerEpoch(
        f"epoch {epoch} of {txn.transactional_id!r} is newer than its current epoch {current_epoch}"
    )


async def timed_out_at(
    session: AsyncSession, transactional_id: str, producer_id: int, epoch: int
) -> bool:
    """The coordinator aborted this producer's transaction at `epoch` after its timeout."""
    found = await session.scalar(
        select(TimedOutEpoch.producer_epoch).where(
            TimedOutEpoch.transactional_id == transactional_id,
            TimedOutEpoch.producer_id == producer_id,
            TimedOutEpoch.producer_epoch == epoch,
        )
    )
    return found is not None


async def _refuse_timed_out(
    session: AsyncSession, txn: Transaction, producer_id: int, epoch: int
) -> None:
    """An older epoch whose transaction timed out is told so, not that it was fenced."""
    if await timed_out_at(session, txn.transactional_id, producer_id, epoch):
        raise TransactionTimedOut(
            f"the coordinator aborted the transaction of {txn.transactional_id!r} at epoch "
            f"{epoch} after its timeout of {txn.timeout_ms} ms; call init-pid again"
        )
