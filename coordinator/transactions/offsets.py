"""A transaction's offsets (AddOffsets, Kafka's TxnOffsetCommit) in two statements on Postgres,
neither in a transaction: the hot call of every consume-transform-produce loop. `service.
add_offsets` takes its locking path instead on SQLite and whenever this writes nothing.

The first statement reads what the rules decide on, each row with its version: the transaction
(its state, its producer and that producer's epoch), and what `groups.committing` reads for a
member's commit (the group, the member, the epochs at which it was given the partitions, and
whether the partitions exist). The rules run on those facts: the caller is the transaction's
producer at its current epoch, `Op.ADD_OFFSETS` may run in the transaction's state, and the
member may commit those partitions (`fencing.check_member_commit`, KIP-447). Anything they
refuse, and anything missing (no such transaction or group), is left to the locking path, which
answers from rows read under its locks.

The second statement takes the locks in the fixed order (the transaction with its producer, then
the group FOR SHARE, the member and its ownership rows) and writes the offsets into the
transaction, and the transaction's state (begun if it was empty), only if every locked row is
the version the rules read: an end, a fence, a heartbeat or a rebalance between the two sends
the call to the locking path.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.database import Database, on_driver
from coordinator.core.errors import CoordinatorError
from coordinator.groups import committing
from coordinator.groups.fencing import check_member_commit
from coordinator.transactions.models import Transaction, TransactionOffset
from coordinator.transactions.schemas import AddOffsetsRequest
from coordinator.transactions.states import OPEN, TRANSITIONS, Op, State

# The member's facts as `committing` reads them ($1 group, $2 member, $3 topics, $4
# partitions), and the transaction's beside them ($5); a version is the row's xmin (the
# transaction's is its row's and its producer's).
_FACTS = f"""
SELECT t.state, t.producer_id, i.producer_epoch, t.xmin::text || '/' || i.xmin::text, f.*
FROM ({committing.FACTS}) AS f
LEFT JOIN transactions t ON t.transactional_id = $5
LEFT JOIN producer_ids i ON i.producer_id = t.producer_id
"""

_WRITE = f"""
WITH txn AS (
  SELECT t.xmin::text || '/' || i.xmin::text AS version
  FROM transactions t
  JOIN producer_ids i ON i.producer_id = t.producer_id
  WHERE t.transactional_id = $5
  FOR UPDATE OF t, i
), {committing.member_locks(after="txn")}, checked AS (
  SELECT (SELECT version FROM txn) = $6
     AND ($7::text IS NULL OR (SELECT version FROM g) = $7)
     AND ($2::varchar IS NULL OR (SELECT version FROM m) = $8)
     AND (SELECT coalesce(array_agg(version ORDER BY topic, "partition"), '{{}}') FROM o)
         = $9::text[] AS passes
), written AS (
  INSERT INTO transaction_offsets (transactional_id, group_id, topic, "partition", "offset",
                                   metadata, leader_epoch)
  SELECT $5, $1, w.topic, w."partition", w."offset", w.metadata, w.leader_epoch
  FROM unnest($3::varchar[], $4::int[], $10::bigint[], $11::bytea[], $12::int[])
    AS w(topic, "partition", "offset", metadata, leader_epoch)
  WHERE (SELECT passes FROM checked)
  ON CONFLICT (transactional_id, group_id, topic, "partition") DO UPDATE
  SET "offset" = excluded."offset", metadata = excluded.metadata,
      leader_epoch = excluded.leader_epoch
), updated AS (
  UPDATE transactions
  SET state = $13, updated_ms = $14,
      started_ms = CASE WHEN $15 THEN $14 ELSE started_ms END,
      deadline_ms = CASE WHEN $15 THEN $14 + timeout_ms ELSE deadline_ms END
  WHERE transactional_id = $5 AND (SELECT passes FROM checked)
)
SELECT passes FROM checked
"""


async def add_in_two_statements(
    db: Database,
    transactional_id: str,
    body: AddOffsetsRequest,
    keys: Sequence[tuple[str, int]],
    now: int,
) -> State | None:
    """Add `body`'s offsets (of the sorted, distinct partitions `keys`) to the transaction, if
    the rules let its caller and nothing they read changed before the write; the state it left
    the transaction in, or None when nothing was written and the locking path must decide."""
    if db.is_sqlite:
        return None
    topics, partitions = [t for t, _ in keys], [p for _, p in keys]
    member_id, member_epoch = body.member_id, body.member_epoch
    async with db.autocommit() as connection:
        (row,) = await on_driver(
            connection, _FACTS, body.group_id, member_id, topics, partitions, transactional_id
        )
        state, producer_id, epoch, txn_version = row[0:4]
        if txn_version is None or (producer_id, epoch) != (body.producer_id, body.producer_epoch):
            return None
        target = TRANSITIONS[Op.ADD_OFFSETS].get(State(state))
        if target is None:
            return None
        read = committing.read_facts(body.group_id, row[4:])
        group_version = member_version = None
        owned_versions: list[str] = []
        if keys or member_id is not None:
            # KIP-447: the group checks the member when the offsets join the transaction.
            if read is None or read.existing != len(keys):
                return None
            group_version = read.group_version
            if member_id is not None:
                if read.member_version is None or member_epoch is None:
                    return None
                try:
                    check_member_commit(
                        read.facts,
                        body.group_id,
                        member_id,
                        member_epoch,
                        keys,
                        transactional=True,
                        now=now,
                    )
                except CoordinatorError:
                    return None
                member_version, owned_versions = read.member_version, read.owned_versions
        offsets = {(o.topic, o.partition): o for o in body.offsets}
        ordered = [offsets[key] for key in keys]
        (written,) = await on_driver(
            connection,
            _WRITE,
            body.group_id,
            member_id,
            topics,
            partitions,
            transactional_id,
            txn_version,
            group_version,
            member_version,
            owned_versions,
            [o.offset for o in ordered],
            [None if o.metadata is None else o.metadata.encode() for o in ordered],
            [o.leader_epoch for o in ordered],
            str(target),
            now,
            State(state) is not State.ONGOING,
        )
    return target if written[0] else None


async def pending_offset(
    session: AsyncSession, group_id: str, topic: str | None
) -> tuple[str, int] | None:
    """A (topic, partition) of the group (of `topic` only, if given) whose offset an open
    transaction holds, or None: what makes a stable offset fetch UNSTABLE_OFFSET_COMMIT
    (`groups.service.PendingOffset`, given to the groups domain by the app)."""
    pending = (
        select(TransactionOffset.topic, TransactionOffset.partition)
        .join(Transaction, Transaction.transactional_id == TransactionOffset.transactional_id)
        .where(TransactionOffset.group_id == group_id, Transaction.state.in_(list(OPEN)))
        .limit(1)
    )
    if topic is not None:
        pending = pending.where(TransactionOffset.topic == topic)
    held = (await session.execute(pending)).first()
    return None if held is None else (held.topic, held.partition)
