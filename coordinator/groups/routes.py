"""HTTP routes of consumer group offsets."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from starlette.responses import Response

from coordinator.core.auth import AccessDep
from coordinator.core.dependencies import DB
from coordinator.core.responses import json_response
from coordinator.core.schemas import TOPIC_PATTERN, IdPath
from coordinator.groups import service
from coordinator.groups.schemas import CommitOffsetsRequest, OffsetsResponse

router = APIRouter(prefix="/v1/groups", tags=["consumer groups"])


@router.post("/{group_id:path}/offsets", response_model=OffsetsResponse)
async def commit_offsets(
    group_id: IdPath, body: CommitOffsetsRequest, db: DB, access: AccessDep
) -> Response:
    access.group(group_id, "consumer")
    for o in body.offsets:
        access.topic(o.topic, "consumer")
    return json_response(await service.commit(db, group_id, body))


@router.get("/{group_id:path}/offsets", response_model=OffsetsResponse)
async def fetch_offsets(
    group_id: IdPath,
    db: DB,
    access: AccessDep,
    topic: Annotated[str | None, Query(pattern=TOPIC_PATTERN)] = None,
    require_stable: bool = False,
) -> Response:
    access.group(group_id, "consumer")
    if topic is not None:
        access.topic(topic, "consumer")
    return json_response(await service.fetch(db, group_id, topic, require_stable))
