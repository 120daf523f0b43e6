"""HTTP routes of share groups (docs/pages/http-api.md, Share groups): membership, fetch (which
acquires), acknowledge, release, describe, list, delete, offsets; and every group's configs."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from coordinator.core.acls import Operation
from coordinator.core.auth import AccessDep
from coordinator.core.clock import rfc3339
from coordinator.core.dependencies import DB, AppSettings
from coordinator.core.errors import InvalidRequest
from coordinator.core.names import TOPIC_PATTERN
from coordinator.core.responses import json_response
from coordinator.core.schemas import IdPath
from coordinator.groups import configs as group_configs
from coordinator.groups import service as groups_service
from coordinator.groups.schemas import DeletedGroup
from coordinator.shares import membership, offsets, service
from coordinator.shares.inflight import TYPES
from coordinator.shares.schemas import (
    Acknowledgement,
    AcquiredOut,
    AlterGroupConfigs,
    GroupConfigEntry,
    GroupConfigList,
    ResetShareOffsetsRequest,
    ShareAcknowledgeRequest,
    ShareAcknowledgeResponse,
    ShareFetchRequest,
    ShareFetchResponse,
    ShareGroupDescription,
    ShareGroupList,
    ShareGroupSummary,
    ShareHeartbeatRequest,
    ShareHeartbeatResponse,
    ShareMemberOut,
    ShareOffsetOut,
    ShareOffsetsResponse,
    ShareRecordOut,
    ShareReleaseRequest,
    TopicPartitionOut,
)
from coordinator.shares.service import AckBatch, PartitionResult
from sdk import recordbatch

router = APIRouter(prefix="/v1/share-groups", tags=["share groups"])
configs_router = APIRouter(prefix="/v1/groups", tags=["consumer groups"])

TP = tuple[str, int]


def acknowledgements(acks: Sequence[Acknowledgement]) -> dict[TP, list[AckBatch]]:
    """The body's acknowledgements by partition, as the domain takes them."""
    out: dict[TP, list[AckBatch]] = {}
    for a in acks:
        last = a.first_offset if a.last_offset is None else a.last_offset
        out.setdefault((a.topic, a.partition), []).append(
            AckBatch(a.first_offset, last, (TYPES[a.type],))
        )
    return out


def _tps(partitions: Sequence[TP]) -> list[TopicPartitionOut]:
    return [TopicPartitionOut(topic=t, partition=p) for t, p in partitions]


@router.get("", response_model=ShareGroupList)
async def list_groups(db: DB, access: AccessDep) -> Response:
    listed = await groups_service.list_groups(db, access.visible_group)
    return json_response(
        ShareGroupList(
            groups=[
                ShareGroupSummary(group_id=g.group_id, state=g.state, members=g.members)
                for g in listed.groups
                if g.type == "share"
            ]
        )
    )


@router.post("/{group_id:path}/heartbeat", response_model=ShareHeartbeatResponse)
async def heartbeat(
    group_id: IdPath,
    body: ShareHeartbeatRequest,
    request: Request,
    db: DB,
    settings: AppSettings,
    access: AccessDep,
) -> Response:
    """Join (member_epoch 0, with its topics), heartbeat, or leave (member_epoch -1)."""
    access.join(group_id, body.subscribed_topics or ())
    client_host = request.client.host if request.client is not None else ""
    answer = await membership.heartbeat(
        db,
        settings,
        group_id,
        membership.ShareBeat(
            body.member_id, body.member_epoch, body.subscribed_topics, body.rack_id
        ),
        request.headers.get("user-agent", "")[:255],
        client_host[:255],
    )
    return json_response(
        ShareHeartbeatResponse(
            member_id=answer.member_id,
            member_epoch=answer.member_epoch,
            heartbeat_interval_ms=answer.heartbeat_interval_ms,
            assignment=None if answer.assignment is None else _tps(answer.assignment),
        )
    )


def _text(raw: bytes, offset: int) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise InvalidRequest(
            f"the record at offset {offset} is not valid UTF-8; fetch with encoding=base64"
        ) from None


def _records(result: PartitionResult, encoding: str) -> list[ShareRecordOut]:
    """The acquired records of the partition's batches (a batch may hold others)."""

    def text(raw: bytes | None, offset: int) -> str | None:
        if raw is None:
            return None
        return _text(raw, offset) if encoding == "utf8" else base64.b64encode(raw).decode()

    out = []
    for payload in result.batches:
        for record in recordbatch.records(payload):
            taken = next((a for a in result.acquired if a.first <= record.offset <= a.last), None)
            if taken is None:
                continue
            out.append(
                ShareRecordOut(
                    topic=result.topic,
                    partition=result.partition,
                    offset=record.offset,
                    key=text(record.key, record.offset),
                    value=text(record.value, record.offset),
                    headers={k: text(v, record.offset) for k, v in record.headers},
                    timestamp=record.timestamp,
                    delivery_count=taken.deliveries,
                )
            )
    return out


@router.post("/{group_id:path}/fetch", response_model=ShareFetchResponse)
async def fetch(
    group_id: IdPath, body: ShareFetchRequest, db: DB, settings: AppSettings, access: AccessDep
) -> Response:
    """Acquire records for the member, each locked to it for the group's lock duration (or
    until it acknowledges them); waits up to `max_wait_ms` while there are none."""
    access.group(group_id, Operation.READ)
    if body.partitions is None:
        partitions = await membership.assignment_of(db, group_id, body.member_id)
    else:
        partitions = sorted({(p.topic, p.partition) for p in body.partitions})
    for topic in {t for t, _ in partitions}:
        access.fetch(topic)
    results, lock_ms = await service.acquire_waiting(
        db,
        settings,
        group_id,
        body.member_id,
        partitions,
        {},
        max_records=body.max_records,
        max_bytes=settings.fetch_max_bytes,
        wait_ms=body.max_wait_ms,
        whole_batches=body.acquire_mode == "batch_optimized",
    )
    for result in results.values():
        if result.error is not None:
            raise result.error
    records = (
        [r for tp in sorted(results) for r in _records(results[tp], body.encoding)]
        if body.records
        else []
    )
    acquired = [
        AcquiredOut(
            topic=r.topic,
            partition=r.partition,
            first_offset=a.first,
            last_offset=a.last,
            delivery_count=a.deliveries,
        )
        for _, r in sorted(results.items())
        for a in r.acquired
    ]
    return json_response(
        ShareFetchResponse(records=records, acquired=acquired, acquisition_lock_timeout_ms=lock_ms)
    )


@router.post("/{group_id:path}/acknowledge", response_model=ShareAcknowledgeResponse)
async def acknowledge(
    group_id: IdPath,
    body: ShareAcknowledgeRequest,
    db: DB,
    settings: AppSettings,
    access: AccessDep,
) -> Response:
    """All of the acknowledgements, or none: 409 INVALID_RECORD_STATE names the first the
    member may not make (records it does not hold now)."""
    access.group(group_id, Operation.READ)
    acks = acknowledgements(body.acknowledgements)
    for topic in {t for t, _ in acks}:
        access.fetch(topic)
    _, lock_ms = await service.acknowledge(
        db, settings, group_id, body.member_id, acks, atomic=True
    )
    count = sum(b.last - b.first + 1 for batches in acks.values() for b in batches)
    return json_response(
        ShareAcknowledgeResponse(acknowledged=count, acquisition_lock_timeout_ms=lock_ms)
    )


@router.post("/{group_id:path}/release", response_model=ShareAcknowledgeResponse)
async def release(
    group_id: IdPath,
    body: ShareReleaseRequest,
    db: DB,
    settings: AppSettings,
    access: AccessDep,
) -> Response:
    """Every record the member holds becomes available again (as a share session's close)."""
    access.group(group_id, Operation.READ)
    await service.release(db, settings, group_id, body.member_id, None)
    return json_response(ShareAcknowledgeResponse(acknowledged=0, acquisition_lock_timeout_ms=0))


def _offsets(found: Sequence[offsets.ShareOffset]) -> list[ShareOffsetOut]:
    return [
        ShareOffsetOut(topic=o.topic, partition=o.partition, start_offset=o.start_offset, lag=o.lag)
        for o in found
    ]


@router.post("/{group_id:path}/offsets", response_model=ShareOffsetsResponse)
async def reset_offsets(
    group_id: IdPath,
    body: ResetShareOffsetsRequest,
    db: DB,
    settings: AppSettings,
    access: AccessDep,
) -> Response:
    """Each share partition starts anew at its offset (only while the group has no members):
    Kafka's AlterShareGroupOffsets, kafka-share-groups.sh --reset-offsets."""
    access.group(group_id, Operation.READ)
    wanted = {(o.topic, o.partition): o.offset for o in body.offsets}
    if len(wanted) != len(body.offsets):
        raise InvalidRequest("offsets: a partition appears more than once")
    for topic in {t for t, _ in wanted}:
        access.fetch(topic)
    for refusal in (await offsets.alter_offsets(db, settings, group_id, wanted)).values():
        if refusal is not None:
            raise refusal
    found = await offsets.describe_offsets(db, settings, group_id, sorted(wanted))
    return json_response(ShareOffsetsResponse(offsets=_offsets(found)))


@router.delete("/{group_id:path}/offsets", response_model=ShareOffsetsResponse)
async def delete_offsets(
    group_id: IdPath,
    db: DB,
    settings: AppSettings,
    access: AccessDep,
    topic: Annotated[str, Query(pattern=TOPIC_PATTERN)],
) -> Response:
    """The group forgets its share partitions of `topic` (only while it has no members)."""
    access.group(group_id, Operation.DELETE)
    access.fetch(topic)
    for refusal in (await offsets.delete_offsets(db, group_id, [topic])).values():
        if refusal is not None:
            raise refusal
    return json_response(
        ShareOffsetsResponse(
            offsets=_offsets(await offsets.describe_offsets(db, settings, group_id, None))
        )
    )


@router.get("/{group_id:path}", response_model=ShareGroupDescription)
async def describe(group_id: IdPath, db: DB, settings: AppSettings, access: AccessDep) -> Response:
    access.group(group_id, Operation.DESCRIBE)
    view = await membership.describe(db, group_id)
    found = await offsets.describe_offsets(db, settings, group_id, None)
    return json_response(
        ShareGroupDescription(
            group_id=view.group_id,
            state=view.state,
            group_epoch=view.group_epoch,
            members=[
                ShareMemberOut(
                    member_id=m.member_id,
                    member_epoch=m.member_epoch,
                    client_id=m.client_id,
                    subscribed_topics=m.subscribed_topics,
                    assignment=_tps(m.assignment),
                    last_heartbeat_at=rfc3339(m.last_heartbeat_ms),
                )
                for m in view.members
            ],
            offsets=_offsets(found),
        )
    )


@router.delete("/{group_id:path}", response_model=DeletedGroup)
async def delete(group_id: IdPath, db: DB, access: AccessDep) -> Response:
    """Delete a share group with no members, with its share partitions' state (admin)."""
    access.delete_group(group_id)
    await membership.describe(db, group_id)  # a share group, or 404
    return json_response(await groups_service.delete_group(db, group_id))


# -- every group's configs (Kafka's GROUP config resources) ---------------------------------------


def _config_list(values: Sequence[group_configs.GroupConfigValue]) -> GroupConfigList:
    return GroupConfigList(
        configs=[
            GroupConfigEntry(name=c.name, value=c.value, source="GROUP" if c.is_set else "DEFAULT")
            for c in values
        ]
    )


@configs_router.get("/{group_id:path}/configs", response_model=GroupConfigList)
async def describe_configs(
    group_id: IdPath, db: DB, settings: AppSettings, access: AccessDep
) -> Response:
    """Every group config (kafka-configs.sh --entity-type groups), set or default."""
    access.group(group_id, Operation.DESCRIBE_CONFIGS)
    return json_response(_config_list(await group_configs.describe(db, settings, group_id)))


@configs_router.patch("/{group_id:path}/configs", response_model=GroupConfigList)
async def alter_configs(
    group_id: IdPath, body: AlterGroupConfigs, db: DB, settings: AppSettings, access: AccessDep
) -> Response:
    """Set and delete group configs, all or none (400 INVALID_CONFIG names the first bad one)."""
    access.group(group_id, Operation.ALTER_CONFIGS)
    to_set = {k: v if isinstance(v, str) or v is None else str(v) for k, v in body.set.items()}
    await group_configs.alter(db, settings, group_id, to_set, body.delete)
    return json_response(_config_list(await group_configs.describe(db, settings, group_id)))
