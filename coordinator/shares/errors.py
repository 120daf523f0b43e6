"""Errors of share groups, each Kafka's code by name (the Kafka door maps them so)."""

from coordinator.core.errors import CoordinatorError


class InvalidRecordState(CoordinatorError):
    """An acknowledgement of records the member does not hold now: never delivered to it, its
    lock ran out, acknowledged already, or held by a transaction. Nothing of the call changed."""

    code = "INVALID_RECORD_STATE"
    status = 409
    title = "Invalid record state"


class ShareSessionNotFound(CoordinatorError):
    """A share session this process does not know (it closed, or another process has it):
    open a new one with epoch 0."""

    code = "SHARE_SESSION_NOT_FOUND"
    status = 409
    title = "Share session not found"


class InvalidShareSessionEpoch(CoordinatorError):
    code = "INVALID_SHARE_SESSION_EPOCH"
    status = 409
    title = "Invalid share session epoch"


class ShareSessionLimitReached(CoordinatorError):
    code = "SHARE_SESSION_LIMIT_REACHED"
    status = 409
    retriable = True
    title = "Share session limit reached"
