"""HTTP routes of the admin calls."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from starlette.responses import Response

from coordinator.admin import service
from coordinator.admin.schemas import Stats
from coordinator.core.auth import Access, access
from coordinator.core.dependencies import DB, AppSettings
from coordinator.core.names import TOPIC_PATTERN
from coordinator.core.responses import json_response
from coordinator.core.schemas import INT32_MAX, INT64_MAX, Digits, IdPath
from coordinator.groups import service as groups
from coordinator.groups.schemas import GroupDescriptions
from coordinator.log import producer_states
from coordinator.log.schemas import ProducerList
from coordinator.transactions import aborts, listing
from coordinator.transactions.finishing import BY_ADMIN
from coordinator.transactions.schemas import EndTxnResponse, Hanging, TransactionList
from coordinator.transactions.states import Op, State


async def require_admin(caller: Annotated[Access, Depends(access)]) -> None:
    caller.cluster()


router = APIRouter(prefix="/v1/admin", tags=["admin"], dependencies=[Depends(require_admin)])


@router.get("/transactions", response_model=TransactionList)
async def list_transactions(
    db: DB,
    state: State | None = None,
    older_than_ms: Annotated[int | None, Digits, Query(ge=0, le=INT64_MAX)] = None,
    prefix: Annotated[str | None, Query(min_length=1, max_length=255)] = None,
    limit: Annotated[int, Digits, Query(ge=1, le=10_000)] = 1000,
) -> Response:
    return json_response(await listing.list_transactions(db, state, older_than_ms, prefix, limit))


@router.get("/producers", response_model=ProducerList)
async def describe_producers(
    db: DB,
    topic: Annotated[str, Query(pattern=TOPIC_PATTERN)],
    partition: Annotated[int, Digits, Query(ge=0, le=INT32_MAX)],
) -> Response:
    return json_response(await producer_states.describe_producers(db, topic, partition))


@router.get("/hanging", response_model=Hanging)
async def find_hanging(
    db: DB,
    max_transaction_timeout_ms: Annotated[int, Digits, Query(ge=0, le=INT64_MAX)] = 900_000,
) -> Response:
    return json_response(await listing.find_hanging(db, max_transaction_timeout_ms))


@router.post("/transactions/{transactional_id:path}/abort", response_model=EndTxnResponse)
async def abort(transactional_id: IdPath, db: DB) -> Response:
    """Abort the open transaction and fence its producer: its epoch is raised."""
    return json_response(
        await aborts.abort_by_coordinator(db, transactional_id, BY_ADMIN, Op.ADMIN_ABORT)
    )


@router.get("/groups", response_model=GroupDescriptions)
async def describe_groups(db: DB) -> Response:
    """Every consumer group, described as `GET /v1/groups/{group}` does (members, assignment,
    lag per partition), in one call: the dashboard's groups panel."""
    described = await groups.describe_all(db, lambda _: True)
    return json_response(GroupDescriptions(groups=described))


@router.get("/stats", response_model=Stats)
async def stats(
    db: DB, settings: AppSettings, minutes: Annotated[int, Digits, Query(ge=1, le=1440)] = 60
) -> Response:
    """Transactions by state, commits and aborts per minute, every partition's LSO lag and the
    side-effect keys by state: the numbers the dashboard shows besides its lists."""
    return json_response(await service.stats(db, settings, minutes))
