"""Share-group acknowledgements inside a transaction, which no Kafka broker offers: a
transactional producer that consumed records of a share group (KIP-932) acknowledges them in
the same transaction as its output. The records stay the member's, with no lock to run out,
until the transaction ends: a commit applies the acknowledgements with the output, an abort
(the producer's, a timeout, a newer epoch fencing it) releases the records for delivery again.
So a consume-process-produce over a queue is exactly once.

The caller is checked as for its offsets (`Op.ADD_OFFSETS`, KIP-447's fencing by the producer's
epoch); the records must be acquired by the member it names, not expired, and not held by
another transaction, else INVALID_RECORD_STATE and nothing changes. Lock order: the
transactional id, then the share partitions in (topic, partition) order, as the transaction's
end takes them after its own partitions (`finishing.finish` settles them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy.orm.attributes import flag_modified

from coordinator.core.clock import now_ms
from coordinator.core.errors import InvalidRequest
from coordinator.groups.inputs import check_id
from coordinator.shares.held import hold_in
from coordinator.shares.service import AckBatch
from coordinator.store import Store, store_of
from coordinator.transactions.caller import check_caller
from coordinator.transactions.finishing import begin
from coordinator.transactions.inputs import Caller
from coordinator.transactions.locks import lock_existing
from coordinator.transactions.models import TransactionShareAck
from coordinator.transactions.schemas import StateResponse
from coordinator.transactions.states import Op, State, transition

TP = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ShareAcks:
    """A member's acknowledgements joining the caller's transaction."""

    caller: Caller
    group_id: str
    member_id: str
    acks: Mapping[TP, Sequence[AckBatch]]

    def check(self) -> None:
        self.caller.check()
        check_id("group_id", self.group_id)
        check_id("member_id", self.member_id)
        if not self.acks:
            raise InvalidRequest("acknowledgements: at least one")


async def add_share_acks(db: Store, transactional_id: str, adding: ShareAcks) -> StateResponse:
    adding.check()
    body = adding.caller
    async with db.write() as session:
        now = now_ms()
        locked = await lock_existing(session, transactional_id)
        txn = locked.txn
        await check_caller(session, txn, locked.epoch, body.producer_id, body.producer_epoch)
        target = transition(txn.state, Op.ADD_OFFSETS, transactional_id)
        await hold_in(
            session, db.settings, adding.group_id, adding.member_id, transactional_id, adding.acks
        )
        await store_of(session).insert_ignore(
            session,
            TransactionShareAck,
            [
                {
                    "transactional_id": transactional_id,
                    "group_id": adding.group_id,
                    "topic": topic,
                    "partition": partition,
                }
                for topic, partition in sorted(adding.acks)
            ],
            ["transactional_id", "group_id", "topic", "partition"],
        )
        if txn.state != State.ONGOING:
            begin(txn, now)
        txn.state = target
        txn.share_acks = True
        txn.updated_ms = now
        flag_modified(txn, "updated_ms")  # a new version of the row, as in add_partitions
    return StateResponse(state=target)
