"""Python SDK of the exactly-once transaction coordinator: Kafka's Producer, Consumer and
AdminClient (confluent-kafka's surface) over the coordinator's HTTP API.

    from sdk import Consumer, Producer, TopicPartition

Porting code written for confluent-kafka means changing the import and replacing
`bootstrap.servers` with `coordinator.url`. Configuration is typed (`ProducerConfig`...), and
errors are a typed tree under `KafkaException` (see `sdk._errors`).
"""

from sdk._admin import (
    AdminClient,
    ClusterMetadata,
    HangingPartition,
    HangingTransactions,
    NewTopic,
    PartitionDescription,
    PartitionMetadata,
    ProducerState,
    TopicDescription,
    TopicMetadata,
    TransactionDescription,
)
from sdk._config import (
    AdminConfig,
    AdminOptions,
    ConsumerConfig,
    ConsumerOptions,
    ProducerConfig,
    ProducerOptions,
)
from sdk._consumer import Consumer
from sdk._errors import (
    AuthenticationFailed,
    AuthorizationFailed,
    ConcurrentTransactions,
    ConfigError,
    CoordinatorNotAvailable,
    FatalError,
    IllegalStateError,
    InternalError,
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    InvalidRequest,
    InvalidTransactionTimeout,
    InvalidTxnState,
    KafkaError,
    KafkaException,
    KafkaTimeoutError,
    MessagePurged,
    MessageSizeTooLarge,
    MessageTimedOut,
    NotFound,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    RecordListTooLarge,
    RetriableError,
    ServiceError,
    TopicAlreadyExists,
    TransactionalIdAuthorizationFailed,
    TransactionalIdNotFound,
    TransactionTimedOut,
    TransportError,
    UnknownProducerId,
    UnknownTopicOrPartition,
    UnstableOffsetCommit,
)
from sdk._producer import Producer
from sdk._types import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    ConsumerGroupMetadata,
    DeliveryCallback,
    Headers,
    Message,
    TopicPartition,
)

__version__ = "0.1.0"

__all__ = [
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TIMESTAMP_NOT_AVAILABLE",
    "AdminClient",
    "AdminConfig",
    "AdminOptions",
    "AuthenticationFailed",
    "AuthorizationFailed",
    "ClusterMetadata",
    "ConcurrentTransactions",
    "ConfigError",
    "Consumer",
    "ConsumerConfig",
    "ConsumerGroupMetadata",
    "ConsumerOptions",
    "CoordinatorNotAvailable",
    "DeliveryCallback",
    "FatalError",
    "HangingPartition",
    "HangingTransactions",
    "Headers",
    "IllegalStateError",
    "InternalError",
    "InvalidProducerEpoch",
    "InvalidProducerIdMapping",
    "InvalidRequest",
    "InvalidTransactionTimeout",
    "InvalidTxnState",
    "KafkaError",
    "KafkaException",
    "KafkaTimeoutError",
    "Message",
    "MessagePurged",
    "MessageSizeTooLarge",
    "MessageTimedOut",
    "NewTopic",
    "NotFound",
    "OutOfOrderSequenceNumber",
    "PartitionDescription",
    "PartitionMetadata",
    "Producer",
    "ProducerConfig",
    "ProducerFenced",
    "ProducerOptions",
    "ProducerState",
    "RecordListTooLarge",
    "RetriableError",
    "ServiceError",
    "TopicAlreadyExists",
    "TopicDescription",
    "TopicMetadata",
    "TopicPartition",
    "TransactionDescription",
    "TransactionTimedOut",
    "TransactionalIdAuthorizationFailed",
    "TransactionalIdNotFound",
    "TransportError",
    "UnknownProducerId",
    "UnknownTopicOrPartition",
    "UnstableOffsetCommit",
]

# Public names report the package as their home, as httpx's do.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith("sdk._"):
        _obj.__module__ = "sdk"
del _name, _obj
