"""`GET /metrics`: Prometheus text format, admin role."""

from __future__ import annotations

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from coordinator.core import metrics
from coordinator.core.auth import AccessDep
from coordinator.core.dependencies import DB

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
async def scrape(db: DB, access: AccessDep) -> Response:
    access.cluster()
    async with db.read() as session:
        body = await metrics.render(session)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
