"""Request-scoped access to the app's store and settings. Async so FastAPI calls them on the
event loop rather than hopping to its threadpool on every request."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from coordinator.core.quotas import MutationQuota
from coordinator.core.settings import Settings
from coordinator.store import Store


async def get_db(request: Request) -> Store:
    db: Store = request.app.state.db
    return db


async def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


DB = Annotated[Store, Depends(get_db)]
AppSettings = Annotated[Settings, Depends(get_app_settings)]


async def get_quota(request: Request) -> MutationQuota:
    quota: MutationQuota = request.app.state.quota
    return quota


Quota = Annotated[MutationQuota, Depends(get_quota)]
