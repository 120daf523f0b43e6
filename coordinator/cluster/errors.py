"""Errors of the cluster: a broker that may not register, a request sent to the wrong broker."""

from coordinator.core.errors import CoordinatorError


class NotCoordinator(CoordinatorError):
    """A group's or transactional id's request sent to a broker that does not coordinate it
    (now): the client asks FindCoordinator again."""

    code = "NOT_COORDINATOR"
    status = 409
    retriable = True
    title = "Not the coordinator"


class DuplicateBroker(CoordinatorError):
    """A node id that a live broker of another address holds (Kafka refuses to start a broker
    whose id is registered: DuplicateBrokerRegistrationException)."""

    code = "INVALID_REQUEST"
    status = 409
    title = "Duplicate broker id"
