"""What the log knows of each producer on a partition: Kafka's DescribeProducers, for both doors."""

from __future__ import annotations

from sqlalchemy import select

from coordinator.log.errors import UnknownTopicOrPartition
from coordinator.log.models import Partition, ProducerState
from coordinator.log.schemas import ProducerInfo, ProducerList
from coordinator.store import Store


async def describe_producers(db: Store, topic: str, partition: int) -> ProducerList:
    async with db.read() as session:
        known = await session.scalar(
            select(Partition.partition).where(
                Partition.topic == topic, Partition.partition == partition
            )
        )
        if known is None:
            raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
        rows = await session.execute(
            select(
                ProducerState.producer_id,
                ProducerState.producer_epoch,
                ProducerState.last_sequence,
                ProducerState.last_timestamp,
                ProducerState.current_txn_first_offset,
            )
            .where(ProducerState.topic == topic, ProducerState.partition == partition)
            .order_by(ProducerState.producer_id)
        )
        return ProducerList(
            producers=[
                ProducerInfo(
                    producer_id=pid,
                    producer_epoch=epoch,
                    last_sequence=sequence,
                    last_timestamp=timestamp,
                    current_txn_start_offset=first,
                )
                for pid, epoch, sequence, timestamp, first in rows
            ]
        )
