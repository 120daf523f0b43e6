"""Errors of consumer groups: offsets, membership and the fencing of members (KIP-447, KIP-848)."""

from coordinator.core.errors import CoordinatorError, InvalidRequest


class UnstableOffsetCommit(CoordinatorError):
    code = "UNSTABLE_OFFSET_COMMIT"
    status = 409
    retriable = True
    title = "Unstable offset commit"


class UnknownMemberId(CoordinatorError):
    """Not (or no longer) a member of the group: rejoin with epoch 0."""

    code = "UNKNOWN_MEMBER_ID"
    status = 409
    title = "Unknown member id"


class FencedMemberEpoch(CoordinatorError):
    """A stale member epoch, or a partition the member does not own: rejoin with epoch 0."""

    code = "FENCED_MEMBER_EPOCH"
    status = 409
    title = "Fenced member epoch"


class StaleMemberEpoch(CoordinatorError):
    """A streams group member's commit with an epoch older than its current one (KIP-1071):
    it must heartbeat first, then commit again."""

    code = "STALE_MEMBER_EPOCH"
    status = 409
    title = "Stale member epoch"


class GroupMaxSizeReached(CoordinatorError):
    """A new member of a group already at COORDINATOR_GROUP_CONSUMER_MAX_SIZE members (Kafka's
    group.consumer.max.size); the members it has keep going."""

    code = "GROUP_MAX_SIZE_REACHED"
    status = 409
    title = "Group max size reached"


class InvalidGroupId(CoordinatorError):
    """A group id no group may have: empty, or longer than the store keeps (255 characters).
    The HTTP door's path validation refuses it first; Kafka's clients get INVALID_GROUP_ID."""

    code = "INVALID_GROUP_ID"
    status = 400
    title = "Invalid group id"


class GroupIdNotFound(CoordinatorError):
    code = "GROUP_ID_NOT_FOUND"
    status = 404
    title = "Group not found"


class NonEmptyGroup(CoordinatorError):
    code = "NON_EMPTY_GROUP"
    status = 409
    title = "The group still has members"


class InvalidSessionTimeout(InvalidRequest):
    """A session timeout outside the service's bounds: INVALID_REQUEST over HTTP, Kafka's
    INVALID_SESSION_TIMEOUT over its protocol."""


class GroupSubscribedToTopic(CoordinatorError):
    """Offsets of a topic the group's members subscribe to cannot be deleted (Kafka's
    OffsetDelete): they would be committed again, or lost under a consumer reading them."""

    code = "GROUP_SUBSCRIBED_TO_TOPIC"
    status = 409
    title = "Group subscribed to topic"


# -- the classic protocol (Kafka's JoinGroup, SyncGroup, Heartbeat, LeaveGroup) ---------------


class IllegalGeneration(FencedMemberEpoch):
    """A classic group's member sent a generation other than the group's: rejoin."""

    code = "ILLEGAL_GENERATION"


class RebalanceInProgress(CoordinatorError):
    """The classic group is rebalancing: the member joins again (JoinGroup)."""

    code = "REBALANCE_IN_PROGRESS"
    status = 409
    retriable = True
    title = "Rebalance in progress"


class FencedInstanceId(CoordinatorError):
    """Another member joined with this member's group.instance.id (static membership) and
    replaced it."""

    code = "FENCED_INSTANCE_ID"
    status = 409
    title = "Fenced instance id"


class UnreleasedInstanceId(CoordinatorError):
    """A member joined with the instance id of a member that is still in the group and has not
    left for now (KIP-848 static membership)."""

    code = "UNRELEASED_INSTANCE_ID"
    status = 409
    title = "Unreleased instance id"


class InconsistentGroupProtocol(CoordinatorError):
    """The member's protocol type, or every protocol it offers, differs from the group's."""

    code = "INCONSISTENT_GROUP_PROTOCOL"
    status = 409
    title = "Inconsistent group protocol"


class MemberIdRequired(CoordinatorError):
    """A new dynamic member is given its member id first and joins again with it (KIP-394)."""

    code = "MEMBER_ID_REQUIRED"
    status = 409
    retriable = True
    title = "Member id required"

    def __init__(self, detail: str, member_id: str = "") -> None:
        super().__init__(detail)
        self.member_id = member_id
