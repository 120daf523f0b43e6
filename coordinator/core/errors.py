"""Domain errors and their mapping to RFC 9457 problem documents.

Services raise a `CoordinatorError` subclass; it carries the API code, HTTP status and whether the
request may simply be sent again. One set of handlers (installed by `install_error_handlers`) turns
these, validation failures, unknown paths and unexpected failures into `application/problem+json`.
Endpoints never build `HTTPException`.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match

from coordinator.core.metrics import set_error_code

log = logging.getLogger("coordinator")

PROBLEM_JSON = "application/problem+json"


class CoordinatorError(Exception):
    code: ClassVar[str] = "INTERNAL_ERROR"
    status: ClassVar[int] = 500
    retriable: ClassVar[bool] = False
    title: ClassVar[str] = "Internal error"

    def __init__(self, detail: str, extensions: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        # RFC 9457 extension members the problem document carries besides the standard ones.
        self.extensions = extensions or {}


class InvalidRequest(CoordinatorError):
    code = "INVALID_REQUEST"
    status = 422
    title = "Invalid request"


class UnstorableText(CoordinatorError):
    """Text holding a NUL character: Postgres cannot keep it (SQLite could, but the stores must
    agree, and no Kafka name or id may hold one), so it is refused before it reaches either."""

    code = "INVALID_REQUEST"
    status = 400
    title = "Invalid text"


class NotUtf8(CoordinatorError):
    """Text that is not UTF-8 where only UTF-8 is taken (a path, a query, a name): refused, not
    repaired, or two different ids would become one."""

    code = "INVALID_REQUEST"
    status = 400
    title = "Invalid text"


class NotImplementedCoding(CoordinatorError):
    """A transfer coding other than chunked (RFC 9112, 6.1: the server answers 501)."""

    code = "INVALID_REQUEST"
    status = 501
    title = "Transfer coding not implemented"


class RequestTooLarge(CoordinatorError):
    code = "INVALID_REQUEST"
    status = 413
    title = "Request body too large"


class RecordListTooLarge(CoordinatorError):
    """A record batch, or a request body, over its limit (Kafka's RECORD_LIST_TOO_LARGE)."""

    code = "RECORD_LIST_TOO_LARGE"
    status = 413
    title = "Record batch too large"


class NotFound(CoordinatorError):
    code = "NOT_FOUND"
    status = 404
    title = "Not found"


class MethodNotAllowed(CoordinatorError):
    code = "METHOD_NOT_ALLOWED"
    status = 405
    title = "Method not allowed"


class Unauthenticated(CoordinatorError):
    code = "UNAUTHENTICATED"
    status = 401
    title = "Unauthenticated"


class TransactionalIdAuthorizationFailed(CoordinatorError):
    code = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    status = 403
    title = "Not authorised for this transactional id"


class TopicAuthorizationFailed(CoordinatorError):
    code = "TOPIC_AUTHORIZATION_FAILED"
    status = 403
    title = "Not authorised for this topic"


class GroupAuthorizationFailed(CoordinatorError):
    code = "GROUP_AUTHORIZATION_FAILED"
    status = 403
    title = "Not authorised for this group"


class ClusterAuthorizationFailed(CoordinatorError):
    code = "CLUSTER_AUTHORIZATION_FAILED"
    status = 403
    title = "Not authorised for this operation"


class CoordinatorNotAvailable(CoordinatorError):
    code = "COORDINATOR_NOT_AVAILABLE"
    status = 503
    retriable = True
    title = "Coordinator not available"


class StoreUnavailable(CoordinatorNotAvailable):
    """The database cannot be reached (restarting, failing over, the network cut): retriable,
    503 over HTTP; over Kafka's protocol the code each API uses for it."""

    title = "Store unavailable"


class InternalError(CoordinatorError):
    code = "INTERNAL_ERROR"
    status = 500
    retriable = True
    title = "Internal error"


def problem_response(
    error: CoordinatorError, status: int | None = None, headers: dict[str, str] | None = None
) -> Response:
    status = status or error.status
    body = {
        "type": f"urn:coordinator:error:{error.code.lower()}",
        "title": error.title,
        "status": status,
        "detail": error.detail,
        "code": error.code,
        "retriable": error.retriable,
        **error.extensions,
    }
    return Response(orjson.dumps(body), status, headers, media_type=PROBLEM_JSON)


def _field_name(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:] or parts
    return ".".join(parts) or "body"


def describe_validation_errors(errors: list[dict[str, Any]] | Any) -> str:
    messages = []
    for err in list(errors)[:5]:
        if err.get("type") == "json_invalid":
            position = err.get("loc", ("body", "?"))[-1]
            messages.append(f"body: not valid JSON (near character {position})")
            continue
        field = _field_name(err.get("loc", ()))
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        messages.append(f"{field}: {message}")
    return "; ".join(messages) or "invalid request"


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route answers on this path (RFC 9110: a 405 lists them all; Starlette
    lists only the first route's)."""
    routes = request.app.router.routes
    return [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes
        )
    ]


# SQLSTATE classes of a server that cannot serve now rather than of a statement that failed:
# 08 connection exception; 57 operator intervention (shutting down, starting up, terminated).
UNAVAILABLE_SQLSTATE_CLASSES = ("08", "57")


def store_unavailable(exc: DBAPIError) -> bool:
    """Whether a driver error says the store is unreachable or going away (a 503, retriable),
    not that a statement failed (a bug: 500)."""
    if exc.connection_invalidated:
        return True
    sqlstate = getattr(exc.orig, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate[:2] in UNAVAILABLE_SQLSTATE_CLASSES


def install_error_handlers(app: FastAPI) -> None:
    def answer(
        request: Request,
        error: CoordinatorError,
        status: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        set_error_code(request.scope, error.code)
        return problem_response(error, status, headers)

    async def on_domain_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, CoordinatorError)
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthenticated) else None
        return answer(request, exc, headers=headers)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return answer(request, InvalidRequest(describe_validation_errors(exc.errors())))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            return answer(request, NotFound("no such path"))
        if exc.status_code == 405:
            allowed = ", ".join(_allowed_methods(request))
            return answer(
                request,
                MethodNotAllowed(f"this path answers {allowed}"),
                headers={"Allow": allowed},
            )
        if 400 <= exc.status_code < 500:
            # FastAPI raises 400 itself when a body cannot be parsed at all (too deep, a number
            # too long, not UTF-8); said the same way as JSON that does not parse.
            return answer(request, InvalidRequest("body: not valid JSON"), exc.status_code)
        return answer(request, InternalError(str(exc.detail)), headers=dict(exc.headers or {}))

    async def on_store_error(request: Request, exc: Exception) -> Response:
        # A lost connection or an unreachable store: the request did not commit, try again.
        log.warning("store unavailable: %s", exc.__class__.__name__)
        return answer(request, CoordinatorNotAvailable("the store did not answer; retry"))

    async def on_driver_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, DBAPIError)
        if store_unavailable(exc):
            return await on_store_error(request, exc)
        return await on_unexpected(request, exc)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected failure", exc_info=exc)
        return answer(request, InternalError("unexpected failure; nothing was changed"))

    app.add_exception_handler(CoordinatorError, on_domain_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(OperationalError, on_store_error)
    app.add_exception_handler(InterfaceError, on_store_error)
    app.add_exception_handler(DBAPIError, on_driver_error)
    # Connecting to a store that is down raises the socket's error as it is (refused, reset).
    app.add_exception_handler(ConnectionError, on_store_error)
    app.add_exception_handler(Exception, on_unexpected)
