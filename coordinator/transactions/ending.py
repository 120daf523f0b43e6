"""A transaction's end, written once: the statements that end it, for both ways of ending one.

Ending a transaction writes a marker on each of its partitions (`log.markers.marker_writes`),
drops its partitions, takes its pending offsets (a commit applies them to their groups:
`groups.offsets`), records who ended it and how (`ENDED`), and, from transaction version 2 on,
raises its producer's epoch (`producers.repository.SET_EPOCH`). `end_writes` builds the
transaction's own part of that. Two paths run these same statements:

- the locking path (`service._finish`): every end, on both stores, after the locks and checks
  of `service`, the statements composed by `log.markers.write_markers`;
- EndTxn in one statement (`end_in_one_statement`, the store's `end_at_once`; on Postgres):
  the producer's end of its own transaction, the hot call of every transactional pipeline, in
  one round trip when the transaction is as its caller says it is; otherwise `service.end`
  takes the locking path, which answers. Transaction version 2 raises the epoch in it; version
  1 (librdkafka's, and Kafka's clients before KIP-890) keeps the epoch and the row's recovered
  identity, as the locking path does for it.

The one statement locks the transaction row with its producer's row, then the transaction's
partitions (the fixed lock order), and checks on the locked rows what `service.end` checks,
rendered from where those rules live: the caller is the transaction's producer at its current
epoch (`caller.is_current`), and the transaction is in a state that `op` may end
(`states.TRANSITIONS`). Anything else (a retry of an end, a fenced or unknown producer, an epoch
at its last value, no such transaction) writes nothing and takes the locking path
(`coordinator.store.postgres.transactions`).
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Table, bindparam, delete, update

from coordinator.core.schemas import EPOCH_MAX
from coordinator.log.group_commit import transaction_ended
from coordinator.log.markers import marker_params
from coordinator.store import Store
from coordinator.transactions.models import Transaction, TransactionOffset, TransactionPartition
from coordinator.transactions.states import TRANSITIONS, Op, State

_transactions = cast(Table, Transaction.__table__)
_txn_partitions = cast(Table, TransactionPartition.__table__)
_txn_offsets = cast(Table, TransactionOffset.__table__)

# The transaction row's columns an end sets (bind parameters `end_{column}`), beside clearing its
# start and deadline.
ENDED = (
    "state",
    "last_producer_id",
    "last_producer_epoch",
    "last_state",
    "last_reason",
    "last_group_key",
    "updated_ms",
    "recovered_producer_id",
    "recovered_producer_epoch",
)


def end_writes(gate: Any = None, columns: tuple[str, ...] = ENDED) -> tuple[list[Any], Any]:
    """The transaction's own rows at its end (bind parameters `tid` and `end_*`), written only
    where `gate` holds (None: always): its partitions dropped and its end recorded (`columns`
    of `ENDED`); and, apart because its rows are answered, its pending offsets taken (deleted,
    RETURNING the offsets a commit applies to their groups)."""
    where = () if gate is None else (gate,)
    dropped = delete(_txn_partitions).where(
        _txn_partitions.c.transactional_id == bindparam("tid"), *where
    )
    ended = (
        update(_transactions)
        .where(_transactions.c.transactional_id == bindparam("tid"), *where)
        .values(
            started_ms=None,
            deadline_ms=None,
            **{column: bindparam(f"end_{column}") for column in columns},
        )
    )
    taken = (
        delete(_txn_offsets)
        .where(_txn_offsets.c.transactional_id == bindparam("tid"), *where)
        .returning(
            _txn_offsets.c.group_id,
            _txn_offsets.c.topic,
            _txn_offsets.c.partition,
            _txn_offsets.c.offset,
            _txn_offsets.c.metadata,
            _txn_offsets.c.leader_epoch,
        )
    )
    return [dropped, ended], taken


# -- EndTxn in one statement ----------------------------------------------------------------------

# What an end of transaction version 1 leaves as it was: the epoch is not raised, so the
# identity a recovery gave the row stays (as `service._finish` keeps it without `raise_epoch`).
KEPT_BY_VERSION_1 = ("recovered_producer_id", "recovered_producer_epoch")


async def end_in_one_statement(
    db: Store,
    transactional_id: str,
    producer_id: int,
    epoch: int,
    op: Op,
    reason: str,
    now: int,
    *,
    raise_epoch: bool = True,
) -> State | None:
    """End the transaction as `op` (commit or abort) for its producer `producer_id` at `epoch`
    and, with `raise_epoch` (transaction version 2), raise the epoch, in one statement that
    commits by itself (Postgres); the state it ended in, or None when it wrote nothing and the
    locking path must decide."""
    if raise_epoch and epoch >= EPOCH_MAX:
        return None
    (target,) = set(TRANSITIONS[op].values())
    commit = target is State.COMPLETE_COMMIT
    values = {
        **marker_params(commit, producer_id, epoch, now),
        "tid": transactional_id,
        "states": [str(state) for state in TRANSITIONS[op]],
        "pid": producer_id,
        "epoch": epoch + 1,
        "end_state": str(target),
        "end_last_producer_id": producer_id,
        "end_last_producer_epoch": epoch,
        "end_last_state": str(target),
        "end_last_reason": reason,
        "end_last_group_key": None,
        "end_updated_ms": now,
        "end_recovered_producer_id": None,
        "end_recovered_producer_epoch": None,
    }
    ended = await db.end_at_once(values, raise_epoch)
    if ended is None:
        return None
    transaction_ended(db, producer_id, ended)
    return target
