"""Every table, imported in one place so `Base.metadata` is complete (for Alembic and tests)."""

from coordinator.cluster.models import BrokerRow
from coordinator.core.acls import AclRow
from coordinator.core.delegation import DelegationTokenRow
from coordinator.core.quotas import ClientQuota
from coordinator.core.scram import ScramCredential
from coordinator.core.tables import Base
from coordinator.effects.models import Effect
from coordinator.groups.models import (
    ConsumerGroup,
    GroupConfig,
    GroupMember,
    GroupOffset,
    GroupOwnedPartition,
    GroupTargetPartition,
    ShareMember,
    StreamsGroup,
)
from coordinator.log.models import Batch, Partition, ProducerState, Topic
from coordinator.producers.models import ProducerId
from coordinator.shares.models import SharePartitionRow
from coordinator.telemetry.models import ClientMetricsConfig, ClientTelemetry
from coordinator.transactions.models import (
    TimedOutEpoch,
    Transaction,
    TransactionOffset,
    TransactionPartition,
    TransactionShareAck,
)

__all__ = [
    "AclRow",
    "Base",
    "Batch",
    "BrokerRow",
    "ClientMetricsConfig",
    "ClientQuota",
    "ClientTelemetry",
    "ConsumerGroup",
    "DelegationTokenRow",
    "Effect",
    "GroupConfig",
    "GroupMember",
    "GroupOffset",
    "GroupOwnedPartition",
    "GroupTargetPartition",
    "Partition",
    "ProducerId",
    "ProducerState",
    "ScramCredential",
    "ShareMember",
    "SharePartitionRow",
    "StreamsGroup",
    "TimedOutEpoch",
    "Topic",
    "Transaction",
    "TransactionOffset",
    "TransactionPartition",
    "TransactionShareAck",
]
