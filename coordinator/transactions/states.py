"""The transaction state machine, as data: which operation may run in which state, and where it
leads. Services call `transition(state, op)`; nothing else decides whether a call is allowed."""

from __future__ import annotations

from enum import StrEnum

from coordinator.transactions.errors import InvalidTxnState


class State(StrEnum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARED = "Prepared"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"


class Op(StrEnum):
    ADD_PARTITIONS = "add partitions"
    ADD_OFFSETS = "add offsets"
    PRODUCE = "produce"
    PREPARE = "prepare"
    COMMIT = "commit"
    ABORT = "abort"
    # Kafka's transaction version 2 (EndTxn 5): an abort with nothing open at the caller's epoch
    # ends nothing but raises the epoch, fencing whatever the producer may still have in flight.
    ABORT_NOTHING = "abort nothing"
    # The coordinator's own: a raised epoch (InitPid), a timeout, an operator.
    FENCE = "fence"
    TIME_OUT = "time out"
    ADMIN_ABORT = "admin abort"
    EXPIRE = "expire"
    # After InitPid raised the epoch (an open transaction was fenced first, or kept Prepared).
    INIT_PID = "init producer id"


OPEN = frozenset({State.ONGOING, State.PREPARED})
IDLE = frozenset({State.EMPTY, State.COMPLETE_COMMIT, State.COMPLETE_ABORT})

_START = {state: State.ONGOING for state in IDLE}
_END_OPEN = {State.ONGOING: State.COMPLETE_ABORT, State.PREPARED: State.COMPLETE_ABORT}

TRANSITIONS: dict[Op, dict[State, State]] = {
    # Joining starts a transaction when none is open at this epoch; nothing joins a Prepared one.
    Op.ADD_PARTITIONS: {**_START, State.ONGOING: State.ONGOING},
    Op.ADD_OFFSETS: {**_START, State.ONGOING: State.ONGOING},
    # A transactional batch joins (and starts) the transaction itself (Kafka 4's transaction
    # version 2); a Prepared one takes no more records.
    Op.PRODUCE: {**_START, State.ONGOING: State.ONGOING},
    # A task with no output prepares an empty transaction; preparing twice is a harmless retry.
    Op.PREPARE: {
        State.ONGOING: State.PREPARED,
        State.PREPARED: State.PREPARED,
        State.EMPTY: State.PREPARED,
        State.COMPLETE_COMMIT: State.PREPARED,
        State.COMPLETE_ABORT: State.PREPARED,
    },
    Op.COMMIT: {State.ONGOING: State.COMPLETE_COMMIT, State.PREPARED: State.COMPLETE_COMMIT},
    Op.ABORT: dict(_END_OPEN),
    Op.ABORT_NOTHING: {state: State.COMPLETE_ABORT for state in IDLE},
    Op.FENCE: dict(_END_OPEN),
    Op.TIME_OUT: dict(_END_OPEN),
    Op.ADMIN_ABORT: dict(_END_OPEN),
    Op.EXPIRE: {state: State.DEAD for state in IDLE},
    Op.INIT_PID: {state: State.EMPTY for state in IDLE} | {State.PREPARED: State.PREPARED},
}


def allowed(op: Op) -> list[State]:
    """The states `op` may start from."""
    return list(TRANSITIONS[op])


def transition(state: str, op: Op, transactional_id: str) -> State:
    """The state `op` leads to from `state`, or INVALID_TXN_STATE when it is not allowed there."""
    target = TRANSITIONS[op].get(State(state))
    if target is None:
        raise InvalidTxnState(f"cannot {op} while transaction {transactional_id!r} is {state}")
    return target
