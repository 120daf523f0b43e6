"""HTTP routes of the transaction calls, and InitPid's."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from coordinator.core.auth import AccessDep
from coordinator.core.dependencies import DB, AppSettings
from coordinator.core.responses import json_response
from coordinator.core.schemas import IdPath
from coordinator.groups.inputs import CommittedOffset
from coordinator.producers.schemas import InitPidRequest, InitPidResponse
from coordinator.shares.routes import acknowledgements
from coordinator.shares.schemas import TxnShareAcksRequest
from coordinator.transactions import commit_group as committing
from coordinator.transactions import producer_ids, service
from coordinator.transactions.inputs import AddOffsets, Caller, Committing, InitPid
from coordinator.transactions.schemas import (
    AddOffsetsRequest,
    AddPartitionsRequest,
    CommitGroupRequest,
    CommitGroupResponse,
    EndTxnRequest,
    EndTxnResponse,
    PrepareRequest,
    StateResponse,
    TransactionDescription,
)
from coordinator.transactions.schemas import Caller as CallerBody
from coordinator.transactions.share_acks import ShareAcks, add_share_acks

router = APIRouter(prefix="/v1/transactions", tags=["transactions"])
# InitPid keeps its own tag in the OpenAPI schema (the HTTP API's "Producer ids").
producers_router = APIRouter(tags=["producers"])


# Declared before the `{transactional_id}` routes so "commit-group" is never read as an id.
@router.post("/commit-group", response_model=CommitGroupResponse)
async def commit_group(body: CommitGroupRequest, db: DB, access: AccessDep) -> Response:
    for member in body.transactions:
        access.transactional_id(member.transactional_id)
    if body.abort_others_with_prefix is not None:
        access.transactional_prefix(body.abort_others_with_prefix)
    transactions = [
        Committing(m.transactional_id, m.producer_id, m.producer_epoch) for m in body.transactions
    ]
    committed = await committing.commit_group(db, transactions, body.abort_others_with_prefix)
    return json_response(committed)


@router.post("/{transactional_id:path}/partitions", response_model=StateResponse)
async def add_partitions(
    transactional_id: IdPath, body: AddPartitionsRequest, db: DB, access: AccessDep
) -> Response:
    access.add_partitions(transactional_id, (p.topic for p in body.partitions))
    partitions = [(p.topic, p.partition) for p in body.partitions]
    return json_response(
        await service.add_partitions(db, transactional_id, _caller(body), partitions)
    )


@router.post("/{transactional_id:path}/offsets", response_model=StateResponse)
async def add_offsets(
    transactional_id: IdPath, body: AddOffsetsRequest, db: DB, access: AccessDep
) -> Response:
    access.transaction_offsets(transactional_id, body.group_id, (o.topic for o in body.offsets))
    offsets = [
        CommittedOffset(o.topic, o.partition, o.offset, o.metadata, o.leader_epoch)
        for o in body.offsets
    ]
    adding = AddOffsets(_caller(body), body.group_id, offsets, body.member_id, body.member_epoch)
    return json_response(await service.add_offsets(db, transactional_id, adding))


@router.post("/{transactional_id:path}/share-acknowledgements", response_model=StateResponse)
async def add_share_acknowledgements(
    transactional_id: IdPath, body: TxnShareAcksRequest, db: DB, access: AccessDep
) -> Response:
    """A share group member's acknowledgements join the transaction: they apply if it
    commits, and an abort releases their records (docs/pages/http-api.md, Share groups)."""
    acks = acknowledgements(body.acknowledgements)
    access.transaction_offsets(transactional_id, body.group_id, {t for t, _ in acks})
    adding = ShareAcks(
        Caller(body.producer_id, body.producer_epoch), body.group_id, body.member_id, acks
    )
    return json_response(await add_share_acks(db, transactional_id, adding))


@router.post("/{transactional_id:path}/prepare", response_model=StateResponse)
async def prepare(
    transactional_id: IdPath, body: PrepareRequest, db: DB, settings: AppSettings, access: AccessDep
) -> Response:
    access.transactional_id(transactional_id)
    return json_response(await service.prepare(db, settings, transactional_id, _caller(body)))


@router.post("/{transactional_id:path}/end", response_model=EndTxnResponse)
async def end(transactional_id: IdPath, body: EndTxnRequest, db: DB, access: AccessDep) -> Response:
    access.transactional_id(transactional_id)
    return json_response(await service.end(db, transactional_id, _caller(body), body.commit))


@router.get("/{transactional_id:path}", response_model=TransactionDescription)
async def describe(transactional_id: IdPath, db: DB, access: AccessDep) -> Response:
    access.transactional_id(transactional_id)
    return json_response(await service.describe(db, transactional_id))


@producers_router.post("/v1/init-pid", response_model=InitPidResponse)
async def init_pid(
    body: InitPidRequest, db: DB, settings: AppSettings, access: AccessDep
) -> Response:
    if body.transactional_id is None:
        access.idempotent_producer()
    else:
        access.transactional_id(body.transactional_id)
    asked = InitPid(body.transactional_id, body.transaction_timeout_ms, body.keep_prepared)
    return json_response(await producer_ids.init_pid(db, settings, asked))


def _caller(body: CallerBody) -> Caller:
    return Caller(body.producer_id, body.producer_epoch)
