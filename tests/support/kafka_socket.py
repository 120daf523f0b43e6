"""A Kafka connection kept open across a store's outage, spoken to byte by byte."""

from __future__ import annotations

import datetime
import socket
import struct
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from kio.static.constants import EntityType

from coordinator.kafka.wire import payload_type
from tests.support.kafka_fuzz import encode_request


class KafkaSocket:
    """One Kafka connection kept across the outage."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)
        self.correlation = 0

    def call(self, api_key: int, version: int, **fields: Any) -> Any:
        self.correlation += 1
        request_type = payload_type(api_key, version, EntityType.request)
        frame = encode_request(api_key, version, request_type(**fields), self.correlation)
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", self._exactly(4))[0]
        answer = self._exactly(size)
        response_type = payload_type(api_key, version, EntityType.response)
        header, used = entity_reader(response_type.__header_schema__)(answer, 0)
        assert header.correlation_id == self.correlation
        return entity_reader(response_type)(answer, used)[0]

    def _exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            assert chunk, "the listener closed the connection"
            data += chunk
        return data


def produce_v9(kafka: KafkaSocket, topic: str, batch: bytes, timeout_s: float = 5) -> ErrorCode:
    """Produce v9 of one batch to partition 0; the partition's error code."""
    module: Any = __import__("kio.schema.produce.v9.request", fromlist=["x"])
    answer = kafka.call(
        0,
        9,
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=timeout_s),
        topic_data=(
            module.TopicProduceData(
                name=topic, partition_data=(module.PartitionProduceData(index=0, records=batch),)
            ),
        ),
    )
    code: ErrorCode = answer.responses[0].partition_responses[0].error_code
    return code


DEADLINE_S = 30.0
