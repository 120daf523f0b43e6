"""HTTP routes of the side-effect calls."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from coordinator.core.auth import AccessDep
from coordinator.core.dependencies import DB
from coordinator.core.responses import json_response
from coordinator.effects import service
from coordinator.effects.schemas import (
    ClaimRequest,
    ClaimResponse,
    CompleteRequest,
    DoneResponse,
    EffectDescription,
    EffectKeyPath,
    ReleaseRequest,
    ReleaseResponse,
)

router = APIRouter(prefix="/v1/effects", tags=["side effects"])


@router.post("/{key:path}/claim", response_model=ClaimResponse)
async def claim(key: EffectKeyPath, body: ClaimRequest, db: DB, access: AccessDep) -> Response:
    access.effect(key)
    return json_response(await service.claim(db, key, body.owner, body.lease_ms))


@router.post("/{key:path}/complete", response_model=DoneResponse)
async def complete(
    key: EffectKeyPath, body: CompleteRequest, db: DB, access: AccessDep
) -> Response:
    access.effect(key)
    return json_response(await service.complete(db, key, body.fencing_token, body.result))


@router.post("/{key:path}/release", response_model=ReleaseResponse)
async def release(key: EffectKeyPath, body: ReleaseRequest, db: DB, access: AccessDep) -> Response:
    access.effect(key)
    return json_response(await service.release(db, key, body.fencing_token))


@router.get("/{key:path}", response_model=EffectDescription)
async def describe(key: EffectKeyPath, db: DB, access: AccessDep) -> Response:
    access.effect(key)
    return json_response(await service.describe(db, key))
