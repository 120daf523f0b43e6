"""Transactions: transactional ids, epochs that fence zombies, the state machine, EndTxn with
control markers, commit-group, and the coordinator's timeouts.

The log calls the produce-time join through the interface it declares
(`coordinator.log.produce.GroupTransactions`); importing this package provides it, so the log
never imports the transactions domain."""

from coordinator.log import produce as _produce
from coordinator.transactions.joining import GroupJoins as _GroupJoins
from coordinator.transactions.states import TRANSITIONS as _TRANSITIONS
from coordinator.transactions.states import Op as _Op
from coordinator.transactions.states import State as _State

# A batch joins (and starts) its transaction from any state PRODUCE leaves, and leaves it Ongoing.
assert set(_TRANSITIONS[_Op.PRODUCE].values()) == {_State.ONGOING}
_produce.use_transactions(_GroupJoins, _State.ONGOING, [str(s) for s in _TRANSITIONS[_Op.PRODUCE]])
