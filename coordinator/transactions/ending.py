"""A transaction's end, written once: the statements that end it, for both ways of ending one.

Ending a transaction writes a marker on each of its partitions (`log.markers.marker_writes`),
drops its partitions, takes its pending offsets (a commit applies them to their groups:
`groups.offsets`), records who ended it and how (`ENDED`), and, from transaction version 2 on,
raises its producer's epoch (`producers.repository.SET_EPOCH`). `end_writes` builds the
transaction's own part of that. Two paths run these same statements:

- the locking path (`service._finish`): every end, on both stores, after the locks and checks
  of `service`, the statements composed by `log.markers.write_markers`;
- EndTxn in one statement on Postgres (`end_in_one_statement`): the producer's end of its own
  transaction, the hot call of every transactional pipeline, in one round trip when the
  transaction is as its caller says it is; otherwise `service.end` takes the locking path,
  which answers. Transaction version 2 raises the epoch in it; version 1 (librdkafka's, and
  Kafka's clients before KIP-890) keeps the epoch and the row's recovered identity, as the
  locking path does for it.

The one statement locks the transaction row with its producer's row, then the transaction's
partitions (the fixed lock order), and checks on the locked rows what `service.end` checks: the
caller is the transaction's producer at its current epoch, and the transaction is in a state
that `op` may end (`states.allowed`). Anything else (a retry of an end, a fenced or unknown
producer, an epoch at its last value, no such transaction) writes nothing and takes the locking
path. Every write is gated on that check (`gate`).

A statement reads what it does not lock as of its start. Everything it writes from such reads
(the transaction's partitions and pending offsets, each partition's first offset of the
transaction, the batches an abort flags) changes only with a new version of the transaction row
or of a partition row (every write of a transaction's membership updates its row; every append
moves its partition's high watermark). So the statement also checks that the rows it locked
are the versions it read at its start: if one changed while it waited for the lock, it writes
nothing and the locking path, whose statements read after the locks, ends the transaction.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    String,
    Table,
    bindparam,
    column,
    delete,
    func,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect

from coordinator.core.database import Database, on_driver
from coordinator.core.schemas import EPOCH_MAX
from coordinator.groups.offsets import upsert_sql
from coordinator.log.markers import ENDING_COLUMNS, marker_params, marker_writes
from coordinator.log.produce import transaction_ended
from coordinator.producers.repository import SET_EPOCH
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


# -- EndTxn in one statement (Postgres) -----------------------------------------------------------

# The transaction row and its producer's, locked, and whether the row is the version the
# statement started from.
_TXN = (
    text(
        """SELECT t.state, t.producer_id, i.producer_epoch,
       t.xmin::text = (SELECT s.xmin::text FROM transactions s
                       WHERE s.transactional_id = :tid) AS unchanged
  FROM transactions t
  JOIN producer_ids i ON i.producer_id = t.producer_id
  WHERE t.transactional_id = :tid
  FOR UPDATE OF t, i"""
    )
    .columns(
        column("state", String()),
        column("producer_id", BigInteger()),
        column("producer_epoch", Integer()),
        column("unchanged", Boolean()),
    )
    .cte("txn")
)
# Its partitions, locked after it in the fixed order, as `marker_writes` reads them.
_LOCKED = (
    text(
        """SELECT p.topic, p."partition", p.high_watermark, x.producer_id,
       s.current_txn_first_offset AS first_offset,
       p.xmin::text = (SELECT q.xmin::text FROM partitions q
                       WHERE q.topic = p.topic AND q."partition" = p."partition") AS unchanged
  FROM partitions p
  JOIN transaction_partitions x ON x.topic = p.topic AND x."partition" = p."partition"
  LEFT JOIN producer_states s
    ON s.topic = p.topic AND s."partition" = p."partition" AND s.producer_id = x.producer_id
  WHERE x.transactional_id = :tid AND (SELECT count(*) FROM txn) >= 0
  ORDER BY p.topic, p."partition"
  FOR UPDATE OF p"""
    )
    .columns(
        *(column(name, type_) for name, type_ in ENDING_COLUMNS), column("unchanged", Boolean())
    )
    .cte("locked")
)
# `service.end`'s checks, on the locked rows: the caller's transaction, in a state `op` ends.
_CHECKED = (
    text(
        """SELECT EXISTS (SELECT 1 FROM txn
               WHERE unchanged AND state = ANY(:states) AND producer_id = :m_pid
                 AND producer_epoch = :m_epoch)
   AND NOT EXISTS (SELECT 1 FROM locked WHERE NOT unchanged OR producer_id <> :m_pid) AS passes"""
    )
    .bindparams(bindparam("states", type_=ARRAY(String())))
    .columns(column("passes", Boolean()))
    .cte("checked")
)


# What an end of transaction version 1 leaves as it was: the epoch is not raised, so the
# identity a recovery gave the row stays (as `service._finish` keeps it without `raise_epoch`).
_KEPT_BY_VERSION_1 = ("recovered_producer_id", "recovered_producer_epoch")


def _one_statement(raise_epoch: bool) -> tuple[str, tuple[str, ...], dict[str, Any]]:
    """The statement, compiled once for asyncpg: its text, its parameters' names in order, and
    the values of the literals it binds. `raise_epoch`: transaction version 2's end."""
    gate = select(_CHECKED.c.passes).scalar_subquery()
    if raise_epoch:
        ends, taken = end_writes(gate)
        writes = [*marker_writes(_LOCKED, gate), *ends, SET_EPOCH.where(gate)]
    else:
        columns = tuple(c for c in ENDED if c not in _KEPT_BY_VERSION_1)
        ends, taken = end_writes(gate, columns)
        writes = [*marker_writes(_LOCKED, gate), *ends]
    taken_cte = taken.cte("taken")
    applied = (
        text(
            upsert_sql(
                """SELECT group_id, topic, "partition", "offset", metadata, leader_epoch,
         CAST(:m_timestamp AS BIGINT)
  FROM taken
  WHERE :m_commit"""
            )
        )
        .columns()
        .cte("applied")
    )
    # With the partitions it ended, for the process's views of what is written.
    ended_topics = select(func.array_agg(_LOCKED.c.topic)).scalar_subquery()
    ended_partitions = select(func.array_agg(_LOCKED.c.partition)).scalar_subquery()
    statement = select(_CHECKED.c.passes, ended_topics, ended_partitions).add_cte(
        _TXN,
        _LOCKED,
        _CHECKED,
        *(write.cte(f"w{i}") for i, write in enumerate(writes)),
        taken_cte,
        applied,
    )
    compiled = statement.compile(dialect=asyncpg_dialect())  # type: ignore[no-untyped-call]
    return compiled.string, tuple(compiled.positiontup or ()), dict(compiled.params)


# By whether it raises the epoch (transaction version 2) or not (version 1).
_END = {raise_epoch: _one_statement(raise_epoch) for raise_epoch in (True, False)}


async def end_in_one_statement(
    db: Database,
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
    if db.is_sqlite or (raise_epoch and epoch >= EPOCH_MAX):
        return None
    sql, order, literals = _END[raise_epoch]
    (target,) = set(TRANSITIONS[op].values())
    commit = target is State.COMPLETE_COMMIT
    values = {
        **literals,
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
    async with db.autocommit() as connection:
        rows = await on_driver(connection, sql, *(values[name] for name in order))
    if not (rows and rows[0][0]):
        return None
    _, topics, partitions = rows[0]
    transaction_ended(db, producer_id, zip(topics or (), partitions or (), strict=True))
    return target
