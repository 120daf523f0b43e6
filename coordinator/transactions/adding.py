"""AddPartitions in one statement on Postgres: the producer adding partitions to its own
transaction (Kafka's AddPartitionsToTxn before version 4, which every client of transaction
version 1 sends before a transaction's first batch on a partition), in one round trip when the
transaction is as its caller says it is and every partition exists; otherwise
`service.add_partitions` takes the locking path, which answers (and refuses).

The statement locks the transaction row with its producer's row, as the locking path does,
checks on them what `service.add_partitions` checks (the caller is the transaction's producer at
its current epoch, the state is one `Op.ADD_PARTITIONS` starts from, every partition exists),
and only then writes, each write gated on that check: the row becomes Ongoing (started now when
it was not open) with a new version (`updated_ms`, which is how an end sees its membership
changed), and the partitions are included, those already in it left as they are.

What it reads without a lock is whether the partitions exist, as the locking path reads it.
"""

from __future__ import annotations

from coordinator.core.database import Database, on_driver
from coordinator.transactions.states import TRANSITIONS, Op, State

# $1 transactional id, $2 producer id, $3 epoch, $4 states it may start from, $5 topics and
# $6 partitions (the keys, in order), $7 now.
_ADD_SQL = """
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
                  WHERE state = ANY($4::text[]) AND producer_id = $2 AND producer_epoch = $3)
     AND (SELECT count(*) FROM partitions p
            JOIN wanted w ON w.topic = p.topic AND w."partition" = p."partition")
         = cardinality($5::text[]) AS passes
), started AS (
  UPDATE transactions
     SET state = 'Ongoing',
         started_ms = CASE WHEN state = 'Ongoing' THEN started_ms ELSE $7 END,
         deadline_ms = CASE WHEN state = 'Ongoing' THEN deadline_ms ELSE $7 + timeout_ms END,
         updated_ms = $7
   WHERE transactional_id = $1 AND (SELECT passes FROM checked)
), included AS (
  INSERT INTO transaction_partitions (transactional_id, topic, "partition", producer_id)
  SELECT $1, topic, "partition", $2 FROM wanted WHERE (SELECT passes FROM checked)
  ON CONFLICT DO NOTHING
)
SELECT passes FROM checked
"""

_STATES = [str(state) for state in TRANSITIONS[Op.ADD_PARTITIONS]]
# The statement writes 'Ongoing': every state it may start from leads there.
assert set(TRANSITIONS[Op.ADD_PARTITIONS].values()) == {State.ONGOING}


async def add_in_one_statement(
    db: Database,
    transactional_id: str,
    producer_id: int,
    epoch: int,
    keys: list[tuple[str, int]],
    now: int,
) -> bool:
    """Add the partitions `keys` (distinct, sorted) to the transaction of `producer_id` at
    `epoch`, in one statement that commits by itself (Postgres): True when it did, False when
    it wrote nothing and the locking path must decide."""
    if db.is_sqlite or not keys:
        return False
    topics = [topic for topic, _ in keys]
    partitions = [partition for _, partition in keys]
    async with db.autocommit() as connection:
        rows = await on_driver(
            connection,
            _ADD_SQL,
            transactional_id,
            producer_id,
            epoch,
            _STATES,
            topics,
            partitions,
            now,
        )
    return bool(rows and rows[0][0])
