"""HTTP routes of topics, produce and fetch."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from starlette.responses import Response

from coordinator.core.auth import AccessDep
from coordinator.core.dependencies import DB, AppSettings
from coordinator.core.responses import json_response
from coordinator.core.schemas import (
    INT32_MAX,
    INT64_MAX,
    TOPIC_PATTERN,
    Digits,
    TopicNameParam,
)
from coordinator.log import service
from coordinator.log.schemas import (
    CreateTopic,
    FetchResponse,
    ProduceRequest,
    ProduceResponse,
    TopicDescription,
    TopicList,
    TopicSummary,
)

router = APIRouter(prefix="/v1/topics", tags=["topics and records"])

TopicPath = Annotated[str, Path(pattern=TOPIC_PATTERN, description="topic name"), TopicNameParam]
PartitionPath = Annotated[int, Digits, Path(ge=0, le=INT32_MAX, description="partition number")]


@router.post("", status_code=201, response_model=TopicSummary)
async def create_topic(body: CreateTopic, db: DB, access: AccessDep) -> Response:
    access.cluster()
    return json_response(await service.create_topic(db, body), 201)


@router.get("", response_model=TopicList)
async def list_topics(db: DB, access: AccessDep) -> Response:
    """Every topic for an admin; for others, the topics under their prefixes."""
    topics = await service.list_topics(db)
    topics.topics = [t for t in topics.topics if access.visible_topic(t.name)]
    return json_response(topics)


@router.get("/{topic}", response_model=TopicDescription)
async def describe_topic(topic: TopicPath, db: DB, access: AccessDep) -> Response:
    access.topic(topic, "producer", "consumer")
    return json_response(await service.describe_topic(db, topic))


@router.post("/{topic}/partitions/{partition}/records", response_model=ProduceResponse)
async def produce(
    topic: TopicPath,
    partition: PartitionPath,
    body: ProduceRequest,
    db: DB,
    settings: AppSettings,
    access: AccessDep,
) -> Response:
    access.topic(topic, "producer")
    if body.transactional_id is not None:
        access.transactional_id(body.transactional_id)
    result = await service.produce(db, topic, partition, body, settings.max_request_bytes)
    return json_response(result)


@router.get("/{topic}/partitions/{partition}/records", response_model=FetchResponse)
async def fetch(
    topic: TopicPath,
    partition: PartitionPath,
    db: DB,
    settings: AppSettings,
    access: AccessDep,
    offset: Annotated[int, Digits, Query(ge=0, le=INT64_MAX)] = 0,
    max_records: Annotated[int, Digits, Query(ge=1, le=10_000)] = 500,
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed",
    encoding: Literal["utf8", "base64"] = "utf8",
) -> Response:
    access.topic(topic, "consumer")
    result = await service.fetch(
        db,
        topic,
        partition,
        offset,
        max_records,
        isolation_level == "read_committed",
        encoding,
        settings.fetch_max_bytes,
    )
    return json_response(result)
