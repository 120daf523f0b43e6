"""The producer's transaction manager, as Kafka's `TransactionManager`: the producer's identity
(producer id, epoch, each partition's next sequence) and its transaction's state machine, as data.
It does no I/O and has no lock of its own: the producer's lock guards it. The facade asks
`check(op)` before a call and `enter(op)` to take it; the sender asks `may_send()` and, for each
batch, `holds_back(generation)`.

`commit_transaction_async()` commits a transaction in the background while the next one fills:
`pending` is then the accumulator's generation of the committing transaction's batches. They are
sent under the current epoch; the later generations' wait for the epoch EndTxn's answer gives.

A transaction that failed (a record or a call refused) stays IN_TRANSACTION with `error` set:
every call but `abort_transaction()` raises that error until the abort. A transaction the
coordinator aborted on its timeout leaves the producer NEEDS_INIT with `error` set.
"""

from __future__ import annotations

import enum

from sdk._errors import IllegalStateError, KafkaException, TransactionTimedOut

__all__ = ["SEQUENCE_MODULUS", "TRANSITIONS", "Op", "TransactionManager", "TxnState"]

SEQUENCE_MODULUS = 2**31

TopicKey = tuple[str, int]


class TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized"  # transactional, before init_transactions()
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    PREPARED = "prepared"
    COMMITTING = "committing"  # EndTxn(commit) sent, answer not yet seen
    ABORTING = "aborting"
    NEEDS_INIT = "needs init_transactions()"  # the coordinator aborted us on timeout


class Op(enum.Enum):
    """The caller's calls, named as they appear in its error messages."""

    INIT = "init_transactions()"
    BEGIN = "begin_transaction()"
    PRODUCE = "produce()"
    SEND_OFFSETS = "send_offsets_to_transaction()"
    PREPARE = "prepare_transaction()"
    COMMIT = "commit_transaction()"
    COMMIT_ASYNC = "commit_transaction_async()"
    ABORT = "abort_transaction()"
    ENDED = "the transaction's end"  # EndTxn answered (or nothing was there to end)


S = TxnState
TRANSITIONS: dict[Op, dict[TxnState, TxnState]] = {
    # InitPid's answer: READY, or PREPARED when it kept an older instance's prepared transaction.
    Op.INIT: {S.UNINITIALIZED: S.READY, S.READY: S.READY, S.NEEDS_INIT: S.READY},
    Op.BEGIN: {S.READY: S.IN_TRANSACTION},
    Op.PRODUCE: {S.IN_TRANSACTION: S.IN_TRANSACTION},
    Op.SEND_OFFSETS: {S.IN_TRANSACTION: S.IN_TRANSACTION},
    Op.PREPARE: {S.IN_TRANSACTION: S.PREPARED},
    # A commit or abort whose answer was lost is called again from where it left off.
    Op.COMMIT: {
        S.IN_TRANSACTION: S.COMMITTING,
        S.PREPARED: S.COMMITTING,
        S.COMMITTING: S.COMMITTING,
    },
    # The commit goes on in the background (`pending`); the next transaction may begin at once.
    Op.COMMIT_ASYNC: {S.IN_TRANSACTION: S.READY, S.PREPARED: S.READY, S.COMMITTING: S.READY},
    Op.ABORT: {S.IN_TRANSACTION: S.ABORTING, S.PREPARED: S.ABORTING, S.ABORTING: S.ABORTING},
    Op.ENDED: {S.COMMITTING: S.READY, S.ABORTING: S.READY},
}

# The calls a failed transaction refuses with its error (all but the abort, and a begin, which
# an open transaction refuses anyway).
_REFUSED_AFTER_FAILURE = frozenset(
    {Op.PRODUCE, Op.SEND_OFFSETS, Op.PREPARE, Op.COMMIT, Op.COMMIT_ASYNC}
)
# The calls whose refusal fails the transaction, in the states where it is open.
_CALLS_IN_TRANSACTION = frozenset({Op.SEND_OFFSETS, Op.PREPARE, Op.COMMIT})
_OPEN = frozenset({S.IN_TRANSACTION, S.COMMITTING, S.PREPARED})


class TransactionManager:
    def __init__(self, transactional: bool, idempotent: bool) -> None:
        self.transactional = transactional
        self.idempotent = idempotent
        self.state = TxnState.UNINITIALIZED if transactional else TxnState.READY
        self.producer_id = -1
        self.epoch = -1
        self.error: KafkaException | None = None  # what fails the current transaction
        self.fatal: KafkaException | None = None  # what fails the producer
        self.touched = False  # the coordinator may hold an open transaction of ours
        self.ending: tuple[int, int] | None = None  # (pid, epoch) an EndTxn was sent with
        # The generation of the transaction committing in the background, if one is.
        self.pending: int | None = None
        self._sequences: dict[TopicKey, int] = {}

    # -- the state machine --------------------------------------------------------------------

    def check(self, op: Op) -> TxnState:
        """The state `op` starts from; raises what the caller must see if it may not run."""
        if self.fatal is not None:
            raise self.fatal
        state = self.state
        timed_out = state is TxnState.NEEDS_INIT and self.error is not None
        if timed_out and op not in (Op.INIT, Op.BEGIN):
            raise self.error  # type: ignore[misc]
        if op is Op.BEGIN and state is TxnState.IN_TRANSACTION and self.error is not None:
            raise self.error  # a failed transaction (or commit_transaction_async()) to abort
        if state not in TRANSITIONS[op]:
            raise IllegalStateError(f"{op.value} is not allowed {state.value}")
        if op in _REFUSED_AFTER_FAILURE and self.error is not None:
            raise self.error
        return state

    def enter(self, op: Op) -> None:
        """Take `op`'s transition (checked before, under the same lock)."""
        self.state = TRANSITIONS[op][self.state]
        if op is Op.BEGIN and self.pending is None:
            # (While a commit is pending, an error is that commit's: it fails this one too.)
            self.error = None

    def may_send(self) -> bool:
        """Whether the sender may send batches: always, unless a transaction is not open or
        already failed."""
        if not self.transactional:
            return True
        if self.pending is not None:
            return self.error is None
        return self.state is TxnState.IN_TRANSACTION and self.error is None

    def holds_back(self, generation: int) -> bool:
        """Whether a batch of `generation` must wait: it belongs to a transaction begun while
        an earlier one commits in the background, and needs the epoch that commit gives."""
        return self.pending is not None and generation > self.pending

    def refused(self, op: Op, error: KafkaException) -> KafkaException:
        """A call of the transaction was refused with `error` (not fatal, not a timeout): it
        fails the open transaction, which must be aborted. Returns what the caller raises."""
        if op in _CALLS_IN_TRANSACTION and self.state in _OPEN:
            error = error.with_abort_required()
            self.error = error
            self.state = TxnState.IN_TRANSACTION
        return error

    def record_failed(self, error: KafkaException) -> KafkaException | None:
        """A record of the transaction failed: the transaction can only be aborted now. Returns
        the error its unsent records are purged with, if this failed it."""
        if isinstance(error, TransactionTimedOut):
            self.timed_out(error)
            return error
        if self.error is None and not error.fatal:
            self.error = error.with_abort_required()
            return self.error
        return None

    def timed_out(self, error: KafkaException) -> None:
        """The coordinator aborted the transaction on its timeout: only InitPid helps now."""
        self.error = error
        self.state = TxnState.NEEDS_INIT

    # -- the identity -------------------------------------------------------------------------

    def start_epoch(self, producer_id: int, epoch: int) -> None:
        """A new (producer id, epoch): every partition's sequences start again at 0, and no
        transaction of it is open anywhere."""
        self.producer_id, self.epoch = producer_id, epoch
        self._sequences.clear()
        self.touched = False
        self.error = None
        self.ending = None

    def end_identity(self) -> tuple[int, int]:
        """The (producer id, epoch) EndTxn names this transaction by: fixed at its first
        attempt, so a retry after a lost answer carries the epoch the transaction ends with."""
        if self.ending is None:
            self.ending = (self.producer_id, self.epoch)
        return self.ending

    def next_sequence(self, tp: TopicKey, count: int) -> int:
        """The base sequence of `tp`'s next batch of `count` records (-1 when not idempotent)."""
        if not self.idempotent:
            return -1
        sequence = self._sequences.get(tp, 0)
        self._sequences[tp] = (sequence + count) % SEQUENCE_MODULUS
        return sequence

    def batch_identity(self) -> tuple[int, int]:
        """The (producer id, epoch) a batch is built with; (-1, -1) when not idempotent."""
        return (self.producer_id, self.epoch) if self.idempotent else (-1, -1)
