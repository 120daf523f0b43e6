"""HTTP route of InitPid."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from coordinator.core.auth import AccessDep
from coordinator.core.dependencies import DB, AppSettings
from coordinator.core.responses import json_response
from coordinator.producers import service
from coordinator.producers.schemas import InitPidRequest, InitPidResponse

router = APIRouter(tags=["producers"])


@router.post("/v1/init-pid", response_model=InitPidResponse)
async def init_pid(
    body: InitPidRequest, db: DB, settings: AppSettings, access: AccessDep
) -> Response:
    if body.transactional_id is None:
        access.idempotent_producer()
    else:
        access.transactional_id(body.transactional_id)
    return json_response(await service.init_pid(db, settings, body))
