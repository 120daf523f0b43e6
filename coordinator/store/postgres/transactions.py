"""The Postgres engine's one-statement paths of the transactions: the producer's AddPartitions and
EndTxn of its own transaction, each in one round trip, and its offsets in two. Each applies the
domain's rules, rendered into its SQL from where they live: who may act
(`transactions.caller.is_current`), which states an operation starts from
(`transactions.states.TRANSITIONS`), what an end writes (`log.markers.marker_writes`,
`transactions.ending.end_writes`, `groups.offsets.commit_from`), how offsets join a transaction
(`transactions.offsets.pending_from`). When the rows are not as the caller says, each writes
nothing and the domain's locking path decides, and answers.

A statement reads what it does not lock as of its start. Everything EndTxn writes from such
reads (the transaction's partitions and pending offsets, each partition's first offset of the
transaction, the batches an abort flags) changes only with a new version of the transaction row
or of a partition row (every write of a transaction's membership updates its row; every append
moves its partition's high watermark). So it also checks that the rows it locked are the
versions it read at its start: if one changed while it waited for the lock, it writes nothing.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    String,
    bindparam,
    column,
    func,
    select,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY

from coordinator.groups.offsets import commit_from
from coordinator.log.markers import ENDING_COLUMNS, marker_writes
from coordinator.producers.repository import SET_EPOCH
from coordinator.store.postgres.driver import Compiled, Driven, on_driver, render, rows_of
from coordinator.store.postgres.groups import FACTS, member_locks, read_facts
from coordinator.transactions.caller import in_sql
from coordinator.transactions.ending import ENDED, KEPT_BY_VERSION_1, end_writes
from coordinator.transactions.offsets import (
    PENDING_COLUMNS,
    OffsetsRule,
    TxnFacts,
    TxnOffsets,
    pending_from,
)
from coordinator.transactions.states import TRANSITIONS, Op, State

# -- AddPartitions ---------------------------------------------------------------------------------

# The transaction row locked with its producer's row, as the locking path locks them; the caller
# and the state checked on them, and every partition's existence (read, as the locking path reads
# it); the row becomes Ongoing (started now when it was not open) with a new version
# (`updated_ms`, which is how an end sees its membership changed), and the partitions are
# included, those already in it left as they are. $1 transactional id, $2 producer id, $3
# epoch, $4 states it may start from, $5 topics and $6 partitions (the keys, in order), $7 now.
#
# Its commit is not flushed on its own (`synchronous_commit` off for this statement's
# transaction alone): everything that comes of an add and matters is written by a later unit of
# work that does flush (the transaction's batches, its offsets, its end), and a flush of the WAL
# takes every commit before it along. What a crash of the store can lose is the add alone, with
# nothing written on it: the producer's next batch to the partition joins (and starts) the
# transaction itself (`TRANSITIONS[Op.PRODUCE]`), and an end finds it as it was before the add
# (docs/pages/semantics.md, AddPartitions on Postgres). That holds while a batch may join and
# start a transaction wherever an add may (asserted below).
_ADD_PARTITIONS = f"""
WITH txn AS (
  SELECT t.state, t.producer_id, i.producer_epoch
    FROM transactions t
    JOIN producer_ids i ON i.producer_id = t.producer_id
   WHERE t.transactional_id = $1
     FOR UPDATE OF t, i
), wanted AS (
  SELECT * FROM unnest($5::text[], $6::int[]) AS w(topic, "partition")
), checked AS (
  SELECT EXISTS (SELECT 1 FROM txn
                  WHERE state = ANY($4::text[])
                    AND {in_sql("producer_id", "producer_epoch", "$2", "$3")})
     AND (SELECT count(*) FROM partitions p
            JOIN wanted w ON w.topic = p.topic AND w."partition" = p."partition")
         = cardinality($5::text[]) AS passes
), started AS (
  UPDATE transactions
     SET state = '{State.ONGOING}',
         started_ms = CASE WHEN state = '{State.ONGOING}' THEN started_ms ELSE $7 END,
         deadline_ms = CASE WHEN state = '{State.ONGOING}' THEN deadline_ms
                            ELSE $7 + timeout_ms END,
         updated_ms = $7
   WHERE transactional_id = $1 AND (SELECT passes FROM checked)
), included AS (
  INSERT INTO transaction_partitions (transactional_id, topic, "partition", producer_id)
  SELECT $1, topic, "partition", $2 FROM wanted WHERE (SELECT passes FROM checked)
  ON CONFLICT DO NOTHING
)
SELECT passes, set_config('synchronous_commit', 'off', true) FROM checked
"""

_ADD_STATES = [str(state) for state in TRANSITIONS[Op.ADD_PARTITIONS]]
# The statement writes 'Ongoing': every state it may start from leads there.
assert set(TRANSITIONS[Op.ADD_PARTITIONS].values()) == {State.ONGOING}
# Why its commit need not be flushed on its own (see the statement).
assert TRANSITIONS[Op.PRODUCE] == TRANSITIONS[Op.ADD_PARTITIONS]


async def add_partitions(
    connection: Driven,
    transactional_id: str,
    producer_id: int,
    epoch: int,
    keys: list[tuple[str, int]],
    now: int,
) -> bool:
    rows = await on_driver(
        connection,
        _ADD_PARTITIONS,
        transactional_id,
        producer_id,
        epoch,
        _ADD_STATES,
        [topic for topic, _ in keys],
        [partition for _, partition in keys],
        now,
    )
    return bool(rows and rows[0][0])


# -- EndTxn --------------------------------------------------------------------------------------

# The transaction row and its producer's, locked, and whether the row is the version the
# statement started from.
_TXN = (
    text(
        """SELECT t.state, t.producer_id, i.producer_epoch, t.share_acks,
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
        column("share_acks", Boolean()),
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
# `service.end`'s checks, on the locked rows: the caller's transaction, in a state `op` ends;
# one that holds share-group acknowledgements is the locking path's (`finishing.finish` settles
# them).
_CHECKED = (
    text(
        f"""SELECT EXISTS (SELECT 1 FROM txn
               WHERE unchanged AND NOT share_acks AND state = ANY(:states)
                 AND {in_sql("producer_id", "producer_epoch", ":m_pid", ":m_epoch")})
   AND NOT EXISTS (SELECT 1 FROM locked WHERE NOT unchanged OR producer_id <> :m_pid) AS passes"""
    )
    .bindparams(bindparam("states", type_=ARRAY(String())))
    .columns(column("passes", Boolean()))
    .cte("checked")
)


def _end_statement(raise_epoch: bool) -> Compiled:
    """The statement, compiled once. `raise_epoch`: transaction version 2's end."""
    gate = select(_CHECKED.c.passes).scalar_subquery()
    if raise_epoch:
        ends, taken = end_writes(gate)
        writes = [*marker_writes(_LOCKED, gate), *ends, SET_EPOCH.where(gate)]
    else:
        ends, taken = end_writes(gate, tuple(c for c in ENDED if c not in KEPT_BY_VERSION_1))
        writes = [*marker_writes(_LOCKED, gate), *ends]
    taken_cte = taken.cte("taken")
    committed = select(
        *(taken_cte.c[c] for c in ("group_id", "topic", "partition", "offset", "metadata")),
        taken_cte.c.leader_epoch,
        bindparam("m_timestamp", type_=BigInteger()),
    ).where(bindparam("m_commit", type_=Boolean()))
    applied = commit_from(postgresql.insert, committed).cte("applied")
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
    return Compiled(statement)


# By whether it raises the epoch (transaction version 2) or not (version 1).
_END = {raise_epoch: _end_statement(raise_epoch) for raise_epoch in (True, False)}


async def end(
    connection: Driven, values: dict[str, Any], raise_epoch: bool
) -> list[tuple[str, int]] | None:
    rows = await _END[raise_epoch].run(connection, values)
    if not (rows and rows[0][0]):
        return None
    _, topics, partitions = rows[0]
    return list(zip(topics or (), partitions or (), strict=True))


# -- AddOffsets ------------------------------------------------------------------------------------

# The member's facts as `committing` reads them ($1 group, $2 member, $3 topics, $4
# partitions), and the transaction's beside them ($5), if there is one; a version is the row's
# xmin. The write checks the group's rows by their versions, and the transaction on its row as
# it locked it, as the rule checks it (its caller current, $13 and $14, and in a state the
# offsets join, $6), so an append that joined the transaction between the two does not send the
# call to the locks.
_OFFSETS_FACTS = f"""
SELECT t.state, t.producer_id, i.producer_epoch, t.transactional_id IS NOT NULL, f.*
FROM ({FACTS}) AS f
LEFT JOIN transactions t ON t.transactional_id = $5
LEFT JOIN producer_ids i ON i.producer_id = t.producer_id
"""

_PENDING = rows_of(
    """SELECT $5, $1, w.topic, w."partition", w."offset", w.metadata, w.leader_epoch
  FROM unnest($3::varchar[], $4::int[], $10::bigint[], $11::bytea[], $12::int[])
    AS w(topic, "partition", "offset", metadata, leader_epoch)
  WHERE (SELECT passes FROM checked)""",
    PENDING_COLUMNS,
)
_OFFSETS_WRITE = f"""
WITH txn AS (
  SELECT t.state, t.producer_id, i.producer_epoch
  FROM transactions t
  JOIN producer_ids i ON i.producer_id = t.producer_id
  WHERE t.transactional_id = $5
  FOR UPDATE OF t, i
), {member_locks(after="txn")}, checked AS (
  SELECT EXISTS (SELECT 1 FROM txn
                  WHERE state = ANY($6::text[])
                    AND {in_sql("producer_id", "producer_epoch", "$13", "$14")})
     AND ($7::text IS NULL OR (SELECT version FROM g) = $7)
     AND ($2::varchar IS NULL OR (SELECT version FROM m) = $8)
     AND (SELECT coalesce(array_agg(version ORDER BY topic, "partition"), '{{}}') FROM o)
         = $9::text[] AS passes
), written AS (
  {render(pending_from(postgresql.insert, _PENDING))}
), updated AS (
  UPDATE transactions
  SET state = '{State.ONGOING}', updated_ms = $15,
      started_ms = CASE WHEN state = '{State.ONGOING}' THEN started_ms ELSE $15 END,
      deadline_ms = CASE WHEN state = '{State.ONGOING}' THEN deadline_ms
                         ELSE $15 + timeout_ms END
  WHERE transactional_id = $5 AND (SELECT passes FROM checked)
)
SELECT passes FROM checked
"""
_OFFSETS_STATES = [str(state) for state in TRANSITIONS[Op.ADD_OFFSETS]]
# The statement writes 'Ongoing': every state the offsets may join a transaction in leads there.
assert set(TRANSITIONS[Op.ADD_OFFSETS].values()) == {State.ONGOING}


async def add_offsets(connection: Driven, ask: TxnOffsets, rule: OffsetsRule) -> State | None:
    """The facts read, `rule` applied, the offsets and the transaction's state written if every
    locked row is the version the rule read."""
    topics, partitions = [t for t, _ in ask.keys], [p for _, p in ask.keys]
    (row,) = await on_driver(
        connection,
        _OFFSETS_FACTS,
        ask.group_id,
        ask.member_id,
        topics,
        partitions,
        ask.transactional_id,
    )
    state, producer_id, epoch, found = row[0:4]
    if not found:
        return None
    read = read_facts(ask.group_id, row[4:])
    target = rule(ask, TxnFacts(state, producer_id, epoch), read)
    if target is None:
        return None
    group_version = member_version = None
    owned_versions: list[str] = []
    if read is not None and (ask.keys or ask.member_id is not None):
        group_version = read.group_version
        if ask.member_id is not None:
            member_version, owned_versions = read.member_version, read.owned_versions
    (written,) = await on_driver(
        connection,
        _OFFSETS_WRITE,
        ask.group_id,
        ask.member_id,
        topics,
        partitions,
        ask.transactional_id,
        _OFFSETS_STATES,
        group_version,
        member_version,
        owned_versions,
        [offset for offset, _, _ in ask.offsets],
        [None if metadata is None else metadata.encode() for _, metadata, _ in ask.offsets],
        [leader_epoch for _, _, leader_epoch in ask.offsets],
        ask.producer_id,
        ask.producer_epoch,
        ask.now,
    )
    return State.ONGOING if written[0] else None
