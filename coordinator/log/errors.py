"""Errors of the partition logs and producer state (docs/pages/http-api.md, Records and Error
codes)."""

from coordinator.core.errors import CoordinatorError

# A batch over its limits is RECORD_LIST_TOO_LARGE, as a body over the request limit is (core).
from coordinator.core.errors import RecordListTooLarge as RecordListTooLarge


class UnknownTopicOrPartition(CoordinatorError):
    code = "UNKNOWN_TOPIC_OR_PARTITION"
    status = 404
    title = "Unknown topic or partition"


class TopicAlreadyExists(CoordinatorError):
    code = "TOPIC_ALREADY_EXISTS"
    status = 409
    title = "Topic already exists"


class OutOfOrderSequenceNumber(CoordinatorError):
    code = "OUT_OF_ORDER_SEQUENCE_NUMBER"
    status = 409
    title = "Out of order sequence number"


class UnknownProducerId(CoordinatorError):
    code = "UNKNOWN_PRODUCER_ID"
    status = 409
    title = "Unknown producer id"


class InvalidProducerEpoch(CoordinatorError):
    code = "INVALID_PRODUCER_EPOCH"
    status = 409
    title = "Invalid producer epoch"


class CorruptMessage(CoordinatorError):
    code = "CORRUPT_MESSAGE"
    status = 400
    title = "Corrupt record batch"


class InvalidRecord(CoordinatorError):
    code = "INVALID_RECORD"
    status = 400
    title = "Invalid record"


class InvalidConfig(CoordinatorError):
    code = "INVALID_CONFIG"
    status = 400
    title = "Invalid topic config"


class OffsetOutOfRange(CoordinatorError):
    code = "OFFSET_OUT_OF_RANGE"
    status = 416
    title = "Offset out of range"


class InvalidPartitions(CoordinatorError):
    """A partition count a topic cannot take (it only grows, up to the limit)."""

    code = "INVALID_PARTITIONS"
    status = 400
    title = "Invalid partition count"


class InvalidTxnState(CoordinatorError):
    """A call the transaction's state does not allow; raised by the log too, for a
    non-transactional batch of a producer whose transaction is open on the partition."""

    code = "INVALID_TXN_STATE"
    status = 409
    title = "Invalid transaction state"


class BatchTooLarge(RecordListTooLarge):
    """One batch over its topic's `max.message.bytes`: RECORD_LIST_TOO_LARGE over HTTP, as
    docs/pages/http-api.md says; Kafka's broker names it MESSAGE_TOO_LARGE, and so does the Kafka
    door."""


class FencedLeaderEpoch(CoordinatorError):
    code = "FENCED_LEADER_EPOCH"
    status = 409
    title = "Fenced leader epoch"


class NotLeaderOrFollower(CoordinatorError):
    """A Kafka request for a partition that another broker leads now (`coordinator.cluster`):
    the client refreshes its metadata and goes there."""

    code = "NOT_LEADER_OR_FOLLOWER"
    status = 409
    retriable = True
    title = "Not the partition's leader"


class UnknownLeaderEpoch(CoordinatorError):
    code = "UNKNOWN_LEADER_EPOCH"
    status = 409
    retriable = True
    title = "Unknown leader epoch"


class InvalidTopic(CoordinatorError):
    """A name that is not a topic name (Kafka's INVALID_TOPIC_EXCEPTION)."""

    code = "INVALID_TOPIC_EXCEPTION"
    status = 422
    title = "Invalid topic name"


class InvalidReplicationFactor(CoordinatorError):
    """A replication factor the store does not take (the database keeps the copies)."""

    code = "INVALID_REPLICATION_FACTOR"
    status = 400
    title = "Invalid replication factor"


class InvalidReplicaAssignment(CoordinatorError):
    """A manual replica assignment that names another broker than this one."""

    code = "INVALID_REPLICA_ASSIGNMENT"
    status = 400
    title = "Invalid replica assignment"
