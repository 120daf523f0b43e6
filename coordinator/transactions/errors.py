"""Errors of transactions (docs/pages/http-api.md, Transactions and Error codes)."""

from coordinator.core.errors import CoordinatorError

# INVALID_TXN_STATE is the log's too (a plain batch into an open transaction): defined there.
from coordinator.log.errors import InvalidTxnState as InvalidTxnState


class TransactionalIdNotFound(CoordinatorError):
    code = "TRANSACTIONAL_ID_NOT_FOUND"
    status = 404
    title = "Transactional id not found"


class InvalidProducerIdMapping(CoordinatorError):
    code = "INVALID_PRODUCER_ID_MAPPING"
    status = 409
    title = "Producer id does not belong to this transactional id"


class ProducerFenced(CoordinatorError):
    code = "PRODUCER_FENCED"
    status = 409
    title = "Producer fenced"


class TransactionTimedOut(CoordinatorError):
    code = "TRANSACTION_TIMED_OUT"
    status = 409
    title = "Transaction timed out"


class ConcurrentTransactions(CoordinatorError):
    code = "CONCURRENT_TRANSACTIONS"
    status = 409
    retriable = True
    title = "Concurrent transactions"
