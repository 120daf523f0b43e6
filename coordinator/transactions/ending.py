"""EndTxn in one statement on Postgres: the producer's end of its own transaction (transaction
version 2), the hot call of every transactional pipeline, written in one round trip when the
transaction is as its caller says it is; otherwise `service.end` takes the locks and answers.

The statement locks the transaction row with its producer's row, then the transaction's
partitions (the fixed lock order), and checks on the locked rows what `service.end` checks:
the caller is the transaction's producer at its current epoch, and the transaction is in a state
that `op` may end (`states.allowed`). Anything else (a retry of an end, a fenced or unknown
producer, an epoch at its last value, no such transaction) writes nothing and takes the locking
path, which answers it.

A statement reads what it does not lock as of its start. Everything it writes from such reads
(the transaction's partitions and pending offsets, each partition's first offset of the
transaction, the batches an abort flags) changes only with a new version of the transaction row
or of a partition row (every write of a transaction's membership updates its row; every append
moves its partition's high watermark). So the statement also checks that the rows it locked
are the versions it read at its start: if one changed while it waited for the lock, it writes
nothing and the locking path, whose statements read after the locks, ends the transaction.

Its writes are the locking path's (`service._finish` with `markers.write_markers`): a marker on
each partition at its high watermark, an abort's batches flagged, the producer's open
transaction released, the partitions and pending offsets taken, a commit's offsets applied to the
groups, the transaction's end recorded and its producer's epoch raised.
"""

from __future__ import annotations

from coordinator.core.database import Database, on_driver
from coordinator.core.schemas import EPOCH_MAX
from coordinator.groups.offsets import upsert_sql
from coordinator.log.models import CONTROL_ABORT, CONTROL_COMMIT
from coordinator.transactions.states import TRANSITIONS, Op, State
from sdk import recordbatch

# The transaction's offsets, taken from it, as the group's commit ($5: a commit, $6: now).
_TAKEN = """SELECT group_id, topic, "partition", "offset", metadata, leader_epoch, $6
  FROM taken
  WHERE $5"""

_END_POSTGRES = f"""
WITH txn AS (
  SELECT t.state, t.producer_id, i.producer_epoch,
         t.xmin::text = (SELECT s.xmin::text FROM transactions s
                         WHERE s.transactional_id = $1) AS unchanged
  FROM transactions t
  JOIN producer_ids i ON i.producer_id = t.producer_id
  WHERE t.transactional_id = $1
  FOR UPDATE OF t, i
), locked AS (
  SELECT p.topic, p."partition", p.high_watermark, x.producer_id,
         s.current_txn_first_offset AS first,
         p.xmin::text = (SELECT q.xmin::text FROM partitions q
                         WHERE q.topic = p.topic AND q."partition" = p."partition") AS unchanged
  FROM partitions p
  JOIN transaction_partitions x ON x.topic = p.topic AND x."partition" = p."partition"
  LEFT JOIN producer_states s
    ON s.topic = p.topic AND s."partition" = p."partition" AND s.producer_id = x.producer_id
  WHERE x.transactional_id = $1 AND (SELECT count(*) FROM txn) >= 0
  ORDER BY p.topic, p."partition"
  FOR UPDATE OF p
), checked AS (
  SELECT EXISTS (SELECT 1 FROM txn
                 WHERE unchanged AND state = ANY($2::varchar[]) AND producer_id = $3
                   AND producer_epoch = $4)
     AND NOT EXISTS (SELECT 1 FROM locked WHERE NOT unchanged OR producer_id <> $3) AS passes
), aborting AS (
  UPDATE batches b SET aborted = true
  FROM locked l
  WHERE NOT $5 AND (SELECT passes FROM checked) AND l.first IS NOT NULL
    AND b.topic = l.topic AND b."partition" = l."partition" AND b.base_offset >= l.first
    AND b.producer_id = l.producer_id AND b.control IS NULL
), marking AS (
  INSERT INTO batches (topic, "partition", base_offset, last_offset, producer_id,
                       producer_epoch, base_sequence, last_sequence, "timestamp", max_timestamp,
                       size, is_transactional, control, aborted, first_offset, record_count,
                       payload)
  SELECT l.topic, l."partition", l.high_watermark, l.high_watermark, l.producer_id,
         $4, -1, -1, $6, $6, length($7::bytea), true, $8, NOT $5, l.first, 1,
         overlay($7::bytea PLACING int8send(l.high_watermark) FROM 1 FOR 8)
  FROM locked l
  WHERE (SELECT passes FROM checked)
), advancing AS (
  UPDATE partitions p SET high_watermark = l.high_watermark + 1
  FROM locked l
  WHERE p.topic = l.topic AND p."partition" = l."partition" AND (SELECT passes FROM checked)
), releasing AS (
  UPDATE producer_states s SET current_txn_first_offset = NULL
  FROM locked l
  WHERE s.topic = l.topic AND s."partition" = l."partition" AND s.producer_id = l.producer_id
    AND l.first IS NOT NULL AND (SELECT passes FROM checked)
), dropped AS (
  DELETE FROM transaction_partitions
  WHERE transactional_id = $1 AND (SELECT passes FROM checked)
), taken AS (
  DELETE FROM transaction_offsets
  WHERE transactional_id = $1 AND (SELECT passes FROM checked)
  RETURNING group_id, topic, "partition", "offset", metadata, leader_epoch
), applied AS (
  {upsert_sql(_TAKEN)}
), ended AS (
  UPDATE transactions
  SET state = $9, started_ms = NULL, deadline_ms = NULL, last_producer_id = $3,
      last_producer_epoch = $4, last_state = $9, last_reason = $10, last_group_key = NULL,
      updated_ms = $6, recovered_producer_id = NULL, recovered_producer_epoch = NULL
  WHERE transactional_id = $1 AND (SELECT passes FROM checked)
), raised AS (
  UPDATE producer_ids SET producer_epoch = $4 + 1
  WHERE producer_id = $3 AND (SELECT passes FROM checked)
)
SELECT passes FROM checked
"""


async def end_in_one_statement(
    db: Database,
    transactional_id: str,
    producer_id: int,
    epoch: int,
    op: Op,
    reason: str,
    now: int,
) -> State | None:
    """End the transaction as `op` (commit or abort) for its producer `producer_id` at `epoch`
    and raise the epoch, in one statement that commits by itself (Postgres); the state it
    ended in, or None when it wrote nothing and the locking path must decide."""
    if db.is_sqlite or epoch >= EPOCH_MAX:
        return None
    (target,) = set(TRANSITIONS[op].values())
    commit = target is State.COMPLETE_COMMIT
    payload = recordbatch.build_control(commit, producer_id, epoch, now)
    async with db.autocommit() as connection:
        rows = await on_driver(
            connection,
            _END_POSTGRES,
            transactional_id,
            [str(state) for state in TRANSITIONS[op]],
            producer_id,
            epoch,
            commit,
            now,
            payload,
            CONTROL_COMMIT if commit else CONTROL_ABORT,
            str(target),
            reason,
        )
    return target if rows and rows[0][0] else None
