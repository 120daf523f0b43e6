"""Python SDK of the exactly-once transaction coordinator: Kafka's Producer, Consumer and
AdminClient (confluent-kafka's surface) over the coordinator's HTTP API, and the EffectsClient
whose `once(key, fn)` makes a call to the outside world once per key.

    from sdk import Consumer, Producer, TopicPartition

Porting code written for confluent-kafka means changing the import and replacing
`bootstrap.servers` with `coordinator.url`. Configuration is typed (`ProducerConfig`...), and
errors are a typed tree under `KafkaException` (see `sdk._errors`).
"""

# The names load on first use (PEP 562): a process that needs one part of the SDK (a Spark task's
# Python worker unpickling the writer, the service's record batch codec) imports that part's
# module, not the whole SDK and every library behind it. Only public names are public here:
# `dir(sdk)` lists `__all__` (and `spark` or `recordbatch` once imported), nothing else.

import typing as _typing

from sdk._lazy import exports as _exports
from sdk._lazy import public as _public

__version__ = "0.1.0"  # the SDK's (and its User-Agent's)

if _typing.TYPE_CHECKING:
    # Each name `as` itself: re-exported for type checkers, whose `__all__` this is not.
    from sdk._admin import AdminClient as AdminClient
    from sdk._admin import AlterConfigOpType as AlterConfigOpType
    from sdk._admin import ClusterMetadata as ClusterMetadata
    from sdk._admin import ConfigEntry as ConfigEntry
    from sdk._admin import ConfigResource as ConfigResource
    from sdk._admin import ConfigSource as ConfigSource
    from sdk._admin import DeletedRecords as DeletedRecords
    from sdk._admin import HangingPartition as HangingPartition
    from sdk._admin import HangingTransactions as HangingTransactions
    from sdk._admin import NewTopic as NewTopic
    from sdk._admin import PartitionDescription as PartitionDescription
    from sdk._admin import PartitionMetadata as PartitionMetadata
    from sdk._admin import ProducerState as ProducerState
    from sdk._admin import ResourceType as ResourceType
    from sdk._admin import TopicDescription as TopicDescription
    from sdk._admin import TopicMetadata as TopicMetadata
    from sdk._admin import TransactionDescription as TransactionDescription
    from sdk._config import AdminConfig as AdminConfig
    from sdk._config import AdminOptions as AdminOptions
    from sdk._config import ConsumerConfig as ConsumerConfig
    from sdk._config import ConsumerOptions as ConsumerOptions
    from sdk._config import EffectsConfig as EffectsConfig
    from sdk._config import EffectsOptions as EffectsOptions
    from sdk._config import ProducerConfig as ProducerConfig
    from sdk._config import ProducerOptions as ProducerOptions
    from sdk._config import ShareConsumerConfig as ShareConsumerConfig
    from sdk._config import ShareConsumerOptions as ShareConsumerOptions
    from sdk._consumer import Consumer as Consumer
    from sdk._effects import Claim as Claim
    from sdk._effects import Effect as Effect
    from sdk._effects import EffectsClient as EffectsClient
    from sdk._errors import AuthenticationFailed as AuthenticationFailed
    from sdk._errors import AuthorizationFailed as AuthorizationFailed
    from sdk._errors import ConcurrentTransactions as ConcurrentTransactions
    from sdk._errors import ConfigError as ConfigError
    from sdk._errors import CoordinatorNotAvailable as CoordinatorNotAvailable
    from sdk._errors import EffectClaimed as EffectClaimed
    from sdk._errors import EffectNotFound as EffectNotFound
    from sdk._errors import FatalError as FatalError
    from sdk._errors import FencedClaim as FencedClaim
    from sdk._errors import FencedMemberEpoch as FencedMemberEpoch
    from sdk._errors import GroupIdNotFound as GroupIdNotFound
    from sdk._errors import IllegalStateError as IllegalStateError
    from sdk._errors import InternalError as InternalError
    from sdk._errors import InvalidProducerEpoch as InvalidProducerEpoch
    from sdk._errors import InvalidProducerIdMapping as InvalidProducerIdMapping
    from sdk._errors import InvalidRequest as InvalidRequest
    from sdk._errors import InvalidTransactionTimeout as InvalidTransactionTimeout
    from sdk._errors import InvalidTxnState as InvalidTxnState
    from sdk._errors import KafkaError as KafkaError
    from sdk._errors import KafkaException as KafkaException
    from sdk._errors import KafkaTimeoutError as KafkaTimeoutError
    from sdk._errors import MessagePurged as MessagePurged
    from sdk._errors import MessageSizeTooLarge as MessageSizeTooLarge
    from sdk._errors import MessageTimedOut as MessageTimedOut
    from sdk._errors import NonEmptyGroup as NonEmptyGroup
    from sdk._errors import NotFound as NotFound
    from sdk._errors import OutOfOrderSequenceNumber as OutOfOrderSequenceNumber
    from sdk._errors import ProducerFenced as ProducerFenced
    from sdk._errors import RecordListTooLarge as RecordListTooLarge
    from sdk._errors import RetriableError as RetriableError
    from sdk._errors import ServiceError as ServiceError
    from sdk._errors import TopicAlreadyExists as TopicAlreadyExists
    from sdk._errors import TransactionalIdAuthorizationFailed as TransactionalIdAuthorizationFailed
    from sdk._errors import TransactionalIdNotFound as TransactionalIdNotFound
    from sdk._errors import TransactionTimedOut as TransactionTimedOut
    from sdk._errors import TransportError as TransportError
    from sdk._errors import UnknownMemberId as UnknownMemberId
    from sdk._errors import UnknownProducerId as UnknownProducerId
    from sdk._errors import UnknownTopicOrPartition as UnknownTopicOrPartition
    from sdk._errors import UnstableOffsetCommit as UnstableOffsetCommit
    from sdk._producer import Producer as Producer
    from sdk._share_consumer import AcknowledgeType as AcknowledgeType
    from sdk._share_consumer import ShareAcknowledgement as ShareAcknowledgement
    from sdk._share_consumer import ShareConsumer as ShareConsumer
    from sdk._share_consumer import ShareGroupMetadata as ShareGroupMetadata
    from sdk._types import OFFSET_BEGINNING as OFFSET_BEGINNING
    from sdk._types import OFFSET_END as OFFSET_END
    from sdk._types import OFFSET_INVALID as OFFSET_INVALID
    from sdk._types import OFFSET_STORED as OFFSET_STORED
    from sdk._types import TIMESTAMP_CREATE_TIME as TIMESTAMP_CREATE_TIME
    from sdk._types import TIMESTAMP_LOG_APPEND_TIME as TIMESTAMP_LOG_APPEND_TIME
    from sdk._types import TIMESTAMP_NOT_AVAILABLE as TIMESTAMP_NOT_AVAILABLE
    from sdk._types import CommitCallback as CommitCallback
    from sdk._types import ConsumerGroupMetadata as ConsumerGroupMetadata
    from sdk._types import DeliveryCallback as DeliveryCallback
    from sdk._types import Headers as Headers
    from sdk._types import Message as Message
    from sdk._types import RebalanceCallback as RebalanceCallback
    from sdk._types import TopicPartition as TopicPartition

# Each public name, by the module it lives in.
_EXPORTS = {
    "sdk._types": (
        "OFFSET_BEGINNING",
        "OFFSET_END",
        "OFFSET_INVALID",
        "OFFSET_STORED",
        "TIMESTAMP_CREATE_TIME",
        "TIMESTAMP_LOG_APPEND_TIME",
        "TIMESTAMP_NOT_AVAILABLE",
        "CommitCallback",
        "ConsumerGroupMetadata",
        "DeliveryCallback",
        "Headers",
        "Message",
        "RebalanceCallback",
        "TopicPartition",
    ),
    "sdk._admin": (
        "AdminClient",
        "AlterConfigOpType",
        "ClusterMetadata",
        "ConfigEntry",
        "ConfigResource",
        "ConfigSource",
        "DeletedRecords",
        "HangingPartition",
        "HangingTransactions",
        "NewTopic",
        "PartitionDescription",
        "PartitionMetadata",
        "ProducerState",
        "ResourceType",
        "TopicDescription",
        "TopicMetadata",
        "TransactionDescription",
    ),
    "sdk._config": (
        "AdminConfig",
        "AdminOptions",
        "ConsumerConfig",
        "ConsumerOptions",
        "EffectsConfig",
        "EffectsOptions",
        "ProducerConfig",
        "ProducerOptions",
        "ShareConsumerConfig",
        "ShareConsumerOptions",
    ),
    "sdk._errors": (
        "AuthenticationFailed",
        "AuthorizationFailed",
        "ConcurrentTransactions",
        "ConfigError",
        "CoordinatorNotAvailable",
        "EffectClaimed",
        "EffectNotFound",
        "FatalError",
        "FencedClaim",
        "FencedMemberEpoch",
        "GroupIdNotFound",
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
        "MessagePurged",
        "MessageSizeTooLarge",
        "MessageTimedOut",
        "NonEmptyGroup",
        "NotFound",
        "OutOfOrderSequenceNumber",
        "ProducerFenced",
        "RecordListTooLarge",
        "RetriableError",
        "ServiceError",
        "TopicAlreadyExists",
        "TransactionTimedOut",
        "TransactionalIdAuthorizationFailed",
        "TransactionalIdNotFound",
        "TransportError",
        "UnknownMemberId",
        "UnknownProducerId",
        "UnknownTopicOrPartition",
        "UnstableOffsetCommit",
    ),
    "sdk._effects": ("Claim", "Effect", "EffectsClient"),
    "sdk._consumer": ("Consumer",),
    "sdk._producer": ("Producer",),
    "sdk._share_consumer": (
        "AcknowledgeType",
        "ShareAcknowledgement",
        "ShareConsumer",
        "ShareGroupMetadata",
    ),
}

__all__ = _public(_EXPORTS)

if not _typing.TYPE_CHECKING:
    __getattr__, __dir__ = _exports("sdk", _EXPORTS, globals(), home_of_classes=True)
