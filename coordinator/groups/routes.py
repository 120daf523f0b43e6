"""HTTP routes of consumer groups: offsets, membership (heartbeat), describe, list, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from coordinator.core.auth import AccessDep
from coordinator.core.dependencies import DB, AppSettings
from coordinator.core.responses import json_response
from coordinator.core.schemas import TOPIC_PATTERN, IdPath
from coordinator.groups import membership, service
from coordinator.groups.schemas import (
    CommitOffsetsRequest,
    DeletedGroup,
    GroupDescription,
    GroupList,
    HeartbeatRequest,
    HeartbeatResponse,
    OffsetsResponse,
)

router = APIRouter(prefix="/v1/groups", tags=["consumer groups"])


@router.get("", response_model=GroupList)
async def list_groups(db: DB, access: AccessDep) -> Response:
    """Every group the caller may see (consumers: those under their group prefixes)."""
    return json_response(await service.list_groups(db, access.visible_group))


@router.post("/{group_id:path}/offsets", response_model=OffsetsResponse)
async def commit_offsets(
    group_id: IdPath, body: CommitOffsetsRequest, db: DB, access: AccessDep
) -> Response:
    access.offsets(group_id, (o.topic for o in body.offsets))
    return json_response(await service.commit(db, group_id, body))


@router.get("/{group_id:path}/offsets", response_model=OffsetsResponse)
async def fetch_offsets(
    group_id: IdPath,
    db: DB,
    access: AccessDep,
    topic: Annotated[str | None, Query(pattern=TOPIC_PATTERN)] = None,
    require_stable: bool = False,
) -> Response:
    access.offsets(group_id, () if topic is None else (topic,))
    return json_response(await service.fetch(db, group_id, topic, require_stable))


@router.post("/{group_id:path}/heartbeat", response_model=HeartbeatResponse)
async def heartbeat(
    group_id: IdPath,
    body: HeartbeatRequest,
    request: Request,
    db: DB,
    settings: AppSettings,
    access: AccessDep,
) -> Response:
    """Join (member_epoch 0), heartbeat, or leave (member_epoch -1): the answer says which
    partitions the member may own now (API.md, Membership)."""
    access.join(group_id, body.subscribed_topics or ())
    client_id = body.client_id or request.headers.get("user-agent", "")[:255]
    client_host = request.client.host if request.client is not None else ""
    return json_response(
        await membership.heartbeat(db, settings, group_id, body, client_id, client_host[:255])
    )


@router.get("/{group_id:path}", response_model=GroupDescription)
async def describe(group_id: IdPath, db: DB, access: AccessDep) -> Response:
    access.group(group_id, "consumer")
    return json_response(await service.describe(db, group_id))


@router.delete("/{group_id:path}", response_model=DeletedGroup)
async def delete(group_id: IdPath, db: DB, access: AccessDep) -> Response:
    """Delete a group with no members, with its committed offsets (admin)."""
    access.delete_group(group_id)
    return json_response(await service.delete_group(db, group_id))
