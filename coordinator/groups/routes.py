"""HTTP routes of consumer groups: offsets, membership (heartbeat), describe, list, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from coordinator.core.acls import Operation
from coordinator.core.auth import AccessDep
from coordinator.core.dependencies import DB, AppSettings
from coordinator.core.names import TOPIC_PATTERN
from coordinator.core.responses import json_response
from coordinator.core.schemas import IdPath
from coordinator.groups import consumer, service
from coordinator.groups.inputs import Beat, CommittedOffset
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
    offsets = [
        CommittedOffset(o.topic, o.partition, o.offset, o.metadata, o.leader_epoch)
        for o in body.offsets
    ]
    committed = await service.commit(db, group_id, offsets, body.member_id, body.member_epoch)
    return json_response(committed)


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
    partitions the member may own now (docs/pages/http-api.md, Membership)."""
    access.join(group_id, body.subscribed_topics or ())
    client_id = body.client_id or request.headers.get("user-agent", "")[:255]
    client_host = request.client.host if request.client is not None else ""
    beat = Beat(
        body.member_id,
        body.member_epoch,
        body.subscribed_topics,
        None
        if body.owned_partitions is None
        else [(p.topic, p.partition) for p in body.owned_partitions],
        body.rebalance_timeout_ms,
        body.session_timeout_ms,
        body.client_id,
    )
    return json_response(
        await consumer.heartbeat(db, settings, group_id, beat, client_id, client_host[:255])
    )


@router.get("/{group_id:path}", response_model=GroupDescription)
async def describe(group_id: IdPath, db: DB, access: AccessDep) -> Response:
    access.group(group_id, Operation.DESCRIBE)
    return json_response(await service.describe(db, group_id))


@router.delete("/{group_id:path}", response_model=DeletedGroup)
async def delete(group_id: IdPath, db: DB, access: AccessDep) -> Response:
    """Delete a group with no members, with its committed offsets (admin)."""
    access.delete_group(group_id)
    return json_response(await service.delete_group(db, group_id))
