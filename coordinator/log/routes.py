"""HTTP routes of topics, topic configs, produce and fetch.

Produce and fetch speak JSON and Kafka's record batch (`application/vnd.kafka.record-batch`):
the content type of a produce body, and a fetch's `Accept` header, choose.
"""

from __future__ import annotations

import json
from email.message import Message
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.responses import Response

from coordinator.core.acls import Operation
from coordinator.core.auth import Access, AccessDep
from coordinator.core.dependencies import DB, AppSettings, Quota
from coordinator.core.errors import InvalidRequest
from coordinator.core.names import TOPIC_PATTERN
from coordinator.core.responses import json_response
from coordinator.core.schemas import (
    INT32_MAX,
    INT64_MAX,
    Digits,
    TopicNameParam,
    TransactionalId,
)
from coordinator.core.settings import Settings
from coordinator.log import fetch as log_fetch
from coordinator.log import produce as appending
from coordinator.log import topics as log_topics
from coordinator.log.schemas import (
    AlterConfigs,
    ConfigList,
    CreateTopic,
    DeletedRecords,
    DeleteRecords,
    FetchResponse,
    ProduceRequest,
    ProduceResponse,
    TopicDescription,
    TopicList,
    TopicSummary,
)
from coordinator.store import Store

RECORD_BATCH = "application/vnd.kafka.record-batch"

router = APIRouter(prefix="/v1/topics", tags=["topics and records"])

TopicPath = Annotated[str, Path(pattern=TOPIC_PATTERN, description="topic name"), TopicNameParam]
PartitionPath = Annotated[int, Digits, Path(ge=0, le=INT32_MAX, description="partition number")]


@router.post("", status_code=201, response_model=TopicSummary)
async def create_topic(body: CreateTopic, db: DB, access: AccessDep, quota: Quota) -> Response:
    access.topic_or_cluster(body.name, Operation.CREATE)
    await quota.admit(db, access.name, body.partitions)
    spec = log_topics.TopicSpec(body.name, body.partitions, body.configs)
    return json_response(await log_topics.create_topic(db, spec), 201)


@router.get("", response_model=TopicList)
async def list_topics(db: DB, access: AccessDep) -> Response:
    """Every topic for an admin; for others, the topics under their prefixes."""
    topics = await log_topics.list_topics(db)
    topics.topics = [t for t in topics.topics if access.visible_topic(t.name)]
    return json_response(topics)


@router.get("/{topic}", response_model=TopicDescription)
async def describe_topic(topic: TopicPath, db: DB, access: AccessDep) -> Response:
    access.describe_topic(topic)
    return json_response(await log_topics.describe_topic(db, topic))


@router.post("/{topic}/delete-records", response_model=DeletedRecords)
async def delete_records(
    topic: TopicPath, body: DeleteRecords, db: DB, access: AccessDep
) -> Response:
    """Move partitions' log start offsets up (Kafka's DeleteRecords; offset -1: the high
    watermark)."""
    access.topic(topic, Operation.DELETE)
    wanted = [(p.partition, p.offset) for p in body.partitions]
    return json_response(await log_topics.delete_records(db, topic, wanted))


@router.get("/{topic}/configs", response_model=ConfigList)
async def describe_configs(
    topic: TopicPath, db: DB, settings: AppSettings, access: AccessDep
) -> Response:
    access.topic(topic, Operation.DESCRIBE_CONFIGS)
    return json_response(await log_topics.describe_configs(db, settings, topic))


@router.patch("/{topic}/configs", response_model=ConfigList)
async def alter_configs(
    topic: TopicPath, body: AlterConfigs, db: DB, settings: AppSettings, access: AccessDep
) -> Response:
    access.topic(topic, Operation.ALTER_CONFIGS)
    change = log_topics.ConfigChange(body.set, body.delete)
    return json_response(await log_topics.alter_configs(db, settings, topic, change))


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """A pydantic JSON schema with its `$defs` inlined (for `openapi_extra`)."""
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved


_BINARY = {"schema": {"type": "string", "format": "binary"}}
_PRODUCE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": _inline(ProduceRequest.model_json_schema())},
            RECORD_BATCH: _BINARY,
        },
    }
}
_FETCH_ANSWER: dict[int | str, dict[str, Any]] = {200: {"content": {RECORD_BATCH: _BINARY}}}


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return True
    message = Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def is_record_batch(content_type: str | None) -> bool:
    return (
        content_type is not None and content_type.split(";", 1)[0].strip().lower() == RECORD_BATCH
    )


async def produce_body(request: Request) -> ProduceRequest | bytes:
    """The produce body: a record batch's bytes, or the JSON body validated as FastAPI would."""
    raw = await request.body()
    content_type = request.headers.get("content-type")
    if is_record_batch(content_type):
        return raw
    body: Any = raw
    if raw and _is_json(content_type):
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RequestValidationError(
                [
                    {
                        "type": "json_invalid",
                        "loc": ("body", exc.pos),
                        "msg": "JSON decode error",
                        "input": {},
                        "ctx": {"error": exc.msg},
                    }
                ]
            ) from None
        except (ValueError, RecursionError):
            raise InvalidRequest("body: not valid JSON") from None
    try:
        return ProduceRequest.model_validate(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        raise RequestValidationError(errors) from None


@router.post(
    "/{topic}/partitions/{partition}/records",
    response_model=ProduceResponse,
    openapi_extra=_PRODUCE_BODY,
)
async def produce(
    topic: TopicPath,
    partition: PartitionPath,
    body: Annotated[ProduceRequest | bytes, Depends(produce_body)],
    db: DB,
    settings: AppSettings,
    access: AccessDep,
    transactional_id: Annotated[TransactionalId | None, Query()] = None,
) -> Response:
    if isinstance(body, bytes):
        return await produce_batch(db, settings, access, topic, partition, body, transactional_id)
    if transactional_id is not None:
        raise InvalidRequest(
            "transactional_id: goes in the JSON body; the query parameter is for record batches"
        )
    access.produce(topic, body.transactional_id)
    return _produced(await appending.produce_json(db, settings, topic, partition, body))


async def produce_batch(
    db: Store,
    settings: Settings,
    access: Access,
    topic: str,
    partition: int,
    body: bytes,
    transactional_id: str | None,
) -> Response:
    """A record batch's produce (this route's, and `hot_routes`' for the same request)."""
    access.produce(topic, transactional_id)
    return _produced(
        await appending.produce_batch(db, settings, topic, partition, body, transactional_id)
    )


def _produced(result: appending.Appended) -> Response:
    return json_response(
        {
            "base_offset": result.base_offset,
            "last_offset": result.last_offset,
            "duplicate": result.duplicate,
        }
    )


def wants_batches(accept: str | None) -> bool:
    return accept is not None and RECORD_BATCH in accept.lower()


@router.get(
    "/{topic}/partitions/{partition}/records",
    response_model=FetchResponse,
    responses=_FETCH_ANSWER,
)
async def fetch(
    request: Request,
    topic: TopicPath,
    partition: PartitionPath,
    db: DB,
    settings: AppSettings,
    access: AccessDep,
    offset: Annotated[int, Digits, Query(ge=0, le=INT64_MAX)] = 0,
    max_records: Annotated[int, Digits, Query(ge=1, le=10_000)] = 500,
    max_bytes: Annotated[int | None, Digits, Query(ge=1, le=INT32_MAX)] = None,
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed",
    encoding: Literal["utf8", "base64"] = "utf8",
) -> Response:
    # These parameters' types and defaults are `hot_routes`' rules too (as are produce's).
    if wants_batches(request.headers.get("accept")):
        return await fetch_batches(
            db, settings, access, topic, partition, offset, max_bytes, isolation_level
        )
    access.fetch(topic)
    limit, read_committed = _read_as(settings, max_bytes, isolation_level)
    result = await log_fetch.fetch_json(
        db, topic, partition, offset, max_records, read_committed, encoding, limit
    )
    return json_response(result)


def _read_as(settings: Settings, max_bytes: int | None, isolation_level: str) -> tuple[int, bool]:
    """A fetch's byte budget and whether it reads committed only."""
    limit = settings.fetch_max_bytes if max_bytes is None else max_bytes
    return limit, isolation_level == "read_committed"


async def fetch_batches(
    db: Store,
    settings: Settings,
    access: Access,
    topic: str,
    partition: int,
    offset: int,
    max_bytes: int | None,
    isolation_level: str,
) -> Response:
    """A fetch of record batches (this route's, and `hot_routes`' for the same request)."""
    access.fetch(topic)
    limit, read_committed = _read_as(settings, max_bytes, isolation_level)
    fetched = await log_fetch.fetch_batches(
        db, topic, partition, offset, max_bytes=limit, read_committed=read_committed
    )
    headers = {
        "Next-Offset": str(fetched.next_offset),
        "High-Watermark": str(fetched.high_watermark),
        "Last-Stable-Offset": str(fetched.last_stable_offset),
        "Log-Start-Offset": str(fetched.log_start_offset),
    }
    return Response(b"".join(fetched.batches), headers=headers, media_type=RECORD_BATCH)
