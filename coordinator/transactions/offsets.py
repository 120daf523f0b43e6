"""A transaction's offsets (AddOffsets, Kafka's TxnOffsetCommit): what they are, how they are
written, and the rule by which Postgres takes them in two statements, neither in a transaction:
the hot call of every consume-transform-produce loop. `service.add_offsets` takes its locking
path whenever the store writes nothing this way (always, on SQLite).

The first statement reads what the rule decides on, each row with its version: the transaction
(its state, its producer and that producer's epoch), and what `groups.committing` reads for a
member's commit. `offsets_rule` runs on those facts: the caller is the transaction's producer at
its current epoch (`caller.is_current`), `Op.ADD_OFFSETS` may run in the transaction's state,
and the member may commit those partitions (`fencing.check_member_commit`, KIP-447). Anything it
refuses, and anything missing (no such transaction or group), is left to the locking path,
which answers from rows read under its locks. The second statement takes the locks in the fixed
order and writes the offsets into the transaction (`pending_from`), and the transaction's state,
only if the group's locked rows are the versions the rule read and the transaction, as locked,
still passes the rule's own checks of it, rendered into the SQL (`caller.in_sql`, the states
`Op.ADD_OFFSETS` starts from): an append that joined the transaction meanwhile, as a Kafka
client's Produce may while its offsets are on their way, gives the row a new version but leaves
it the caller's and open, and the offsets wait for that append's lock and are written
(`coordinator.store.postgres`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, select
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.errors import CoordinatorError
from coordinator.groups.committing import ReadFacts
from coordinator.groups.fencing import check_member_commit
from coordinator.store import ROWS_PER_STATEMENT, Store, store_of
from coordinator.transactions.caller import is_current
from coordinator.transactions.models import Transaction, TransactionOffset
from coordinator.transactions.states import OPEN, TRANSITIONS, Op, State

PENDING_COLUMNS = (
    "transactional_id",
    "group_id",
    "topic",
    "partition",
    "offset",
    "metadata",
    "leader_epoch",
)
_PENDING_KEY = ["transactional_id", "group_id", "topic", "partition"]
_pending = cast(Table, TransactionOffset.__table__)


def pending(statement: Any) -> Any:
    """An INSERT of a transaction's offsets (of rows, or from a SELECT of `PENDING_COLUMNS`):
    a partition's offset given again replaces the one the transaction held."""
    replaced = {c: statement.excluded[c] for c in PENDING_COLUMNS if c not in _PENDING_KEY}
    return statement.on_conflict_do_update(index_elements=_PENDING_KEY, set_=replaced)


def pending_from(insert: Callable[[Any], Any], source: Any) -> Any:
    """`pending` of the rows `source` holds, with the dialect's `insert`."""
    return pending(insert(_pending).from_select(list(PENDING_COLUMNS), source))


@dataclass(frozen=True, slots=True)
class TxnOffsets:
    """AddOffsets, as the rule and the store take it: `keys` sorted and distinct, `offsets`
    (offset, metadata, leader epoch) in their order."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str
    member_id: str | None
    member_epoch: int | None
    keys: Sequence[tuple[str, int]]
    offsets: Sequence[tuple[int, str | None, int | None]]
    now: int


async def hold_offsets(session: AsyncSession, ask: TxnOffsets) -> None:
    """The locking path's write of the offsets into the transaction (`pending`)."""
    rows = [
        dict(zip(PENDING_COLUMNS, (ask.transactional_id, ask.group_id, *key, *offset), strict=True))
        for key, offset in zip(ask.keys, ask.offsets, strict=True)
    ]
    insert = store_of(session).insert
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        await session.execute(
            pending(insert(_pending).values(rows[start : start + ROWS_PER_STATEMENT]))
        )


@dataclass(frozen=True, slots=True)
class TxnFacts:
    """The transaction as read: its state, its producer and that producer's current epoch."""

    state: str
    producer_id: int
    epoch: int


OffsetsRule = Callable[[TxnOffsets, TxnFacts, ReadFacts | None], State | None]


def offsets_rule(ask: TxnOffsets, txn: TxnFacts, read: ReadFacts | None) -> State | None:
    """The state the offsets leave the transaction in, or None when the locking path must
    decide (a refusal, or something missing)."""
    if not is_current(txn.producer_id, txn.epoch, ask.producer_id, ask.producer_epoch):
        return None
    target = TRANSITIONS[Op.ADD_OFFSETS].get(State(txn.state))
    if target is None:
        return None
    if ask.keys or ask.member_id is not None:
        # KIP-447: the group checks the member when the offsets join the transaction.
        if read is None or read.existing != len(ask.keys):
            return None
        if ask.member_id is not None:
            if read.member_version is None or ask.member_epoch is None:
                return None
            try:
                check_member_commit(
                    read.facts,
                    ask.group_id,
                    ask.member_id,
                    ask.member_epoch,
                    ask.keys,
                    transactional=True,
                    now=ask.now,
                )
            except CoordinatorError:
                return None
    return target


async def add_in_two_statements(db: Store, ask: TxnOffsets) -> State | None:
    """Add the offsets to the transaction, if the rule lets its caller and nothing it read
    changed before the write; the state it left the transaction in, or None when nothing was
    written and the locking path must decide."""
    return await db.add_offsets_at_once(ask, offsets_rule)


async def pending_offset(
    session: AsyncSession, group_id: str, topic: str | None
) -> tuple[str, int] | None:
    """A (topic, partition) of the group (of `topic` only, if given) whose offset an open
    transaction holds, or None: what makes a stable offset fetch UNSTABLE_OFFSET_COMMIT
    (`groups.service.PendingOffset`, given to the groups domain by the app)."""
    held_by = (
        select(TransactionOffset.topic, TransactionOffset.partition)
        .join(Transaction, Transaction.transactional_id == TransactionOffset.transactional_id)
        .where(TransactionOffset.group_id == group_id, Transaction.state.in_(list(OPEN)))
        .limit(1)
    )
    if topic is not None:
        held_by = held_by.where(TransactionOffset.topic == topic)
    held = (await session.execute(held_by)).first()
    return None if held is None else (held.topic, held.partition)
