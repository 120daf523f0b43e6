"""`GET /healthz`: 200 when the store answers a query, else 503."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text
from starlette.responses import Response

from coordinator.core.dependencies import DB
from coordinator.core.errors import CoordinatorNotAvailable, problem_response
from coordinator.core.responses import json_response

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(db: DB) -> Response:
    try:
        async with db.read() as session:
            await session.execute(text("SELECT 1"))
    except Exception as exc:  # any failure to reach the store means "not healthy"
        return problem_response(CoordinatorNotAvailable(f"the store did not answer: {exc!s:.200}"))
    return json_response({"status": "ok"})
