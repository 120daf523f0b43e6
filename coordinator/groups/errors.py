"""Errors of consumer group offsets."""

from coordinator.core.errors import CoordinatorError


class UnstableOffsetCommit(CoordinatorError):
    code = "UNSTABLE_OFFSET_COMMIT"
    status = 409
    retriable = True
    title = "Unstable offset commit"
