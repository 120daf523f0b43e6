"""Domain errors as Kafka error codes, by name: the HTTP API's codes are Kafka's, so the mapping is
the name itself, but for the few the HTTP API has and Kafka's protocol does not."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from coordinator.core.errors import CoordinatorError
from coordinator.groups.errors import InvalidSessionTimeout
from coordinator.log.errors import BatchTooLarge

_BESIDES_THE_NAME = {
    # A Kafka client of transaction version 1 knows only that it was fenced (as Kafka answers).
    "TRANSACTION_TIMED_OUT": ErrorCode.producer_fenced,
    "UNAUTHENTICATED": ErrorCode.sasl_authentication_failed,
    "NOT_FOUND": ErrorCode.invalid_request,
    "METHOD_NOT_ALLOWED": ErrorCode.invalid_request,
    "INTERNAL_ERROR": ErrorCode.unknown_server_error,
}


class Refused(Exception):
    """A refusal only Kafka's protocol has (acks, replication factor, a resource type), with
    its Kafka error code; the domain's own refusals are `CoordinatorError`s."""

    def __init__(self, code: ErrorCode, detail: str) -> None:
        super().__init__(detail)
        self.code = code


def error_code(error: BaseException) -> ErrorCode:
    """The Kafka error code for what a domain service raised."""
    if isinstance(error, Refused):
        return error.code
    if isinstance(error, InvalidSessionTimeout):
        return ErrorCode.invalid_session_timeout
    if isinstance(error, BatchTooLarge):
        return ErrorCode.message_too_large
    if isinstance(error, CoordinatorError):
        found = _BESIDES_THE_NAME.get(error.code)
        if found is not None:
            return found
        return ErrorCode.__members__.get(error.code.lower(), ErrorCode.unknown_server_error)
    raise error


def message(error: BaseException) -> str:
    if isinstance(error, CoordinatorError):
        return error.detail
    return str(error)


def outcome(failure: BaseException | None = None) -> dict[str, Any]:
    """The `error_code` and `error_message` of one item's result (a topic, a partition, a config
    resource): none, or the failure's."""
    if failure is None:
        return {"error_code": ErrorCode.none, "error_message": None}
    return {"error_code": error_code(failure), "error_message": message(failure)}


FAILURES = (CoordinatorError, Refused)
