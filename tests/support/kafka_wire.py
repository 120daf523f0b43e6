"""A Kafka connection spoken to byte by byte: kio builds each request and reads each answer, by
the API's key and version. For the listener's tests and the differential conformance corpus
(`tests.support.conformance`), which sends the same bytes to Apache Kafka."""

from __future__ import annotations

import asyncio
import datetime
import io
import struct
from typing import Any

from kio.index import load_payload_module
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from coordinator.kafka.wire import payload_type


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.correlation = 0

    async def call(self, api_key: int, version: int, **fields: Any) -> Any:
        request_type = payload_type(api_key, version, EntityType.request)
        return await self.request(request_type(**fields))

    async def request(self, request: Any) -> Any:
        """Send a kio request entity; its answer, read by the request's key and version."""
        correlation = await self.send_request(request)
        return await self.receive(request.__api_key__, request.__version__, correlation)

    async def send_request(self, request: Any) -> int:
        """Send a kio request entity without waiting for its answer; its correlation id."""
        api_key, version = request.__api_key__, request.__version__
        request_type = type(request)
        self.correlation += 1
        buffer = io.BytesIO()
        header_type = request_type.__header_schema__
        entity_writer(header_type)(
            buffer,
            header_type(
                request_api_key=api_key,
                request_api_version=version,
                correlation_id=self.correlation,
                client_id="test",
            ),
        )
        entity_writer(request_type)(buffer, request)
        await self.send(buffer.getvalue())
        return self.correlation

    async def produce(self, topic: str, batch: bytes) -> Any:
        """Produce v9 of one batch to partition 0, acks=-1."""
        return await self.request(produce_request(topic, batch))

    async def fetch(
        self,
        topic: str,
        partitions: tuple[int, ...] = (0,),
        *,
        max_bytes: int = 1 << 20,
        current_leader_epoch: int = -1,
    ) -> Any:
        """Fetch v12 from offset 0 of each partition, read_uncommitted, answered at once."""
        return await self.request(
            fetch_request(
                topic, partitions, max_bytes=max_bytes, current_leader_epoch=current_leader_epoch
            )
        )

    async def send(self, frame: bytes) -> None:
        self.writer.write(struct.pack(">i", len(frame)) + frame)
        await self.writer.drain()

    async def receive(self, api_key: int, version: int, correlation: int | None = None) -> Any:
        """The next answer on the connection, which must be to `correlation` (by default the
        last request sent)."""
        (size,) = struct.unpack(">i", await self.reader.readexactly(4))
        frame = await self.reader.readexactly(size)
        response_type = payload_type(api_key, version, EntityType.response)
        header, used = entity_reader(response_type.__header_schema__)(frame, 0)
        assert header.correlation_id == (self.correlation if correlation is None else correlation)
        body, _ = entity_reader(response_type)(frame, used)
        return body

    async def call_frame(self, api_key: int, version: int, **fields: Any) -> bytes:
        """A request's answer body as bytes, unread: for answers kio cannot read (Kafka's -1
        where its schema wants a time)."""
        request_type = payload_type(api_key, version, EntityType.request)
        correlation = await self.send_request(request_type(**fields))
        (size,) = struct.unpack(">i", await self.reader.readexactly(4))
        frame = await self.reader.readexactly(size)
        response_type = payload_type(api_key, version, EntityType.response)
        header, used = entity_reader(response_type.__header_schema__)(frame, 0)
        assert header.correlation_id == correlation
        return frame[used:]

    async def closed(self) -> bool:
        """True when the listener closed the connection (reads end)."""
        try:
            return await asyncio.wait_for(self.reader.read(1), 10) == b""
        except ConnectionError:
            return True


def produce_request(topic: str, batch: bytes, partition: int = 0) -> Any:
    """Produce v9 of one batch to `partition`, acks=-1."""
    module = load_payload_module(0, 9, EntityType.request)
    request_type = payload_type(0, 9, EntityType.request)
    return request_type(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            module.TopicProduceData(
                name=topic,
                partition_data=(module.PartitionProduceData(index=partition, records=batch),),
            ),
        ),
    )


def fetch_request(
    topic: str,
    partitions: tuple[int, ...] = (0,),
    *,
    max_bytes: int = 1 << 20,
    current_leader_epoch: int = -1,
    isolation_level: int = 0,
    max_wait_ms: int = 0,
    offset: int = 0,
) -> Any:
    """Fetch v12 from `offset` of each partition, read_uncommitted (`isolation_level` 0) or
    read_committed (1), answered at once (or, with `max_wait_ms`, once a byte is there)."""
    module = load_payload_module(1, 12, EntityType.request)
    return payload_type(1, 12, EntityType.request)(
        cluster_id=None,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=isolation_level,
        session_id=0,
        session_epoch=-1,
        topics=(
            module.FetchTopic(
                topic=topic,
                partitions=tuple(
                    module.FetchPartition(
                        partition=p,
                        current_leader_epoch=current_leader_epoch,
                        fetch_offset=offset,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=1_000_000,
                    )
                    for p in partitions
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
