"""The operator's dashboard at `/dashboard` (to be built)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["dashboard"])
