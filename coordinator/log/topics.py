"""Topics and their configs, partitions and log start: the rules of the HTTP API's Topics section
for every front door (HTTP and Kafka's protocol). Produce is `coordinator.log.produce`, fetch
`coordinator.log.fetch`; deleting a topic, which reaches into transactions and groups, is
`coordinator.deletion`."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from coordinator.core.errors import InvalidRequest
from coordinator.core.names import topic_name_problem
from coordinator.core.settings import Settings
from coordinator.log import configs
from coordinator.log.bounds import all_bounds, bytes_kept
from coordinator.log.errors import (
    InvalidConfig,
    InvalidPartitions,
    InvalidReplicaAssignment,
    InvalidReplicationFactor,
    InvalidTopic,
    OffsetOutOfRange,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from coordinator.log.models import Batch, Partition, Topic
from coordinator.log.schemas import (
    MAX_PARTITIONS,
    ConfigEntry,
    ConfigList,
    DeletedRecords,
    LogStart,
    PartitionInfo,
    TopicDescription,
    TopicList,
    TopicSummary,
)
from coordinator.store import Store
from coordinator.store.sql import pairs_in

# At most this many configs in one topic's creation or change.
MAX_CONFIGS = 100
# The largest stated replication factor taken: Metadata lists that many replicas per partition,
# so a factor is bounded as every other size a client sends is.
MAX_REPLICATION_FACTOR = 16


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic to create: its name, partition count, configs (as given: the log checks and
    stores them) and stated replication factor (Kafka's CreateTopics)."""

    name: str
    partitions: int = 1
    configs: Mapping[str, object] | None = None
    replication_factor: int = 1

    def checked(self) -> dict[str, str]:
        """Its configs as stored, once the rules pass: a topic name, 1 to MAX_PARTITIONS
        partitions, at most MAX_CONFIGS valid configs."""
        problem = topic_name_problem(self.name)
        if problem is not None:
            raise InvalidTopic(problem)
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            raise InvalidPartitions(f"{self.partitions} partitions: 1 to {MAX_PARTITIONS}")
        if len(self.configs or {}) > MAX_CONFIGS:
            raise InvalidRequest(f"configs: at most {MAX_CONFIGS}")
        return configs.validated(self.configs or {})


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """Configs to set, and configs to delete (back to their defaults)."""

    set: Mapping[str, object] = field(default_factory=dict)
    delete: Sequence[str] = ()

    def checked(self) -> tuple[dict[str, str], list[str]]:
        """What it sets (as stored) and deletes, once the rules pass."""
        if len(self.set) > MAX_CONFIGS or len(self.delete) > MAX_CONFIGS:
            raise InvalidRequest(f"at most {MAX_CONFIGS} configs set and {MAX_CONFIGS} deleted")
        changes = configs.validated(self.set)
        removed = configs.known(self.delete)
        both = sorted(set(changes) & set(removed))
        if both:
            raise InvalidConfig(f"{both[0]!r} is both set and deleted")
        return changes, removed


def replication_factor(asked: int, *, strict: bool) -> int:
    """The stated factor Kafka's CreateTopics asked (-1: the default, 1). The database keeps the
    copies, so any factor up to MAX_REPLICATION_FACTOR is kept as stated, but 1 only when
    `strict` (COORDINATOR_STRICT_REPLICATION_FACTOR)."""
    factor = 1 if asked == -1 else asked
    if strict and factor != 1:
        raise InvalidReplicationFactor(
            f"replication factor {asked}: this coordinator is one broker; the database keeps "
            "the copies (use 1 or -1)"
        )
    if not 1 <= factor <= MAX_REPLICATION_FACTOR:
        raise InvalidReplicationFactor(
            f"replication factor {asked}: 1 to {MAX_REPLICATION_FACTOR}, or -1 for the default (1)"
        )
    return factor


def assigned_partitions(
    assignments: Mapping[int, Sequence[int]], num_partitions: int, factor: int, broker: int
) -> int:
    """How many partitions a manual replica assignment (partition -> replicas) makes: it is
    taken when it names this one `broker` for every partition, 0 to n-1, with the count and
    the factor left to it (-1), as Kafka asks."""
    if num_partitions != -1 or factor != -1:
        raise InvalidRequest(
            "with a replica assignment, num_partitions and replication_factor must be -1"
        )
    if sorted(assignments) != list(range(len(assignments))):
        raise InvalidReplicaAssignment("partitions must be 0 to n-1")
    on_one_broker(assignments, broker)
    return len(assignments)


def on_one_broker(assignments: Mapping[int, Sequence[int]], broker: int) -> None:
    """A replica assignment (partition -> replicas) names this one `broker` alone."""
    for partition, replicas in sorted(assignments.items()):
        if list(replicas) != [broker]:
            raise InvalidReplicaAssignment(
                f"partition {partition}: this coordinator is one broker, node {broker}; its "
                f"replicas are [{broker}]"
            )


async def create_topic(db: Store, spec: TopicSpec, *, validate_only: bool = False) -> TopicSummary:
    """Create the topic (with `validate_only`, only check that it could be created)."""
    topic_configs = configs.encode(spec.checked())
    if validate_only:
        async with db.read() as session:
            if await session.scalar(select(Topic.name).where(Topic.name == spec.name)):
                raise TopicAlreadyExists(f"topic {spec.name!r} already exists")
        return TopicSummary(
            name=spec.name,
            partitions=spec.partitions,
            topic_id=None,
            replication_factor=spec.replication_factor,
        )
    try:
        async with db.write() as session:
            exists = await session.scalar(select(Topic.name).where(Topic.name == spec.name))
            if exists is not None:
                raise TopicAlreadyExists(f"topic {spec.name!r} already exists")
            topic = Topic(
                name=spec.name,
                partitions=spec.partitions,
                created_at=datetime.now(UTC),
                configs=topic_configs,
                topic_id=uuid.uuid4(),
                replication_factor=spec.replication_factor,
            )
            session.add(topic)
            await session.flush()
            await session.execute(
                insert(Partition),
                [
                    {"topic": spec.name, "partition": p, "log_start_offset": 0, "high_watermark": 0}
                    for p in range(spec.partitions)
                ],
            )
    except IntegrityError:
        # Another process created it between our check and our insert.
        raise TopicAlreadyExists(f"topic {spec.name!r} already exists") from None
    return TopicSummary(
        name=spec.name,
        partitions=spec.partitions,
        topic_id=topic.topic_id,
        replication_factor=spec.replication_factor,
    )


async def grow_topic(db: Store, name: str, count: int, *, validate_only: bool = False) -> int:
    """Kafka's CreatePartitions: the topic's partition count raised to `count` (it never
    shrinks), the new partitions empty. Producers see them in the topic's description; a group
    subscribed to the topic rebalances over them at its next heartbeat (its count changed).
    Returns how many partitions were added."""
    async with db.write() as session:
        current = await session.scalar(
            select(Topic.partitions).where(Topic.name == name).with_for_update()
        )
        if current is None:
            raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
        if count <= current:
            raise InvalidPartitions(
                f"topic {name!r} has {current} partitions; a count only grows (asked {count})"
            )
        if count > MAX_PARTITIONS:
            raise InvalidPartitions(f"{count} partitions: at most {MAX_PARTITIONS}")
        if validate_only:
            return count - current
        await session.execute(update(Topic).where(Topic.name == name).values(partitions=count))
        await session.execute(
            insert(Partition),
            [
                {"topic": name, "partition": p, "log_start_offset": 0, "high_watermark": 0}
                for p in range(current, count)
            ],
        )
        return count - current


async def list_topics(db: Store) -> TopicList:
    async with db.read() as session:
        rows = (
            await session.execute(
                select(Topic.name, Topic.partitions, Topic.topic_id, Topic.replication_factor)
            )
        ).all()
    # Sorted here, by code point: a database's collation would make the order differ by store.
    return TopicList(
        topics=[
            TopicSummary(name=n, partitions=p, topic_id=i, replication_factor=r)
            for n, p, i, r in sorted(rows)
        ]
    )


async def names_by_id(db: Store, ids: Collection[uuid.UUID]) -> dict[uuid.UUID, str]:
    """The name of each topic in `ids` that exists (Fetch v13 on names its topics by id, and a
    topic deleted and created again under its name has another id)."""
    if not ids:
        return {}
    return await db.topic_names(ids)


async def describe_topic(db: Store, name: str) -> TopicDescription:
    async with db.read() as session:
        bounds = await all_bounds(session, name)
    if not bounds:
        raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
    return TopicDescription(
        name=name,
        partitions=[
            PartitionInfo(
                partition=p,
                log_start_offset=b.log_start_offset,
                high_watermark=b.high_watermark,
                last_stable_offset=b.last_stable_offset,
            )
            for (_, p), b in bounds.items()
        ],
    )


def _config_list(stored: str, settings: Settings) -> ConfigList:
    return ConfigList(
        configs=[
            ConfigEntry.model_validate(e)
            for e in configs.describe(configs.decode(stored), settings)
        ]
    )


async def describe_configs(db: Store, settings: Settings, name: str) -> ConfigList:
    async with db.read() as session:
        stored = await session.scalar(select(Topic.configs).where(Topic.name == name))
    if stored is None:
        raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
    return _config_list(stored, settings)


async def alter_configs(
    db: Store, settings: Settings, name: str, change: ConfigChange, *, validate_only: bool = False
) -> ConfigList:
    """Set and delete (back to the default) configs, all or nothing (with `validate_only`,
    only check that they could be)."""
    changes, removed = change.checked()
    if validate_only:
        return await describe_configs(db, settings, name)
    async with db.write() as session:
        stored = await session.scalar(
            select(Topic.configs).where(Topic.name == name).with_for_update()
        )
        if stored is None:
            raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
        current = configs.decode(stored)
        current.update(changes)
        for config in removed:
            current.pop(config, None)
        updated = configs.encode(current)
        await session.execute(update(Topic).where(Topic.name == name).values(configs=updated))
    return _config_list(updated, settings)


async def delete_records(
    db: Store, name: str, partitions: Sequence[tuple[int, int]]
) -> DeletedRecords:
    """Kafka's DeleteRecords: move each partition's log start offset up to the offset asked
    (-1: the high watermark), deleting the batches wholly below it; all or nothing. `partitions`
    are (partition, offset) pairs."""
    wanted: dict[int, int] = {}
    for partition, offset in partitions:
        if partition in wanted:
            raise InvalidRequest(f"body.partitions: partition {partition} is named twice")
        if offset < -1:
            raise OffsetOutOfRange(f"{name}-{partition}: offset {offset}, not -1 or an offset")
        if not 0 <= partition < MAX_PARTITIONS:
            raise UnknownTopicOrPartition(f"{name}-{partition} does not exist")
        wanted[partition] = offset
    async with db.write() as session:
        rows = (
            await session.execute(
                select(Partition.partition, Partition.log_start_offset, Partition.high_watermark)
                .where(Partition.topic == name, Partition.partition.in_(sorted(wanted)))
                .order_by(Partition.partition)
                .with_for_update()
            )
        ).all()
        found = {p: (start, hw) for p, start, hw in rows}
        missing = sorted(set(wanted) - set(found))
        if missing:
            exists = await session.scalar(select(Topic.name).where(Topic.name == name))
            if exists is None:
                raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
            raise UnknownTopicOrPartition(f"{name}-{missing[0]} does not exist")
        starts: dict[int, int] = {}
        for p, offset in wanted.items():
            start, hw = found[p]
            target = hw if offset == -1 else offset
            if target > hw:
                raise OffsetOutOfRange(
                    f"{name}-{p}: offset {offset} is above the high watermark {hw}"
                )
            # The log start never moves down.
            starts[p] = max(start, target)
        for p, start in starts.items():
            if start > found[p][0]:
                await move_log_start(session, name, p, start)
    return DeletedRecords(
        partitions=[LogStart(partition=p, log_start_offset=starts[p]) for p in sorted(starts)]
    )


async def move_log_start(
    session: AsyncSession, topic: str, partition: int, start: int
) -> tuple[int, int]:
    """Delete the batches wholly below `start` and move the log start offset up to it (never
    down); the caller holds the partition's lock. Returns the batches and bytes removed."""
    where = (Batch.topic == topic, Batch.partition == partition, Batch.last_offset < start)
    batches, size = (
        await session.execute(
            select(func.count(), func.coalesce(func.sum(Batch.size), 0)).where(*where)
        )
    ).one()
    if batches:
        await session.execute(delete(Batch).where(*where))
    await session.execute(
        update(Partition)
        .where(
            Partition.topic == topic,
            Partition.partition == partition,
            Partition.log_start_offset < start,
        )
        .values(log_start_offset=start)
    )
    return batches, size


async def require_partitions(session: AsyncSession, keys: list[tuple[str, int]]) -> None:
    """Raise UnknownTopicOrPartition for the first of `keys` that does not exist."""
    found = set(
        (
            await session.execute(
                select(Partition.topic, Partition.partition).where(
                    pairs_in(Partition.topic, Partition.partition, keys)
                )
            )
        ).all()
    )
    for topic, partition in keys:
        if (topic, partition) not in found:
            raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")


async def partition_sizes(db: Store) -> dict[tuple[str, int], int]:
    """Bytes of the record batches each partition keeps (Kafka's DescribeLogDirs)."""
    async with db.read() as session:
        return await bytes_kept(session)
