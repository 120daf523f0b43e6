"""Request and response bodies of topics, produce and fetch (docs/pages/http-api.md, Topics and
Records)."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, Field, model_validator

from coordinator.core.schemas import (
    INT64_MAX,
    ProducerEpochField,
    ProducerIdField,
    RequestModel,
    SequenceField,
    TopicName,
    TransactionalId,
)

MAX_PARTITIONS = 10_000
Encoding = Literal["utf8", "base64"]
HeaderName = Annotated[str, Field(max_length=1024)]


ConfigName = Annotated[str, Field(max_length=255)]


class CreateTopic(RequestModel):
    name: TopicName
    partitions: Annotated[int, Field(ge=1, le=MAX_PARTITIONS)] = 1
    # Values are checked by the service (400 INVALID_CONFIG naming the config, as in Kafka).
    configs: Annotated[dict[ConfigName, Any], Field(max_length=100)] | None = None


class AlterConfigs(RequestModel):
    set: Annotated[dict[ConfigName, Any], Field(max_length=100)] = Field(default_factory=dict)
    delete: Annotated[list[ConfigName], Field(max_length=100)] = Field(default_factory=list)


class ConfigEntry(BaseModel):
    name: str
    value: str
    source: Literal["TOPIC", "DEFAULT"]


class ConfigList(BaseModel):
    configs: list[ConfigEntry]


class DeleteRecordsPartition(RequestModel):
    partition: Annotated[int, Field(ge=0, lt=MAX_PARTITIONS)]
    # The new log start offset; -1: the high watermark (Kafka's DeleteRecords).
    offset: Annotated[int, Field(ge=-1, le=INT64_MAX)]


class DeleteRecords(RequestModel):
    partitions: Annotated[
        list[DeleteRecordsPartition], Field(min_length=1, max_length=MAX_PARTITIONS)
    ]


class LogStart(BaseModel):
    partition: int
    log_start_offset: int


class DeletedRecords(BaseModel):
    partitions: list[LogStart]


class DeletedTopic(BaseModel):
    name: str


class TopicSummary(BaseModel):
    name: str
    partitions: int
    # Kafka's topic id, for the Kafka door (not in the HTTP API's answer).
    topic_id: UUID | None = Field(default=None, exclude=True)
    # The topic's stated replication factor, for the Kafka door (not in the HTTP API's answer).
    replication_factor: int = Field(default=1, exclude=True)


class TopicList(BaseModel):
    topics: list[TopicSummary]


class PartitionInfo(BaseModel):
    partition: int
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int


class TopicDescription(BaseModel):
    name: str
    partitions: list[PartitionInfo]


class RecordIn(RequestModel):
    key: str | None = None
    value: str | None = None
    headers: Annotated[dict[HeaderName, str], Field(max_length=1000)] = Field(default_factory=dict)
    # CreateTime in ms; without it the append time.
    timestamp: Annotated[int, Field(ge=0, le=INT64_MAX)] | None = None


class ProduceRequest(RequestModel):
    producer_id: ProducerIdField = -1
    producer_epoch: ProducerEpochField = -1
    base_sequence: SequenceField = -1
    transactional_id: TransactionalId | None = None
    encoding: Encoding = "utf8"
    records: Annotated[list[RecordIn], Field(min_length=1, max_length=1_000_000)]

    @model_validator(mode="after")
    def _producer_fields_agree(self) -> ProduceRequest:
        if self.producer_id == -1:
            if self.producer_epoch != -1 or self.base_sequence != -1:
                raise ValueError(
                    "producer_epoch and base_sequence must be -1 (or absent) when producer_id is -1"
                )
            if self.transactional_id is not None:
                raise ValueError("a transactional batch needs a producer_id")
        elif self.producer_epoch < 0 or self.base_sequence < 0:
            raise ValueError("producer_epoch and base_sequence are required with a producer_id")
        return self


class ProduceResponse(BaseModel):
    base_offset: int
    last_offset: int
    duplicate: bool


class RecordOut(BaseModel):
    offset: int
    key: str | None
    value: str | None
    # A header value is null only when a binary producer wrote a null one.
    headers: dict[str, str | None]
    timestamp: int


class FetchResponse(BaseModel):
    records: list[RecordOut]
    next_offset: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int


class ProducerInfo(BaseModel):
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    current_txn_start_offset: int | None


class ProducerList(BaseModel):
    producers: list[ProducerInfo]
