"""Every Kafka API the listener answers, by key (the versions are `wire.SUPPORTED`)."""

from __future__ import annotations

from coordinator.kafka.connection import Handler
from coordinator.kafka.handlers import cluster, groups, records, sasl, topics, transactions

HANDLERS: dict[int, Handler] = {
    0: records.produce,
    1: records.fetch,
    2: records.list_offsets,
    3: cluster.metadata,
    8: groups.offset_commit,
    9: groups.offset_fetch,
    10: cluster.find_coordinator,
    11: groups.join_group,
    12: groups.heartbeat,
    13: groups.leave_group,
    14: groups.sync_group,
    15: groups.describe_groups,
    16: groups.list_groups,
    17: sasl.handshake,
    18: cluster.api_versions,
    19: topics.create_topics,
    20: topics.delete_topics,
    21: records.delete_records,
    22: transactions.init_producer_id,
    24: transactions.add_partitions_to_txn,
    25: transactions.add_offsets_to_txn,
    26: transactions.end_txn,
    28: transactions.txn_offset_commit,
    29: cluster.describe_acls,
    30: cluster.create_acls,
    31: cluster.delete_acls,
    32: topics.describe_configs,
    33: topics.alter_configs,
    36: sasl.authenticate,
    37: topics.create_partitions,
    42: groups.delete_groups,
    44: topics.incremental_alter_configs,
    47: groups.offset_delete,
    60: cluster.describe_cluster,
    61: transactions.describe_producers,
    65: transactions.describe_transactions,
    66: transactions.list_transactions,
}
