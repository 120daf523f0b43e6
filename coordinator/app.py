"""The app factory: one FastAPI app per store, with every domain's routes and the error mapping."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

import coordinator
from coordinator.admin.dashboard import router as dashboard_router
from coordinator.admin.metrics import router as metrics_router
from coordinator.admin.routes import router as admin_router
from coordinator.core import acls, memory
from coordinator.core.auth import Authenticator
from coordinator.core.errors import install_error_handlers
from coordinator.core.health import router as health_router
from coordinator.core.limits import BodySizeLimit
from coordinator.core.metrics import MetricsMiddleware
from coordinator.core.openapi import install_openapi
from coordinator.core.quotas import MutationQuota
from coordinator.core.settings import Settings, get_settings
from coordinator.deletion import router as deletion_router
from coordinator.effects.routes import router as effects_router
from coordinator.effects.tasks import run_expiry
from coordinator.groups import service as groups_service
from coordinator.groups.routes import router as groups_router
from coordinator.groups.tasks import run_group_sweeper
from coordinator.kafka.server import KafkaListener
from coordinator.log import produce
from coordinator.log.cleaner import run_cleaner
from coordinator.log.hot_routes import hot_routes
from coordinator.log.purgatory import PURGATORY
from coordinator.log.routes import router as log_router
from coordinator.shares.routes import configs_router as group_configs_router
from coordinator.shares.routes import router as shares_router
from coordinator.shares.tasks import run_share_sweeper
from coordinator.store.engines import open_store
from coordinator.store.postgres.replicas import watch_replicas
from coordinator.transactions.joining import GroupJoins
from coordinator.transactions.offsets import pending_offset
from coordinator.transactions.routes import producers_router
from coordinator.transactions.routes import router as transactions_router
from coordinator.transactions.states import TRANSITIONS, Op, State
from coordinator.transactions.tasks import run_sweeper


def wire_domains() -> None:
    """Give the lower domains what they call above them, here, where the app composes them
    (dependencies run one way: core, the log, groups, transactions, the doors, the app): the
    log's append groups reach the transactions their batches join, and a stable offset fetch of
    the groups domain the offsets open transactions hold. Idempotent."""
    # A batch joins (and starts) its transaction from any state PRODUCE leaves, and leaves it
    # Ongoing: what the log's one-statement append checks.
    assert set(TRANSITIONS[Op.PRODUCE].values()) == {State.ONGOING}
    produce.use_transactions(GroupJoins, State.ONGOING, [str(s) for s in TRANSITIONS[Op.PRODUCE]])
    groups_service.use_pending_offsets(pending_offset)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    wire_domains()
    memory.configure(settings.queued_max_request_bytes, settings.queued_max_request_wait_ms / 1000)
    level = os.environ.get("COORDINATOR_LOG_LEVEL")
    if level:  # a worker of `serve --workers N --log-level ...`
        logging.getLogger("coordinator").setLevel(level.upper())
    # Built here, not in the lifespan, so in-process test clients (which skip it) work too.
    db = open_store(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Everything loaded at start lives as long as the process: keep the collector from
        # rescanning it on every collection (a measurable share of a produce's CPU).
        gc.collect()
        gc.freeze()
        background = [
            asyncio.create_task(run_sweeper(db, settings), name="coordinator-sweeper"),
            asyncio.create_task(run_group_sweeper(db, settings), name="group-sweeper"),
            asyncio.create_task(run_share_sweeper(db, settings), name="share-sweeper"),
            asyncio.create_task(run_expiry(db, settings), name="coordinator-effect-expiry"),
            asyncio.create_task(run_cleaner(db, settings), name="coordinator-log-cleaner"),
        ]
        # Fetches of this process waiting on a partition wake when another process moves it.
        background.append(
            asyncio.create_task(db.listen_moves(PURGATORY.moved), name="coordinator-moves")
        )
        if db.replicas is not None:
            background.append(
                asyncio.create_task(watch_replicas(db, settings), name="replica-watch")
            )
        authenticator: Authenticator | None = app.state.authenticator
        if authenticator is not None:
            # The ACLs are checked from memory: loaded before the first request is served.
            await acls.refresh(db, authenticator.acls)
            background.append(
                asyncio.create_task(
                    acls.keep_fresh(db, authenticator.acls, settings.acl_refresh_ms / 1000),
                    name="acl-refresh",
                )
            )
        listener = None
        if settings.kafka_listener is not None:
            listener = KafkaListener(db, settings, app.state.authenticator, app.state.quota)
            await listener.start()
        try:
            yield
        finally:
            if listener is not None:
                await listener.close()
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await db.dispose()

    app = FastAPI(
        title="Exactly-once transaction coordinator",
        version=coordinator.__version__,
        lifespan=lifespan,
        # An unknown path is a 404 problem document (docs/pages/http-api.md), not a bare redirect.
        redirect_slashes=False,
    )
    app.state.settings = settings
    app.state.db = db
    # One per process, shared by both doors.
    app.state.quota = MutationQuota(settings.controller_mutation_rate)
    app.state.authenticator = (
        Authenticator.from_file(settings.auth_tokens_file) if settings.auth_tokens_file else None
    )
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(MetricsMiddleware)  # outermost: sees every answer, even a refused body
    # Before the FastAPI routes of the same path: the data path's plain requests, answered
    # without FastAPI's per-request dependency resolution (coordinator.log.hot_routes).
    app.router.routes.extend(hot_routes())
    # The routers' own routes, complete (prefix, tags, dependencies) and built once, at import.
    # `include_router` would have each app build copies of them all at its first request, a
    # tenth of a second of this machine's CPU that every in-process test would pay again.
    for router in (
        health_router,
        log_router,
        deletion_router,
        producers_router,
        transactions_router,
        # A group's configs before the groups' own routes, whose describe takes any path.
        group_configs_router,
        groups_router,
        shares_router,
        effects_router,
        admin_router,
        dashboard_router,
        metrics_router,
    ):
        app.router.routes.extend(router.routes)
    install_openapi(app)
    return app
