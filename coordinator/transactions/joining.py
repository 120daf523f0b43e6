"""The produce-time join (KIP-890 part 2): transactional batches add their partitions to their
transaction in the append group's own unit of work, no AddPartitions call needed. This is the
log's `GroupTransactions` (declared in `coordinator.log.produce`), provided to it when this
package is imported."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, insert, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from coordinator.transactions.caller import check_caller
from coordinator.transactions.errors import TransactionalIdNotFound
from coordinator.transactions.locks import Locked, lock_ids, partitions_by_id
from coordinator.transactions.models import Transaction, TransactionPartition
from coordinator.transactions.states import Op, State, transition

_transactions = cast(Table, Transaction.__table__)
_txn_partitions = cast(Table, TransactionPartition.__table__)

_JOIN_PARTITION = insert(_txn_partitions).values(
    transactional_id=bindparam("j_tid"),
    topic=bindparam("j_topic"),
    partition=bindparam("j_partition"),
    producer_id=bindparam("j_producer_id"),
)
_JOIN_STATE = (
    update(_transactions)
    .where(_transactions.c.transactional_id == bindparam("j_tid"))
    .values(
        state=bindparam("j_state"),
        started_ms=bindparam("j_started_ms"),
        deadline_ms=bindparam("j_deadline_ms"),
        updated_ms=bindparam("j_updated_ms"),
    )
)


@dataclass(slots=True)
class _Joining:
    """A transaction an append group's batches join, locked, with the partitions it includes."""

    locked: Locked
    joined: set[tuple[str, int]]


class GroupJoins:
    """The transactions of one append group, in its unit of work."""

    def __init__(self, session: AsyncSession) -> None:
        self._session = session
        self._joining: dict[str, _Joining] = {}
        self._partitions: list[dict[str, Any]] = []
        self._states: dict[str, dict[str, Any]] = {}

    async def lock(self, transactional_ids: Collection[str]) -> None:
        """Lock the ids in the fixed order (sorted, before any partition), with each one's
        partitions; an unknown id is left for `check` to refuse."""
        for locked in await lock_ids(self._session, transactional_ids):
            self._joining[locked.txn.transactional_id] = _Joining(locked, set())
        for tid, topic, partition, _ in await partitions_by_id(self._session, list(self._joining)):
            self._joining[tid].joined.add((topic, partition))

    async def check(self, transactional_id: str, producer_id: int, epoch: int) -> None:
        """A transactional batch's checks, in the contract's order: id, caller, state."""
        joining = self._joining.get(transactional_id)
        if joining is None:
            raise TransactionalIdNotFound(f"transactional id {transactional_id!r} is not known")
        locked = joining.locked
        await check_caller(self._session, locked.txn, locked.epoch, producer_id, epoch)
        transition(locked.txn.state, Op.PRODUCE, transactional_id)

    def join(self, transactional_id: str, topic: str, partition: int, now: int) -> None:
        """Add the partition to the transaction, starting it when none is open at this epoch;
        the locked row object is brought up to date as if the writes had run."""
        joining = self._joining[transactional_id]
        if (topic, partition) in joining.joined:
            return
        txn = joining.locked.txn
        started, deadline = txn.started_ms, txn.deadline_ms
        if txn.state != State.ONGOING:
            started, deadline = now, now + txn.timeout_ms
        state = transition(txn.state, Op.PRODUCE, transactional_id)
        changes = {
            "state": state,
            "started_ms": started,
            "deadline_ms": deadline,
            "updated_ms": now,
        }
        for name, value in changes.items():
            set_committed_value(txn, name, value)
        joining.joined.add((topic, partition))
        self._partitions.append(
            {
                "j_tid": transactional_id,
                "j_topic": topic,
                "j_partition": partition,
                "j_producer_id": txn.producer_id,
            }
        )
        self._states[transactional_id] = {
            "j_tid": transactional_id,
            **{f"j_{k}": v for k, v in changes.items()},
        }

    async def write(self) -> None:
        """The joins' writes, one statement each (none when nothing joined)."""
        if self._partitions:
            await self._session.execute(_JOIN_PARTITION, self._partitions)
        if self._states:
            await self._session.execute(_JOIN_STATE, list(self._states.values()))
