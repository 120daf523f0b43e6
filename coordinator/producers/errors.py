"""Errors of InitPid."""

from coordinator.core.errors import CoordinatorError


class InvalidTransactionTimeout(CoordinatorError):
    code = "INVALID_TRANSACTION_TIMEOUT"
    status = 400
    title = "Invalid transaction timeout"
